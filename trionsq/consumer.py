"""Consuming: connections, RDY, backoff, discovery and clean shutdown, in one nursery.

Every task a :class:`Consumer` starts lives in the nurseries its ``async with``
opens, so nothing outlives the block.  Leaving it sends CLS to every nsqd and
requeues (REQ 0) every message nobody can answer any more: at once what was not
handed out, what ``async for`` handed out (its loop is over) and what cancelled
handlers held; after ``close_timeout`` what handlers still hold.  Then it waits
for nsqd's CLOSE_WAIT and for the answers to be written (bounded), and closes,
so that nothing of the consumer stays in flight at any nsqd.
"""

from __future__ import annotations

import functools
import logging
import math
import random
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from . import telemetry
from .backoff import Backoff, BackoffState
from .config import Config
from .connection import Connection, NegotiationError, RequestRefused
from .discovery import Discovery
from .flow import Flow
from .handlers import HandlerPool
from .lifecycle import CLOSED, CLOSING, NEW, OPEN, OPENING, AsyncContext, Lifecycle, Moves
from .message import Message, cancel_may_be_pending
from .multiplex import Multiplexer
from .protocol import commands
from .protocol.errors import NSQError, NSQErrorResponse, ProtocolError
from .protocol.names import is_valid_channel_name, is_valid_topic_name
from .rdy import RdyController, starved
from .reasons import cannot_connect
from .session import Session, Sessions

if TYPE_CHECKING:
    pass

__all__ = ["Consumer", "ConsumerStats", "ConnectionStats", "Handler", "GiveUpHandler"]

log = logging.getLogger("trionsq.consumer")

#: ``handler(message)``: return (or complete) to FIN, raise to REQ.
Handler = Callable[[Message], Awaitable[object] | object]
#: ``give_up(message)``: called for messages past ``max_attempts`` (then FINed).
GiveUpHandler = Callable[[Message], Awaitable[object] | object]

#: How long leaving may take once nobody can answer a message any more: CLS
#: answered, the last FINs and REQs written.  Bounds the exit whatever nsqd does.
_CLS_TIMEOUT = 5.0
#: After CLOSE_WAIT, how long a connection that had RDY stays open for a message
#: nsqd's sender took for us just before reading CLS (it then writes it right
#: after CLOSE_WAIT): received, it is requeued instead of left to time out.
#: nsqd gives no signal that none is coming, and how late one comes depends on
#: how soon its sender goroutine runs again: the wait is at least
#: _STRAGGLER_GRACE, and twice the wait for CLOSE_WAIT when that was longer (a
#: busy machine delays both alike), up to _STRAGGLER_GRACE_MAX.
_STRAGGLER_GRACE = 0.01
_STRAGGLER_GRACE_MAX = 0.25
#: ``async for`` hands out this many queued messages between two yields to the
#: scheduler: fewer passes through the run loop (the writer then sends the FINs
#: of a whole batch at once), while other tasks still get their turn.
_YIELD_EVERY = 256
#: nsqd's default --msg-timeout, for a connection whose nsqd did not say its own
_NSQD_MSG_TIMEOUT = 60.0

_NORMAL = BackoffState.NORMAL


@dataclass(frozen=True, slots=True)
class ConnectionStats:
    """One subscribed nsqd: ``rdy`` the RDY decided for it, ``in_flight`` its
    messages received and not answered yet, ``handed_out`` those of them handed
    out (to a handler or through iteration), the rest waiting in the consumer."""

    address: str
    rdy: int
    in_flight: int
    max_rdy_count: int
    handed_out: int = 0


@dataclass(frozen=True, slots=True)
class ConsumerStats:
    """A snapshot of a consumer's counters (see :attr:`Consumer.stats`).

    ``finished`` and ``requeued`` count FIN and REQ commands sent (give-ups are
    counted in ``given_up`` only); ``connections`` maps each subscribed nsqd to
    its current RDY and messages in flight.
    """

    received: int = 0
    finished: int = 0
    requeued: int = 0
    given_up: int = 0
    backoff_state: str = BackoffState.NORMAL.value
    backoff_level: int = 0
    connections: dict[str, ConnectionStats] = field(default_factory=dict)

    @property
    def in_flight(self) -> int:
        return sum(c.in_flight for c in self.connections.values())

    @property
    def rdy(self) -> int:
        return sum(c.rdy for c in self.connections.values())


#: A Consumer's life: entered once (OPENING while its nurseries open), its
#: flow stopped once (CLOSING: leaving, from the first step of __aexit__),
#: CLOSED once everything it started has ended.
MOVES = Moves(
    "Consumer",
    NEW,
    {NEW: {OPENING}, OPENING: {OPEN, CLOSED}, OPEN: {CLOSING}, CLOSING: {CLOSED}},
    refusals={OPENING: "a Consumer can be entered only once"},
)


class Consumer(Sessions, Flow, Discovery, HandlerPool, AsyncContext):
    """Consumes ``topic`` on ``channel`` from nsqds given directly or found via lookupd.

    Either pass ``handler`` (sync or async; returning finishes the message,
    raising requeues it with a delay growing with its attempts), or iterate::

        async with trionsq.Consumer("topic", "channel", nsqd_tcp_addresses=[...]) as c:
            async for message in c:
                ...
                await message.finish()

    Sync handlers run in the event loop: keep them quick (or use
    ``trio.to_thread``).  Messages with more than ``max_attempts`` attempts go to
    ``give_up`` (default: log a warning) and are finished.  Messages are never
    touched automatically.  Other options are those of
    :class:`~trionsq.config.Config`; ``rng`` seeds the jitter (for tests).

    Leaving the block sends CLS to every nsqd and requeues (REQ 0, no backoff)
    every message nobody can answer any more: at once the ones not handed out
    yet and the ones ``async for`` handed out and the block left unanswered;
    handlers get up to ``close_timeout`` to finish theirs, then are cancelled
    and their messages requeued.  Cancellation of the enclosing scope, or a
    KeyboardInterrupt, skips the wait (cancelled handlers cannot answer).
    Then it waits, at most a few seconds, for nsqd's CLOSE_WAIT and for the
    answers to be written: after the block nothing of this consumer is in
    flight at any nsqd it is still connected to.  An exception from the block
    propagates unchanged.  Nothing the consumer started outlives the block.
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        *,
        handler: Handler | None = None,
        give_up: GiveUpHandler | None = None,
        config: Config | None = None,
        rng: random.Random | None = None,
        **options: Any,
    ) -> None:
        if not isinstance(topic, str) or not is_valid_topic_name(topic):
            raise ValueError(f"invalid topic name {topic!r}")
        if not isinstance(channel, str) or not is_valid_channel_name(channel):
            raise ValueError(f"invalid channel name {channel!r}")
        if handler is not None and not callable(handler):
            raise TypeError("handler must be callable")
        if give_up is not None and not callable(give_up):
            raise TypeError("give_up must be callable")
        config = Config(**options) if config is None else config.replace(**options)
        if not config.nsqd_tcp_addresses and not config.lookupd_http_addresses:
            raise ValueError("give nsqd_tcp_addresses or lookupd_http_addresses (or both)")
        self.topic = topic
        self.channel = channel
        self.config = config
        self._handler = handler
        self._give_up_handler = give_up
        self._rng = rng if rng is not None else random.Random()
        self._rdy: RdyController[Session] = RdyController(
            config.max_in_flight, config.low_rdy_idle_timeout
        )
        self._backoff = Backoff(config.backoff_policy, self._rng)
        self._backoff_wakeup = trio.Event()
        # RDY raises wait until the lowerings that freed their budget are written
        # (on other connections, so no single buffer orders them): the lowered
        # sessions not known to be written yet, the raises held back, and the
        # task that flushes the former and then sends the latter.
        self._rdy_lowered: list[Session] = []
        # Dicts as ordered sets: iterating a set of objects follows their memory
        # addresses, and seeded simulations must repeat exactly.
        self._rdy_held: dict[Session, None] = {}
        self._rdy_barrier_wakeup = trio.Event()
        self._sessions: dict[Session, None] = {}
        self._discovered: dict[str, trio.CancelScope] = {}
        # Messages received and not yet handed out (to a handler worker or to
        # ``async for``), in arrival order, and the tasks waiting for one.
        self._queue: deque[Message] = deque()
        self._queue_waiters = trio.lowlevel.ParkingLot()
        self._workers = 0
        self._pool_limit = max(1, config.max_in_flight)  # at least one, for stragglers
        self._waking = 0  # workers started or unparked that have not run yet
        self._since_yield = 0
        # Set, while closing, whenever a handed-out message is answered or a
        # connection ends: the drain re-checks what it waits for.
        self._settled_event = trio.Event()
        # Set, while leaving, when a message comes after a CLOSE_WAIT (see
        # _finish_closes).
        self._straggled = trio.Event()
        # Messages with give_up running (handed out like a handler's).
        self._giving_up: set[Message] = set()
        # Sessions inside their shielded scope (see _serve), to cancel on exit.
        self._serving: dict[Session, None] = {}
        # A KeyboardInterrupt or SystemExit a handler raised: re-raised on exit.
        self._interrupted: BaseException | None = None
        self._received = 0
        self._finished = 0
        self._requeued = 0
        self._given_up = 0
        #: the consumer's life (:data:`MOVES`): once it is not OPEN, the
        #: flow has stopped (CLS sent, the queue closed: nothing more is
        #: handed out, what comes is requeued)
        self._life = Lifecycle(MOVES)
        self._stack: AsyncExitStack | None = None
        self._nursery: trio.Nursery | None = None
        # The shared I/O of the plain-TCP connections, and its task's scope:
        # shielded like each connection's (leaving still needs them), and
        # cancelled with them (see _exit).
        self._mux = Multiplexer()
        self._mux_scope = trio.CancelScope(shield=True)
        self._handlers: trio.Nursery | None = None
        self._connected = trio.Event()
        # Spans, metrics, the trace context envelope (None: nothing to do)
        self._telemetry: telemetry.ConsumerTelemetry | None = None

    # --- public ---

    @property
    def stats(self) -> ConsumerStats:
        return ConsumerStats(
            received=self._received,
            finished=self._finished,
            requeued=self._requeued,
            given_up=self._given_up,
            backoff_state=self._backoff.state.value,
            backoff_level=self._backoff.level,
            connections={
                s.address: ConnectionStats(
                    s.address, state.rdy, state.in_flight, state.max_rdy_count, len(s.out)
                )
                for s, state in self._rdy.conns.items()
            },
        )

    def is_starved(self) -> bool:
        """The client guide's ``is_starved``: some connection has handed out
        (and not had answered) 85% or more of the last RDY sent to it, so nsqd
        sends it nothing more until some are answered: time to process the
        batch held.  Messages received but still waiting in the consumer do not
        count (the application has not seen them)."""
        if self._life.state is not OPEN:
            return False
        return any(starved(len(s.out), s.wire_rdy) for s in self._sessions)

    @property
    def connections(self) -> list[str]:
        """Addresses of the nsqds currently subscribed to."""
        return sorted(s.address for s in self._sessions)

    async def wait_connected(self) -> None:
        """Wait until at least one nsqd subscription is up."""
        await self._connected.wait()

    async def set_max_in_flight(self, max_in_flight: int) -> None:
        """Change ``max_in_flight`` at run time (0 pauses the flow)."""
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int):
            raise TypeError("max_in_flight must be an int")
        if max_in_flight < 0:
            raise ValueError("max_in_flight must be >= 0")
        await trio.lowlevel.checkpoint()
        self._rdy.set_max_in_flight(max_in_flight)
        self._pool_limit = max(1, max_in_flight)
        self._update_rdy()

    def __aiter__(self) -> AsyncIterator[Message]:
        if self._handler is not None:
            raise RuntimeError("a Consumer with a handler cannot be iterated")
        # Instrumented, each iteration is a span (trionsq.telemetry)
        return self if self._telemetry is None else self._telemetry.iterate(self)

    async def __anext__(self) -> Message:
        # Always a cancellation point; a scheduling point only every
        # _YIELD_EVERY messages while some are queued (the queue holds at most
        # what RDY allowed, so the run without a yield is bounded), and
        # whenever the queue runs dry (the task then waits for the reader).
        queue = self._queue
        since = self._since_yield + 1
        if queue and since < _YIELD_EVERY and self._life.state is OPEN:
            # The fast path, on almost every message: a message is there and
            # no yield is due; a cancellation point still.
            self._since_yield = since
            if cancel_may_be_pending():
                await trio.lowlevel.checkpoint_if_cancelled()
            message = queue.popleft()
            message.responder.out[message] = None
            return message
        return await self._next_slowly(since)

    async def _next_slowly(self, since: int) -> Message:
        """__anext__ when a yield is due, the queue is empty or closed."""
        state = self._life.state
        if state is NEW or state is OPENING:
            raise RuntimeError("iterate the Consumer inside 'async with'")
        if since >= _YIELD_EVERY:
            self._since_yield = 0
            await trio.lowlevel.checkpoint()
        else:
            self._since_yield = since
            await trio.lowlevel.checkpoint_if_cancelled()
        while not self._queue:
            if self._life.state is not OPEN:
                raise StopAsyncIteration
            self._since_yield = 0
            await self._queue_waiters.park()
        if self._life.state is not OPEN:
            raise StopAsyncIteration
        message = self._queue.popleft()
        message.responder.out[message] = None
        return message

    # --- lifecycle ---

    async def __aenter__(self) -> Consumer:
        self._life.move(OPENING)
        stack = AsyncExitStack()
        try:
            self._nursery = await stack.enter_async_context(trio.open_nursery())
            self._handlers = await stack.enter_async_context(trio.open_nursery())
        except BaseException:
            self._life.move(CLOSED)
            raise
        self._stack = stack
        self._telemetry = telemetry.for_consumer(
            self.config,
            self.topic,
            self.channel,
            msg_timeout=self.msg_timeout_of,
            stats=lambda: self.stats,
        )
        if self._telemetry is not None and self._handler is not None:
            self._handler = self._telemetry.wrap_handler(self._handler)
        nursery = self._nursery
        nursery.start_soon(self._run_mux)
        for address in dict.fromkeys(self.config.nsqd_tcp_addresses):
            nursery.start_soon(self._static_connection, address)
        if self.config.lookupd_http_addresses:
            nursery.start_soon(self._discovery)
        nursery.start_soon(self._backoff_loop)
        nursery.start_soon(self._rdy_loop)
        nursery.start_soon(self._rdy_barrier_loop)
        self._life.move(OPEN)
        return self

    async def _exit_block(self, exc: BaseException | None) -> None:
        assert self._stack is not None
        try:
            if exc is None or isinstance(exc, Exception):
                # A clean exit, or an error in the block: handlers get their time.
                # (Cancelled and KeyboardInterrupt mean "now": no waiting.)
                await self._drain()
        except trio.Cancelled:
            if self._interrupted is None:
                raise
            # Our own cancellation, for a handler's KeyboardInterrupt: raised below.
        finally:
            await self._exit()
            if self._telemetry is not None:
                self._telemetry.close()
        if self._interrupted is not None:
            raise self._interrupted

    async def _drain(self) -> None:
        """CLS everywhere, requeue what nobody can answer, and give handlers up
        to ``close_timeout`` to answer theirs."""
        self._start_closing()
        if self._handler is None:
            # The block is over, so is any loop over the consumer: what it was
            # handed and left unanswered, nobody can answer any more.
            left = [
                message
                for session in self._sessions
                for message in session.out
                if message not in self._giving_up
            ]
            if left:
                log.info("leaving: requeueing %d message(s) the block left unanswered", len(left))
            for message in left:
                self._abandon(message)
        with trio.move_on_after(self.config.close_timeout):
            while self._awaited():
                self._settled_event = trio.Event()
                await self._settled_event.wait()

    def _awaited(self) -> bool:
        """Whether a handed-out message could still be answered (its
        connection is up), which is all leaving waits for."""
        return any(session.out for session in self._sessions)

    def _start_closing(self) -> None:
        """Stop the flow: CLS to every nsqd, the queue closed and requeued."""
        if self._life.state is not OPEN:
            return
        self._life.move(CLOSING)
        # Wake every parked worker or iterator: each counts as woken.
        self._waking += len(self._queue_waiters) if self._handler is not None else 0
        self._queue_waiters.unpark_all()
        for session in self._sessions:
            session.start_close()
            session.wake()  # what it holds is requeued at once too
        # Messages never handed out go back at once (REQs after the CLS: nsqd
        # then has stopped sending when they free its RDY).
        while self._queue:
            self._abandon(self._queue.popleft())

    @trio.lowlevel.enable_ki_protection
    async def _exit(self) -> None:
        """Requeue whatever is unanswered, hear every CLOSE_WAIT, flush, close;
        bounded, and whatever cancellation is under way.  KI-protected: a
        Ctrl-C now waits for the consumer to be left cleanly (at most
        ``_CLS_TIMEOUT``)."""
        assert self._stack is not None and self._nursery is not None
        assert self._handlers is not None
        try:
            with trio.move_on_after(_CLS_TIMEOUT, shield=True) as scope:
                await self._leave()
            if scope.cancelled_caught:
                log.warning("leaving took more than %.0fs: closing anyway", _CLS_TIMEOUT)
        finally:
            for session in list(self._serving):
                session.scope.cancel()
            self._mux_scope.cancel()
            self._handlers.cancel_scope.cancel()
            self._nursery.cancel_scope.cancel()
            # Whatever happens, the nurseries must be exited.  The block's
            # exception is not theirs: passing it would wrap it in groups.
            try:
                await self._stack.__aexit__(None, None, None)
            finally:
                if self._life.state is OPEN:  # (leaving stops the flow first)
                    self._life.move(CLOSING)
                self._life.move(CLOSED)

    async def _leave(self) -> None:
        """Requeue every message still unanswered (no handler may answer any
        more), then wait for each connection's CLOSE_WAIT and writes."""
        self._start_closing()
        # From now on no handler answers: cancelled, its message goes back.
        assert self._handlers is not None
        self._handlers.cancel_scope.cancel()
        sessions = list(self._sessions)
        unanswered = [m for session in sessions for m in session.out]
        if unanswered:
            log.log(
                logging.WARNING if self._handler is not None else logging.INFO,
                "leaving: requeueing %d message(s) not answered",
                len(unanswered),
            )
        for message in unanswered:
            self._abandon(message)
        await self._finish_closes(sessions)

    async def _finish_closes(self, sessions: list[Session]) -> None:
        """Wait for each session's CLOSE_WAIT (what nsqd sent before it has
        then been read, and answered), and briefly for a message sent just
        after it, then until everything queued has been written (or the
        connection has ended).

        All in this one task, one session after the other: the answers come
        in parallel all the same, and a task, a timer and a cancel scope a
        connection are what leaving would otherwise cost per nsqd.
        """
        # How long each CLOSE_WAIT is still in coming (answered already, e.g.
        # during close_timeout, a straggler had all that time to come).
        since = trio.current_time()
        answered = [session.cls is not None and session.cls.done for session in sessions]
        deadline = -math.inf  # the end of the latest straggler's grace
        closed: list[tuple[Session, float]] = []
        for session, done in zip(sessions, answered, strict=True):
            if session.cls is None:
                continue
            try:
                await session.cls.result()
            except NSQError as exc:
                log.info("%s: CLS failed: %s", session.address, exc)
                continue
            # Seen after the answers waited for before it: a round trip counted
            # from `since` may come out longer than it was, never shorter (a
            # longer grace, within _STRAGGLER_GRACE_MAX).
            now = trio.current_time()
            round_trip = 0.0 if done else now - since
            closed.append((session, round_trip))
            # nsqd's sender may have taken a message for us just before CLS
            # set our RDY to 0: it comes right after CLOSE_WAIT.  So too when
            # our last RDY was 0 but read just before CLS, under the RDY
            # before it.  A connection never given RDY cannot have one coming.
            if session.had_rdy:
                grace = min(max(_STRAGGLER_GRACE, 2 * round_trip), _STRAGGLER_GRACE_MAX)
                deadline = max(deadline, now + grace)
        # One wait for every connection's straggler, until each has come or
        # the last grace is over (a connection's own grace may end earlier: it
        # then stays open that much longer, and still requeues one).
        waiting = [session for session, _ in closed if session.had_rdy]
        while waiting and trio.current_time() < deadline:
            self._straggled = trio.Event()
            waiting = [session for session in waiting if not session.straggled]
            if not waiting:
                break
            with trio.move_on_at(deadline):
                await self._straggled.wait()
        for session, round_trip in closed:
            # What a user checking a close needs, next to nsqd's own debug
            # log of the commands it read.
            log.debug(
                "%s: CLOSE_WAIT after %.1f ms (RDY %d); a message after it: %s",
                session.address,
                round_trip * 1000,
                session.wire_rdy,
                "requeued" if session.straggled else "none",
            )
        for session in sessions:
            await session.conn.flush()
            log.debug("%s: everything queued written; closing", session.address)

    def _abandon(self, message: Message) -> None:
        """REQ 0, no backoff: a message nobody will answer goes back at once."""
        if message.responded is None:
            message.responded = "requeued"
            session = message.responder
            assert isinstance(session, Session)
            log.debug("%s: leaving: requeueing %r (REQ 0)", session.address, message)
            self._settle(session, message, commands.req(message.id, 0), False, None)

    def msg_timeout_of(self, message: Message) -> float:
        """How long nsqd gives ``message`` (one of this consumer's) before
        redelivering it: its connection's negotiated ``msg_timeout``."""
        session = message.responder
        timeout = session.conn.msg_timeout if isinstance(session, Session) else None
        return timeout if timeout is not None else _NSQD_MSG_TIMEOUT

    def _interrupt(self, exc: BaseException) -> None:
        """A handler raised KeyboardInterrupt or SystemExit: leave at once (the
        block is cancelled), then raise it from ``__aexit__``."""
        if self._interrupted is None:
            self._interrupted = exc
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()

    # --- connections ---

    @trio.lowlevel.enable_ki_protection
    async def _run_mux(self) -> None:
        with self._mux_scope:
            await self._mux.run()

    # Internal tasks are KI-protected (a Ctrl-C goes to the main task, which
    # leaves the consumer cleanly); only handlers run unprotected.

    @trio.lowlevel.enable_ki_protection
    async def _static_connection(self, address: str) -> None:
        """Keep a configured nsqd connected, reconnecting with growing delays."""
        failures = 0
        retry = Backoff(self.config.reconnect_backoff, self._rng)
        while self._life.state is OPEN:
            started = trio.current_time()
            worked = await self._connect_and_serve(address)
            if self._life.state is not OPEN:
                return
            # A connection that worked (an nsqd restarted, the network cut
            # it) or lived a while starts the delays again: back within
            # `base` after a restart.  Failures to connect, and connections
            # ended by what the nsqd sent, make them grow.
            lived = trio.current_time() - started
            if worked or lived > self.config.reconnect_backoff.max:
                failures = 1
            else:
                failures += 1
            delay = retry.duration(min(failures, retry.max_level))
            log.info("reconnecting to %s in %.1fs", address, delay)
            await trio.sleep(delay)
            telemetry.counters.count_reconnect(address)

    async def _connect_and_serve(self, address: str) -> bool:
        """Connect, subscribe and serve until the connection ends; whether it
        worked: subscribed, then lost as a working nsqd's connection is
        (closed, reset, silent), not ended by something the nsqd sent (a
        protocol error, a fatal error frame)."""
        try:
            # SUB answered as part of connecting (see Connection.open's then):
            # the connection needs no task of its own until it runs.
            conn = await Connection.open(
                address, self.config, then=commands.sub(self.topic, self.channel)
            )
        except RequestRefused as exc:
            log.warning("%s: SUB failed: %s", address, exc.error)
            return False
        except (NSQError, NegotiationError) as exc:
            log.warning("%s", cannot_connect(address, exc))
            return False
        await self._serve(conn)
        return not isinstance(conn.close_reason, ProtocolError | NSQErrorResponse)

    async def _serve(self, conn: Connection) -> None:
        session = Session(self, conn)
        on_messages = functools.partial(self._on_messages, session)
        # Shielded: leaving, even when cancelled, still needs the connection to
        # requeue what is unanswered and hear CLOSE_WAIT; _exit cancels it.
        with session.scope:
            self._serving[session] = None
            try:
                if self._life.state is not OPEN:
                    return
                # Subscribed (see _connect_and_serve): the connection counts
                # from now on, and runs in this task.
                self._sessions[session] = None
                self._rdy.add(session, conn.max_rdy_count, trio.current_time())
                session.rdy_state = self._rdy.conns[session]
                self._connected.set()
                log.info("%s: subscribed to %s/%s", conn.address, self.topic, self.channel)
                self._update_rdy()
                await conn.run(
                    on_messages,
                    session.make_message,
                    self._mux,
                    functools.partial(self._on_oversized, session),
                )
            finally:
                del self._serving[session]
                self._sessions.pop(session, None)
                self._rdy.remove(session)
                session.rdy_state = None
                with trio.CancelScope(shield=True):
                    await conn.aclose()
                if self._life.state is not OPEN:
                    self._settled_event.set()  # its messages can no longer be answered
        if self._life.state is OPEN:
            self._update_rdy()

    # --- for the front ends (trionsq.hosting.consumer) ---

    def take_ready(self, most: int) -> list[Message]:
        """Up to ``most`` of the messages already read, handed out (as
        ``__anext__`` hands each out, without a step of iteration each); none
        once the consumer is closing.  A front end's pump takes the rest of a
        read with it after ``async for`` gave it the first."""
        queue = self._queue
        if self._life.state is not OPEN or not queue:
            return []
        taken = [queue.popleft() for _ in range(min(most, len(queue)))]
        for message in taken:
            message.responder.out[message] = None
        return taken
