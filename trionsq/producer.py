"""Publishing: one pipelined connection, with failover between nsqds."""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Iterable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import trio

from .config import Config
from .connection import Connection, NegotiationError, NSQConnectionError
from .lifecycle import OPEN
from .protocol import commands
from .protocol.errors import (
    BadBodyError,
    BadMessageError,
    NSQError,
    NSQErrorResponse,
    ProtocolError,
)
from .protocol.frames import OK
from .protocol.names import check_topic
from .reasons import cannot_connect, naming

__all__ = ["Producer", "ProducerStats"]

log = logging.getLogger("trionsq.producer")


_BYTES = {bytes}

#: how many valid topic names a Producer remembers (a bound, not a tuning knob)
_VALID_TOPICS_KEPT = 1000


def check_body(verb: str, body: bytes) -> bytes:
    """``body`` as the bytes a ``verb`` sends; raises what the publish raises
    for a body that is not bytes-like or is empty (nsqd's own error)."""
    if type(body) is bytes and body:
        return body  # the common case: nothing to check further, nothing to copy
    if not isinstance(body, bytes | bytearray | memoryview):
        raise TypeError(f"message body must be bytes, not {type(body).__name__}")
    data = bytes(body)
    if not data:
        raise BadMessageError(f"{verb} invalid message body size 0")
    return data


@dataclass(frozen=True, slots=True)
class ProducerStats:
    """A snapshot of a producer's counters (see :attr:`Producer.stats`).

    ``published`` counts messages nsqd acknowledged (an MPUB of n counts n),
    ``batches`` the acknowledged MPUBs among them, ``errors`` the publishes
    that raised after their arguments were accepted (no nsqd reachable, a
    refusal, a lost connection).  ``in_flight`` is how many publishes hold a
    place in the window right now, out of ``window`` (``publish_window``).
    """

    published: int = 0
    batches: int = 0
    errors: int = 0
    in_flight: int = 0
    window: int = 0


class Producer:
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
        if not config.nsqd_tcp_addresses:
            raise ValueError("a Producer needs at least one address in nsqd_tcp_addresses")
        self.config = config
        self._conn: Connection | None = None
        self._index = 0
        self._connect_lock = trio.Lock()
        # The publish window: a count of places taken and the publishes queued
        # for one (FIFO, a freed place is handed to the first of them).  Unlike
        # trio.Semaphore, taking a free place does not yield: a publish waits
        # for its response anyway, and a yield more each costs scheduler passes.
        self._in_flight = 0
        self._window = config.publish_window
        self._window_waiters: deque[trio.lowlevel.Task] = deque()
        # Topic names already found valid (a few, in practice): checked once.
        self._valid_topics: set[str] = set()
        self._published = 0
        self._batches = 0
        self._errors = 0
        self._stack: AsyncExitStack | None = None
        self._nursery: trio.Nursery | None = None
        self._closed = False

    async def __aenter__(self) -> Producer:
        if self._stack is not None or self._closed:
            raise RuntimeError("a Producer can be entered only once")
        stack = AsyncExitStack()
        self._nursery = await stack.enter_async_context(trio.open_nursery())
        self._stack = stack
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        self._closed = True
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
        return False  # the block's own exception propagates unchanged

    @property
    def stats(self) -> ProducerStats:
        return ProducerStats(
            published=self._published,
            batches=self._batches,
            errors=self._errors,
            in_flight=self._in_flight,
            window=self.config.publish_window,
        )

    @property
    def address(self) -> str | None:
        """The nsqd currently connected to, if any."""
        conn = self._conn
        return conn.address if conn is not None and not conn.closed else None

    async def _run(self, conn: Connection) -> None:
        await conn.run()
        reason = conn.close_reason
        if reason is not None and not isinstance(reason, NSQErrorResponse):
            # The nsqd itself looks unwell: start with the next one.
            addresses = self.config.nsqd_tcp_addresses
            if addresses[self._index % len(addresses)] == conn.address:
                self._index = (self._index + 1) % len(addresses)

    async def _connection(self) -> Connection:
        if self._nursery is None or self._closed:
            raise RuntimeError("use the Producer inside 'async with'")
        conn = self._conn
        if conn is not None and not conn.closed:
            return conn  # the common case: no lock, no yield
        async with self._connect_lock:
            conn = self._conn
            if conn is not None and not conn.closed:
                return conn
            addresses = self.config.nsqd_tcp_addresses
            failures: list[str] = []
            refusals: list[NSQErrorResponse] = []
            start = self._index  # read once: _run may move it meanwhile
            for step in range(len(addresses)):
                index = (start + step) % len(addresses)
                try:
                    conn = await Connection.open(addresses[index], self.config)
                except (NSQConnectionError, NegotiationError, ProtocolError) as exc:
                    log.warning("%s", cannot_connect(addresses[index], exc))
                    failures.append(naming(addresses[index], exc))
                    continue
                except NSQErrorResponse as exc:
                    log.warning("%s refused the connection: %s", addresses[index], exc)
                    failures.append(naming(addresses[index], exc))
                    refusals.append(exc)
                    continue
                self._index = index
                self._conn = conn
                self._nursery.start_soon(self._run, conn)
                return conn
            if len(refusals) == len(addresses):
                # Every nsqd answered, and refused (E_AUTH_FAILED...): its typed error.
                raise refusals[0]
            raise NSQConnectionError("no nsqd reachable (" + "; ".join(failures) + ")")

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

    def _release_place(self) -> None:
        if self._window_waiters:
            # The place goes to the next in line.
            trio.lowlevel.reschedule(self._window_waiters.popleft())
        else:
            self._in_flight -= 1

    async def _publish(self, data: bytes, messages: int = 1, batch: bool = False) -> None:
        if self._in_flight < self._window and not self._window_waiters:
            self._in_flight += 1
        else:
            await self._wait_for_place()
        try:
            conn = self._conn
            # conn.life.state: conn.closed without a property call
            if conn is None or conn.life.state is not OPEN or self._closed:
                conn = await self._connection()
            response = await conn.request(data)
        except (NSQError, OSError):
            self._errors += 1
            raise
        finally:
            self._release_place()
        if response != OK:
            self._errors += 1
            raise ProtocolError(f"unexpected response to a publish: {response[:100]!r}")
        self._published += messages
        if batch:
            self._batches += 1

    def check_topic(self, verb: str, topic: str) -> None:
        """Raise what publishing to ``topic`` raises before sending anything
        (:func:`trionsq.protocol.names.check_topic`); valid names are
        remembered, so a topic published to again costs a set look-up."""
        if type(topic) is str and topic in self._valid_topics:
            return
        check_topic(verb, topic)
        if len(self._valid_topics) >= _VALID_TOPICS_KEPT:
            self._valid_topics.clear()
        self._valid_topics.add(topic)

    async def publish(self, topic: str, body: bytes) -> None:
        """PUB one message."""
        if type(topic) is not str or topic not in self._valid_topics:
            self.check_topic("PUB", topic)
        if type(body) is not bytes or not body:
            body = check_body("PUB", body)
        data = commands.pub(topic, body)
        # _publish, written out: the path every PUB takes, one coroutine less.
        if self._in_flight < self._window and not self._window_waiters:
            self._in_flight += 1
        else:
            await self._wait_for_place()
        try:
            conn = self._conn
            # conn.life.state: conn.closed without a property call
            if conn is None or conn.life.state is not OPEN or self._closed:
                conn = await self._connection()
            response = await conn.request(data)
        except (NSQError, OSError):
            self._errors += 1
            raise
        finally:
            if self._window_waiters:
                trio.lowlevel.reschedule(self._window_waiters.popleft())
            else:
                self._in_flight -= 1
        if response != OK:
            self._errors += 1
            raise ProtocolError(f"unexpected response to a publish: {response[:100]!r}")
        self._published += 1

    async def multi_publish(self, topic: str, bodies: Iterable[bytes]) -> None:
        """MPUB several messages atomically."""
        if type(topic) is not str or topic not in self._valid_topics:
            self.check_topic("MPUB", topic)
        data = bodies if type(bodies) is list else list(bodies)
        if not data:
            raise BadBodyError("MPUB invalid message count 0")
        if set(map(type, data)) != _BYTES or not all(data):  # all bytes, none empty
            data = [check_body("MPUB", body) for body in data]  # the rare case
        command = commands.mpub(topic, data)
        # _publish, written out as in publish(): one coroutine less a batch.
        if self._in_flight < self._window and not self._window_waiters:
            self._in_flight += 1
        else:
            await self._wait_for_place()
        try:
            conn = self._conn
            if conn is None or conn.life.state is not OPEN or self._closed:
                conn = await self._connection()
            response = await conn.request(command)
        except (NSQError, OSError):
            self._errors += 1
            raise
        finally:
            if self._window_waiters:
                trio.lowlevel.reschedule(self._window_waiters.popleft())
            else:
                self._in_flight -= 1
        if response != OK:
            self._errors += 1
            raise ProtocolError(f"unexpected response to a publish: {response[:100]!r}")
        self._published += len(data)
        self._batches += 1

    async def deferred_publish(self, topic: str, body: bytes, delay: float) -> None:
        """DPUB: the message becomes visible after ``delay`` seconds."""
        self.check_topic("DPUB", topic)
        if isinstance(delay, bool) or not isinstance(delay, int | float):
            raise TypeError("delay must be a number of seconds")
        if not math.isfinite(delay) or delay < 0:
            raise ValueError(f"delay must be >= 0 seconds, got {delay!r}")
        await self._publish(commands.dpub(topic, round(delay * 1000), check_body("DPUB", body)))

    async def connection(self) -> Connection:
        """The connection publishes go on, connected (failing over between the
        nsqds) as a publish connects it: for the front ends (trionsq.hosted),
        which pipeline their publishes on it themselves."""
        return await self._connection()
