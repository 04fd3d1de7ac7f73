"""The CommandParser's FIN fast path (added for fakensq's throughput) must agree
with the general path on every input."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from trionsq.protocol.commands import CommandParser, Fin
from trionsq.protocol.errors import InvalidError, NSQErrorResponse


def _parse(data: bytes, chunks: list[int], state: str) -> list[object]:
    seen: list[bytes] = []

    def precheck(name: bytes) -> None:
        seen.append(name)
        if state == "init" and name == b"FIN":
            raise InvalidError("cannot FIN in current state")

    parser = CommandParser(expect_magic=False, precheck=precheck)
    out: list[object] = []
    pos = 0
    for size in [*chunks, len(data)]:
        parser.feed(data[pos : pos + size])
        pos += size
        while True:
            try:
                command = parser.next_command()
            except NSQErrorResponse as exc:
                return [*out, exc.wire_text(), list(seen)]
            if command is None:
                break
            out.append(command)
    return [*out, list(seen)]


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
    got = _parse(data, chunks, state)
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
