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
