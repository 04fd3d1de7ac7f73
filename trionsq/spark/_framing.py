"""Frames on the source's own sockets: a JSON header and an optional binary payload.

The nsq source's processes talk over plain sockets: tasks to their executor's
agent (a Unix socket), agents to the driver's coordinator and to each other (TCP).
Every frame is::

    header length (4 bytes, big-endian) | header (UTF-8 JSON object)
    payload length (8 bytes, big-endian) | payload (bytes, often empty)

Headers carry the small things (operations, ids, counts, errors); payloads carry
Arrow data and pickled options.  Both sides of every socket are trionsq code of
the same version, so there is no negotiation; sizes are still checked, so a
stray client or a corrupt stream fails one connection with a clear error.
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

import trio

__all__ = [
    "MAX_HEADER",
    "MAX_PAYLOAD",
    "FramingError",
    "encode",
    "receive",
    "receive_sync",
    "send",
    "send_sync",
]

#: Headers are small JSON objects; anything bigger is a stray client.
MAX_HEADER = 1 << 20
#: A payload is one partition's Arrow data: bounded by what a slot holds.
MAX_PAYLOAD = 1 << 40

_LENGTH = struct.Struct(">I")
_PAYLOAD_LENGTH = struct.Struct(">Q")


class FramingError(ConnectionError):
    """The peer sent something that is not a frame, or closed mid-frame."""


def encode(header: dict[str, Any], payload: bytes = b"") -> list[bytes]:
    """A frame, as the pieces to write (a payload is not copied)."""
    data = json.dumps(header, separators=(",", ":")).encode()
    if len(data) > MAX_HEADER:
        raise FramingError(f"frame header of {len(data)} bytes is too big")
    if len(payload) > MAX_PAYLOAD:
        raise FramingError(f"frame payload of {len(payload)} bytes is too big")
    return [_LENGTH.pack(len(data)) + data + _PAYLOAD_LENGTH.pack(len(payload)), payload]


def _header(data: bytes) -> dict[str, Any]:
    try:
        header = json.loads(data)
    except ValueError as exc:
        raise FramingError(f"frame header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise FramingError("frame header is not a JSON object")
    return header


def _length(data: bytes, limit: int, what: str) -> int:
    (length,) = (_LENGTH if len(data) == 4 else _PAYLOAD_LENGTH).unpack(data)
    if length > limit:
        raise FramingError(f"frame {what} of {length} bytes is too big")
    return int(length)


# --- Trio ----------------------------------------------------------------------


class _Reader:
    """Exact reads from a Trio stream (receive_some returns what has arrived)."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self.stream = stream
        self.buffer = bytearray()

    async def exactly(self, count: int) -> bytes:
        while len(self.buffer) < count:
            chunk = await self.stream.receive_some(max(65536, count - len(self.buffer)))
            if not chunk:
                if self.buffer:
                    raise FramingError("connection closed in the middle of a frame")
                raise EOFError
            self.buffer += chunk
        data = bytes(self.buffer[:count])
        del self.buffer[:count]
        return data


async def send(stream: trio.abc.SendStream, header: dict[str, Any], payload: bytes = b"") -> None:
    """Write one frame (callers serialize writers: Trio streams allow one at a time)."""
    head, body = encode(header, payload)
    if len(body) < 65536:
        await stream.send_all(head + body)
    else:
        await stream.send_all(head)
        await stream.send_all(body)


class FrameReceiver:
    """Reads frames one after the other from a Trio stream."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._reader = _Reader(stream)

    async def __call__(self) -> tuple[dict[str, Any], bytes]:
        """The next frame; :class:`EOFError` at a clean end of stream."""
        reader = self._reader
        size = _length(await reader.exactly(4), MAX_HEADER, "header")
        header = _header(await reader.exactly(size))
        try:
            size = _length(await reader.exactly(8), MAX_PAYLOAD, "payload")
        except EOFError:
            raise FramingError("connection closed in the middle of a frame") from None
        payload = await reader.exactly(size) if size else b""
        return header, payload


async def receive(stream: trio.abc.ReceiveStream) -> tuple[dict[str, Any], bytes]:
    """One frame from a stream that carries just one (a request or an answer)."""
    return await FrameReceiver(stream)()


# --- blocking sockets (the task side) ---------------------------------------------


def send_sync(sock: socket.socket, header: dict[str, Any], payload: bytes = b"") -> None:
    head, body = encode(header, payload)
    sock.sendall(head)
    if body:
        sock.sendall(body)


def _exactly_sync(sock: socket.socket, count: int) -> bytes:
    view = memoryview(bytearray(count))
    got = 0
    while got < count:
        n = sock.recv_into(view[got:], min(count - got, 1 << 20))
        if n == 0:
            raise FramingError("connection closed in the middle of a frame")
        got += n
    return view.tobytes()


def receive_sync(sock: socket.socket) -> tuple[dict[str, Any], bytes]:
    size = _length(_exactly_sync(sock, 4), MAX_HEADER, "header")
    header = _header(_exactly_sync(sock, size))
    size = _length(_exactly_sync(sock, 8), MAX_PAYLOAD, "payload")
    payload = _exactly_sync(sock, size) if size else b""
    return header, payload
