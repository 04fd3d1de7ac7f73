"""A connection's stream before it runs: the handshake and its upgrades.

nsqd's handshake is the magic and IDENTIFY, nsqd's answer (the features it
grants: TLS, snappy or deflate, AUTH required, its max RDY and message
timeout), the upgrades of the stream in that order (each answered by an
``OK`` on the upgraded stream), then AUTH.  :class:`Handshake` holds those
steps for :class:`~trionsq.connection.Connection` (whose life is OPENING while
they run): no reader or writer task yet, one frame read at a time.  Also here:
the stream helpers the running connection uses too (a plain socket's read,
the close at once) and the failures to connect.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Any, overload

import trio

from .config import Config, tls_context
from .protocol import codecs, commands, handshake
from .protocol.errors import NSQError, ProtocolError
from .protocol.frames import OK
from .reasons import cannot_connect

__all__ = [
    "CodecStream",
    "Handshake",
    "NSQConnectionError",
    "NegotiationError",
    "RECEIVE_SIZE",
    "RequestRefused",
    "WRITE_TO_SOCKETS",
    "close_at_once",
    "read_socket",
]

#: how much one read of a connection's stream asks for
RECEIVE_SIZE = 64 * 1024
#: whether a socket's descriptor takes os.write (not so on Windows)
WRITE_TO_SOCKETS = sys.platform != "win32"


class NSQConnectionError(NSQError, ConnectionError):
    """An nsqd could not be reached, or the connection to it was lost."""


class RequestRefused(Exception):
    """nsqd answered :meth:`Connection.open`'s ``then`` request with an error
    frame (its typed error in :attr:`error`; nsqd closes the connection)."""

    def __init__(self, error: NSQError) -> None:
        super().__init__(str(error))
        self.error = error


class NegotiationError(NSQError):
    """nsqd does not offer a feature the configuration requires (TLS, AUTH)."""


class CodecStream(trio.abc.Stream):
    """A stream whose bytes go through a compression codec in both directions.

    A read decompresses at most what it returns (``max_bytes``, else
    ``RECEIVE_SIZE``), and reads the inner stream only once the input taken
    so far gives nothing more: a small compressed input that inflates to
    gigabytes costs one read's worth at a time, and reading it stops with
    the reader (see :meth:`trionsq.consumer.Consumer._on_messages`).
    """

    def __init__(
        self,
        inner: trio.abc.Stream,
        encoder: codecs.Encoder,
        decoder: codecs.Decoder,
        initial: bytes = b"",
    ) -> None:
        self.inner = inner
        self._encoder = encoder
        self._decoder = decoder
        self._raw = initial  # compressed bytes read before the switch

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(self._encoder.encode(bytes(data)))

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        limit = RECEIVE_SIZE if max_bytes is None else max_bytes
        decoder = self._decoder
        while True:
            if self._raw:
                raw, self._raw = self._raw, b""
            elif decoder.pending:
                raw = b""
            else:
                raw = bytes(await self.inner.receive_some(RECEIVE_SIZE))
                if not raw:
                    return b""
            out = decoder.decode_some(raw, limit)
            if out:
                return out

    async def aclose(self) -> None:
        await self.inner.aclose()


#: The last configuration greeted with and its greeting (see _greeting).
_greeted: tuple[Config, bytes] | None = None


def _greeting(config: Config) -> bytes:
    """The magic and IDENTIFY a connection opens with.  A Config is frozen, so
    the last one's is kept: a consumer's connections (and reconnections)
    share theirs instead of encoding the same JSON each."""
    global _greeted
    if _greeted is None or _greeted[0] is not config:
        _greeted = (config, commands.MAGIC_V2 + commands.identify(config.identify_body()))
    return _greeted[1]


def read_socket(fd: int) -> bytes | None:
    """Read a plain TCP socket that is readable: its bytes (empty at the end
    of the stream), or None when there is nothing after all.  Errors are
    translated as :meth:`trio.SocketStream.receive_some` translates them."""
    try:
        return os.read(fd, RECEIVE_SIZE)
    except BlockingIOError:
        return None
    except OSError as exc:
        if exc.errno in (errno.EBADF, errno.ENOTSOCK):
            raise trio.ClosedResourceError("this socket was already closed") from None
        raise trio.BrokenResourceError(f"socket connection broken: {exc}") from exc


async def close_at_once(stream: trio.abc.Stream) -> None:
    """:func:`trio.aclose_forcefully`; a plain TCP stream is closed as it
    would close it (the socket, then a checkpoint) without the cancelled
    scope and the ``Cancelled`` it raises and catches: at every close of
    every connection."""
    if type(stream) is trio.SocketStream:
        stream.socket.close()
        await trio.lowlevel.cancel_shielded_checkpoint()
    else:
        await trio.aclose_forcefully(stream)


class Handshake:
    """The handshake's steps, for :class:`~trionsq.connection.Connection`
    (which inherits them, and sets these attributes up)."""

    address: str
    config: Config
    _stream: trio.abc.Stream
    _leftover: bytes
    #: whether the peer sent anything yet (a close before that is NO_ANSWER)
    _heard: bool = False
    identify_response: dict[str, Any]
    auth_response: dict[str, Any] | None
    max_rdy_count: int
    msg_timeout: float | None
    tls: bool
    compression: str | None

    async def _receive_exactly(self, size: int) -> bytes:
        data = self._leftover
        while len(data) < size:
            stream = self._stream
            if type(stream) is trio.SocketStream and WRITE_TO_SOCKETS:
                # A handshake's answer is never there yet when asked for:
                # wait first, then read (no failed recv, no BlockingIOError
                # a connection); errors read as receive_some's.
                fd = stream.socket.fileno()
                await trio.lowlevel.wait_readable(fd)
                got = read_socket(fd)
                if got is None:
                    continue  # woken without data: wait again
                chunk = got
            else:
                chunk = bytes(await stream.receive_some(RECEIVE_SIZE))
            if not chunk:
                said = "connection closed during handshake" if self._heard else handshake.NO_ANSWER
                raise NSQConnectionError(cannot_connect(self.address, said))
            self._heard = True
            data += chunk
        self._leftover = data[size:]
        return data[:size]

    async def _request_now(self, data: bytes) -> None:
        """Send a request before :meth:`run` and read its ``OK`` here, the
        handshake's way: no reader, writer or task of the connection's own is
        needed for it yet (heartbeats meanwhile are answered)."""
        await self._stream.send_all(data)
        while True:
            try:
                response = await self._read_response(heartbeats=True)
            except NSQError as exc:
                if isinstance(exc, NSQConnectionError | ProtocolError):
                    raise
                raise RequestRefused(exc) from exc
            if response is None:
                await self._stream.send_all(commands.nop())
            elif response != OK:
                raise ProtocolError(f"expected OK, got {response[:100]!r}")
            else:
                return

    @overload
    async def _read_response(self) -> bytes: ...

    @overload
    async def _read_response(self, heartbeats: bool) -> bytes | None: ...

    async def _read_response(self, heartbeats: bool = False) -> bytes | None:
        """Read one handshake frame: a response's data, or raise the error
        frame (a heartbeat: None with ``heartbeats``, else an error)."""
        max_frame_size = self.config.max_frame_size
        header = await self._receive_exactly(4)
        size = handshake.answer_size(header, max_frame_size)
        if size is None:
            said = handshake.foreign_answer(header)
            raise NSQConnectionError(cannot_connect(self.address, str(said)))
        payload = await self._receive_exactly(size)
        return handshake.answer(header + payload, max_frame_size, heartbeats)

    async def _handshake(self, host: str) -> None:
        config = self.config
        await self._stream.send_all(_greeting(config))
        # What nsqd's answers mean is trionsq.protocol.handshake's (sans-IO,
        # shared with the blocking publisher); the steps' I/O is here.
        negotiated = handshake.negotiate(
            await self._read_response(),
            tls=config.tls is not False,
            snappy=config.snappy,
            deflate=config.deflate,
            deflate_level=config.deflate_level,
            has_auth_secret=config.auth_secret is not None,
        )
        self.identify_response = negotiated.response
        self.max_rdy_count = negotiated.max_rdy_count
        self.msg_timeout = negotiated.msg_timeout
        if negotiated.refusal is not None:
            raise NegotiationError(f"{self.address}: {negotiated.refusal}")

        if negotiated.tls:
            if self._leftover:
                raise ProtocolError("nsqd sent data before the TLS handshake")
            tls_stream = trio.SSLStream(self._stream, tls_context(config), server_hostname=host)
            self._stream = tls_stream
            await tls_stream.do_handshake()
            self.tls = True
            handshake.expect_ok(await self._read_response(), "TLS")

        codec = negotiated.codec()
        if codec is not None:
            self.compression = negotiated.compression
            self._stream = CodecStream(self._stream, *codec, initial=self._leftover)
            self._leftover = b""
            handshake.expect_ok(await self._read_response(), self.compression or "")

        if negotiated.auth:
            assert config.auth_secret is not None  # (else a refusal above)
            await self._stream.send_all(commands.auth(config.auth_secret))
            self.auth_response = handshake.parse_auth(await self._read_response())
