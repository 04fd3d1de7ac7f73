"""One connection to one nsqd: its life, its reader, and the parts it is made of.

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

The connection is made of three parts, one module each: the handshake and the
stream's upgrades (:mod:`trionsq.handshake`: :class:`Handshake`, run while its
life is OPENING), the write path (:mod:`trionsq.writing`: :class:`Writing`,
commands and requests queued, the writer, the socket's loan), and here its
life (:data:`CONNECTION_MOVES`), running, the reader and the end.
"""

from __future__ import annotations

import functools
import logging
import math
import ssl
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias, TypeVar

import trio

from .config import Config, KeyPasswordMissing
from .handshake import (
    RECEIVE_SIZE,
    WRITE_TO_SOCKETS,
    CodecStream,
    Handshake,
    NegotiationError,
    NSQConnectionError,
    RequestRefused,
    close_at_once,
    read_socket,
)
from .lifecycle import CLOSED, CLOSING, OPEN, OPENING, Lifecycle, Moves
from .multiplex import Multiplexer
from .protocol import commands, states
from .protocol.errors import NSQError, ProtocolError
from .protocol.frames import (
    HEARTBEAT,
    OK,
    Error,
    FrameParser,
    MessageFactory,
    OversizedMessage,
    Response,
)
from .protocol.handshake import DEFAULT_MAX_RDY_COUNT
from .reasons import cannot_connect
from .telemetry import counters
from .transport import parse_address
from .writing import (
    LOAN_MOVES,
    OK_FRAME,
    OK_FRAME_SIZE,
    WRITER_MOVES,
    ConnectionClosedError,
    Loan,
    PendingResponse,
    Writer,
    Writing,
)

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


M = TypeVar("M")

#: Called by the reader with the messages of one read, in order (a run of them
#: between two other frames, if any); it returns an awaitable when it has
#: something to wait for (the reader awaits it before going on), None when it is
#: done (the common case: no coroutine per read).
MessagesCallback: TypeAlias = Callable[[list[M]], Awaitable[None] | None]


class Connection(Handshake, Writing):
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
        self._reader: trio.lowlevel.Task | None = None  # the reader, while parked lending
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
                await conn._start(host, then)
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
                await close_at_once(conn._stream)
        # Only the scope's own deadline ends the block without a return.
        raise NSQConnectionError(
            cannot_connect(address, f"connect timed out after {config.connect_timeout:g}s")
        )

    async def _start(self, host: str, then: bytes | None) -> None:
        """The handshake (OPENING), then the ``then`` request; OPEN after."""
        await self._handshake(host)
        if then is not None:
            if then and then[0] in self._watched:
                self._follow(then)
            await self._request_now(then)
        self.life.move(OPEN)

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
        if type(stream) is trio.SocketStream and WRITE_TO_SOCKETS and self.life.state is OPEN:
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
            await close_at_once(self._stream)

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
                data = await receive(RECEIVE_SIZE)
            self._read_deadline = math.inf
            drained = len(data) < RECEIVE_SIZE
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
        return read_socket(fd)

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
                counters.count_error(self.address, error.code)
                return
            if self._pending:
                self._pending.popleft().fail(error)
            raise error

    def _answer_oks(self, data: bytes | bytearray) -> int:
        """The fast path for a producer's reads: how many bytes at the start
        of ``data`` are whole ``OK`` responses, each handed to its request
        (0 when ``data`` does not start with a run of them, or when more came
        than were asked for: the parser then deals with it, error included)."""
        count = len(data) // OK_FRAME_SIZE
        end = count * OK_FRAME_SIZE
        if (
            count
            and data.startswith(OK_FRAME)
            and count <= len(self._pending)
            # count non-overlapping matches in count * 10 bytes tile them exactly
            and data.count(OK_FRAME, 0, end) == count
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
        await close_at_once(self._stream)
