"""Commands: every encoder parses back, any chunking works, garbage gives typed errors,
and malformed commands get nsqd's own error codes and texts."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trionsq.protocol import commands as c
from trionsq.protocol import errors
from trionsq.protocol.commands import MAGIC_V2, CommandParser
from trionsq.protocol.names import is_valid_name

from .test_frames import split_at

name_chars = st.sampled_from("abcxyzABC0123456789._-")
names = st.builds(
    lambda core, eph: (core + "#ephemeral")[:64] if eph else core,
    st.text(name_chars, min_size=1, max_size=64),
    st.booleans(),
).filter(is_valid_name)
# Ids are opaque bytes to the parser, but a line cannot carry spaces or newlines,
# and a trailing CR is stripped as nsqd strips it.
msg_ids = st.binary(min_size=16, max_size=16).filter(
    lambda b: b" " not in b and b"\n" not in b and not b.endswith(b"\r")
)
message_bodies = st.binary(min_size=1, max_size=512)

commands_and_events = st.one_of(
    st.builds(lambda t, ch: (c.sub(t, ch), c.Sub(t, ch)), names, names),
    st.builds(lambda t, b: (c.pub(t, b), c.Pub(t, b)), names, message_bodies),
    st.builds(
        lambda t, bs: (c.mpub(t, bs), c.MPub(t, bs)),
        names,
        st.lists(message_bodies, min_size=1, max_size=8),
    ),
    st.builds(
        lambda t, d, b: (c.dpub(t, d, b), c.DPub(t, d, b)),
        names,
        st.integers(min_value=0, max_value=3_600_000),
        message_bodies,
    ),
    st.builds(lambda n: (c.rdy(n), c.Rdy(str(n).encode())), st.integers(0, 10_000)),
    st.builds(lambda i: (c.fin(i), c.Fin(i)), msg_ids),
    st.builds(
        lambda i, d: (c.req(i, d), c.Req(i, d * 1_000_000)),
        msg_ids,
        st.integers(0, 3_600_000),
    ),
    st.builds(lambda i: (c.touch(i), c.Touch(i)), msg_ids),
    st.builds(lambda s: (c.auth(s), c.Auth(s)), st.binary(min_size=1, max_size=64)),
    st.just((c.cls(), c.Cls())),
    st.just((c.nop(), c.Nop())),
)


def parse_all(parser: CommandParser, pieces: list[bytes]) -> list[c.Command]:
    out: list[c.Command] = []
    for piece in pieces:
        parser.feed(piece)
        while (command := parser.next_command()) is not None:
            out.append(command)
    return out


@given(st.lists(commands_and_events, max_size=15))
def test_every_command_round_trips(pairs: list[tuple[bytes, c.Command]]) -> None:
    data = MAGIC_V2 + b"".join(raw for raw, _ in pairs)
    assert parse_all(CommandParser(), [data]) == [event for _, event in pairs]


@given(st.lists(commands_and_events, max_size=8), st.lists(st.integers(min_value=0), max_size=40))
def test_any_chunking_gives_the_same_commands(
    pairs: list[tuple[bytes, c.Command]], cuts: list[int]
) -> None:
    data = MAGIC_V2 + b"".join(raw for raw, _ in pairs)
    assert parse_all(CommandParser(), split_at(data, cuts)) == [event for _, event in pairs]


def test_identify_body_round_trips() -> None:
    (command,) = parse_all(CommandParser(), [MAGIC_V2 + c.identify({"client_id": "x"})])
    assert command == c.Identify(b'{"client_id":"x"}')


@given(st.binary(max_size=600), st.lists(st.integers(min_value=0), max_size=10))
def test_garbage_gives_commands_or_a_typed_error(data: bytes, cuts: list[int]) -> None:
    parser = CommandParser(expect_magic=False, max_line_length=256, max_body_size=1024)
    try:
        parse_all(parser, split_at(data, cuts))
    except (errors.NSQErrorResponse, errors.ProtocolError) as exc:
        # Server-side errors are the kind nsqd sends, and all of them are fatal.
        if isinstance(exc, errors.NSQErrorResponse):
            assert exc.fatal
            assert exc.to_bytes().startswith(b"E_")
    assert parser.buffered <= len(data)


def error_for(data: bytes, **limits: int) -> errors.NSQError:
    parser = CommandParser(**limits)  # type: ignore[arg-type]
    with pytest.raises(errors.NSQError) as info:
        parse_all(parser, [data])
    return info.value


@pytest.mark.parametrize(
    ("data", "cls", "text"),
    [
        (b"  V1", errors.BadProtocolError, "E_BAD_PROTOCOL"),
        (MAGIC_V2 + b"BOGUS\n", errors.InvalidError, "E_INVALID invalid command BOGUS"),
        (MAGIC_V2 + b"\n", errors.InvalidError, "E_INVALID invalid command "),
        (MAGIC_V2 + b"SUB t\n", errors.InvalidError, "E_INVALID SUB insufficient number of parameters"),
        (MAGIC_V2 + b"SUB a!b c\n", errors.BadTopicError, 'E_BAD_TOPIC SUB topic name "a!b" is not valid'),
        (MAGIC_V2 + b"SUB t c c\n", None, None),
        (MAGIC_V2 + b"SUB t " + b"c" * 65 + b"\n", errors.BadChannelError, "E_BAD_CHANNEL SUB channel name"),
        (MAGIC_V2 + b"PUB\n", errors.InvalidError, "E_INVALID PUB insufficient number of parameters"),
        (MAGIC_V2 + b"PUB t\n" + struct.pack(">l", 0), errors.BadMessageError, "E_BAD_MESSAGE PUB invalid message body size 0"),
        (MAGIC_V2 + b"PUB t\n" + struct.pack(">l", 2_000_000), errors.BadMessageError, "E_BAD_MESSAGE PUB message too big 2000000 > 1048576"),
        (MAGIC_V2 + b"MPUB a/b\n", errors.BadTopicError, 'E_BAD_TOPIC E_BAD_TOPIC MPUB topic name "a/b" is not valid'),
        (MAGIC_V2 + b"MPUB t\n" + struct.pack(">l", -5), errors.BadBodyError, "E_BAD_BODY MPUB invalid body size -5"),
        (MAGIC_V2 + b"MPUB t\n" + struct.pack(">ll", 10, 0), errors.BadBodyError, "E_BAD_BODY MPUB invalid message count 0"),
        (MAGIC_V2 + b"MPUB t\n" + struct.pack(">lll", 10, 1, 0), errors.BadMessageError, "E_BAD_MESSAGE MPUB invalid message(0) body size 0"),
        (MAGIC_V2 + b"DPUB t x\n", errors.InvalidError, "E_INVALID DPUB could not parse timeout x"),
        (MAGIC_V2 + b"DPUB t 3600001\n", errors.InvalidError, "E_INVALID DPUB timeout 3600001 out of range 0-3600000"),
        (MAGIC_V2 + b"DPUB t\n", errors.InvalidError, "E_INVALID DPUB insufficient number of parameters"),
        (MAGIC_V2 + b"FIN\n", errors.InvalidError, "E_INVALID FIN insufficient number of params"),
        (MAGIC_V2 + b"FIN abc\n", errors.InvalidError, "E_INVALID invalid message ID"),
        (MAGIC_V2 + b"REQ 0123456789abcdef\n", errors.InvalidError, "E_INVALID REQ insufficient number of params"),
        (MAGIC_V2 + b"REQ 0123456789abcdef -1\n", errors.InvalidError, "E_INVALID REQ could not parse timeout -1"),
        (MAGIC_V2 + b"TOUCH 01234\n", errors.InvalidError, "E_INVALID invalid message ID"),
        (MAGIC_V2 + b"AUTH x\n", errors.InvalidError, "E_INVALID AUTH invalid number of parameters"),
        (MAGIC_V2 + b"AUTH\n" + struct.pack(">l", 0), errors.BadBodyError, "E_BAD_BODY AUTH invalid body size 0"),
        (MAGIC_V2 + b"IDENTIFY\n" + struct.pack(">l", 6_000_000), errors.BadBodyError, "E_BAD_BODY IDENTIFY body too big 6000000 > 5242880"),
        (MAGIC_V2 + b"IDENTIFY\n" + struct.pack(">l", -1), errors.BadBodyError, "E_BAD_BODY IDENTIFY invalid body size -1"),
    ],
)  # fmt: skip
def test_nsqd_error_texts(data: bytes, cls: type[errors.NSQError] | None, text: str | None) -> None:
    if cls is None:
        assert parse_all(CommandParser(), [data]) == [c.Sub("t", "c")]
        return
    err = error_for(data)
    assert isinstance(err, cls)
    assert isinstance(err, errors.NSQErrorResponse)
    assert text is not None and err.wire_text().startswith(text)


def test_rdy_count_parsing_follows_nsqd() -> None:
    assert c.Rdy(None).count() == 1
    assert c.Rdy(b"").count() == 0  # nsqd's ByteToBase10 reads "" as 0
    assert c.Rdy(b"2500").count() == 2500
    assert c.Rdy(b"18446744073709551615").count() == -1  # wraps like Go's int64(uint64)
    with pytest.raises(errors.InvalidError, match="RDY could not parse count 1x"):
        c.Rdy(b"1x").count()


def test_crlf_line_endings_are_accepted() -> None:
    assert parse_all(CommandParser(), [MAGIC_V2 + b"NOP\r\nRDY 3\r\n"]) == [c.Nop(), c.Rdy(b"3")]


def test_long_line_is_dropped_like_nsqd() -> None:
    parser = CommandParser(expect_magic=False, max_line_length=64)
    parser.feed(b"X" * 63)
    assert parser.next_command() is None
    parser.feed(b"X")
    with pytest.raises(errors.LineTooLong):
        parser.next_command()


def test_precheck_runs_before_parameters_are_validated() -> None:
    seen: list[bytes] = []

    def precheck(name: bytes) -> None:
        seen.append(name)
        if name == b"SUB":
            raise errors.InvalidError("cannot SUB in current state")

    parser = CommandParser(precheck=precheck)
    parser.feed(MAGIC_V2 + b"NOP\nSUB bad!topic c\n")
    assert parser.next_command() == c.Nop()
    with pytest.raises(errors.InvalidError, match="cannot SUB in current state"):
        parser.next_command()
    assert seen == [b"NOP", b"SUB"]


def test_body_sizes_are_checked_before_the_body_arrives() -> None:
    parser = CommandParser(max_msg_size=10)
    parser.feed(MAGIC_V2 + b"PUB t\n" + struct.pack(">l", 11))
    with pytest.raises(errors.BadMessageError, match="PUB message too big 11 > 10"):
        parser.next_command()


def test_mpub_cannot_outgrow_the_body_limit() -> None:
    parser = CommandParser(max_body_size=100, max_msg_size=80)
    parser.feed(MAGIC_V2 + b"MPUB t\n" + struct.pack(">ll", 50, 3))
    for _ in range(2):
        parser.feed(struct.pack(">l", 40) + b"x" * 40)
    with pytest.raises(errors.BadBodyError, match="MPUB body too big"):
        parser.feed(struct.pack(">l", 40))
        parser.next_command()


def test_take_buffer_hands_over_unparsed_bytes() -> None:
    parser = CommandParser()
    parser.feed(MAGIC_V2 + c.identify({}) + b"\x00compressed")
    assert isinstance(parser.next_command(), c.Identify)
    assert parser.take_buffer() == b"\x00compressed"
    assert parser.buffered == 0


@given(names, st.lists(message_bodies, min_size=1, max_size=8))
def test_mpub_takes_any_iterable_of_bodies(topic: str, bodies: list[bytes]) -> None:
    expected = c.mpub(topic, bodies)
    assert c.mpub(topic, tuple(bodies)) == expected
    assert c.mpub(topic, (body for body in bodies)) == expected
    size = 4 + sum(4 + len(body) for body in bodies)
    assert expected.startswith(
        b"MPUB %s\n%s" % (topic.encode(), struct.pack(">LL", size, len(bodies)))
    )


def test_body_commands_are_those_that_wait_for_a_body() -> None:
    msg_id = b"0123456789abcdef"
    lines = [
        b"IDENTIFY\n",
        b"AUTH\n",
        b"PUB t\n",
        b"MPUB t\n",
        b"DPUB t 10\n",
        b"SUB t c\n",
        b"RDY 1\n",
        b"FIN " + msg_id + b"\n",
        b"REQ " + msg_id + b" 0\n",
        b"TOUCH " + msg_id + b"\n",
        b"CLS\n",
        b"NOP\n",
    ]
    waiting = set()
    for line in lines:
        parser = CommandParser(expect_magic=False)
        parser.feed(line)
        if parser.next_command() is None:
            waiting.add(line.split(b" ")[0].strip())
    assert waiting == c.BODY_COMMANDS
