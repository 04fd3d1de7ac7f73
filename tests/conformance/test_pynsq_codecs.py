"""pynsq's deflate and snappy over plain TCP, on fakensq and nsqd: broken on both.

nsqd hands each of its writer stack's writes to the socket by itself, and Go's
sockets send at once (no Nagle), so on loopback each write is a segment a
client may read alone:

- compress/flate (deflate): a small flush is a stored block, written as its
  header byte, its length (4 bytes), its data, then ``Flush``'s empty stored
  block as one byte and the sync marker ``00 00 ff ff`` (seen with strace on
  nsqd v1.3.0: an ``OK`` answer is the writes 1, 4, 10, 1, 4); a Huffman block
  goes out in pieces of at most 246 bytes, the marker alone after them.
- golang/snappy: an uncompressed chunk is its 8-byte header, then its data.

pynsq 0.9.1's ``DeflateSocket`` and ``SnappySocket`` decompress each ``recv``
and raise ``socket.error(EWOULDBLOCK)`` (a plain ``OSError(11)``, which
tornado does not take for "would block": "error on read: 11", the connection
closed) when a read decompresses to nothing: the marker, a stored block's
header, a chunk header read alone.  Whether a read ends at such a boundary is
timing: the lead's loop (60 messages, Writer and Reader) failed 6 of 8 runs on
nsqd with deflate, 3 of 5 with snappy.  fakensq sends each of nsqd's writes by
itself too (fakensq.nsqd.output), so pynsq breaks on it as well.

To make the outcome deterministic, pynsq reads nsqd through a pacing proxy
(:class:`PacedProxy`) that delivers the server's output cut at those
boundaries, a piece at a time, each once pynsq has read the one before (the
kernel's count of unread bytes of pynsq's socket is 0): pynsq meets every cut.
The cuts are found in the stream itself, the same on both daemons: deflate,
before and after every sync marker (a marker inside Huffman-coded data would
be cut too: 1 in 2**32 positions; the bodies here are text); snappy, between
an uncompressed chunk's header and its data (the stream identifier stays with
the first header, as golang/snappy writes it).  Without compression the same
proxy changes nothing (the control case).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any

import nsq  # pynsq, installed by the test extra
import pytest
import trio

from ..support.waiting import wait_until
from .conftest import Conformance, Target
from .test_pynsq_suite import CASE_TIMEOUT, _publish, _run_pynsq, _stream_error

_MARKER = b"\x00\x00\xff\xff"
_SNAPPY_UNCOMPRESSED = 0x01


def deflate_cuts(data: bytes) -> tuple[list[bytes], bytes]:
    """The pieces of ``data`` up to its last sync marker, cut before and after
    each marker; and what follows the last marker (kept for more data)."""
    pieces: list[bytes] = []
    pos = 0
    while (at := data.find(_MARKER, pos)) >= 0:
        if at > pos:
            pieces.append(data[pos:at])
        pieces.append(_MARKER)
        pos = at + len(_MARKER)
    return pieces, data[pos:]


def snappy_cuts(data: bytes) -> tuple[list[bytes], bytes]:
    """Whole framed-snappy chunks of ``data``, an uncompressed one cut after
    its 8-byte header (a stream identifier joins the next piece); the rest."""
    pieces: list[bytes] = []
    pos, start = 0, 0
    while len(data) - pos >= 4:
        end = pos + 4 + int.from_bytes(data[pos + 1 : pos + 4], "little")
        if end > len(data):
            break
        kind = data[pos]
        if kind == _SNAPPY_UNCOMPRESSED:
            pieces.append(data[start : pos + 8])
            start = pos + 8
        if kind != 0xFF:  # (the stream identifier: written with what follows)
            pieces.append(data[start:end])
            start = end
        pos = end
    return [p for p in pieces if p], data[start:]


def plain_cuts(data: bytes) -> tuple[list[bytes], bytes]:
    """Everything as it came (the control)."""
    return [data], b""


def _unread(local_port: int, remote_port: int) -> int | None:
    """Bytes the kernel holds unread on the loopback socket from
    ``local_port`` to ``remote_port`` (/proc/net/tcp's rx_queue); None once
    it is gone."""
    want = (f"0100007F:{local_port:04X}", f"0100007F:{remote_port:04X}")
    with open("/proc/net/tcp") as table:
        for line in table:
            fields = line.split()
            if (fields[1], fields[2]) == want:
                return int(fields[4].split(":")[1], 16)
    return None


class PacedProxy:
    """A loopback proxy to ``upstream``: the client's bytes go up as they
    come; the server's first frame (IDENTIFY's answer, before any upgrade)
    goes down whole, then the rest in the pieces ``cuts`` makes, each sent
    once the client has read everything before it."""

    def __init__(self, upstream: str, cuts: Callable[[bytes], tuple[list[bytes], bytes]]):
        self.upstream = upstream
        self.cuts = cuts
        self.address = ""

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.address = f"127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, client: trio.SocketStream) -> None:
        host, port = self.upstream.rsplit(":", 1)
        async with client, await trio.open_tcp_stream(host, int(port)) as server:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._up, client, server, nursery.cancel_scope)
                await self._down(server, client)
                nursery.cancel_scope.cancel()

    async def _up(
        self, client: trio.SocketStream, server: trio.SocketStream, scope: trio.CancelScope
    ) -> None:
        try:
            async for data in client:
                await server.send_all(data)
        except trio.BrokenResourceError:
            pass
        scope.cancel()

    async def _down(self, server: trio.SocketStream, client: trio.SocketStream) -> None:
        own = client.socket.getsockname()[1]
        peer = client.socket.getpeername()[1]
        buffer, first = b"", True
        try:
            async for data in server:
                buffer += data
                if first:
                    if len(buffer) < 4 or len(buffer) < 4 + int.from_bytes(buffer[:4], "big"):
                        continue
                    size = 4 + int.from_bytes(buffer[:4], "big")
                    pieces, buffer, first = [buffer[:size]], buffer[size:], False
                    more, buffer = self.cuts(buffer)
                    pieces += more
                else:
                    pieces, buffer = self.cuts(buffer)
                for piece in pieces:
                    await client.send_all(piece)
                    await wait_until(
                        lambda: not _unread(peer, own), what="the client read the piece"
                    )
        except trio.BrokenResourceError:
            pass


def _conn_messages(
    host: str, port: int, options: dict[str, Any], done: asyncio.Future[str]
) -> None:
    c = nsq.AsyncConn(host, port, **options)
    count = 0
    ready = False

    def on_message(**kwargs: Any) -> None:
        nonlocal count
        count += 1
        kwargs["message"].finish()
        if count == 5 and not done.done():
            done.set_result("5 messages")

    def on_ready(**kwargs: Any) -> None:
        nonlocal ready
        ready = True
        c.on("message", on_message)
        c.send(nsq.protocol.subscribe("paced", "ch"))
        c.send_rdy(5)

    def on_close(**kwargs: Any) -> None:
        if not done.done():
            stage = f"{count} messages" if ready else "the upgrade"
            done.set_result(f"closed after {stage}: {_stream_error(c)}")

    c.on("ready", on_ready)
    c.on("close", on_close)
    c.connect()


CUTS = {
    "deflate": (deflate_cuts, {"deflate": True, "deflate_level": 4}),
    "snappy": (snappy_cuts, {"snappy": True}),
    "plain": (plain_cuts, {}),
}

#: What pynsq sees on both daemons.  Snappy: the upgrade's OK (read with
#: the upgrade's bytes, SnappySocket's bootstrap), then the stream
#: identifier and a chunk header, read alone: nothing.  Deflate: the
#: upgrade's OK, SUB's OK, then the marker after it, alone: nothing.
OUTCOMES = {
    "deflate": "closed after 0 messages: OSError(11)",
    "snappy": "closed after the upgrade: OSError(11)",
    "plain": "5 messages",
}


@pytest.mark.parametrize("codec", list(CUTS))
async def test_pynsq_meeting_nsqds_write_boundaries(conformance: Conformance, codec: str) -> None:
    cuts, options = CUTS[codec]

    async def scenario(t: Target) -> Any:
        await _publish(t, "paced", 5)
        proxy = PacedProxy(t.tcp_address, cuts)
        async with trio.open_nursery() as nursery:
            await nursery.start(proxy.serve)
            host, port = proxy.address.rsplit(":", 1)
            run = functools.partial(_conn_messages, host, int(port), options)
            with trio.fail_after(CASE_TIMEOUT + 10):
                outcome = await trio.to_thread.run_sync(_run_pynsq, run)
            nursery.cancel_scope.cancel()
        return outcome

    await conformance.nsqd(scenario, expect=([], OUTCOMES[codec]))


@pytest.mark.parametrize(
    ("cuts", "data", "pieces", "rest"),
    [
        (
            deflate_cuts,
            b"ab" + _MARKER + b"\x00" + _MARKER + b"cd",
            [b"ab", _MARKER, b"\x00", _MARKER],
            b"cd",
        ),
        (deflate_cuts, _MARKER, [_MARKER], b""),
        (
            snappy_cuts,
            b"\xff\x06\x00\x00sNaPpY"
            + b"\x01\x06\x00\x00crcdOK"
            + b"\x00\x03\x00\x00xyz"
            + b"\x01\x09",
            [b"\xff\x06\x00\x00sNaPpY\x01\x06\x00\x00crcd", b"OK", b"\x00\x03\x00\x00xyz"],
            b"\x01\x09",
        ),
    ],
)
def test_cuts(
    cuts: Callable[[bytes], tuple[list[bytes], bytes]],
    data: bytes,
    pieces: list[bytes],
    rest: bytes,
) -> None:
    assert cuts(data) == (pieces, rest)
