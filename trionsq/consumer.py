"""Consuming: connections, RDY, backoff, discovery and clean shutdown, in one nursery.

Every task a :class:`Consumer` starts lives in the nurseries its ``async with``
opens, so nothing outlives the block.  Leaving it sends CLS to every nsqd, waits
(up to ``close_timeout``) for the messages already handed out to be finished or
requeued, requeues at once what arrives meanwhile, then closes.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import random
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import httpx
import trio

from .backoff import Backoff, BackoffState
from .config import Config
from .connection import Connection, NegotiationError
from .lookupd import lookup, merge
from .message import Message
from .protocol import commands
from .protocol.errors import NSQError
from .protocol.frames import MessageFrame
from .protocol.names import is_valid_channel_name, is_valid_topic_name
from .rdy import RdyController

__all__ = ["Consumer", "ConsumerStats", "ConnectionStats", "Handler", "GiveUpHandler"]

log = logging.getLogger("trionsq.consumer")

#: ``handler(message)``: return (or complete) to FIN, raise to REQ.
Handler = Callable[[Message], Awaitable[object] | object]
#: ``give_up(message)``: called for messages past ``max_attempts`` (then FINed).
GiveUpHandler = Callable[[Message], Awaitable[object] | object]

_CLS_TIMEOUT = 5.0
#: ``async for`` hands out this many queued messages between two yields to the
#: scheduler: fewer passes through the run loop (the writer then sends the FINs
#: of a whole batch at once), while other tasks still get their turn.
_YIELD_EVERY = 256


@dataclass(frozen=True, slots=True)
class ConnectionStats:
    address: str
    rdy: int
    in_flight: int
    max_rdy_count: int


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

    def _finish(self, message: Message) -> None:
        self.consumer._settle(self, commands.fin(message.id), True, True)

    def _requeue(self, message: Message, delay: float | None, backoff: bool) -> None:
        if delay is None:
            config = self.consumer.config
            delay = min(config.default_requeue_delay * message.attempts, config.max_requeue_delay)
        data = commands.req(message.id, round(delay * 1000))
        self.consumer._settle(self, data, False, False if backoff else None)

    async def _touch(self, message: Message) -> None:
        try:
            await self.conn.send(commands.touch(message.id))
        except NSQError as exc:
            log.info("%s: could not touch a message: %s", self.address, exc)


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

    Leaving the block sends CLS to every nsqd, requeues at once the messages
    not handed out yet, and waits up to ``close_timeout`` for the ones handed
    out (to a handler or through iteration) to be finished or requeued; handlers
    still running then are cancelled and their messages left to nsqd's timeout.
    Cancellation skips the wait.  Nothing the consumer started outlives the
    block.
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
        self._unsettled = 0
        self._settled_event = trio.Event()
        self._received = 0
        self._finished = 0
        self._requeued = 0
        self._given_up = 0
        self._closing = False
        self._stack: AsyncExitStack | None = None
        self._nursery: trio.Nursery | None = None
        self._handlers: trio.Nursery | None = None
        self._connected = trio.Event()

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
                    s.address, state.rdy, state.in_flight, state.max_rdy_count
                )
                for s, state in self._rdy.conns.items()
            },
        )

    def is_starved(self) -> bool:
        """The client guide's ``is_starved``: a connection has about as many
        messages in flight as its RDY allows (time to process a batch)."""
        return self._rdy.is_starved()

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

    def __aiter__(self) -> Consumer:
        if self._handler is not None:
            raise RuntimeError("a Consumer with a handler cannot be iterated")
        return self

    async def __anext__(self) -> Message:
        if self._stack is None:
            raise RuntimeError("iterate the Consumer inside 'async with'")
        # Always a cancellation point; a scheduling point only every
        # _YIELD_EVERY messages while some are queued (the queue holds at most
        # what RDY allowed, so the run without a yield is bounded).
        self._since_yield += 1
        if self._since_yield >= _YIELD_EVERY:
            self._since_yield = 0
            await trio.lowlevel.checkpoint()
        else:
            await trio.lowlevel.checkpoint_if_cancelled()
        while not self._queue:
            if self._queue_closed:
                raise StopAsyncIteration
            self._since_yield = 0
            await self._queue_waiters.park()
        if self._queue_closed:
            raise StopAsyncIteration
        return self._queue.popleft()

    # --- lifecycle ---

    async def __aenter__(self) -> Consumer:
        if self._stack is not None:
            raise RuntimeError("a Consumer can be entered only once")
        stack = AsyncExitStack()
        self._nursery = await stack.enter_async_context(trio.open_nursery())
        self._handlers = await stack.enter_async_context(trio.open_nursery())
        self._stack = stack
        nursery = self._nursery
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
    ) -> bool | None:
        assert self._stack is not None and self._nursery is not None
        assert self._handlers is not None
        try:
            await self._drain()
        finally:
            self._handlers.cancel_scope.cancel()
            self._nursery.cancel_scope.cancel()
            try:
                with trio.CancelScope(shield=True):
                    for session in list(self._sessions):
                        await session.conn.aclose()
            finally:
                # Whatever happens, the nurseries must be exited.
                result = await self._stack.__aexit__(exc_type, exc, tb)
        return result

    async def _drain(self) -> None:
        """CLS everywhere, then give handed-out messages time to be settled."""
        self._closing = True
        self._queue_closed = True
        # Wake every parked worker or iterator: each counts as woken.
        self._waking += len(self._queue_waiters) if self._handler is not None else 0
        self._queue_waiters.unpark_all()
        async with trio.open_nursery() as nursery:
            for session in list(self._sessions):
                nursery.start_soon(self._close_session, session)
        if self._handler is None:
            # Messages never handed out go back at once (without backoff).  With
            # a handler, every message received has been given to the handler
            # pool: the workers go on with them during close_timeout.
            while self._queue:
                await self._queue.popleft().requeue(0, backoff=False)
        with trio.move_on_after(self.config.close_timeout):
            while self._unsettled > 0:
                self._settled_event = trio.Event()
                await self._settled_event.wait()
        if self._unsettled:
            log.warning("closing with %d message(s) still unanswered", self._unsettled)
        # The last FINs and REQs may still be queued: let them out before closing.
        with trio.move_on_after(_CLS_TIMEOUT):
            for session in list(self._sessions):
                await session.conn.flush()

    async def _close_session(self, session: _Session) -> None:
        with trio.move_on_after(_CLS_TIMEOUT):
            try:
                await session.conn.request(commands.cls())
            except NSQError as exc:
                log.info("%s: CLS failed: %s", session.address, exc)

    # --- connections ---

    async def _static_connection(self, address: str) -> None:
        """Keep a configured nsqd connected, reconnecting with growing delays."""
        failures = 0
        retry = Backoff(self.config.reconnect_backoff, self._rng)
        while not self._closing:
            started = trio.current_time()
            await self._connect_and_serve(address)
            if self._closing:
                return
            # A connection that lived a while resets the delay.
            lived = trio.current_time() - started
            failures = 1 if lived > self.config.reconnect_backoff.max else failures + 1
            delay = retry.duration(min(failures, retry.max_level))
            log.info("reconnecting to %s in %.1fs", address, delay)
            await trio.sleep(delay)

    async def _connect_and_serve(self, address: str) -> None:
        try:
            conn = await Connection.open(address, self.config)
        except (NSQError, NegotiationError) as exc:
            log.warning("cannot connect to %s: %s", address, exc)
            return
        await self._serve(conn)

    async def _serve(self, conn: Connection) -> None:
        session = _Session(self, conn)
        on_message = functools.partial(self._on_message, session)

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(conn.run, on_message)
                try:
                    await conn.request(commands.sub(self.topic, self.channel))
                except NSQError as exc:
                    log.warning("%s: SUB failed: %s", conn.address, exc)
                    await conn.aclose()
                    return
                if self._closing:
                    await conn.aclose()
                    return
                self._sessions[session] = None
                self._rdy.add(session, conn.max_rdy_count, trio.current_time())
                self._connected.set()
                log.info("%s: subscribed to %s/%s", conn.address, self.topic, self.channel)
                self._update_rdy()
                await conn.wait_closed()
        finally:
            self._sessions.pop(session, None)
            self._rdy.remove(session)
            with trio.CancelScope(shield=True):
                await conn.aclose()
        if not self._closing:
            self._update_rdy()

    # --- messages ---

    def _on_message(self, session: _Session, frame: MessageFrame) -> Awaitable[None] | None:
        """Take a message from ``session``'s reader (see MessageCallback)."""
        message = Message(
            frame.id, frame.body, frame.attempts, frame.timestamp, session.address, session
        )
        self._received += 1
        self._unsettled += 1
        due = self._rdy.on_message(session, trio.current_time())
        if self._closing:
            return message.requeue(0, backoff=False)
        max_attempts = self.config.max_attempts
        if max_attempts and message.attempts > max_attempts:
            assert self._handlers is not None
            self._handlers.start_soon(self._give_up, message)
        else:
            self._queue.append(message)
            if self._handler is None:
                if self._queue_waiters:
                    self._queue_waiters.unpark()
            elif not self._waking:
                self._wake_workers(1)
        if due:
            self._update_rdy()
        return None

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
                    if fresh:
                        fresh = False
                        spare = len(self._queue) - self._waking
                        if spare > 0:
                            self._wake_workers(min(2, spare))
                    await self._handle(message)
                elif self._queue_closed:
                    return
                else:
                    await self._queue_waiters.park()
                    woken = True
        finally:
            self._workers -= 1
            if woken:
                self._waking -= 1
            if self._queue and not self._waking and self._queue_waiters:
                # Leaving over the limit: pass the queue on to a parked worker.
                self._queue_waiters.unpark()
                self._waking += 1

    async def _handle(self, message: Message) -> None:
        assert self._handler is not None
        try:
            result = self._handler(message)
            # Sync handlers return None: skip the (comparatively slow) awaitable check.
            if result is not None and inspect.isawaitable(result):
                await result
        except Exception as exc:
            log.warning("handler failed for %r: %r", message, exc, exc_info=True)
            await message.requeue()
        else:
            await message.finish()

    async def _give_up(self, message: Message) -> None:
        self._given_up += 1
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
        if not message.has_responded:
            message.responded = "finished"
            session = message._responder
            assert isinstance(session, _Session)
            # A give-up is a FIN: as in go-nsq it counts as a success, so a give-up
            # during a backoff test ends the test instead of leaving it open.
            self._settle(session, commands.fin(message.id), True, True, count=False)

    def _settle(
        self,
        session: _Session,
        data: bytes,
        fin: bool,
        success: bool | None,
        count: bool = True,
    ) -> None:
        """Update backoff and RDY for a settled message, then queue ``data``
        (its FIN if ``fin``, else its REQ); nothing here waits.

        ``success`` feeds backoff: True a success, False a failure, None neither;
        ``count=False`` leaves the finished/requeued counters alone (give-ups).
        RDY goes first: a failure that starts a backoff queues RDY 0 before the
        REQ, or nsqd could hand the requeued message straight back.
        """
        due = self._rdy.on_settled(session)
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
        self._unsettled -= 1
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

    async def _rdy_barrier_loop(self) -> None:
        """Send held RDY raises once the lowered connections have written their RDY."""
        while True:
            await self._rdy_barrier_wakeup.wait()
            self._rdy_barrier_wakeup = trio.Event()
            # Each stays listed until written: raises decided meanwhile are held too.
            while self._rdy_lowered:
                await self._rdy_lowered[0].conn.flush()  # returns early if it closes
                del self._rdy_lowered[0]
            held, self._rdy_held = self._rdy_held, {}
            for session in held:
                session.flush_rdy()

    async def _backoff_loop(self) -> None:
        while True:
            self._backoff_wakeup = trio.Event()
            deadline = self._backoff.deadline
            with trio.move_on_at(deadline if deadline is not None else math.inf):
                await self._backoff_wakeup.wait()
            if self._backoff.on_timer(trio.current_time()):
                self._rdy.set_mode(self._backoff.state)
            self._update_rdy()

    async def _rdy_loop(self) -> None:
        """Periodic redistribution (RDY rotation when max_in_flight < connections)."""
        interval = min(5.0, self.config.low_rdy_idle_timeout / 2)
        while True:
            await trio.sleep(interval)
            self._update_rdy()

    # --- discovery ---

    async def _discovery(self) -> None:
        config = self.config
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

    def _connect_discovered(self, found: set[str]) -> None:
        assert self._nursery is not None
        static = set(self.config.nsqd_tcp_addresses)
        for address in sorted(found - static - set(self._discovered)):
            if self._closing:
                return
            scope = trio.CancelScope()
            self._discovered[address] = scope
            self._nursery.start_soon(self._discovered_connection, address, scope)

    async def _discovered_connection(self, address: str, scope: trio.CancelScope) -> None:
        """One attempt; the next lookupd poll reconnects (per the client guide)."""
        with scope:
            await self._connect_and_serve(address)
        if self._discovered.get(address) is scope:
            del self._discovered[address]
