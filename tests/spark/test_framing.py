"""Frames on the source's own sockets: round trips, and bad input that fails cleanly."""

from __future__ import annotations

import socket
import struct

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from trionsq.spark import _framing as framing

headers = st.dictionaries(
    st.text(max_size=8),
    st.one_of(st.integers(), st.text(max_size=20), st.none(), st.lists(st.integers(), max_size=3)),
    max_size=5,
)


@given(headers, st.binary(max_size=300))
def test_blocking_round_trip(header: dict[str, object], payload: bytes) -> None:
    left, right = socket.socketpair()
    with left, right:
        framing.send_sync(left, header, payload)
        assert framing.receive_sync(right) == (header, payload)


async def test_trio_round_trip_of_several_frames() -> None:
    left, right = trio.testing.memory_stream_pair()
    frames = [({"op": "a", "n": 1}, b""), ({"op": "b"}, b"x" * 200_000), ({"op": "c"}, b"y")]
    receive = framing.FrameReceiver(right)
    async with trio.open_nursery() as nursery:

        async def writer() -> None:
            for header, payload in frames:
                await framing.send(left, header, payload)
            await left.aclose()

        nursery.start_soon(writer)
        got = [await receive() for _ in frames]
        with pytest.raises(EOFError):
            await receive()
    assert got == frames


@given(st.binary(max_size=64))
def test_garbage_is_a_frame_or_a_framing_error_never_a_crash(data: bytes) -> None:
    async def main() -> None:
        left, right = trio.testing.memory_stream_pair()
        await left.send_all(data)
        await left.aclose()
        try:
            header, payload = await framing.receive(right)
        except (framing.FramingError, EOFError):
            return
        assert isinstance(header, dict) and isinstance(payload, bytes)

    trio.run(main)


def test_oversized_lengths_are_refused_before_reading() -> None:
    left, right = socket.socketpair()
    with left, right:
        left.sendall(struct.pack(">I", framing.MAX_HEADER + 1))
        with pytest.raises(framing.FramingError, match="too big"):
            framing.receive_sync(right)


def test_a_header_must_be_a_json_object() -> None:
    left, right = socket.socketpair()
    with left, right:
        left.sendall(struct.pack(">I", 2) + b"[]" + struct.pack(">I", 0))
        with pytest.raises(framing.FramingError, match="not a JSON object"):
            framing.receive_sync(right)
