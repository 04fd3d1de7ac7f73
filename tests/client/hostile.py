"""A hostile nsqd for the client's tests: a proper handshake (IDENTIFY, snappy
or deflate, SUB), then whatever the test scripts, over in-memory streams
(``lockstep``: a write waits for the client's read, as a full socket does),
real TCP sockets on 127.0.0.1 (the consumer's shared reader serves those), or
TLS over TCP; or listening on a port for a client in another process.

It records what the client sends (RDY, FIN, REQ, NOP) unless told never to
read, and counts what it sent.  Unlike :mod:`tests.client.minisrv` it keeps no
queue and honours no RDY: the script decides everything.
"""

from __future__ import annotations

import json
import ssl
import struct
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio
import trio.testing

from trionsq.connection import CodecStream
from trionsq.protocol import codecs, commands
from trionsq.protocol.commands import CommandParser
from trionsq.protocol.frames import encode_message, encode_response

from ..support.waiting import wait_until
from .minisrv import tcp_stream_pair

Script = Callable[["HostileConn"], Awaitable[None]]

#: nsqd v1.3.0's answer to IDENTIFY, features filled in per connection
IDENTIFY_ANSWER: dict[str, Any] = {
    "max_rdy_count": 2500,
    "version": "1.3.0",
    "max_msg_timeout": 900000,
    "msg_timeout": 60000,
    "tls_v1": False,
    "deflate": False,
    "deflate_level": 6,
    "max_deflate_level": 6,
    "snappy": False,
    "sample_rate": 0,
    "auth_required": False,
    "output_buffer_size": 16384,
    "output_buffer_timeout": 250,
}


def message(index: int, body: bytes, attempts: int = 1) -> bytes:
    """A message frame whose id is ``index`` in hex."""
    return encode_message(1_700_000_000_000_000_000, attempts, b"%016x" % index, body)


@dataclass
class HostileConn:
    """One client connection, as the script sees it."""

    server: HostileNSQD
    raw: trio.abc.Stream  # the transport (TLS included), under any compression
    stream: trio.abc.Stream  # what frames go through (compressed if negotiated)
    identify: dict[str, Any] = field(default_factory=dict)
    compression: str | None = None
    rdys: list[int] = field(default_factory=list)
    fins: list[bytes] = field(default_factory=list)
    reqs: list[tuple[bytes, int]] = field(default_factory=list)
    nops: int = 0
    #: bytes of commands read after SUB
    read_bytes: int = 0
    #: messages (and bytes) the script sent
    sent_messages: int = 0
    sent_bytes: int = 0
    #: the deflate stream the script may extend by hand (bombs)
    deflater: Any = None
    closed: bool = False
    subscribed: trio.Event = field(default_factory=trio.Event)

    async def send(self, data: bytes) -> None:
        """Frames as they are (compressed if negotiated)."""
        await self.stream.send_all(data)
        self.sent_bytes += len(data)

    async def send_messages(self, frames: bytes, count: int) -> None:
        await self.send(frames)
        self.sent_messages += count

    async def send_raw(self, data: bytes) -> None:
        """Bytes under the compression (a hand-made compressed stream)."""
        await self.raw.send_all(data)
        self.sent_bytes += len(data)

    async def read_commands(self, parser: CommandParser) -> None:
        """Record the client's commands until it hangs up."""
        try:
            while True:
                data = await self.stream.receive_some(65536)
                if not data:
                    return
                self.read_bytes += len(data)
                parser.feed(data)
                while (command := parser.next_command()) is not None:
                    if isinstance(command, commands.Rdy):
                        self.rdys.append(command.count())
                    elif isinstance(command, commands.Fin):
                        self.fins.append(command.id)
                    elif isinstance(command, commands.Req):
                        self.reqs.append((command.id, command.delay_ns // 1_000_000))
                    elif isinstance(command, commands.Nop):
                        self.nops += 1
                    elif isinstance(command, commands.Cls) and self.server.answer_cls:
                        await self.send(encode_response(b"CLOSE_WAIT"))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return

    async def wait_rdy(self) -> None:
        """Until the client has sent a RDY above 0."""
        await wait_until(lambda: any(self.rdys))


class HostileNSQD:
    """A scripted nsqd; each connection runs ``script`` once subscribed.

    ``transport``: ``"memory"`` (unbounded in-memory buffers), ``"lockstep"``
    (in-memory, a write waits for the client's read), ``"tcp"`` (a real
    socket pair) or ``"tls"`` (``tls_context`` over a real socket pair).
    ``compression``: ``"snappy"`` or ``"deflate"`` when the client asks.
    ``reads``: whether the client's commands are read after SUB (a server
    that never reads lets the client's writes pile up).
    """

    def __init__(
        self,
        nursery: trio.Nursery,
        script: Script,
        *,
        transport: str = "lockstep",
        compression: str | None = None,
        reads: bool = True,
        tls_context: ssl.SSLContext | None = None,
        identify: dict[str, Any] | None = None,
    ) -> None:
        self.nursery = nursery
        self.script = script
        self.transport = transport
        self.compression = compression
        self.reads = reads
        self.tls_context = tls_context
        self.identify = {**IDENTIFY_ANSWER, **(identify or {})}
        #: answer CLS with CLOSE_WAIT (from the reader: only for scripts that
        #: are not writing then)
        self.answer_cls = False
        self.conns: list[HostileConn] = []
        #: every connection's script ended (or failed) and its stream closed
        self.ended = 0

    async def connector(self, host: str, port: int) -> trio.abc.Stream:
        client: trio.abc.Stream
        server: trio.abc.Stream
        if self.transport == "memory":
            client, server = trio.testing.memory_stream_pair()
        elif self.transport == "lockstep":
            client, server = trio.testing.lockstep_stream_pair()
        else:
            client, server = await tcp_stream_pair()
        self.nursery.start_soon(self.serve, server)
        return client

    async def close_all(self) -> None:
        """Hang up on every client (a script blocked writing gives up)."""
        for conn in self.conns:
            await trio.aclose_forcefully(conn.raw)

    async def listen(self) -> str:
        """Listen on 127.0.0.1 (for a client in another process); the address."""
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.nursery.start_soon(trio.serve_listeners, self.serve, listeners)
        host, port = listeners[0].socket.getsockname()[:2]
        return f"{host}:{port}"

    async def serve(self, stream: trio.abc.Stream) -> None:
        parser = CommandParser()
        try:
            conn = await self._handshake(stream, parser)
        except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError):
            await trio.aclose_forcefully(stream)
            return
        self.conns.append(conn)
        try:
            async with trio.open_nursery() as nursery:
                if self.reads:
                    nursery.start_soon(conn.read_commands, parser)
                await self._run_script(conn)
                nursery.cancel_scope.cancel()
        finally:
            conn.closed = True
            self.ended += 1
            await trio.aclose_forcefully(conn.stream)
            # What a closed connection held (a compressor's state, a write
            # under way) is the server's, not to be counted as the client's.
            conn.stream = conn.raw = trio.testing.MemorySendStream()  # type: ignore[assignment]
            conn.deflater = None

    async def _run_script(self, conn: HostileConn) -> None:
        try:
            await self.script(conn)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client hung up: what a script meets when it is refused

    @staticmethod
    async def _read_command(stream: trio.abc.Stream, parser: CommandParser) -> commands.Command:
        while (command := parser.next_command()) is None:
            data = await stream.receive_some(65536)
            if not data:
                raise trio.BrokenResourceError("the client hung up during the handshake")
            parser.feed(data)
        return command

    async def _handshake(self, stream: trio.abc.Stream, parser: CommandParser) -> HostileConn:
        identify = await self._read_command(stream, parser)
        assert isinstance(identify, commands.Identify), identify
        request = json.loads(identify.body)
        answer = dict(self.identify)
        tls = bool(request.get("tls_v1")) and self.tls_context is not None
        answer["tls_v1"] = tls
        compression = None
        if self.compression and request.get(self.compression):
            compression = self.compression
            answer[compression] = True
        await stream.send_all(encode_response(json.dumps(answer).encode()))
        raw = stream
        if tls:
            assert self.tls_context is not None
            raw = trio.SSLStream(stream, self.tls_context, server_side=True)
            await raw.do_handshake()
            await raw.send_all(encode_response(b"OK"))
        conn = HostileConn(self, raw, raw, identify=request, compression=compression)
        if compression == "snappy":
            leftover = parser.take_buffer()
            conn.stream = CodecStream(
                raw, codecs.SnappyEncoder(), codecs.SnappyDecoder(), initial=leftover
            )
        elif compression == "deflate":
            leftover = parser.take_buffer()
            # The deflate stream the frames go through, which a script may
            # also extend by hand (see deflate_bomb).
            conn.deflater = zlib.compressobj(6, zlib.DEFLATED, -15)
            conn.stream = CodecStream(
                raw, _DeflateWith(conn.deflater), codecs.DeflateDecoder(), initial=leftover
            )
        if compression is not None:
            await conn.stream.send_all(encode_response(b"OK"))
        sub = await self._read_command(conn.stream, parser)
        assert isinstance(sub, commands.Sub), sub
        await conn.stream.send_all(encode_response(b"OK"))
        conn.subscribed.set()
        return conn


class _DeflateWith:
    """A DeflateEncoder over a given compressobj (shared with the script)."""

    def __init__(self, z: Any) -> None:
        self._z = z

    def encode(self, data: bytes) -> bytes:
        out: bytes = self._z.compress(data) + self._z.flush(zlib.Z_SYNC_FLUSH)
        return out


# --- decompression bombs ---------------------------------------------------------


def deflate_block(plain: bytes) -> bytes:
    """``plain`` deflated on its own and sync-flushed: its back-references stay
    within it, so it can be sent into any deflate stream, again and again (a
    block of a megabyte of zeros is about a kilobyte).  The server's own
    compressor is then out of step with what the client inflated: a script
    sends nothing through ``conn.send`` after it."""
    z = zlib.compressobj(9, zlib.DEFLATED, -15)
    return z.compress(plain) + z.flush(zlib.Z_SYNC_FLUSH)


def snappy_bomb_chunk(plain: bytes) -> bytes:
    """One snappy framing chunk holding ``plain`` (at most 64 KiB) compressed:
    sent again and again, it inflates ~20 times its size each time."""
    import cramjam

    framed = bytes(cramjam.snappy.compress(plain))
    assert framed.startswith(b"\xff\x06\x00\x00sNaPpY")
    return framed[10:]


def frame_size_field(size: int) -> bytes:
    return struct.pack(">l", size)
