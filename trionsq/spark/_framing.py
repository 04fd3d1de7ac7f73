"""Frames on the source's own sockets: a fixed prefix, a JSON header, a payload.

The nsq source's processes talk over their own sockets: tasks to their
executor's agent (a Unix socket), agents to the driver's coordinator and to each
other (TCP, under TLS: see :mod:`._secure`).  Every frame is::

    prefix (16 bytes): magic b"TQS1" | header length (4 bytes) | payload length (8 bytes)
    header (UTF-8 JSON object) | payload (bytes, often empty)

both lengths unsigned, big-endian.  Headers carry the small things (operations,
ids, counts, errors); payloads carry Arrow data and pickled options.

On the Unix socket, an agent hands a task big rows in a memory file instead
(:func:`send_file`): the frame's payload is empty, its header says how many bytes
the file holds (``"file"``), and the file's descriptor travels with the frame's
first byte (``SCM_RIGHTS``).  A socket's buffer holds a few hundred KiB, so tens
of MiB of rows through it took a hundred turns of the agent's event loop, each
waiting behind its nsqd connections' reads (a quarter of a second per batch on a
busy machine); a file is one system call, and the task maps it without a copy.

Every receiver states its :class:`Limits`: how big a header may be, and how big a
payload each kind of frame may carry.  Both are checked before a byte of the
header or the payload is read, so a peer that lies about a length costs nothing;
reads go in bounded chunks, so a payload costs memory only as it arrives; and
what nobody has proven to be a peer (a first frame) may carry no payload at all,
so authentication always comes before any payload is read.

An internal module of :mod:`trionsq.spark` (hence the underscore): the
package's own wire, which its modules (the agent, the coordinator, the link,
the tasks' client) import by name; no public API.
"""

from __future__ import annotations

import array
import json
import mmap
import os
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

__all__ = [
    "CHUNK",
    "MAGIC",
    "FramingError",
    "Limits",
    "encode",
    "FrameReceiver",
    "receive",
    "receive_sync",
    "send",
    "send_file",
    "send_sync",
]

MAGIC = b"TQS1"
_PREFIX = struct.Struct(">4sIQ")
#: The most one read asks the kernel (or TLS) for: a lying length never becomes
#: one big allocation, and a payload takes memory only as its bytes come.
CHUNK = 1 << 18
#: Payloads from this size on go to a task in a memory file (Linux's memfd).
FILE_FROM = 1 << 18


class FramingError(ConnectionError):
    """The peer sent something that is not an acceptable frame, or closed mid-frame."""


@dataclass(frozen=True, slots=True)
class Limits:
    """What a receiver accepts: ``header`` bytes of JSON at most, and for each
    frame at most ``payload(header)`` bytes of payload (an int: for every frame)."""

    header: int
    payload: int | Callable[[dict[str, Any]], int] = 0

    def payload_for(self, header: dict[str, Any]) -> int:
        return self.payload if isinstance(self.payload, int) else self.payload(header)


def encode(header: dict[str, Any], payload: bytes = b"") -> list[bytes]:
    """A frame, as the pieces to write (a payload is not copied)."""
    data = json.dumps(header, separators=(",", ":")).encode()
    return [_PREFIX.pack(MAGIC, len(data), len(payload)) + data, payload]


def _prefix(data: bytes, limits: Limits) -> tuple[int, int]:
    magic, header_size, payload_size = _PREFIX.unpack(data)
    if magic != MAGIC:
        raise FramingError(f"not a frame of the nsq source (starts with {magic!r})")
    if header_size > limits.header:
        raise FramingError(f"frame header of {header_size} bytes is too big")
    return int(header_size), int(payload_size)


def _header(data: bytes, payload_size: int, limits: Limits) -> dict[str, Any]:
    try:
        header = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise FramingError(f"frame header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise FramingError("frame header is not a JSON object")
    cap = limits.payload_for(header)
    if payload_size > cap:
        what = header.get("op", "reply" if "re" in header else "?")
        raise FramingError(
            f"a {str(what)[:20]!r} frame carries at most {cap} payload bytes, not {payload_size}"
        )
    return header


# --- Trio ----------------------------------------------------------------------


class _Reader:
    """Exact reads from a Trio stream, never asking for more than :data:`CHUNK`."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self.stream = stream
        self.buffer = bytearray()

    async def exactly(self, count: int) -> bytes:
        buffer = self.buffer
        while len(buffer) < count:
            chunk = await self.stream.receive_some(CHUNK)
            if not chunk:
                if buffer:
                    raise FramingError("connection closed in the middle of a frame")
                raise EOFError
            buffer += chunk
        if len(buffer) == count:
            data = bytes(buffer)
            buffer.clear()
        else:
            data = bytes(memoryview(buffer)[:count])
            del buffer[:count]
        return data


async def send(stream: trio.abc.SendStream, header: dict[str, Any], payload: bytes = b"") -> None:
    """Write one frame (callers serialize writers: Trio streams allow one at a time)."""
    head, body = encode(header, payload)
    if len(body) < 65536:
        await stream.send_all(head + body)
    else:
        await stream.send_all(head)
        await stream.send_all(body)


async def send_file(stream: trio.SocketStream, header: dict[str, Any], payload: bytes) -> None:
    """Write one frame on a Unix socket, a big payload in a memory file passed with it
    (see the module docstring; small ones, or without memfd, as :func:`send` does)."""
    if len(payload) < FILE_FROM or not hasattr(os, "memfd_create"):
        await send(stream, header, payload)
        return
    descriptor = os.memfd_create("trionsq-spark-rows", os.MFD_CLOEXEC)
    try:
        view = memoryview(payload)
        while view:
            view = view[os.write(descriptor, view) :]
        head, _ = encode({**header, "file": len(payload)})
        rights = array.array("i", [descriptor])
        sent = await stream.socket.sendmsg([head], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)])
        if sent < len(head):
            await stream.send_all(head[sent:])
    finally:
        # The task holds its own descriptor once the frame is sent (or the socket's
        # queue does, until the task reads or the socket closes).
        os.close(descriptor)


class FrameReceiver:
    """Reads frames one after the other from a Trio stream, within ``limits``."""

    def __init__(self, stream: trio.abc.ReceiveStream, limits: Limits) -> None:
        self._reader = _Reader(stream)
        self.limits = limits

    async def __call__(self) -> tuple[dict[str, Any], bytes]:
        """The next frame; :class:`EOFError` at a clean end of stream."""
        reader, limits = self._reader, self.limits
        header_size, payload_size = _prefix(await reader.exactly(_PREFIX.size), limits)
        try:
            header = _header(await reader.exactly(header_size), payload_size, limits)
            payload = await reader.exactly(payload_size) if payload_size else b""
        except EOFError:
            raise FramingError("connection closed in the middle of a frame") from None
        return header, payload


async def receive(stream: trio.abc.ReceiveStream, limits: Limits) -> tuple[dict[str, Any], bytes]:
    """One frame from a stream that carries just one (a request or an answer)."""
    return await FrameReceiver(stream, limits)()


# --- blocking sockets (the task side) ---------------------------------------------


def send_sync(sock: socket.socket, header: dict[str, Any], payload: bytes = b"") -> None:
    head, body = encode(header, payload)
    sock.sendall(head)
    if body:
        sock.sendall(body)


def _exactly_sync(sock: socket.socket, count: int) -> bytes:
    # Grown as bytes come (not allocated from the length), in bounded reads.
    data = bytearray()
    while len(data) < count:
        chunk = sock.recv(min(count - len(data), CHUNK))
        if not chunk:
            raise FramingError("connection closed in the middle of a frame")
        data += chunk
    return bytes(data)


def receive_sync(
    sock: socket.socket, limits: Limits, *, files: bool = False
) -> tuple[dict[str, Any], bytes | memoryview]:
    """One frame; ``files``: the payload may come in a memory file (:func:`send_file`),
    returned mapped, read-only, within the same limits."""
    descriptor: int | None = None
    try:
        if files:
            first, descriptors, flags, _ = socket.recv_fds(sock, _PREFIX.size, 1)
            descriptor = descriptors[0] if descriptors else None
            if flags & socket.MSG_CTRUNC or len(descriptors) > 1:
                for extra in descriptors[1:]:
                    os.close(extra)
                raise FramingError("a frame came with more than one file")
            if not first:
                raise FramingError("connection closed in the middle of a frame")
            first += _exactly_sync(sock, _PREFIX.size - len(first))
        else:
            first = _exactly_sync(sock, _PREFIX.size)
        header_size, payload_size = _prefix(first, limits)
        header = _header(_exactly_sync(sock, header_size), payload_size, limits)
        payload = _exactly_sync(sock, payload_size) if payload_size else b""
        size = header.get("file")
        if descriptor is None and size is None:
            return header, payload
        if descriptor is None or type(size) is not int or payload_size or size <= 0:
            raise FramingError("a frame's file and its header do not match")
        cap = limits.payload_for(header)
        if size > cap or os.fstat(descriptor).st_size != size:
            raise FramingError(f"a frame's file holds {size} bytes (at most {cap} accepted)")
        mapped = mmap.mmap(descriptor, size, prot=mmap.PROT_READ)
        return header, memoryview(mapped)
    finally:
        if descriptor is not None:
            os.close(descriptor)  # a mapping lives on without it
