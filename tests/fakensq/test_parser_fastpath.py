"""The CommandParser's FIN fast path (added for fakensq's throughput) must agree
with the general path on every input."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from trionsq.protocol.commands import CommandParser, Fin, FinRun, Rdy
from trionsq.protocol.errors import InvalidError, NSQErrorResponse

ids = st.one_of(
    st.binary(min_size=16, max_size=16),
    st.binary(min_size=0, max_size=20),
    st.just(b"0123456789abcde\r"),
    st.just(b"01234567 9abcdef"),
)


@given(
    msg_id=ids,
    ending=st.sampled_from([b"\n", b"\r\n"]),
    chunks=st.lists(st.integers(1, 8), max_size=4),
    state=st.sampled_from(["subscribed", "init"]),
)
def test_fin_fast_path_matches_the_protocol(
    msg_id: bytes, ending: bytes, chunks: list[int], state: str
) -> None:
    data = b"FIN " + msg_id + ending + b"NOP\n"
    got = _parse_both(data, chunks, state, fin_runs=False)
    line = (b"FIN " + msg_id + ending).split(b"\n")[0]
    if line.endswith(b"\r"):
        line = line[:-1]
    params = line.split(b" ")
    if state == "init":
        assert got[-2] == "E_INVALID cannot FIN in current state"
    elif len(params) < 2:
        assert got[-2] == "E_INVALID FIN insufficient number of params"
    elif len(params[1]) != 16:
        assert got[-2] == "E_INVALID invalid message ID"
    else:
        assert got[0] == Fin(params[1])


def _flatten(result: list[object]) -> list[object]:
    out: list[object] = []
    for item in result:
        if isinstance(item, FinRun):
            out.extend(Fin(msg_id) for msg_id in item.ids)
        else:
            out.append(item)
    return out


def _parse_both(data: bytes, chunks: list[int], state: str, fin_runs: bool) -> list[object]:
    """Every command (FIN runs as single FINs), then the error text if any,
    with the prechecks the parser made."""
    seen: list[bytes] = []

    def precheck(name: bytes) -> None:
        seen.append(name)
        if state == "init" and name == b"FIN":
            raise InvalidError("cannot FIN in current state")

    parser = CommandParser(expect_magic=False, precheck=precheck, fin_runs=fin_runs)
    out: list[object] = []
    pos = 0
    for size in [*chunks, len(data)]:
        parser.feed(data[pos : pos + size])
        pos += size
        while True:
            try:
                command = parser.next_command()
            except NSQErrorResponse as exc:
                return [*_flatten(out), exc.wire_text(), seen]
            if command is None:
                break
            out.append(command)
    return [*_flatten(out), seen]


commands = st.one_of(
    ids.map(lambda msg_id: b"FIN " + msg_id + b"\n"),
    st.just(b"FIN 0123456789abcdef\n"),
    st.just(b"FIN 0123456789abcdef\r\n"),
    st.just(b"RDY 10\n"),
    st.just(b"NOP\n"),
    st.just(b"TOUCH 0123456789abcdef\n"),
    st.just(b"REQ 0123456789abcdef 10\n"),
)


@given(
    parts=st.lists(commands, max_size=12),
    chunks=st.lists(st.integers(1, 30), max_size=6),
    state=st.sampled_from(["subscribed", "init"]),
)
def test_fin_runs_are_the_fins_one_by_one(
    parts: list[bytes], chunks: list[int], state: str
) -> None:
    """With ``fin_runs`` the parser gives the same FINs, in the same order
    between the same other commands, with the same error, as one by one; its
    precheck sees one FIN for a run (a FIN cannot change the state)."""
    data = b"".join(parts)
    runs = _parse_both(data, chunks, state, fin_runs=True)
    single = _parse_both(data, chunks, state, fin_runs=False)
    assert runs[:-1] == single[:-1]
    seen_runs, seen_single = runs[-1], single[-1]
    assert isinstance(seen_runs, list) and isinstance(seen_single, list)

    # Collapsing consecutive FIN prechecks gives the same sequence.
    def collapse(names: list[bytes]) -> list[bytes]:
        return [n for i, n in enumerate(names) if n != b"FIN" or i == 0 or names[i - 1] != b"FIN"]

    assert collapse(seen_runs) == collapse(seen_single)


def test_a_fin_run_is_one_command() -> None:
    parser = CommandParser(expect_magic=False, fin_runs=True)
    parser.feed(b"FIN aaaaaaaaaaaaaaaa\nFIN bbbbbbbbbbbbbbbb\nRDY 5\nFIN cccccccccccccccc\n")
    assert parser.next_command() == FinRun([b"aaaaaaaaaaaaaaaa", b"bbbbbbbbbbbbbbbb"])
    assert isinstance(parser.next_command(), Rdy)
    assert parser.next_command() == FinRun([b"cccccccccccccccc"])
    assert parser.next_command() is None


def _parse_pubs(data: bytes, chunks: list[int], fast: bool, tls: bool) -> list[object]:
    seen: list[bytes] = []

    def precheck(name: bytes) -> None:
        seen.append(name)
        if tls:
            raise InvalidError(f"cannot {name.decode()} in current state (TLS required)")

    parser = CommandParser(expect_magic=False, precheck=precheck, max_msg_size=64)
    if not fast:
        parser._fast_pub = lambda buf, pos: None  # type: ignore[method-assign]
    out: list[object] = []
    pos = 0
    for size in [*chunks, len(data)]:
        parser.feed(data[pos : pos + size])
        pos += size
        while True:
            try:
                command = parser.next_command()
            except NSQErrorResponse as exc:
                return [*out, exc.wire_text(), seen]
            if command is None:
                break
            out.append(command)
    return [*out, seen, parser.buffered]


topics = st.one_of(
    st.sampled_from([b"t", b"topic#ephemeral", b"t\r", b"t extra", b"", b"bad/name", b"a" * 65]),
    st.binary(max_size=8),
)
sizes = st.one_of(st.integers(-2, 70), st.just(5))


@given(
    pubs=st.lists(st.tuples(topics, sizes, st.binary(max_size=8)), max_size=5),
    chunks=st.lists(st.integers(1, 30), max_size=6),
    tls=st.booleans(),
)
def test_the_pub_fast_path_matches_the_general_path(
    pubs: list[tuple[bytes, int, bytes]], chunks: list[int], tls: bool
) -> None:
    data = b"".join(
        b"PUB " + topic + b"\n" + size.to_bytes(4, "big", signed=True) + body
        for topic, size, body in pubs
    )
    assert _parse_pubs(data, chunks, True, tls) == _parse_pubs(data, chunks, False, tls)
