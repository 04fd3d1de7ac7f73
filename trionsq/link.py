"""One nsqd connection on a blocking socket, for the publish drivers beside the
publish core (:mod:`trionsq.publishing`): connecting, the handshake, bytes out
and in.  The blocking publisher (:mod:`trionsq.blocking.direct`) reads and
writes it from the calling threads; the asyncio one (:mod:`trionsq.aio.direct`)
opens it on a thread, then drives its socket from the loop.

The handshake's meaning is :mod:`trionsq.protocol.handshake`'s, shared with
the Trio connection; only its I/O is here.  TLS goes through an in-memory
:class:`ssl.SSLObject` (the socket stays a plain blocking one, read by one
thread while another writes), compression through :mod:`trionsq.protocol.codecs`.
"""

from __future__ import annotations

import functools
import select
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from .config import Config, KeyPasswordMissing, tls_context
from .connection import NegotiationError, NSQConnectionError
from .protocol import codecs, commands, handshake
from .protocol.errors import ProtocolError
from .reasons import cannot_connect
from .transport import parse_address

__all__ = ["Link", "sent_whole"]

_RECEIVE_SIZE = 64 * 1024


class Link:
    """One nsqd connection on a blocking socket, handshaken (see :meth:`open`).

    :meth:`send` is called by one writer at a time, :meth:`receive` by one
    reader at a time.  Under TLS the two share the :class:`ssl.SSLObject`
    through a short lock of its own (no I/O under it).
    """

    def __init__(self, sock: socket.socket, address: str, config: Config) -> None:
        self.sock = sock
        self.address = address
        self.config = config
        self._leftover = b""  # plain bytes read past the handshake's last answer
        self._heard = False  # whether nsqd sent anything yet (see handshake.NO_ANSWER)
        self._tls: ssl.SSLObject | None = None
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls_lock = threading.Lock()
        self._encoder: codecs.Encoder | None = None
        self._decoder: codecs.Decoder | None = None
        #: nsqd's IDENTIFY answer and what was negotiated
        self.negotiated = handshake.Negotiated()
        self.auth_response: dict[str, Any] | None = None
        #: the next bytes the peer sent (see :meth:`_receive_plain`): on a plain
        #: link with nothing put back, the socket's own ``recv`` (no Python
        #: frame a read: the blocking publish's lean path reads through it)
        self.receive: Callable[[], bytes] = self._receive_plain
        self._recv: Callable[[], bytes] = functools.partial(sock.recv, _RECEIVE_SIZE)
        self._transform: Callable[[bytes], bytes] | None = None
        #: how many of the commands given to the last :meth:`send` went out
        #: whole (read after it raised; a lower bound when an interrupt cut it)
        self.sent_whole = 0
        #: whether a read may complete nothing yet (TLS, compression): an empty
        #: read is the end of the stream only with :attr:`closed_by_peer`
        self.transformed = False
        self.closed_by_peer = False

    @classmethod
    def open(cls, address: str, config: Config, greeting: bytes) -> Link:
        """Connect and negotiate within ``connect_timeout``; raises what
        :meth:`trionsq.connection.Connection.open` raises (NSQConnectionError
        naming the address, nsqd's typed refusal, NegotiationError)."""
        host, port = parse_address(address)
        deadline = time.monotonic() + config.connect_timeout
        try:
            sock = socket.create_connection((host, port), timeout=config.connect_timeout)
        except OSError as exc:
            raise NSQConnectionError(cannot_connect(address, exc)) from exc
        link = cls(sock, address, config)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link._handshake(host, greeting, deadline)
        except KeyPasswordMissing as exc:
            sock.close()
            raise NSQConnectionError(cannot_connect(address, f"TLS failed: {exc}")) from None
        except ssl.SSLError as exc:
            sock.close()
            raise NSQConnectionError(cannot_connect(address, f"TLS failed: {exc}")) from exc
        except TimeoutError as exc:
            sock.close()
            timeout = f"connect timed out after {config.connect_timeout:g}s"
            raise NSQConnectionError(cannot_connect(address, timeout)) from exc
        except OSError as exc:
            sock.close()
            raise NSQConnectionError(cannot_connect(address, exc)) from exc
        except BaseException:
            sock.close()
            raise
        # Blocking from now on; a read waits read_timeout at most (the
        # kernel's SO_RCVTIMEO: no poll() before each recv, as a Python
        # socket timeout would add).
        sock.settimeout(None)
        _set_receive_timeout(sock, config.read_timeout)
        if not link.transformed and not link._leftover:
            link.receive = link._recv
        return link

    # --- the handshake (its meaning in trionsq.protocol.handshake) ---

    def _handshake(self, host: str, greeting: bytes, deadline: float) -> None:
        config = self.config
        self._deadline = deadline
        self._write_handshake(greeting)
        negotiated = handshake.negotiate(
            self._answer(),
            tls=config.tls is not False,
            snappy=config.snappy,
            deflate=config.deflate,
            deflate_level=config.deflate_level,
            has_auth_secret=config.auth_secret is not None,
        )
        self.negotiated = negotiated
        if negotiated.refusal is not None:
            raise NegotiationError(f"{self.address}: {negotiated.refusal}")
        if negotiated.tls:
            if self._leftover:
                raise ProtocolError("nsqd sent data before the TLS handshake")
            self._tls = tls_context(config).wrap_bio(
                self._incoming, self._outgoing, server_hostname=host
            )
            while True:
                try:
                    self._tls.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    self._flush_tls()
                    self._feed_tls()
            self._flush_tls()
            handshake.expect_ok(self._answer(), "TLS")
        codec = negotiated.codec()
        if codec is not None:
            self._encoder, self._decoder = codec
            if self._leftover:
                self._leftover = self._decoder.decode(self._leftover)
            handshake.expect_ok(self._answer(), negotiated.compression or "")
        if negotiated.auth:
            assert config.auth_secret is not None  # (else a refusal above)
            self._write_handshake(commands.auth(config.auth_secret))
            self.auth_response = handshake.parse_auth(self._answer())
        if self._tls is not None or self._encoder is not None:
            self._transform = self._transformed
            self.receive = self._receive_transformed
            self.transformed = True

    def _remaining(self) -> float:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("handshake timed out")
        return left

    def _write_handshake(self, data: bytes) -> None:
        self.sock.settimeout(self._remaining())
        self._send_transformed(data)

    def _answer(self) -> bytes:
        max_frame_size = self.config.max_frame_size
        header = self._exactly(4)
        size = handshake.answer_size(header, max_frame_size)
        if size is None:
            said = handshake.foreign_answer(header)
            raise NSQConnectionError(cannot_connect(self.address, str(said)))
        data = handshake.answer(header + self._exactly(size), max_frame_size)
        assert data is not None  # (no heartbeats taken during a handshake)
        return data

    def _exactly(self, size: int) -> bytes:
        data = self._leftover
        while len(data) < size:
            self.sock.settimeout(self._remaining())
            chunk = self._receive_transformed()
            if not chunk and self.closed_by_peer:
                said = "connection closed during handshake" if self._heard else handshake.NO_ANSWER
                raise NSQConnectionError(cannot_connect(self.address, said))
            self._heard = self._heard or bool(chunk)
            data += chunk
        self._leftover = data[size:]
        return data[:size]

    # --- bytes out and in ---

    def send(self, commands: list[bytes]) -> None:
        """Write ``commands`` (whole ones, in order) in one write where the
        socket takes them at once (one system call for many publishes).
        Raises what the socket raises; :attr:`sent_whole` then says how many
        commands went out whole (each transformed, TLS or compression, by
        itself: a command's wire bytes all sent are the command sent)."""
        self.sent_whole = 0
        transform = self._transform
        wire = commands if transform is None else [transform(part) for part in commands]
        data = wire[0] if len(wire) == 1 else b"".join(wire)
        send = self.sock.send
        total = len(data)
        sent = 0
        try:
            sent = send(data)
            if sent < total:
                view = memoryview(data)
                while sent < total:
                    sent += send(view[sent:])
        except BaseException:
            self.sent_whole = sent_whole(wire, sent)
            raise
        self.sent_whole = len(wire)

    def put_back(self, data: bytes) -> None:
        """Bytes :meth:`receive` returned, to be returned again by the next one
        (read by one path, handled by another)."""
        if data:
            self._leftover = data + self._leftover
            if not self.transformed:
                self.receive = self._receive_plain

    def _receive_plain(self) -> bytes:
        """What was put back (or read past the handshake) first, then the
        socket's ``recv`` itself again as :attr:`receive`."""
        leftover = self._leftover
        if leftover:
            self._leftover = b""
            self.receive = self._recv
            return leftover
        return self._recv()

    def _transformed(self, data: bytes) -> bytes:
        """``data`` as it goes on the wire: compressed, encrypted."""
        if self._encoder is not None:
            data = self._encoder.encode(data)
        tls = self._tls
        if tls is not None:
            with self._tls_lock:
                tls.write(data)
                data = self._outgoing.read()
        return data

    def wire(self, data: bytes) -> bytes:
        """``data`` as it goes on the socket (compressed, encrypted), for a
        driver that writes the socket itself (:mod:`trionsq.aio.direct`); the
        calls' order is the bytes' order on the wire."""
        return self._transformed(data)

    def _send_transformed(self, data: bytes) -> None:
        self.sock.sendall(self._transformed(data))

    def _receive_transformed(self) -> bytes:
        """What the peer sent next, decrypted and decompressed; ``b""`` with
        :attr:`closed_by_peer` set at the end of the stream (a read that
        completes nothing yet returns ``b""`` without it: read again)."""
        leftover = self._leftover
        if leftover:
            self._leftover = b""
            return leftover
        raw = self.sock.recv(_RECEIVE_SIZE)
        if not raw:
            self.closed_by_peer = True
            return b""
        tls = self._tls
        if tls is not None:
            with self._tls_lock:
                self._incoming.write(raw)
                parts = []
                while True:
                    try:
                        parts.append(tls.read(_RECEIVE_SIZE))
                    except ssl.SSLWantReadError:
                        break
                    except ssl.SSLZeroReturnError:
                        self.closed_by_peer = True
                        break
                # (What TLS has to send back, a key update's answer, waits in
                # the outgoing buffer for the next write, which sends it first,
                # in the order it was made: the reader writes nothing.)
                raw = b"".join(parts)
        if self._decoder is not None and raw:
            raw = self._decoder.decode(raw)
        return raw

    def _flush_tls(self) -> None:
        data = self._outgoing.read()
        if data:
            self.sock.sendall(data)

    def _feed_tls(self) -> None:
        self.sock.settimeout(self._remaining())
        raw = self.sock.recv(_RECEIVE_SIZE)
        if not raw:
            raise NSQConnectionError(
                cannot_connect(self.address, "connection closed during handshake")
            )
        self._incoming.write(raw)

    def readable_now(self) -> bool:
        """Whether a read would not block (bytes or the end are waiting)."""
        if self._leftover:
            return True
        try:
            ready, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return True  # a read will say what is wrong
        return bool(ready)

    def shut(self) -> None:
        """End the connection: a reader blocked on it wakes (shutdown), then
        the descriptor is closed (CPython forgets it first: no reuse race)."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def sent_whole(parts: list[bytes], sent: int) -> int:
    """How many of ``parts``, written one after the other, fit whole in ``sent`` bytes."""
    count = 0
    for part in parts:
        sent -= len(part)
        if sent < 0:
            break
        count += 1
    return count


def _set_receive_timeout(sock: socket.socket, seconds: float) -> None:
    """A blocking socket's reads give up after ``seconds`` (EAGAIN)."""
    whole = int(seconds)
    value = struct.pack("ll", whole, int((seconds - whole) * 1_000_000))
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
    except OSError:  # pragma: no cover - a platform without it: Python's own timeout
        sock.settimeout(seconds)
