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
import inspect
import logging
import math
import random
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from types import CoroutineType, TracebackType
from typing import TYPE_CHECKING, Any

import trio

from . import telemetry
from .backoff import Backoff, BackoffState
from .config import Config
from .connection import Connection, NegotiationError, PendingResponse, RequestRefused
from .lookupd import lookup, merge
from .message import Message, cancel_may_be_pending
from .multiplex import Multiplexer
from .protocol import commands
from .protocol.errors import NSQError, NSQErrorResponse, ProtocolError
from .protocol.frames import OversizedMessage
from .protocol.names import is_valid_channel_name, is_valid_topic_name
from .rdy import ConnRdy, RdyController, starved
from .reasons import cannot_connect

if TYPE_CHECKING:
    import httpx

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
#: How long RDY raises wait for the lowerings that freed their budget to be
#: written (see Consumer._rdy_barrier_loop) before they go out anyway.
_RDY_BARRIER_TIMEOUT = 5.0
#: ``async for`` hands out this many queued messages between two yields to the
#: scheduler: fewer passes through the run loop (the writer then sends the FINs
#: of a whole batch at once), while other tasks still get their turn.
_YIELD_EVERY = 256
#: nsqd's default --msg-timeout, for a connection whose nsqd did not say its own
_NSQD_MSG_TIMEOUT = 60.0

_new = object.__new__
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


class _Session:
    """One live, subscribed connection; a message's responder."""

    def __init__(self, consumer: Consumer, conn: Connection) -> None:
        self.consumer = consumer
        self.conn = conn
        self.address = conn.address
        self.wire_generation = 0
        self.wire_rdy = 0  # the last RDY queued
        #: whether a RDY above 0 was ever queued (nsqd may have sent under it)
        self.had_rdy = False
        #: the RDY controller's state for this connection, while it has one
        self.rdy_state: ConnRdy | None = None
        #: messages handed out and not answered yet (see message._Responder)
        self.out: dict[Message, None] = {}
        #: shields the connection from cancellation while leaving needs it
        #: (see Consumer._serve); the consumer cancels it when done with it
        self.scope = trio.CancelScope(shield=True)
        #: nsqd's answer to this session's CLS, once queued
        self.cls: PendingResponse | None = None
        #: whether a message arrived after CLOSE_WAIT (there is at most one)
        self.straggled = False
        #: the RDY last queued on this connection, and how many more nsqd
        #: may send under the one before, if it was higher (it sends under
        #: that one until it reads the new one: the room that was left then;
        #: the answers queued after the RDY are read after it, so they make
        #: no more room under the old one)
        self.rdy_limit = 0
        self.grace = 0
        #: messages received beyond ``rdy_limit`` (nsqd resends what timed
        #: out; a broken or hostile one ignores RDY), kept until earlier ones
        #: are answered, reading this connection waiting meanwhile (see
        #: Consumer._on_messages): what a consumer holds stays bounded by RDY
        #: and one read, whatever the server sends
        self.held: deque[Message] = deque()
        # Set when room may have come for what is held (see _release).
        self._room: trio.Event | None = None
        self._warned = False
        #: nsqd's message timeout for this connection (what it said in
        #: IDENTIFY's answer, else what was asked, else its default)
        self.msg_timeout = conn.msg_timeout or consumer.config.msg_timeout or 60.0
        #: reads of messages so far: each message keeps the number of the
        #: read it came in (``Message._read``), which says when it arrived
        self.read_stamp = 0
        #: ``(first read, its time)`` a bucket each ``bucket_width`` seconds,
        #: for the last ``msg_timeout`` (see room)
        self.arrivals: deque[tuple[int, float]] = deque()
        self.bucket_width = self.msg_timeout / 32
        # Unanswered messages that arrived more than msg_timeout ago (nsqd may
        # have timed them out), as of the last count, and until when that
        # count holds at least (answers only make it smaller).
        self._stale = 0
        self._stale_until = -math.inf
        self._first_recent = 0

    # RDY, FIN and REQ are queued without waiting (Connection.send_nowait): one
    # per RDY decision or per message nsqd handed out bounds them, and settling
    # a message then has no await in it, so it cannot be cancelled halfway.

    def flush_rdy(self) -> None:
        """Queue the RDY the controller decided last (if not sent yet)."""
        state = self.consumer._rdy.conns.get(self)
        if state is None or state.generation == self.wire_generation:
            return
        self.wire_generation = state.generation
        self.wire_rdy = state.rdy
        if state.rdy:
            self.had_rdy = True
        if state.rdy < self.rdy_limit:
            # nsqd goes on under the old RDY until it reads this one: what it
            # may still send under it is allowed on top of the new one.
            self.grace = max(0, self.room(trio.current_time()))
        elif state.rdy > self.rdy_limit:
            self.wake()
        self.rdy_limit = state.rdy
        try:
            self.conn.send_nowait(commands.rdy(state.rdy))
        except NSQError:
            pass  # the reader notices the end of the connection

    def _send(self, data: bytes) -> bool:
        try:
            self.conn.send_nowait(data)
        except NSQError as exc:
            # nsqd will time the message out and redeliver it.
            log.info("%s: could not answer a message: %s", self.address, exc)
            return False
        return True

    def make_message(self, timestamp: int, attempts: int, id: bytes, body: bytes) -> Message:
        """The connection's parser makes each message with this (no
        intermediate frame object, no ``__init__`` call: it is per message)."""
        message = _new(Message)
        message.id = id
        message.body = body
        message.attempts = attempts
        message.timestamp = timestamp
        message.address = self.address
        message.responded = None
        message._responder = self
        message._read = self.read_stamp
        return message

    def _finish(self, message: Message) -> None:
        consumer = self.consumer
        state = self.rdy_state
        if (
            state is None
            or consumer._closing
            or consumer._backoff.state is not _NORMAL
            or consumer._rdy._due
        ):
            consumer._settle(self, message, commands.fin(message.id), True, True)
            return
        # The steady state, on every message: a success changes no backoff and
        # frees budget no connection is waiting for, so no RDY is decided
        # (what _settle would find out, the long way).
        self.out.pop(message, None)
        if state.in_flight > 0:
            state.in_flight -= 1
        if self.held:
            self.wake()
        try:
            self.conn.send_nowait(b"FIN " + message.id + b"\n")
        except NSQError as exc:
            log.info("%s: could not answer a message: %s", self.address, exc)
        else:
            consumer._finished += 1

    def _requeue(self, message: Message, delay: float | None, backoff: bool) -> None:
        if delay is None:
            config = self.consumer.config
            delay = min(config.default_requeue_delay * message.attempts, config.max_requeue_delay)
        if self.consumer._telemetry is not None:
            self.consumer._telemetry.requeued(message, delay)
        data = commands.req(message.id, round(delay * 1000))
        self.consumer._settle(self, message, data, False, False if backoff else None)

    async def _touch(self, message: Message) -> None:
        try:
            await self.conn.send(commands.touch(message.id))
        except NSQError as exc:
            log.info("%s: could not touch a message: %s", self.address, exc)

    # --- reading within RDY ---

    def note_read(self, now: float) -> None:
        """A read of messages (made with the current ``read_stamp``) at ``now``."""
        arrivals = self.arrivals
        if not arrivals or now - arrivals[-1][1] >= self.bucket_width:
            cutoff = now - self.msg_timeout - self.bucket_width
            while arrivals and arrivals[0][1] <= cutoff:
                arrivals.popleft()
            arrivals.append((self.read_stamp, now))
            # These stop counting then: the stale count is due again by then.
            self._stale_until = min(self._stale_until, now + self.msg_timeout)
        self.read_stamp += 1

    def room(self, now: float) -> int:
        """How many more messages nsqd's protocol lets it send now: the RDY
        last queued (and what it may still send under a higher one before it
        read this one) less the messages it may still have in flight.  A
        message unanswered for longer than ``msg_timeout`` may have timed out
        at nsqd, which then sends another in its place (or the same again):
        those do not count."""
        state = self.rdy_state
        if state is None:
            return 0
        return self.rdy_limit + self.grace - max(0, state.in_flight - self._count_stale(now))

    def _superseded(self, arriving: list[Message]) -> int:
        """Unanswered messages that nsqd is sending again (a message is in
        flight once at a time: one that comes again was timed out there,
        whatever the time says, e.g. by a channel emptied).  Queued, not handed
        out yet, the old copy is dropped (the new one takes its place); handed
        out, it stops counting as in flight.  Rare: only beyond RDY."""
        ids = {m.id for m in arriving}
        first_recent = self._first_recent
        superseded = 0
        for m in self.out:
            if m.id in ids and m._read >= first_recent:
                superseded += 1
        queue = self.consumer._queue
        old = [m for m in queue if m._responder is self and m.id in ids]
        for m in old:
            queue.remove(m)
            m.responded = "requeued"  # by nsqd: nothing to answer
            self.consumer._rdy.on_settled(self)
        return superseded

    def _count_stale(self, now: float) -> int:
        """How many unanswered messages arrived before the last
        ``msg_timeout`` (a bucket's width less at most: counted as arrived
        when their bucket began, so never one too many in flight)."""
        if now < self._stale_until:
            return self._stale  # answers since can only have made it smaller
        cutoff = now - self.msg_timeout
        first_recent = None
        for stamp, start in self.arrivals:
            if start > cutoff:
                first_recent = stamp
                self._stale_until = start + self.msg_timeout
                break
        if first_recent is None:
            first_recent = self.read_stamp
            self._stale_until = math.inf  # until the next read
        self._first_recent = first_recent
        # Rare (only beyond RDY): the unanswered messages, handed out or queued.
        self._stale = sum(1 for m in self.out if m._read < first_recent) + sum(
            1 for m in self.consumer._queue if m._responder is self and m._read < first_recent
        )
        return self._stale

    def admit(self, arriving: list[Message], now: float) -> int:
        """How many of the ``arriving`` messages (in order) nsqd's protocol
        allows (see :meth:`room`); those beyond the RDY last queued use up the
        room left under the one before."""
        state = self.rdy_state
        if state is None:
            return 0
        stale = self._count_stale(now)
        superseded = self._superseded(arriving)  # (drops queued copies first)
        in_flight = max(0, state.in_flight - stale - superseded)
        limit = self.rdy_limit
        admitted = max(0, min(len(arriving), limit + self.grace - in_flight))
        # The ones beyond RDY among those just admitted use the grace up.
        beyond = max(0, in_flight + admitted - limit) - max(0, in_flight - limit)
        self.grace -= min(beyond, self.grace)
        return admitted

    def wake(self) -> None:
        """Room may have come for what is held (an answer, a higher RDY, leaving)."""
        if self._room is not None:
            self._room.set()

    def hold(self, messages: list[Message]) -> Awaitable[None]:
        """Keep ``messages`` (beyond RDY, or the writes backlogged): reading
        this connection waits on the returned awaitable, which hands them to
        the consumer as room comes."""
        self.held.extend(messages)
        state = self.rdy_state
        if not self._warned and state is not None and state.in_flight >= self.rdy_limit:
            self._warned = True
            log.warning(
                "%s: nsqd sent more messages than RDY %d allows (%d in flight, %d more "
                "held): reading it waits until earlier ones are answered (nsqd resends "
                "messages that timed out; or it ignores RDY)",
                self.address,
                self.rdy_limit,
                state.in_flight,
                len(self.held),
            )
        return self._release()

    async def _release(self) -> None:
        """Hand what is held to the consumer as RDY allows, and wait for the
        writes to drain: the connection reads nothing meanwhile.  While it
        waits, a NOP every heartbeat interval keeps nsqd from dropping a
        client it has not heard from (its handlers may take that long)."""
        consumer = self.consumer
        conn = self.conn
        keepalive = consumer.config.heartbeat_interval
        held = self.held
        next_nop = trio.current_time() + (keepalive or math.inf)
        while True:
            if conn.backlogged:
                await conn.wait_for_room()
                continue
            if self.rdy_state is None:  # the connection is leaving: nothing is answered
                held.clear()
                return
            now = trio.current_time()
            if consumer._closing:
                room = len(held)  # requeued at once, nothing handed out
            else:
                room = self.admit(list(held), now)
            if room > 0:
                consumer._accept(self, [held.popleft() for _ in range(room)], now)
                continue
            if not held:
                return
            if now >= next_nop:
                next_nop = now + (keepalive or math.inf)
                try:
                    conn.send_nowait(commands.nop())
                except NSQError:
                    pass  # its reader finds out how it ended
            # Until an answer or a higher RDY, or an arrival stops counting.
            self._room = room_event = trio.Event()
            try:
                with trio.move_on_at(min(next_nop, self._stale_until)):
                    await room_event.wait()
            finally:
                self._room = None

    def start_close(self) -> None:
        """Queue CLS (once): nsqd sends nothing more and answers CLOSE_WAIT."""
        if self.cls is None:
            try:
                self.cls = self.conn.request_nowait(commands.cls())
            except NSQError:
                pass  # already closed: nothing more comes from it


class Consumer:
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
        self._rdy: RdyController[_Session] = RdyController(
            config.max_in_flight, config.low_rdy_idle_timeout
        )
        self._backoff = Backoff(config.backoff_policy, self._rng)
        self._backoff_wakeup = trio.Event()
        # RDY raises wait until the lowerings that freed their budget are written
        # (on other connections, so no single buffer orders them): the lowered
        # sessions not known to be written yet, the raises held back, and the
        # task that flushes the former and then sends the latter.
        self._rdy_lowered: list[_Session] = []
        # Dicts as ordered sets: iterating a set of objects follows their memory
        # addresses, and seeded simulations must repeat exactly.
        self._rdy_held: dict[_Session, None] = {}
        self._rdy_barrier_wakeup = trio.Event()
        self._sessions: dict[_Session, None] = {}
        self._discovered: dict[str, trio.CancelScope] = {}
        # Messages received and not yet handed out (to a handler worker or to
        # ``async for``), in arrival order, and the tasks waiting for one.
        self._queue: deque[Message] = deque()
        self._queue_waiters = trio.lowlevel.ParkingLot()
        self._queue_closed = False
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
        self._serving: dict[_Session, None] = {}
        # A KeyboardInterrupt or SystemExit a handler raised: re-raised on exit.
        self._interrupted: BaseException | None = None
        self._received = 0
        self._finished = 0
        self._requeued = 0
        self._given_up = 0
        self._closing = False
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
        if self._closing:
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
        if queue and since < _YIELD_EVERY and not self._queue_closed:
            # The fast path, on almost every message: a message is there and
            # no yield is due; a cancellation point still.
            self._since_yield = since
            if cancel_may_be_pending():
                await trio.lowlevel.checkpoint_if_cancelled()
            message = queue.popleft()
            message._responder.out[message] = None
            return message
        return await self._next_slowly(since)

    async def _next_slowly(self, since: int) -> Message:
        """__anext__ when a yield is due, the queue is empty or closed."""
        if self._stack is None:
            raise RuntimeError("iterate the Consumer inside 'async with'")
        if since >= _YIELD_EVERY:
            self._since_yield = 0
            await trio.lowlevel.checkpoint()
        else:
            self._since_yield = since
            await trio.lowlevel.checkpoint_if_cancelled()
        while not self._queue:
            if self._queue_closed:
                raise StopAsyncIteration
            self._since_yield = 0
            await self._queue_waiters.park()
        if self._queue_closed:
            raise StopAsyncIteration
        message = self._queue.popleft()
        message._responder.out[message] = None
        return message

    # --- lifecycle ---

    async def __aenter__(self) -> Consumer:
        if self._stack is not None:
            raise RuntimeError("a Consumer can be entered only once")
        stack = AsyncExitStack()
        self._nursery = await stack.enter_async_context(trio.open_nursery())
        self._handlers = await stack.enter_async_context(trio.open_nursery())
        self._stack = stack
        self._telemetry = telemetry.for_consumer(
            self.config,
            self.topic,
            self.channel,
            msg_timeout=self._msg_timeout,
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
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
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
        return False  # the block's own exception propagates unchanged

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
        if self._closing:
            return
        self._closing = True
        self._queue_closed = True
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
            await self._stack.__aexit__(None, None, None)

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

    async def _finish_closes(self, sessions: list[_Session]) -> None:
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
        closed: list[tuple[_Session, float]] = []
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
            session = message._responder
            assert isinstance(session, _Session)
            log.debug("%s: leaving: requeueing %r (REQ 0)", session.address, message)
            self._settle(session, message, commands.req(message.id, 0), False, None)

    def _msg_timeout(self, message: Message) -> float:
        """How long nsqd gives ``message`` before redelivering it."""
        session = message._responder
        timeout = session.conn.msg_timeout if isinstance(session, _Session) else None
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
        while not self._closing:
            started = trio.current_time()
            worked = await self._connect_and_serve(address)
            if self._closing:
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
        session = _Session(self, conn)
        on_messages = functools.partial(self._on_messages, session)
        # Shielded: leaving, even when cancelled, still needs the connection to
        # requeue what is unanswered and hear CLOSE_WAIT; _exit cancels it.
        with session.scope:
            self._serving[session] = None
            try:
                if self._closing:
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
                if self._closing:
                    self._settled_event.set()  # its messages can no longer be answered
        if not self._closing:
            self._update_rdy()

    # --- messages ---

    def _on_messages(self, session: _Session, messages: list[Message]) -> Awaitable[None] | None:
        """Take one read's messages from ``session``'s reader (see
        MessagesCallback): within RDY, at once; beyond it (or with its writes
        backlogged), held while reading that connection waits."""
        now = trio.current_time()
        state = session.rdy_state
        if state is not None:
            # When they arrived (their read's number is in each): for counting
            # them against RDY only while nsqd may still have them in flight.
            session.note_read(now)
            if session.held or session.conn.backlogged:
                return session.hold(messages)
            if not self._closing and len(messages) > session.rdy_limit - state.in_flight:
                # More than RDY, unless nsqd has not read a lowered one yet,
                # or some in flight have timed out there.
                room = session.admit(messages, now)
                if len(messages) > room:
                    if room > 0:
                        self._accept(session, messages[:room], now)
                    return session.hold(messages[room:])
        self._accept(session, messages, now)
        return None

    def _on_oversized(self, session: _Session, frame: OversizedMessage) -> None:
        """A message above ``max_frame_size`` (its body was read past, never
        held): requeued like a failed one, given up (FIN) after
        ``max_attempts``; the error says so, and what to raise."""
        message = session.make_message(frame.timestamp, frame.attempts, frame.id, b"")
        self._received += 1
        if self._rdy.on_messages(session, 1, trio.current_time()):
            self._update_rdy()
        config = self.config
        limit = config.max_frame_size
        if self._closing:
            self._abandon(message)
        elif config.max_attempts and frame.attempts > config.max_attempts:
            log.error(
                "%s: giving up on message %s (FIN) after %d attempts: its %d bytes are "
                "more than max_frame_size=%d lets the consumer read (raise it to receive "
                "such messages)",
                session.address,
                frame.id.decode(errors="replace"),
                frame.attempts,
                frame.size,
                limit,
            )
            message.responded = "finished"
            self._given_up += 1
            self._settle(session, message, commands.fin(frame.id), True, None, count=False)
        else:
            delay = min(config.default_requeue_delay * frame.attempts, config.max_requeue_delay)
            log.error(
                "%s: message %s is %d bytes, more than max_frame_size=%d lets the "
                "consumer read: not read, requeued in %.0fs (attempt %d; given up after "
                "max_attempts=%d); raise max_frame_size to receive it",
                session.address,
                frame.id.decode(errors="replace"),
                frame.size,
                limit,
                delay,
                frame.attempts,
                config.max_attempts,
            )
            message.responded = "requeued"
            data = commands.req(frame.id, round(delay * 1000))
            self._settle(session, message, data, False, None)

    def _accept(self, session: _Session, messages: list[Message], now: float) -> None:
        """Messages the consumer takes (within RDY): queued for the handlers or
        ``async for``, past ``max_attempts`` given up, requeued while leaving."""
        count = len(messages)
        self._received += count
        due = self._rdy.on_messages(session, count, now)
        if self._closing:
            for message in messages:
                self._abandon(message)  # sent before nsqd read our CLS
            if session.cls is not None and session.cls.done:
                session.straggled = True
                self._straggled.set()
            return
        max_attempts = self.config.max_attempts
        if max_attempts and any(m.attempts > max_attempts for m in messages):
            assert self._handlers is not None
            for message in messages:
                if message.attempts > max_attempts:
                    session.out[message] = None
                    self._giving_up.add(message)
                    self._handlers.start_soon(self._give_up, message)
            messages = [m for m in messages if m.attempts <= max_attempts]
        self._queue.extend(messages)
        if self._handler is None:
            if self._queue_waiters:
                # One iterating task per message at most, as one at a time did.
                self._queue_waiters.unpark(count=len(messages))
        elif not self._waking and messages:
            self._wake_workers(1)
        if due:
            self._update_rdy()

    # --- the handler pool ---
    #
    # Handlers run in a pool of worker tasks taking messages from the queue, not
    # in a task per message: spawning a task costs more than handing a message
    # to a parked worker.  The pool grows on demand, never beyond max_in_flight
    # (which bounds what nsqd hands out), and workers are woken sparingly: at
    # most one wake-up is outstanding for new messages, and a worker just woken
    # that finds more queued than workers on their way wakes two more.  A quick
    # handler thus drains a whole read with a few workers (no task switch per
    # message), while a handler that waits has the pool fan out exponentially,
    # in a few scheduler passes.

    def _wake_workers(self, count: int) -> None:
        assert self._handlers is not None
        for _ in range(count):
            if self._queue_waiters:
                self._queue_waiters.unpark()
            elif self._workers < self._pool_limit and not self._queue_closed:
                self._workers += 1
                self._handlers.start_soon(self._worker)
            else:
                return
            self._waking += 1

    async def _worker(self) -> None:
        """Run the handler on queued messages, one at a time, until closing; a
        worker over a lowered ``max_in_flight`` leaves once its message is settled."""
        woken = True  # counted in _waking until it runs
        fresh = False
        handler = self._handler
        assert handler is not None
        try:
            while self._workers <= self._pool_limit:
                if woken:
                    woken = False
                    fresh = True
                    self._waking -= 1
                    # A worker woken as the consumer is cancelled must not start
                    # a handler it cannot finish.
                    await trio.lowlevel.checkpoint_if_cancelled()
                if self._queue:
                    message = self._queue.popleft()
                    message._responder.out[message] = None
                    if fresh:
                        fresh = False
                        spare = len(self._queue) - self._waking
                        if spare > 0:
                            self._wake_workers(min(2, spare))
                    # _handle, inline: a coroutine less per message.
                    try:
                        result = handler(message)
                        if type(result) is CoroutineType:
                            await result
                        elif result is not None and inspect.isawaitable(result):
                            await result
                    except Exception as exc:
                        log.warning("handler failed for %r: %r", message, exc, exc_info=True)
                        await message.requeue()
                    else:
                        if message.responded is None:
                            # finish(), minus its cancellation point: the
                            # handler is done, its answer must not be lost.
                            message.responded = "finished"
                            message._responder._finish(message)
                elif self._queue_closed:
                    return
                else:
                    await self._queue_waiters.park()
                    woken = True
        except (KeyboardInterrupt, SystemExit) as exc:
            # Workers run unprotected (handlers must stay interruptible), so a
            # Ctrl-C may land here: the consumer leaves and re-raises it.
            self._interrupt(exc)
        finally:
            self._workers -= 1
            if woken:
                self._waking -= 1
            if self._queue and not self._waking and self._queue_waiters:
                # Leaving over the limit: pass the queue on to a parked worker.
                self._queue_waiters.unpark()
                self._waking += 1

    async def _give_up(self, message: Message) -> None:
        self._given_up += 1
        try:
            if self._telemetry is None:
                await self._call_give_up(message)
            else:
                await self._telemetry.given_up(message, self._call_give_up)
        except (KeyboardInterrupt, SystemExit) as exc:
            self._interrupt(exc)
            return
        finally:
            self._giving_up.discard(message)
        if not message.has_responded:
            message.responded = "finished"
            session = message._responder
            assert isinstance(session, _Session)
            # A give-up is a FIN: as in go-nsq it counts as a success, so a give-up
            # during a backoff test ends the test instead of leaving it open.
            self._settle(session, message, commands.fin(message.id), True, True, count=False)

    async def _call_give_up(self, message: Message) -> None:
        try:
            if self._give_up_handler is None:
                log.warning(
                    "giving up on %r after %d attempts (max_attempts=%d)",
                    message,
                    message.attempts,
                    self.config.max_attempts,
                )
            else:
                result = self._give_up_handler(message)
                if inspect.isawaitable(result):
                    await result
        except Exception:
            log.exception("give_up callback failed for %r", message)

    def _settle(
        self,
        session: _Session,
        message: Message,
        data: bytes,
        fin: bool,
        success: bool | None,
        count: bool = True,
    ) -> None:
        """Update backoff and RDY for a settled ``message``, then queue ``data``
        (its FIN if ``fin``, else its REQ); nothing here waits.

        ``success`` feeds backoff: True a success, False a failure, None neither;
        ``count=False`` leaves the finished/requeued counters alone (give-ups).
        RDY goes first: a failure that starts a backoff queues RDY 0 before the
        REQ, or nsqd could hand the requeued message straight back.
        """
        session.out.pop(message, None)
        due = self._rdy.on_settled(session)
        if session.held:
            session.wake()
        # A success only matters to backoff while it tests the waters.
        if (
            success is not None
            and not self._closing
            and (not success or self._backoff.state is BackoffState.TESTING)
        ):
            now = trio.current_time()
            changed = self._backoff.on_success(now) if success else self._backoff.on_failure(now)
            if changed:
                self._rdy.set_mode(self._backoff.state)
                self._backoff_wakeup.set()
                due = True
        if due:
            self._update_rdy()
        sent = session._send(data)
        if self._closing:
            self._settled_event.set()  # only _drain waits for it, after _closing is set
        if sent and count:
            if fin:
                self._finished += 1
            else:
                self._requeued += 1

    # --- RDY and backoff ---

    def _update_rdy(self) -> None:
        if self._closing:
            return
        for session in self._rdy.rebalance(trio.current_time()):
            if session in self._rdy_held:
                continue  # its latest decision goes out after the barrier
            rdy = self._rdy.conns[session].rdy
            if rdy > session.wire_rdy and self._rdy_lowered:
                # nsqd must see the lowering before the raise it paid for.
                self._rdy_held[session] = None
                continue
            if rdy < session.wire_rdy:
                self._rdy_lowered.append(session)
                self._rdy_barrier_wakeup.set()
            session.flush_rdy()

    @trio.lowlevel.enable_ki_protection
    async def _rdy_barrier_loop(self) -> None:
        """Send held RDY raises once the lowered connections have written their RDY."""
        while True:
            await self._rdy_barrier_wakeup.wait()
            self._rdy_barrier_wakeup = trio.Event()
            # Each stays listed until written: raises decided meanwhile are held
            # too.  Not for ever: an nsqd that reads nothing must not hold
            # back every other connection's RDY.
            with trio.move_on_after(_RDY_BARRIER_TIMEOUT) as waited:
                while self._rdy_lowered:
                    await self._rdy_lowered[0].conn.flush()  # returns early if it closes
                    del self._rdy_lowered[0]
            if waited.cancelled_caught:
                log.warning(
                    "%s: a lowered RDY is still not written after %.0fs (nsqd is not "
                    "reading): the other connections get theirs anyway",
                    ", ".join(s.address for s in self._rdy_lowered),
                    _RDY_BARRIER_TIMEOUT,
                )
                self._rdy_lowered.clear()
            held, self._rdy_held = self._rdy_held, {}
            for session in held:
                session.flush_rdy()

    @trio.lowlevel.enable_ki_protection
    async def _backoff_loop(self) -> None:
        while True:
            self._backoff_wakeup = trio.Event()
            deadline = self._backoff.deadline
            with trio.move_on_at(deadline if deadline is not None else math.inf):
                await self._backoff_wakeup.wait()
            if self._backoff.on_timer(trio.current_time()):
                self._rdy.set_mode(self._backoff.state)
            self._update_rdy()

    @trio.lowlevel.enable_ki_protection
    async def _rdy_loop(self) -> None:
        """Periodic redistribution (RDY rotation when max_in_flight < connections)."""
        interval = min(5.0, self.config.low_rdy_idle_timeout / 2)
        while True:
            await trio.sleep(interval)
            self._update_rdy()

    # --- discovery ---

    @trio.lowlevel.enable_ki_protection
    async def _discovery(self) -> None:
        config = self.config
        # Imported here: a consumer given only nsqd addresses never pays for httpx.
        import httpx

        async with httpx.AsyncClient(
            transport=config.http_transport,
            timeout=httpx.Timeout(min(config.lookupd_poll_interval, 10.0)),
        ) as client:
            while not self._closing:
                await self._poll_lookupds(client)
                jitter = config.lookupd_poll_jitter
                factor = 1 + jitter * (self._rng.random() - 0.5)
                await trio.sleep(config.lookupd_poll_interval * factor)

    async def _poll_lookupds(self, client: httpx.AsyncClient) -> None:
        import httpx

        addresses = self.config.lookupd_http_addresses
        answers: list[set[str] | None] = [None] * len(addresses)
        timeout = min(self.config.lookupd_poll_interval, 10.0)

        async def ask(index: int) -> None:
            with trio.move_on_after(timeout):
                try:
                    answers[index] = await lookup(client, addresses[index], self.topic)
                except (httpx.HTTPError, httpx.InvalidURL, ValueError) as exc:
                    log.warning("lookupd %s: %s", addresses[index], exc)
            found = answers[index]
            if found is not None:
                # Connect at once: a slow lookupd must not hold back the others.
                self._connect_discovered(found)

        async with trio.open_nursery() as nursery:
            for index in range(len(addresses)):
                nursery.start_soon(ask, index)
        if all(answer is not None for answer in answers):
            # Only when every lookupd answered is absence meaningful.
            found = merge(answers)
            for address in set(self._discovered) - found:
                log.info("%s no longer has %s: disconnecting", address, self.topic)
                self._discovered.pop(address).cancel()
                for session in self._serving:
                    if session.address == address:
                        session.scope.cancel()  # its connection is shielded

    def _connect_discovered(self, found: set[str]) -> None:
        assert self._nursery is not None
        static = set(self.config.nsqd_tcp_addresses)
        for address in sorted(found - static - set(self._discovered)):
            if self._closing:
                return
            scope = trio.CancelScope()
            self._discovered[address] = scope
            self._nursery.start_soon(self._discovered_connection, address, scope)

    @trio.lowlevel.enable_ki_protection
    async def _discovered_connection(self, address: str, scope: trio.CancelScope) -> None:
        """One attempt; the next lookupd poll reconnects (per the client guide)."""
        with scope:
            await self._connect_and_serve(address)
        if self._discovered.get(address) is scope:
            del self._discovered[address]

    # --- for the front ends (trionsq.hosting.consumer) ---

    def take_ready(self, most: int) -> list[Message]:
        """Up to ``most`` of the messages already read, handed out (as
        ``__anext__`` hands each out, without a step of iteration each); none
        once the consumer is closing.  A front end's pump takes the rest of a
        read with it after ``async for`` gave it the first."""
        queue = self._queue
        if self._queue_closed or not queue:
            return []
        taken = [queue.popleft() for _ in range(min(most, len(queue)))]
        for message in taken:
            message._responder.out[message] = None
        return taken
