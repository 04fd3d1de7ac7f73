"""One connection to one nsqd: handshake, feature upgrades, reader, writes.

Life of a connection::

    conn = await Connection.open("127.0.0.1:4150", config)   # magic, IDENTIFY, TLS,
                                                             # compression, AUTH
    nursery.start_soon(conn.run, on_message)                 # reader and writer
    await conn.request(commands.sub(topic, channel))         # -> b"OK"
    await conn.send(commands.rdy(1))                         # no response expected
    ...
    await conn.aclose()

Requests that expect a response (SUB, PUB, MPUB, DPUB, CLS, ...) can be
pipelined: nsqd answers them in order, so responses are matched to requests
first-in first-out.  Commands are queued in one buffer, in the same step as
their request's place in the response queue, so the two orders agree; a single
writer task sends the buffer, many commands in one write when they pile up.

The reader answers heartbeats with NOP, hands message frames to its callback,
logs the non-fatal errors (``E_FIN_FAILED`` and friends) and treats a fatal error
frame as the end of the connection: nsqd closes right after sending one.  It
never raises for anything the server sends; why the connection ended is in
:attr:`Connection.close_reason`, and every pending request fails with it.

One task's round trips (a producer's MPUB after MPUB) skip the reader: after
answering a request alone, a producer's reader lends the socket, and the
next lone request writes itself and reads its own ``OK``, handing anything
else back to the reader (see ``_lend`` and ``_borrow``).
"""

from __future__ import annotations

import enum
import errno
import functools
import json
import logging
import math
import os
import ssl
import sys
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias, TypeVar, overload

import trio

from .config import Config, KeyPasswordMissing, load_client_certificate
from .lifecycle import CLOSED, CLOSING, OPEN, OPENING, Lifecycle, Moves
from .message import cancel_may_be_pending
from .multiplex import Multiplexer
from .protocol import codecs, commands, states
from .protocol.errors import NSQError, ProtocolError
from .protocol.frames import (
    FRAME_TYPE_RESPONSE,
    HEARTBEAT,
    OK,
    SIZE,
    Error,
    FrameParser,
    MessageFactory,
    OversizedMessage,
    Response,
    encode_frame,
)
from .rdy import DEFAULT_MAX_RDY_COUNT
from .reasons import cannot_connect
from .transport import parse_address

__all__ = [
    "CONNECTION_MOVES",
    "Connection",
    "LOAN_MOVES",
    "Loan",
    "WRITER_MOVES",
    "Writer",
    "NSQConnectionError",
    "ConnectionClosedError",
    "NegotiationError",
    "RequestRefused",
    "CodecStream",
    "PendingResponse",
    "MessagesCallback",
]

log = logging.getLogger("trionsq.connection")

_RECEIVE_SIZE = 64 * 1024
#: queued bytes above which senders wait for the writer (backpressure)
_HIGH_WATER = 1024 * 1024
#: whether a socket's descriptor takes os.write (not so on Windows)
_WRITE_TO_SOCKETS = sys.platform != "win32"
#: an ``OK`` response frame, as nsqd sends it
_OK_FRAME = encode_frame(FRAME_TYPE_RESPONSE, OK)
_OK_FRAME_SIZE = len(_OK_FRAME)
#: how long a producer's reader leaves its socket to a lone requester (see
#: Connection._lend) before it looks whether anyone still reads it
_LEND_PERIOD = 0.05
#: why a handshake answered in HTTP failed (go-nsq's words, and a hint)
_HTTP_ANSWER = (
    "unexpected HTTP response, a nsqd TCP endpoint is required (is this nsqd's HTTP port?)"
)


#: A connection's life: OPENING is the handshake (magic, IDENTIFY, upgrades,
#: AUTH, the ``then`` request), after which :meth:`Connection.open` returns it
#: OPEN; CLOSING is :meth:`Connection.aclose` under way (the connection was
#: closed by its owner, not lost); CLOSED once every pending request has failed
#: (a lost connection goes there from OPEN directly).
CONNECTION_MOVES = Moves(
    "Connection",
    OPENING,
    {OPENING: {OPEN, CLOSED}, OPEN: {CLOSING, CLOSED}, CLOSING: {CLOSED}},
)


class Loan(enum.Enum):
    """Who reads a producer's socket (see :meth:`Connection.request`)."""

    #: the reader task watches the socket (it may not be parked right now)
    READING = "reading"
    #: the reader is parked and lends the socket: the next lone request may
    #: write and read its own answer
    LENT = "lent"
    #: the reader is parked and a requester waits on the socket for its answer
    BORROWED = "borrowed"


READING, LENT, BORROWED = Loan.READING, Loan.LENT, Loan.BORROWED

#: The loan's moves: the reader lends the socket and takes it back (at the end
#: of a lending period with nobody on it, or given back); a lone request
#: borrows it and gives it back (its answer read: LENT again; anything else
#: read, or more requests queued meanwhile: the reader reads again).
LOAN_MOVES = Moves(
    "Connection loan",
    READING,
    {READING: {LENT}, LENT: {READING, BORROWED}, BORROWED: {LENT, READING}},
)


class Writer(enum.Enum):
    """Where the connection's writes are (see :meth:`Connection.send_nowait`)."""

    #: parked with nothing queued: the first command queued arranges a write
    #: (wakes the writer task, or hands the connection to the multiplexer)
    IDLE = "idle"
    #: a write is arranged (or the writer is about to look at the buffer):
    #: commands queued now go with it
    BUSY = "busy"
    #: the writer task is sending a buffer it took (:meth:`Connection.flush`
    #: waits for it)
    WRITING = "writing"


IDLE, BUSY, WRITING = Writer.IDLE, Writer.BUSY, Writer.WRITING

#: The writer's moves.  It starts BUSY: commands queued before it runs are
#: found when it comes round.
WRITER_MOVES = Moves(
    "Connection writer",
    BUSY,
    {IDLE: {BUSY}, BUSY: {IDLE, WRITING}, WRITING: {BUSY}},
)


class NSQConnectionError(NSQError, ConnectionError):
    """An nsqd could not be reached, or the connection to it was lost."""


class ConnectionClosedError(NSQConnectionError):
    """The connection ended before the request got its response."""


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
    ``_RECEIVE_SIZE``), and reads the inner stream only once the input taken
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
        limit = _RECEIVE_SIZE if max_bytes is None else max_bytes
        decoder = self._decoder
        while True:
            if self._raw:
                raw, self._raw = self._raw, b""
            elif decoder.pending:
                raw = b""
            else:
                raw = bytes(await self.inner.receive_some(_RECEIVE_SIZE))
                if not raw:
                    return b""
            out = decoder.decode_some(raw, limit)
            if out:
                return out

    async def aclose(self) -> None:
        await self.inner.aclose()


class PendingResponse:
    """A request's response to come (see :meth:`Connection.request_nowait`).

    No :class:`trio.Event` per request: the first task awaiting :meth:`result`
    parks itself and the reader reschedules it directly (one pipelined publish
    costs one wake-up, nothing more).  A waiter that is cancelled leaves the
    pending in the connection's queue: its response is still taken off in
    order when it comes, and dropped, so later responses meet their requests.
    """

    __slots__ = ("_event", "_task", "done", "error", "value")

    def __init__(self) -> None:
        self.value = b""
        self.error: BaseException | None = None
        #: whether the response (or the connection's end) has arrived
        self.done = False
        self._task: trio.lowlevel.Task | None = None  # the parked waiter
        self._event: trio.Event | None = None  # for further waiters (rare)

    def _abort(self, raise_cancel: Any) -> trio.lowlevel.Abort:
        self._task = None  # cancelled: the response, when it comes, is dropped
        return trio.lowlevel.Abort.SUCCEEDED

    async def wait(self) -> None:
        """Wait until :attr:`done` (a checkpoint, like :meth:`trio.Event.wait`)."""
        if self.done:
            await trio.lowlevel.checkpoint()
        elif self._task is None:
            self._task = trio.lowlevel.current_task()
            await trio.lowlevel.wait_task_rescheduled(self._abort)
        else:
            if self._event is None:
                self._event = trio.Event()
            await self._event.wait()

    @property
    def event(self) -> trio.Event:
        """A :class:`trio.Event` set when :attr:`done` (made on first use)."""
        if self._event is None:
            self._event = trio.Event()
            if self.done:
                self._event.set()
        return self._event

    async def result(self) -> bytes:
        """Wait for the response; an error frame raises its typed error, the
        connection's end :class:`ConnectionClosedError`."""
        await self.wait()
        if self.error is not None:
            raise self.error
        return self.value

    def set(self, value: bytes) -> None:
        self.value = value
        self.done = True
        task = self._task
        if task is not None:
            self._task = None
            trio.lowlevel.reschedule(task)
        if self._event is not None:
            self._event.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.set(b"")


def _ssl_context(config: Config) -> ssl.SSLContext:
    """The context a TLS connection uses: the caller's own, as it is (never
    changed: it may be shared, and another client would then present what
    was loaded into it; Config refuses a client certificate with one), or a
    new one of trionsq's for ``tls=True``, with the client certificate if
    any (a context per connection: a renewed certificate file is picked up
    at the next connection)."""
    if isinstance(config.tls, ssl.SSLContext):
        return config.tls
    context = ssl.create_default_context()
    if config.tls_cert is not None:
        load_client_certificate(context, config)
    return context


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


def _read_socket(fd: int) -> bytes | None:
    """Read a plain TCP socket that is readable: its bytes (empty at the end
    of the stream), or None when there is nothing after all.  Errors are
    translated as :meth:`trio.SocketStream.receive_some` translates them."""
    try:
        return os.read(fd, _RECEIVE_SIZE)
    except BlockingIOError:
        return None
    except OSError as exc:
        if exc.errno in (errno.EBADF, errno.ENOTSOCK):
            raise trio.ClosedResourceError("this socket was already closed") from None
        raise trio.BrokenResourceError(f"socket connection broken: {exc}") from exc


async def _close_at_once(stream: trio.abc.Stream) -> None:
    """:func:`trio.aclose_forcefully`; a plain TCP stream is closed as it
    would close it (the socket, then a checkpoint) without the cancelled
    scope and the ``Cancelled`` it raises and catches: at every close of
    every connection."""
    if type(stream) is trio.SocketStream:
        stream.socket.close()
        await trio.lowlevel.cancel_shielded_checkpoint()
    else:
        await trio.aclose_forcefully(stream)


M = TypeVar("M")

#: Called by the reader with the messages of one read, in order (a run of them
#: between two other frames, if any); it returns an awaitable when it has
#: something to wait for (the reader awaits it before going on), None when it is
#: done (the common case: no coroutine per read).
MessagesCallback: TypeAlias = Callable[[list[M]], Awaitable[None] | None]


class Connection:
    """A handshaken connection to one nsqd (create with :meth:`open`)."""

    def __init__(self, stream: trio.abc.Stream, address: str, config: Config) -> None:
        self.address = address
        self.config = config
        self._stream = stream
        self._leftover = b""  # bytes read past the last handshake frame
        self._out = bytearray()  # queued commands, sent by the writer task
        #: where the writes are: :class:`Writer`, moved by :meth:`_move_writer`
        #: only (an IDLE writer waits on _wake_writer: queueing a command
        #: then wakes it, once; otherwise it finds the command when it comes
        #: round)
        self.writer = Lifecycle(WRITER_MOVES)
        self._wake_writer = trio.Event()
        # The socket's descriptor while the connection runs on a plain TCP
        # socket (see _send_at_once), else -1.
        self._fd = -1
        # The consumer's shared I/O, while the connection runs on a plain TCP
        # socket and was given one (see trionsq.multiplex), else None.
        self._mux: Multiplexer | None = None
        # Whether the last read answered a request alone: a guess that the
        # next request will be alone too (see request), not a state.
        self._lone = True
        #: who reads the socket: :class:`Loan` (a producer's reader may lend
        #: it to a lone requester, which then reads its own response: see
        #: _lend and _borrow)
        self.loan = Lifecycle(LOAN_MOVES)
        self._reader: trio.lowlevel.Task | None = None  # the reader, when it lends
        self._handed: bytes | None = None  # what a requester read and handed back
        # When the read under way has waited too long (inf: none under way).
        self._read_deadline = math.inf
        self._drained = trio.Event()
        self._pending: deque[PendingResponse] = deque()
        self._closed = trio.Event()  # set with the move to CLOSED (wait_closed)
        #: the connection's life (:data:`CONNECTION_MOVES`): read
        #: ``life.state``; only the connection moves it.  ``life.state is
        #: OPEN`` is the one test on every queued command.
        self.life = Lifecycle(CONNECTION_MOVES)
        #: why the connection ended (``None`` for a clean close or while open)
        self.close_reason: BaseException | None = None
        # Who answers a message above max_frame_size (see run), if anyone.
        self._on_oversized: Callable[[OversizedMessage], None] | None = None
        #: nsqd's IDENTIFY response (empty if it does not negotiate features)
        self.identify_response: dict[str, Any] = {}
        #: nsqd's AUTH response, when AUTH was required
        self.auth_response: dict[str, Any] | None = None
        self.max_rdy_count = DEFAULT_MAX_RDY_COUNT
        #: nsqd's message timeout for this connection, in seconds (if it said)
        self.msg_timeout: float | None = None
        self.tls = False
        self.compression: str | None = None
        #: Where the connection is in the protocol's state machine
        #: (:mod:`trionsq.protocol.states`), as of the commands queued so far.
        self.state = states.ConnState.INIT
        # The first bytes of the commands the table must see in this state.
        self._watched = states.watched(self.state)

    def __repr__(self) -> str:
        return f"<Connection {self.address}{' closed' if self.closed else ''}>"

    @property
    def closed(self) -> bool:
        """Whether the connection is closing or closed (no command can be
        queued: ``life.state`` is not OPEN, which code on every command's
        path reads directly)."""
        return self.life.state is not OPEN

    # --- opening ---

    @classmethod
    def over(cls, stream: trio.abc.Stream, address: str, config: Config) -> Connection:
        """A connection on ``stream``, which is past the handshake already (a
        scripted peer in tests, a stream negotiated by other means): OPEN at
        once, with the defaults nsqd's IDENTIFY answer would have set."""
        conn = cls(stream, address, config)
        conn.life.move(OPEN)
        return conn

    @classmethod
    async def open(cls, address: str, config: Config, *, then: bytes | None = None) -> Connection:
        """Connect and negotiate; raises :class:`NSQConnectionError` if nsqd cannot be
        reached in ``connect_timeout``, a typed NSQ error if it refuses.

        ``then``: a request (a consumer's SUB) sent once negotiated and
        answered within the same ``connect_timeout``, before the connection
        runs (see :meth:`run`): an error frame in reply raises
        :class:`RequestRefused`, with nsqd's typed error as its ``error``.
        """
        host, port = parse_address(address)
        conn: Connection | None = None
        # A plain scope, not trio.fail_after (a generator context manager):
        # opened once a connection, so what it costs counts.
        scope = trio.CancelScope(deadline=trio.current_time() + config.connect_timeout)
        try:
            with scope:
                conn = cls(await config.connector(host, port), address, config)
                await conn._handshake(host)
                if then is not None:
                    await conn._request_now(then)
                conn.life.move(OPEN)
                opened, conn = conn, None
                return opened
        except KeyPasswordMissing as exc:  # the key file changed since Config checked it
            raise NSQConnectionError(cannot_connect(address, f"TLS failed: {exc}")) from None
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            cause = exc if isinstance(exc, ssl.SSLError) else exc.__cause__
            if isinstance(cause, ssl.SSLError):
                raise NSQConnectionError(cannot_connect(address, f"TLS failed: {cause}")) from exc
            raise NSQConnectionError(cannot_connect(address, exc)) from exc
        finally:
            if conn is not None:  # the handshake failed: do not leak the stream
                conn.life.move(CLOSED)
                await _close_at_once(conn._stream)
        # Only the scope's own deadline ends the block without a return.
        raise NSQConnectionError(
            cannot_connect(address, f"connect timed out after {config.connect_timeout:g}s")
        )

    async def _receive_exactly(self, size: int) -> bytes:
        data = self._leftover
        while len(data) < size:
            stream = self._stream
            if type(stream) is trio.SocketStream and _WRITE_TO_SOCKETS:
                # A handshake's answer is never there yet when asked for:
                # wait first, then read (no failed recv, no BlockingIOError
                # a connection); errors read as receive_some's.
                fd = stream.socket.fileno()
                await trio.lowlevel.wait_readable(fd)
                got = _read_socket(fd)
                if got is None:
                    continue  # woken without data: wait again
                chunk = got
            else:
                chunk = bytes(await stream.receive_some(_RECEIVE_SIZE))
            if not chunk:
                raise NSQConnectionError(
                    cannot_connect(self.address, "connection closed during handshake")
                )
            data += chunk
        self._leftover = data[size:]
        return data[:size]

    async def _request_now(self, data: bytes) -> None:
        """Send a request before :meth:`run` and read its ``OK`` here, the
        handshake's way: no reader, writer or task of the connection's own is
        needed for it yet (heartbeats meanwhile are answered)."""
        if data and data[0] in self._watched:
            self._follow(data)
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
        header = await self._receive_exactly(4)
        if header == b"HTTP":
            # An HTTP server's answer to the magic (nsqd's HTTP port says
            # "HTTP/1.1 400 Bad Request"): said as go-nsq says it, not as a
            # frame of 1213486160 bytes.
            raise NSQConnectionError(cannot_connect(self.address, _HTTP_ANSWER))
        (size,) = SIZE.unpack(header)
        if size > self.config.max_frame_size or size < 4:
            # Let the parser produce the typed error.
            FrameParser(self.config.max_frame_size).feed(header)
        payload = await self._receive_exactly(size)
        (frame,) = FrameParser(self.config.max_frame_size).feed(header + payload)
        if isinstance(frame, Error):
            raise frame.error
        if isinstance(frame, Response):
            if not frame.is_heartbeat:
                return frame.data
            if heartbeats:
                return None
        raise ProtocolError(f"unexpected frame during handshake: {frame!r}"[:200])

    async def _handshake(self, host: str) -> None:
        config = self.config
        await self._stream.send_all(_greeting(config))
        data = await self._read_response()
        if data != OK:
            try:
                parsed = json.loads(data)
            except ValueError:
                raise ProtocolError(f"IDENTIFY response is not JSON: {data[:100]!r}") from None
            if not isinstance(parsed, dict):
                raise ProtocolError("IDENTIFY response is not a JSON object")
            self.identify_response = parsed
        response = self.identify_response
        max_rdy = response.get("max_rdy_count", DEFAULT_MAX_RDY_COUNT)
        if isinstance(max_rdy, int) and not isinstance(max_rdy, bool) and max_rdy >= 0:
            self.max_rdy_count = max_rdy
        timeout = response.get("msg_timeout")
        if isinstance(timeout, int | float) and not isinstance(timeout, bool):
            self.msg_timeout = timeout / 1000

        if config.tls is not False:
            if not response.get("tls_v1"):
                raise NegotiationError(f"{self.address}: TLS requested but nsqd does not offer it")
            if self._leftover:
                raise ProtocolError("nsqd sent data before the TLS handshake")
            tls_stream = trio.SSLStream(self._stream, _ssl_context(config), server_hostname=host)
            self._stream = tls_stream
            await tls_stream.do_handshake()
            self.tls = True
            await self._expect_ok("TLS")

        codec: tuple[codecs.Encoder, codecs.Decoder] | None = None
        if config.snappy and response.get("snappy"):
            codec = (codecs.SnappyEncoder(), codecs.SnappyDecoder())
            self.compression = "snappy"
        elif config.deflate and response.get("deflate"):
            level = response.get("deflate_level", config.deflate_level)
            codec = (
                codecs.DeflateEncoder(level if isinstance(level, int) else 6),
                codecs.DeflateDecoder(),
            )
            self.compression = "deflate"
        if codec is not None:
            self._stream = CodecStream(self._stream, *codec, initial=self._leftover)
            self._leftover = b""
            await self._expect_ok(self.compression or "")

        if response.get("auth_required"):
            if config.auth_secret is None:
                raise NegotiationError(f"{self.address}: nsqd requires AUTH; set auth_secret")
            await self._stream.send_all(commands.auth(config.auth_secret))
            data = await self._read_response()
            try:
                parsed = json.loads(data)
            except ValueError:
                parsed = None
            self.auth_response = parsed if isinstance(parsed, dict) else {}

    async def _expect_ok(self, step: str) -> None:
        data = await self._read_response()
        if data != OK:
            raise ProtocolError(f"expected OK after the {step} upgrade, got {data[:100]!r}")

    # --- writing ---

    def _follow(self, data: bytes) -> None:
        """The state table, for a command about to be queued: nsqd's error for a
        command not valid in this state (raised here; nothing is sent), else the
        state after it.  A command's state applies from the moment it is queued:
        nsqd reads commands in order and closes the connection when a SUB or
        CLS fails, so every later command meets the state it leads to."""
        name = states.command_name(data)
        states.check(self.state, name)
        after = states.state_after(self.state, name)
        if after is not self.state:
            self.state = after
            self._watched = states.watched(after)

    async def send(self, data: bytes) -> None:
        """Queue a command that gets no response (RDY, FIN, REQ, TOUCH, NOP).

        It is written by the connection's writer task (see :meth:`flush`); if the
        connection is already closed, raises :class:`ConnectionClosedError`.
        """
        # Commands are appended to one buffer that the writer task sends: writes
        # are serialized, several commands go out in one send, and a caller
        # cancelled here never leaves half a command on the wire.
        await trio.lowlevel.checkpoint_if_cancelled()
        while len(self._out) >= _HIGH_WATER and not self.closed:
            await self._drained.wait()
        self.send_nowait(data)

    def send_nowait(self, data: bytes) -> None:
        """Queue a command that gets no response, without waiting for room.

        For commands whose volume something else bounds, such as a consumer's
        FIN, REQ and RDY (one per message nsqd handed out, or per RDY decision):
        they skip :meth:`send`'s backpressure and its checkpoint.  Raises
        :class:`ConnectionClosedError` if the connection is closed.
        """
        if self.life.state is not OPEN:
            raise ConnectionClosedError(f"{self.address}: connection is closed")
        if data and data[0] in self._watched:
            self._follow(data)
        self._out += data
        if self.writer.state is IDLE:
            self._start_writing()

    async def request(self, data: bytes) -> bytes:
        """Send a command and wait for its response (``OK``, ``CLOSE_WAIT``, JSON).

        An error frame in reply raises its typed error; a connection that ends
        first raises :class:`ConnectionClosedError`.
        """
        # send's steps, inline, with the request's place queued with its bytes.
        if cancel_may_be_pending():
            await trio.lowlevel.checkpoint_if_cancelled()
        while len(self._out) >= _HIGH_WATER and not self.closed:
            await self._drained.wait()
        if self.life.state is not OPEN:
            raise ConnectionClosedError(f"{self.address}: connection is closed")
        if data and data[0] in self._watched:
            self._follow(data)
        pending = PendingResponse()
        loan = self.loan
        idle = self.writer.state is IDLE
        if loan.state is LENT and not self._pending and not self._out and idle and self._fd >= 0:
            # The reader lent the socket (it answered a lone request last):
            # write, then read the response here, one task step a round trip.
            self._pending.append(pending)
            fd = self._fd
            loan.move(BORROWED)
            self._send_at_once(data)
            return await self._borrow(fd, pending)
        if idle and self._lone and not self._pending and not self._out and self._fd >= 0:
            # Nothing else awaits a response, nothing is queued, and the last
            # read answered one request alone (one task's round trips: MPUB
            # after MPUB): send it from here, no task switch to the writer.
            # Otherwise the writer coalesces what the woken tasks queue.
            self._pending.append(pending)
            self._give_back(None)  # its response is the reader's to read
            self._send_at_once(data)
        else:
            # In the same step as the bytes: responses come back in this order.
            self._pending.append(pending)
            self._give_back(None)
            self._out += data
            if self.writer.state is IDLE:
                self._start_writing()
        # pending.result(), inline: park until the reader hands the response over.
        pending._task = trio.lowlevel.current_task()
        await trio.lowlevel.wait_task_rescheduled(pending._abort)
        if pending.error is not None:
            raise pending.error
        return pending.value

    async def _borrow(self, fd: int, pending: PendingResponse) -> bytes:
        """Wait for the response to a lone request on the socket the reader
        lent: a read of exactly one ``OK`` is the answer; anything else (a
        heartbeat, an error, a piece of a frame, the end) is handed back to
        the reader, which deals with it as with its own read and answers
        ``pending`` (or fails it) in order."""
        handed: bytes | None = None
        self._read_deadline = trio.current_time() + self.config.read_timeout
        try:
            await trio.lowlevel.wait_readable(fd)
            if self._fd == fd:  # else closed meanwhile: the reader finds out how
                try:
                    handed = os.read(fd, _RECEIVE_SIZE)
                except OSError:
                    handed = None  # the reader's own read meets the error again
        except trio.ClosedResourceError:
            # The connection ended (and failed this request) under the wait.
            self._read_deadline = math.inf
            self._end_borrow()
            self._give_back(None)
            if pending.error is not None:
                raise pending.error from None
            raise ConnectionClosedError(f"{self.address}: connection closed") from None
        except BaseException:
            # Cancelled: the response, when it comes, is the reader's to
            # drop, in order, as for any request given up.
            self._read_deadline = math.inf
            self._end_borrow()
            self._give_back(None)
            raise
        self._read_deadline = math.inf
        self._end_borrow()
        pendings = self._pending
        if handed == _OK_FRAME and pendings and pendings[0] is pending:
            pendings.popleft()
            if pendings:  # others queued requests meanwhile: the reader answers them
                self._give_back(None)
            return OK
        self._give_back(handed)
        if not pending.done:  # (the connection may have ended meanwhile)
            pending._task = trio.lowlevel.current_task()
            await trio.lowlevel.wait_task_rescheduled(pending._abort)
        if pending.error is not None:
            raise pending.error
        return pending.value

    def _end_borrow(self) -> None:
        """A borrower is done waiting on the socket: it is lent again (the
        reader is still parked), unless the reader left meanwhile (the
        connection ended: see :meth:`_lend`)."""
        if self.loan.state is BORROWED:
            self.loan.move(LENT)

    def _give_back(self, data: bytes | None) -> None:
        """End a loan of the socket: the reader reads it again, starting with
        ``data`` (what a requester read and is not the answer it expected).
        While a requester borrows it, the borrower gives it back when it is
        done (it finds what was queued meanwhile): nothing to do now."""
        if data is not None:
            self._handed = data
        if self.loan.state is LENT:
            self.loan.move(READING)
            assert self._reader is not None
            trio.lowlevel.reschedule(self._reader)

    def _abort_lend(self, raise_cancel: Any) -> trio.lowlevel.Abort:
        # The lending period is over.  A borrower keeps the socket (the
        # reader parks again at once: see _lend).
        if self.loan.state is LENT:
            self.loan.move(READING)
        return trio.lowlevel.Abort.SUCCEEDED

    async def _lend(self) -> bytes | None:
        """Leave the socket to lone requesters (see :meth:`request`), each of
        which reads its own response: no wake-up of the reader, then of the
        requester, a round trip.  Returns what a requester handed back, or
        None when the reader must watch the socket again: handed back without
        data, or a period ended with nobody waiting on it (heartbeats, nsqd
        closing the connection), which bounds how long it goes unwatched."""
        self._reader = trio.lowlevel.current_task()
        loan = self.loan
        loan.move(LENT)
        while True:
            with trio.move_on_after(_LEND_PERIOD):
                await trio.lowlevel.wait_task_rescheduled(self._abort_lend)
            # Given back (READING already), or the period is over: with a
            # borrower on the socket, park again (as one step: nobody saw the
            # reader awake), unless the connection ended.
            if loan.state is not BORROWED or self.life.state is not OPEN:
                if loan.state is not READING:
                    loan.move(READING)  # a borrower meets the end itself
                handed, self._handed = self._handed, None
                return handed

    def _send_at_once(self, data: bytes) -> None:
        """Write ``data`` to the socket now, from the calling task, while the
        writer is parked with nothing queued (so the order holds).  A plain
        non-blocking write: no yield, so no cancellation can cut a command in
        half; what the socket does not take (all of it, on an error) goes to
        the writer, which sends it or meets the error and ends the connection."""
        try:
            sent = os.write(self._fd, data)
        except OSError:  # BlockingIOError among them
            sent = 0
        if sent < len(data):
            self._out += memoryview(data)[sent:]
            self._move_writer(BUSY)
            self._wake_writer.set()

    def request_nowait(self, data: bytes) -> PendingResponse:
        """Queue a command that gets a response, without waiting (for room or
        for the response): await the returned :meth:`PendingResponse.result`.

        For the few commands whose volume nothing makes large, such as a
        consumer's CLS, queued in the same step as the commands around it.
        Raises :class:`ConnectionClosedError` if the connection is closed.
        """
        if self.life.state is not OPEN:
            raise ConnectionClosedError(f"{self.address}: connection is closed")
        if data and data[0] in self._watched:
            self._follow(data)
        pending = PendingResponse()
        self._pending.append(pending)
        self._give_back(None)  # its response is the reader's to read
        self._out += data
        if self.writer.state is IDLE:
            self._start_writing()
        return pending

    @property
    def backlogged(self) -> bool:
        """Whether the commands queued and not written yet reach the mark
        above which :meth:`send` waits (nsqd is not reading them): a consumer
        then reads no more from this connection (each message read means a
        FIN or REQ to write) until :meth:`wait_for_room`."""
        return len(self._out) >= _HIGH_WATER

    async def wait_for_room(self) -> None:
        """Wait until the commands queued are below :attr:`backlogged`'s mark
        (or the connection has ended)."""
        await trio.lowlevel.checkpoint()
        while len(self._out) >= _HIGH_WATER and not self.closed:
            await self._drained.wait()

    async def flush(self) -> None:
        """Wait until everything queued so far has been written (or the
        connection has ended)."""
        while (self._out or self.writer.state is WRITING) and self.life.state is not CLOSED:
            await self._drained.wait()

    async def _write_loop(self) -> None:
        while True:
            if not self._out:
                self._drained.set()
                self._drained = trio.Event()
                self._wake_writer = trio.Event()
                self._move_writer(IDLE)
                await self._wake_writer.wait()
                # Woken by the first command queued: let the tasks already
                # runnable queue theirs too (the FINs of a read, a RDY, other
                # publishes), so that they go out in one send, not one each.
                await trio.lowlevel.cancel_shielded_checkpoint()
                continue
            # Swap buffers rather than copy: senders append to a fresh one.
            data, self._out = self._out, bytearray()
            self._move_writer(WRITING)
            fd = self._fd
            if fd >= 0:
                # A plain TCP socket: write what it takes now, without
                # send_all's wrappers and the yield after it (a read's FINs
                # are one send: at many connections, one for few messages).
                # The rest, or an error, is send_all's to wait for or raise.
                try:
                    sent = os.write(fd, data)
                except OSError:
                    sent = 0
                if sent < len(data):
                    await self._stream.send_all(memoryview(data)[sent:])
            else:
                await self._stream.send_all(data)
            self._move_writer(BUSY)

    def _move_writer(self, to: Writer) -> None:
        """The writer's one move (:data:`WRITER_MOVES`); a move to where it
        is already is none (woken by a partial write, it is BUSY still)."""
        writer = self.writer
        if writer.state is not to:
            writer.move(to)

    def _start_writing(self) -> None:
        """The first command queued while the writer is idle: have it written,
        by the shared flusher if there is one, else by the writer task (once a
        batch of commands, not once a command)."""
        self._move_writer(BUSY)
        if self._mux is None:
            self._wake_writer.set()
        else:
            self._mux.flush_later(self)

    # The multiplexer's side (trionsq.multiplex, and nothing else, calls
    # these two): the shared flusher writes for the connection, or leaves the
    # writing to its own writer task again.

    def mux_released(self) -> None:
        """For :mod:`trionsq.multiplex` only: it will not write for this
        connection (it ended); the connection's own writer task writes what
        is queued."""
        self._wake_writer.set()

    def mux_write(self) -> None:
        """For :mod:`trionsq.multiplex` only: the shared flusher's turn: write what
        is queued with one non-blocking write, as the writer would.  No yield,
        so no cancellation cuts a command in half; what the socket does not
        take (all of it, on an error) goes to the writer task, which sends it
        or meets the error and ends the connection."""
        fd = self._fd
        if fd < 0:
            return  # closed meanwhile: nothing more is written
        data, self._out = self._out, bytearray()
        if data:
            try:
                sent = os.write(fd, data)
            except OSError:  # BlockingIOError among them
                sent = 0
            if sent < len(data):
                del data[:sent]
                self._out = data
                self._wake_writer.set()  # it is parked, not idle: it takes over
                return
        self._move_writer(IDLE)
        self._drained.set()
        self._drained = trio.Event()

    # --- running ---

    # The reader and writer are KI-protected: a Ctrl-C reaches the main task
    # (whose code decides what leaving means) instead of tearing a loop apart
    # halfway through a frame.
    @trio.lowlevel.enable_ki_protection
    async def run(
        self,
        on_messages: MessagesCallback[M] | None = None,
        message_factory: MessageFactory[M] | None = None,
        mux: Multiplexer | None = None,
        on_oversized: Callable[[OversizedMessage], None] | None = None,
    ) -> None:
        """Run the reader and the writer until the connection ends, then fail
        what is pending.

        Messages go to ``on_messages`` a read's worth at a time, as
        :class:`~trionsq.protocol.frames.MessageFrame` objects or as
        ``message_factory(timestamp, attempts, id, body)`` makes them (see
        :data:`MessagesCallback`); without ``on_messages`` a message ends the
        connection (a producer's nsqd must not send any).  Returns normally
        however the connection ended; see :attr:`close_reason`.

        On a plain TCP socket, a ``mux`` (:class:`~trionsq.multiplex.Multiplexer`)
        writes the queued commands, for all its connections at once.

        A message above ``max_frame_size`` ends the connection with
        :class:`~trionsq.protocol.errors.FrameTooLarge`, unless there is an
        ``on_oversized``: its body is then read past (never held) and
        ``on_oversized`` gets its header to answer it, the connection going on.
        """
        limit = self.config.max_frame_size
        skip = on_oversized is not None
        parser: FrameParser[Any] = (
            FrameParser(limit, skip_oversized=skip)
            if message_factory is None
            else FrameParser(limit, message_factory=message_factory, skip_oversized=skip)
        )
        self._on_oversized = on_oversized
        stream = self._stream
        if type(stream) is trio.SocketStream and _WRITE_TO_SOCKETS and self.life.state is OPEN:
            # A plain TCP connection: _send_at_once may write to its socket.
            self._fd = stream.socket.fileno()
            if mux is not None and mux.running:
                self._mux = mux
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._guard, self._write_loop, nursery.cancel_scope)
            if self.config.heartbeat_interval is not None:
                # Without heartbeats, silence is normal: only a missed
                # heartbeat is a failure.
                nursery.start_soon(self._guard, self._watch_reads, nursery.cancel_scope)
            if self._mux is not None and self._mux.reads and on_messages is not None:
                # A consumer's connection: the multiplexer reads for it.
                await self._guard(self._read_shared, nursery.cancel_scope, parser, on_messages)
            else:
                await self._guard(self._read_loop, nursery.cancel_scope, parser, on_messages)
        self._finish(None)  # (the loops' _guard ended it already)
        with trio.CancelScope(shield=True):
            await _close_at_once(self._stream)

    @trio.lowlevel.enable_ki_protection
    async def _guard(
        self,
        loop: Callable[..., Awaitable[None]],
        scope: trio.CancelScope,
        *args: Any,
    ) -> None:
        """Run one of the loops; however it ends, the connection ends with it
        (the first loop to fail while it is OPEN says why: a loop that fails
        after it was closed, by :meth:`aclose` or with another loop's
        failure, only meets that end)."""
        reason: BaseException | None = None
        try:
            await loop(*args)
        except trio.ClosedResourceError:
            if self.life.state is OPEN:
                reason = NSQConnectionError(f"{self.address}: connection closed")
        except (NSQError, trio.BrokenResourceError, OSError, ssl.SSLError) as exc:
            if self.life.state is OPEN:
                reason = exc
                log.warning("%s: connection lost: %r", self.address, exc)
        finally:
            # Failing the pending requests now lets their callers go on at once.
            self._finish(reason)
            scope.cancel()

    async def _watch_reads(self) -> None:
        """End the connection when a read has waited ``read_timeout`` for
        data.  A task of its own that wakes about once a timeout, rather than
        a cancel scope around every read (which costs more than the read)."""
        read_timeout = self.config.read_timeout
        while True:
            deadline = self._read_deadline
            if deadline == math.inf:  # not reading now (handing frames on)
                deadline = trio.current_time() + read_timeout
            elif trio.current_time() >= deadline:
                raise NSQConnectionError(f"{self.address}: nothing received for {read_timeout}s")
            await trio.sleep_until(deadline)

    async def _read_loop(
        self, parser: FrameParser[Any], on_messages: MessagesCallback[Any] | None
    ) -> None:
        read_timeout = self.config.read_timeout
        clock = trio.current_time
        frames = parser.feed(self._leftover)
        self._leftover = b""
        receive = self._stream.receive_some
        wait_readable = trio.lowlevel.wait_readable
        # Whether the last read took all there was (it came short of the
        # buffer's size): the socket is most likely empty now.
        drained = True
        # Only a producer's reader lends its socket: a consumer's reads
        # messages that nobody asked for.
        lends = on_messages is None
        data: bytes | bytearray
        while True:
            if frames:
                if parser.others:
                    await self._dispatch(frames, on_messages)
                elif on_messages is None:
                    raise ProtocolError(f"{self.address}: unexpected message frame")
                else:
                    # The common case: a read of nothing but messages, handed on whole.
                    waiting = on_messages(frames)
                    if waiting is not None:
                        await waiting
            # What _watch_reads watches: how long this read may wait.
            self._read_deadline = clock() + read_timeout
            fd = self._fd
            if fd >= 0 and drained:
                got = None
                if lends and self._lone and not self._pending and not parser.buffered:
                    # The last read answered one request alone: its task will
                    # likely send the next alone too, and may read its answer.
                    self._read_deadline = math.inf
                    got = await self._lend()
                    if got is None and self._fd != fd:
                        frames = []
                        continue  # closed meanwhile: receive says how
                if got is None:
                    # A plain TCP socket read dry: wait until it is readable,
                    # then read it (a failed recv less than receive_some's
                    # try-first, and none of its wrapping: a producer's round
                    # trip, a small read of a consumer spread over many nsqds).
                    self._read_deadline = clock() + read_timeout
                    await wait_readable(fd)
                    got = self._read_now(fd)
                    if got is None:  # woken without data, or closed meanwhile
                        frames = []
                        continue
                data = got
            else:
                data = await receive(_RECEIVE_SIZE)
            self._read_deadline = math.inf
            drained = len(data) < _RECEIVE_SIZE
            if not data:
                if self.life.state is OPEN:
                    raise NSQConnectionError(f"{self.address}: closed by nsqd")
                return
            if self._pending and not parser.buffered:
                # A producer's read: a run of OKs, answered without the parser.
                answered = self._answer_oks(data)
                if answered:
                    data = data[answered:]
            frames = parser.feed(data) if data else []

    async def _read_shared(
        self, parser: FrameParser[Any], on_messages: MessagesCallback[Any]
    ) -> None:
        """The reader when the multiplexer reads for the connection: park
        while it does (see :mod:`trionsq.multiplex`); what ends the connection
        there is raised here, as :meth:`_read_loop` would raise it."""
        frames = parser.feed(self._leftover)
        self._leftover = b""
        if frames:
            await self._dispatch(frames, on_messages)
        mux = self._mux
        assert mux is not None
        while True:
            fd = self._fd
            if fd < 0:
                raise trio.ClosedResourceError("the connection was closed")
            # What _watch_reads watches: the shared reader moves it on at each read.
            self._read_deadline = trio.current_time() + self.config.read_timeout
            read_one = functools.partial(self._read_one, fd, parser, on_messages)
            waiting = await mux.read_for(self, fd, read_one)
            if waiting is None:
                # The multiplexer ended (its consumer is leaving): read alone.
                await self._read_loop(parser, on_messages)
                return
            # A callback's awaitable: this connection's reads wait for it,
            # the other connections' do not.
            self._read_deadline = math.inf
            await waiting

    def _read_one(
        self, fd: int, parser: FrameParser[Any], on_messages: MessagesCallback[Any]
    ) -> Awaitable[None] | None:
        """One read for the shared reader, ``fd`` being readable: its frames
        handed on as :meth:`_read_loop` hands them; returns an awaitable the
        callback returned (the rest of the read's frames then wait behind it).
        Raises what ends the connection."""
        data = self._read_now(fd)
        if data is None:
            return None  # nothing after all, or closed meanwhile
        if not data:
            if self.life.state is not OPEN:
                raise trio.ClosedResourceError("the connection was closed")
            raise NSQConnectionError(f"{self.address}: closed by nsqd")
        self._read_deadline = trio.current_time() + self.config.read_timeout
        frames = parser.feed(data)
        if not frames:
            return None
        if parser.others:
            return self._dispatch_now(frames, on_messages)
        return on_messages(frames)

    def _dispatch_now(
        self, frames: list[Any], on_messages: MessagesCallback[Any]
    ) -> Awaitable[None] | None:
        """A consumer's frames handed on without awaiting: runs of messages to
        the callback, the other frames handled, in order, until the callback
        returns an awaitable; then the rest waits behind it in what is returned."""
        run: list[Any] = []
        handle = self._handle
        for index, frame in enumerate(frames):
            kind = type(frame)
            if kind is not Response and kind is not Error and kind is not OversizedMessage:
                run.append(frame)
                continue
            if run:
                waiting = on_messages(run)
                run = []
                if waiting is not None:
                    return self._dispatch_after(waiting, frames[index:], on_messages)
            handle(frame)
        return on_messages(run) if run else None

    async def _dispatch_after(
        self, waiting: Awaitable[None], frames: list[Any], on_messages: MessagesCallback[Any]
    ) -> None:
        await waiting
        await self._dispatch(frames, on_messages)

    def _read_now(self, fd: int) -> bytes | None:
        """Read ``fd`` once it is readable: its bytes (empty at the end of the
        stream), or None when there is nothing yet.  Errors are translated as
        :meth:`trio.SocketStream.receive_some` translates them."""
        if self._fd != fd:
            # Closed while the reader was being woken (the number may even be
            # another socket's now): the stream's own read says how.
            return None
        return _read_socket(fd)

    async def _dispatch(self, frames: list[Any], on_messages: MessagesCallback[Any] | None) -> None:
        """Frames of a read that are not all messages: each run of messages to
        the callback, the others handled, all in order (a producer's reader,
        without a callback, ends the connection at a message)."""
        if on_messages is None:
            handle = self._handle
            for frame in frames:
                kind = type(frame)
                if kind is not Response and kind is not Error:
                    raise ProtocolError(f"{self.address}: unexpected message frame")
                handle(frame)
            return
        waiting = self._dispatch_now(frames, on_messages)
        if waiting is not None:
            await waiting

    def _handle(self, frame: Response | Error | OversizedMessage) -> None:
        """A frame that is not a message: a response goes to the request it
        answers (its waiter is rescheduled, no coroutine per frame)."""
        if isinstance(frame, OversizedMessage):
            assert self._on_oversized is not None  # only such a parser makes one
            self._on_oversized(frame)
            return
        if isinstance(frame, Response):
            data = frame.data
            if data == HEARTBEAT:
                # One every heartbeat interval: no room to wait for.  Any
                # command queued already answers it (nsqd wants to hear from
                # the client, whatever it says): a server sending heartbeats
                # without reading what we write cannot pile NOPs up here.
                if not self._out:
                    self.send_nowait(commands.nop())
            elif self._pending:
                self._pending.popleft().set(data)
            else:
                raise ProtocolError(f"{self.address}: unexpected response {data[:100]!r}")
        else:
            error = frame.error
            if not error.fatal:
                log.warning("%s: %s", self.address, error)
                return
            if self._pending:
                self._pending.popleft().fail(error)
            raise error

    def _answer_oks(self, data: bytes | bytearray) -> int:
        """The fast path for a producer's reads: how many bytes at the start
        of ``data`` are whole ``OK`` responses, each handed to its request
        (0 when ``data`` does not start with a run of them, or when more came
        than were asked for: the parser then deals with it, error included)."""
        count = len(data) // _OK_FRAME_SIZE
        end = count * _OK_FRAME_SIZE
        if (
            count
            and data.startswith(_OK_FRAME)
            and count <= len(self._pending)
            # count non-overlapping matches in count * 10 bytes tile them exactly
            and data.count(_OK_FRAME, 0, end) == count
        ):
            popleft = self._pending.popleft
            for _ in range(count):
                popleft().set(OK)
            # One request answered alone: its task likely sends the next one
            # alone too (see request).
            self._lone = count == 1
            return end
        return 0

    def _finish(self, reason: BaseException | None) -> None:
        """The move to CLOSED (once): every pending request fails (with
        ``reason`` as the cause, kept as :attr:`close_reason`)."""
        life = self.life
        if life.state is CLOSED:
            return
        life.move(CLOSED)
        self.close_reason = reason
        failure = ConnectionClosedError(f"{self.address}: connection closed")
        if reason is not None:
            failure.__cause__ = reason
        while self._pending:
            self._pending.popleft().fail(failure)
        self._fd = -1
        self._closed.set()
        self._drained.set()  # nothing more will be written

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def aclose(self) -> None:
        """Close now (call :meth:`flush` first to send what is queued); the
        loops return and pending requests fail."""
        if self.life.state is OPEN:
            self.life.move(CLOSING)
        if self._mux is not None and self._fd >= 0:
            # Out of the shared reader before the socket closes: its number
            # may be the next connection's at once.
            self._mux.stop_reading(self._fd)
        self._fd = -1
        self._finish(None)
        self._give_back(None)  # a reader that lent its socket sees the end
        await _close_at_once(self._stream)
