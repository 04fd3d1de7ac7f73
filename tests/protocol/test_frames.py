"""Frames and messages: round trips, arbitrary chunking, and garbage."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trionsq.protocol import errors, frames
from trionsq.protocol.frames import Error, FrameParser, MessageFrame, Response

message_ids = st.binary(min_size=16, max_size=16)
timestamps = st.integers(min_value=-(2**63), max_value=2**63 - 1)
attempts = st.integers(min_value=0, max_value=2**16 - 1)
bodies = st.binary(max_size=2048)

messages = st.builds(MessageFrame, timestamps, attempts, message_ids, bodies)
responses = st.builds(Response, st.binary(max_size=256))
error_frames = st.builds(Error, st.binary(max_size=256))
any_frame = st.one_of(messages, responses, error_frames)


def encode(frame: frames.Frame) -> bytes:
    if isinstance(frame, MessageFrame):
        return frames.encode_message(frame.timestamp, frame.attempts, frame.id, frame.body)
    if isinstance(frame, Response):
        return frames.encode_response(frame.data)
    return frames.encode_error(frame.data)


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, start = [], 0
    for point in points:
        pieces.append(data[start:point])
        start = point
    pieces.append(data[start:])
    return pieces


@given(st.lists(any_frame, max_size=20))
def test_encode_parse_round_trip(frame_list: list[frames.Frame]) -> None:
    parser = FrameParser()
    data = b"".join(encode(f) for f in frame_list)
    assert parser.feed(data) == frame_list
    assert parser.buffered == 0


@given(st.lists(any_frame, max_size=10), st.lists(st.integers(min_value=0), max_size=30))
def test_any_chunking_gives_the_same_frames(
    frame_list: list[frames.Frame], cuts: list[int]
) -> None:
    data = b"".join(encode(f) for f in frame_list)
    parser = FrameParser()
    out: list[frames.Frame] = []
    for piece in split_at(data, cuts):
        out.extend(parser.feed(piece))
    assert out == frame_list


@given(st.binary(max_size=512), st.lists(st.integers(min_value=0), max_size=10))
def test_garbage_gives_frames_or_a_typed_protocol_error(data: bytes, cuts: list[int]) -> None:
    parser = FrameParser(max_frame_size=4096)
    try:
        for piece in split_at(data, cuts):
            for frame in parser.feed(piece):
                assert isinstance(frame, MessageFrame | Response | Error)
    except errors.ProtocolError:
        pass
    # Whatever happened, the parser never held more than one frame's bytes.
    assert parser.buffered <= 4096 + 4 + len(data)


def test_oversized_frame_is_refused_before_buffering() -> None:
    parser = FrameParser(max_frame_size=100)
    with pytest.raises(errors.FrameTooLarge):
        parser.feed(struct.pack(">lL", 101, 0))


@pytest.mark.parametrize("size", [-1, 0, 3])
def test_impossible_frame_sizes_are_invalid(size: int) -> None:
    with pytest.raises(errors.InvalidFrame):
        FrameParser().feed(struct.pack(">l", size) + b"\0" * 8)


def test_unknown_frame_type_is_invalid() -> None:
    with pytest.raises(errors.InvalidFrame, match="unknown frame type 7"):
        FrameParser().feed(frames.encode_frame(7, b"x"))


def test_short_message_frame_is_invalid() -> None:
    with pytest.raises(errors.InvalidFrame, match="too short"):
        FrameParser().feed(frames.encode_frame(frames.FRAME_TYPE_MESSAGE, b"\0" * 25))


def test_message_layout_matches_the_spec() -> None:
    data = frames.encode_message(1_600_000_000_000_000_000, 3, b"0123456789abcdef", b"hi")
    size, frame_type, ts, att = struct.unpack(">lLqH", data[:18])
    assert (size, frame_type, ts, att) == (4 + 26 + 2, 2, 1_600_000_000_000_000_000, 3)
    assert data[18:34] == b"0123456789abcdef"
    assert data[34:] == b"hi"


def test_heartbeat_and_error_frames() -> None:
    heartbeat, err = FrameParser().feed(
        frames.encode_response(frames.HEARTBEAT) + frames.encode_error(b"E_BAD_TOPIC nope")
    )
    assert isinstance(heartbeat, Response) and heartbeat.is_heartbeat
    assert isinstance(err, Error)
    assert isinstance(err.error, errors.BadTopicError)
    assert err.error.description == "nope"


@given(st.lists(any_frame, max_size=10), st.lists(st.integers(min_value=0), max_size=30))
def test_a_message_factory_makes_the_messages_and_others_counts_the_rest(
    frame_list: list[frames.Frame], cuts: list[int]
) -> None:
    made: list[tuple[int, int, bytes, bytes]] = []

    def make(timestamp: int, attempts: int, id: bytes, body: bytes) -> tuple[str, int]:
        made.append((timestamp, attempts, id, body))
        return ("made", len(made) - 1)

    parser = FrameParser(message_factory=make)
    out: list[object] = []
    for piece in split_at(b"".join(encode(f) for f in frame_list), cuts):
        got = parser.feed(piece)
        assert parser.others == sum(1 for f in got if isinstance(f, Response | Error))
        out.extend(got)
    expected: list[object] = []
    for frame in frame_list:
        if isinstance(frame, MessageFrame):
            assert made[len([e for e in expected if isinstance(e, tuple)])] == (
                frame.timestamp,
                frame.attempts,
                frame.id,
                frame.body,
            )
            expected.append(("made", len([e for e in expected if isinstance(e, tuple)])))
        else:
            expected.append(frame)
    assert out == expected


def test_take_buffer_returns_what_is_not_parsed_yet() -> None:
    parser = FrameParser()
    data = frames.encode_response(b"OK") + b"\x00\x00\x00\x09compr"
    assert parser.feed(data) == [Response(b"OK")]
    assert parser.take_buffer() == b"\x00\x00\x00\x09compr"
    assert parser.buffered == 0
    # The parser starts afresh: a whole frame parses.
    assert parser.feed(frames.encode_response(b"OK")) == [Response(b"OK")]


# --- messages above the limit, large frames -------------------------------------


@given(
    st.lists(st.one_of(any_frame, st.integers(100, 5000)), max_size=8),
    st.lists(st.integers(min_value=0), max_size=30),
)
def test_oversized_messages_are_read_past_in_any_chunking(
    items: list[frames.Frame | int], cuts: list[int]
) -> None:
    """With ``skip_oversized``, a message above the limit comes out as its
    header and size, its body never held; the frames around it unchanged."""
    limit = 100
    data, expected = b"", []
    for n, item in enumerate(items):
        if isinstance(item, int):  # an oversized message of that body size
            msg_id = b"%016x" % n
            data += frames.encode_message(7, 3, msg_id, b"z" * item)
            expected.append(frames.OversizedMessage(7, 3, msg_id, item))
        elif len(encode(item)) - 4 > limit:
            continue
        else:
            data += encode(item)
            expected.append(item)
    parser = FrameParser(max_frame_size=limit, skip_oversized=True)
    out: list[object] = []
    for piece in split_at(data, cuts):
        out.extend(parser.feed(piece))
        assert len(parser._rest) <= limit + 4 + len(piece)  # never a body above it
    assert out == expected
    assert parser.buffered == 0


def test_an_oversized_response_or_error_is_still_refused() -> None:
    for frame_type in (frames.FRAME_TYPE_RESPONSE, frames.FRAME_TYPE_ERROR):
        parser = FrameParser(max_frame_size=100, skip_oversized=True)
        with pytest.raises(errors.FrameTooLarge, match="max_frame_size"):
            parser.feed(struct.pack(">lL", 2**31 - 1, frame_type))


def test_a_huge_message_length_waits_for_its_header_then_is_skipped() -> None:
    parser = FrameParser(max_frame_size=100, skip_oversized=True)
    head = frames.message_frame_header(1, 2, b"0123456789abcdef", 2**31 - 1 - 30)
    assert parser.feed(head[:10]) == []
    (skipped,) = parser.feed(head[10:])
    assert skipped == frames.OversizedMessage(1, 2, b"0123456789abcdef", 2**31 - 1 - 30)
    for _ in range(100):  # 100 MB of its body: nothing held
        assert parser.feed(b"\0" * 1_000_000) == []
        assert len(parser._rest) == 0
    assert parser.buffered == 2**31 - 1 - 30 - 100_000_000  # the rest of its body


def test_a_large_frame_completing_is_not_copied_whole_with_the_read() -> None:
    """The buffer holding a large frame becomes its body (no join of the
    whole buffer with the last read); the frames after it come out too."""
    body = bytes(range(256)) * 8192  # 2 MiB
    data = frames.encode_message(1, 1, b"0123456789abcdef", body) + frames.encode_response(b"OK")
    parser = FrameParser(max_frame_size=4 * 1024 * 1024)
    out = []
    for start in range(0, len(data), 65536):
        out.extend(parser.feed(data[start : start + 65536]))
    assert out == [MessageFrame(1, 1, b"0123456789abcdef", body), Response(b"OK")]
    assert type(out[0].body) is bytes


def test_the_default_limit_takes_what_nsqd_allows_with_room() -> None:
    # nsqd's --max-msg-size defaults to 1 MiB; 64 MiB and more go through.
    assert frames.DEFAULT_MAX_FRAME_SIZE >= 64 * 1024 * 1024 + frames.MESSAGE_HEADER_SIZE + 4
