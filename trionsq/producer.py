"""Publishing: one pipelined connection, with failover between nsqds."""

from __future__ import annotations

from collections import deque
from collections.abc import Coroutine, Iterable, Sequence
from contextlib import AsyncExitStack
from typing import Any

import trio

from . import telemetry
from .config import Config
from .connection import Connection
from .lifecycle import CLOSED, NEW, OPEN, AsyncContext, Lifecycle, Moves
from .protocol import commands
from .protocol.errors import NSQError
from .publishing import ProducerStats, PublishCore, Rotation

__all__ = ["Producer", "ProducerStats"]

# The verbs of Producer._publish.
_PUB = "PUB"
_MPUB = "MPUB"
_DPUB = "DPUB"

#: A Producer's life: entered once (OPEN inside its ``async with``), CLOSED
#: from the first step of leaving it.
MOVES = Moves(
    "Producer",
    NEW,
    {NEW: {OPEN}, OPEN: {CLOSED}},
    refusals={OPEN: "a Producer can be entered only once"},
)


class Producer(AsyncContext):
    """Publishes to nsqd over TCP.

    ::

        async with trionsq.Producer(nsqd_tcp_addresses=["127.0.0.1:4150"]) as producer:
            await producer.publish("topic", b"body")

    Concurrent publishes share one connection and are pipelined, at most
    ``publish_window`` awaiting their response at a time.  The first reachable
    address (in order, starting with the last one that worked) is used; when its
    connection fails the next publish reconnects, failing over to the others.
    A publish whose connection is lost before its response raises
    :class:`~trionsq.connection.ConnectionClosedError` (it may or may not have
    been published).  nsqd's refusals raise their typed errors (a refused
    connection too, when every nsqd refused it: ``AuthFailedError``...).
    """

    def __init__(
        self,
        nsqd_tcp_addresses: Sequence[str] | None = None,
        *,
        config: Config | None = None,
        **options: Any,
    ) -> None:
        if config is None:
            config = Config(nsqd_tcp_addresses=tuple(nsqd_tcp_addresses or ()), **options)
        elif nsqd_tcp_addresses is not None or options:
            config = config.replace(
                **options,
                **({"nsqd_tcp_addresses": tuple(nsqd_tcp_addresses)} if nsqd_tcp_addresses else {}),
            )
        self.config = config
        self._rotation = Rotation(config.nsqd_tcp_addresses)
        self._core = PublishCore()
        self._conn: Connection | None = None
        self._connect_lock = trio.Lock()
        # The publish window: a count of places taken and the publishes queued
        # for one (FIFO, a freed place is handed to the first of them).  Unlike
        # trio.Semaphore, taking a free place does not yield: a publish waits
        # for its response anyway, and a yield more each costs scheduler passes.
        self._in_flight = 0
        self._window = config.publish_window
        self._window_waiters: deque[trio.lowlevel.Task] = deque()
        self._stack: AsyncExitStack | None = None
        self._nursery: trio.Nursery | None = None
        self._life = Lifecycle(MOVES)

    async def __aenter__(self) -> Producer:
        self._life.move(OPEN)
        stack = AsyncExitStack()
        self._nursery = await stack.enter_async_context(trio.open_nursery())
        self._stack = stack
        traced = telemetry.for_producer(self.config, lambda: self.address)
        if traced is not None:
            traced.instrument(self)  # its publish methods, on this instance
        return self

    async def _exit_block(self, exc: BaseException | None) -> None:
        self._life.move(CLOSED)
        assert self._stack is not None and self._nursery is not None
        # Whatever happens, the nursery must be exited (or Trio's stack breaks).
        self._nursery.cancel_scope.cancel()
        try:
            if self._conn is not None:
                with trio.CancelScope(shield=True):
                    await self._conn.aclose()
        finally:
            # The block's exception is not the nursery's: passing it would
            # wrap it in an exception group.
            await self._stack.__aexit__(None, None, None)

    @property
    def stats(self) -> ProducerStats:
        return self._core.stats(self._in_flight, self.config.publish_window)

    @property
    def address(self) -> str | None:
        """The nsqd currently connected to, if any."""
        conn = self._conn
        return conn.address if conn is not None and not conn.closed else None

    async def _run(self, conn: Connection) -> None:
        await conn.run()
        self._rotation.lost(conn.address, conn.close_reason)

    async def _connection(self) -> Connection:
        if self._life.state is not OPEN:
            raise RuntimeError("use the Producer inside 'async with'")
        conn = self._conn
        if conn is not None and not conn.closed:
            return conn  # the common case: no lock, no yield
        async with self._connect_lock:
            conn = self._conn
            if conn is not None and not conn.closed:
                return conn
            attempt = self._rotation.attempt()
            for address in attempt:
                try:
                    conn = await Connection.open(address, self.config)
                except Exception as exc:
                    attempt.failed(address, exc)
                    continue
                attempt.connected(address)
                self._conn = conn
                assert self._nursery is not None  # (set once OPEN)
                self._nursery.start_soon(self._run, conn)
                return conn
            raise attempt.error()

    async def _wait_for_place(self) -> None:
        """Queue for a place in the window (FIFO); a freed place is handed to
        the first in line, which wakes up holding it."""
        task = trio.lowlevel.current_task()
        waiters = self._window_waiters
        waiters.append(task)

        def abort(raise_cancel: Any) -> trio.lowlevel.Abort:
            waiters.remove(task)  # gave up waiting: it holds no place
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    async def _publish(self, verb: str, topic: str, payload: Any, delay: float = 0.0) -> None:
        """Check and encode one publish, send it pipelined and wait for its
        answer: the one body of :meth:`publish`, :meth:`multi_publish` and
        :meth:`deferred_publish`, each of which returns this coroutine (one
        coroutine a publish, not two: the difference shows at 256 tasks)."""
        core = self._core
        if verb is _PUB:
            # core.pub's checks, written out for the common case (a topic
            # already checked, a non-empty bytes body): the path of every PUB.
            if (
                type(payload) is bytes
                and payload
                and type(topic) is str
                and topic in core.valid_topics
            ):
                data = commands.pub(topic, payload)
            else:
                data = core.pub(topic, payload)
            batch = 0
        elif verb is _MPUB:
            data, batch = core.mpub(topic, payload)
        else:
            data = core.dpub(topic, payload, delay)
            batch = 0
        if self._in_flight < self._window and not self._window_waiters:
            self._in_flight += 1
        else:
            await self._wait_for_place()
        try:
            conn = self._conn
            # conn.life.state: conn.closed without a property call
            if conn is None or conn.life.state is not OPEN or self._life.state is not OPEN:
                conn = await self._connection()
            response = await conn.request(data)
        except (NSQError, OSError):
            core.errors += 1
            raise
        finally:
            if self._window_waiters:
                # The place goes to the next in line.
                trio.lowlevel.reschedule(self._window_waiters.popleft())
            else:
                self._in_flight -= 1
        core.answered(response, batch)

    def check_topic(self, verb: str, topic: str) -> None:
        """Raise what publishing to ``topic`` raises before sending anything
        (:func:`trionsq.protocol.names.check_topic`); valid names are
        remembered, so a topic published to again costs a set look-up."""
        self._core.check_topic(verb, topic)

    def publish(self, topic: str, body: bytes) -> Coroutine[Any, Any, None]:
        """PUB one message (await it: it returns once nsqd acknowledged)."""
        return self._publish(_PUB, topic, body)

    def multi_publish(self, topic: str, bodies: Iterable[bytes]) -> Coroutine[Any, Any, None]:
        """MPUB several messages atomically (await it)."""
        return self._publish(_MPUB, topic, bodies)

    def deferred_publish(self, topic: str, body: bytes, delay: float) -> Coroutine[Any, Any, None]:
        """DPUB: the message becomes visible after ``delay`` seconds (await it)."""
        return self._publish(_DPUB, topic, body, delay)

    async def connection(self) -> Connection:
        """The connection publishes go on, connected (failing over between the
        nsqds) as a publish connects it: for the front ends (trionsq.hosting.producer),
        which pipeline their publishes on it themselves."""
        return await self._connection()
