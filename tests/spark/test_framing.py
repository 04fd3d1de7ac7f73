"""Frames on the source's own sockets: round trips, and bad input that fails cleanly."""

from __future__ import annotations

import os
import socket
import struct

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from trionsq.spark import _framing as framing

ANY = framing.Limits(header=1 << 16, payload=1 << 20)

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
        assert framing.receive_sync(right, ANY) == (header, payload)


async def test_trio_round_trip_of_several_frames() -> None:
    left, right = trio.testing.memory_stream_pair()
    frames = [({"op": "a", "n": 1}, b""), ({"op": "b"}, b"x" * 200_000), ({"op": "c"}, b"y")]
    receive = framing.FrameReceiver(right, ANY)
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
            header, payload = await framing.receive(right, ANY)
        except (framing.FramingError, EOFError):
            return
        assert isinstance(header, dict) and isinstance(payload, bytes)

    trio.run(main)


def test_oversized_lengths_are_refused_before_reading() -> None:
    left, right = socket.socketpair()
    with left, right:
        left.sendall(b"TQS1" + struct.pack(">IQ", ANY.header + 1, 0))
        with pytest.raises(framing.FramingError, match="too big"):
            framing.receive_sync(right, ANY)


@pytest.mark.parametrize("length", [1, 2**40, 2**63, 2**64 - 1])
def test_a_payload_beyond_its_frames_limit_is_refused_before_reading(length: int) -> None:
    limits = framing.Limits(header=100, payload=lambda header: 0 if header["op"] == "hello" else 1)
    left, right = socket.socketpair()
    with left, right:
        left.sendall(b"TQS1" + struct.pack(">IQ", 14, length) + b'{"op":"hello"}')
        with pytest.raises(framing.FramingError, match="carries at most 0 payload bytes"):
            framing.receive_sync(right, limits)


def test_a_frame_must_start_with_the_magic() -> None:
    left, right = socket.socketpair()
    with left, right:
        left.sendall(b"GET / HTTP/1.1\r\n\r\n")
        with pytest.raises(framing.FramingError, match="not a frame"):
            framing.receive_sync(right, ANY)


def test_a_header_must_be_a_json_object() -> None:
    left, right = socket.socketpair()
    with left, right:
        left.sendall(b"TQS1" + struct.pack(">IQ", 2, 0) + b"[]")
        with pytest.raises(framing.FramingError, match="not a JSON object"):
            framing.receive_sync(right, ANY)


async def test_reads_ask_for_bounded_chunks_whatever_the_length() -> None:
    """A payload's bytes are asked for CHUNK at a time, never by its length."""
    asked: list[int] = []

    class Recording(trio.abc.ReceiveStream):
        def __init__(self, data: bytes) -> None:
            self.data = data

        async def receive_some(self, max_bytes: int | None = None) -> bytes:
            assert max_bytes is not None
            asked.append(max_bytes)
            chunk, self.data = self.data[:max_bytes], self.data[max_bytes:]
            return chunk

        async def aclose(self) -> None:
            pass

    payload = b"p" * (3 * framing.CHUNK + 5)
    data = b"".join(framing.encode({"op": "x"}, payload))
    header, got = await framing.receive(Recording(data), framing.Limits(100, len(payload)))
    assert (header, got) == ({"op": "x"}, payload)
    assert max(asked) <= framing.CHUNK


# --- rows in a memory file (the agent's replies to its tasks) ---------------------


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


needs_memfd = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="no memfd (Linux)")


@needs_memfd
@pytest.mark.parametrize("size", [0, 10, framing.FILE_FROM - 1, framing.FILE_FROM, 3 << 20])
async def test_send_file_round_trip(size: int) -> None:
    """Small payloads go inline, big ones in a memory file, mapped on arrival;
    no descriptor is left open on either side."""
    payload = bytes(range(256)) * (size // 256) + b"z" * (size % 256)
    left, right = socket.socketpair(socket.AF_UNIX)
    before = _open_descriptors()
    with right:
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(left))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(framing.send_file, stream, {"re": 1, "rows": 3}, payload)
            header, got = await trio.to_thread.run_sync(
                lambda: framing.receive_sync(right, ANY if size < ANY.payload else BIG, files=True)
            )
        await stream.aclose()
        assert bytes(got) == payload
        assert header["rows"] == 3
        assert ("file" in header) == (size >= framing.FILE_FROM)
        del got
    assert _open_descriptors() <= before


BIG = framing.Limits(header=1 << 16, payload=4 << 20)


@needs_memfd
async def test_a_file_beyond_the_payload_limit_is_refused() -> None:
    left, right = socket.socketpair(socket.AF_UNIX)
    with right:
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(left))
        await framing.send_file(stream, {"re": 1}, b"x" * (2 << 20))
        with pytest.raises(framing.FramingError, match="at most 1048576 accepted"):
            framing.receive_sync(right, ANY, files=True)
        await stream.aclose()


@needs_memfd
def test_a_file_that_does_not_match_its_header_is_refused() -> None:
    """A header that names a file that did not come, a file with no header for it,
    or a file whose size is not the header's: a FramingError, nothing mapped."""
    for header, size in (({"file": 100}, None), ({"re": 1}, 100), ({"file": 100}, 99)):
        left, right = socket.socketpair(socket.AF_UNIX)
        with left, right:
            head, _ = framing.encode(header)
            if size is None:
                left.sendall(head)
            else:
                descriptor = os.memfd_create("test")
                os.write(descriptor, b"x" * size)
                socket.send_fds(left, [head], [descriptor])
                os.close(descriptor)
            with pytest.raises(framing.FramingError):
                framing.receive_sync(right, ANY, files=True)
