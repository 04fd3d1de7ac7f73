"""The blocking Producer: publish from any thread of a synchronous program."""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from sniffio import thread_local as _sniffio

from .. import producer as _core
from .. import telemetry
from ..config import Config
from ..hosting.handover import LightFuture, Waiter
from ..hosting.producer import (
    ClientClosedError,
    Completion,
    HostedProducer,
    HostedProducerState,
    Job,
)
from ..hosting.trio_thread import ForkedError, check_not_in_trio
from ..lifecycle import CLOSED, FORKED, NEW, OPEN, BlockingClient, Lifecycle, Moves
from ..publishing import ProducerStats
from ..transport import tcp_connector
from .pool import DirectPublisher

__all__ = ["Producer"]

AfterFork = Literal["reconnect", "error"]

#: A blocking Producer's life: started (again, after a ``fork()``) and closed
#: once; forked in a child process of a ``fork()`` made while it was open, new
#: again when the child starts it afresh (``after_fork="reconnect"``).
MOVES = Moves(
    "blocking.Producer",
    NEW,
    {
        NEW: {OPEN, CLOSED},
        OPEN: {FORKED, CLOSED},
        FORKED: {NEW, CLOSED},
    },
)


class Producer(HostedProducerState, BlockingClient):
    """Publishes to nsqd from any thread; each call returns once nsqd acknowledged.

    ::

        with trionsq.blocking.Producer(["127.0.0.1:4150"]) as producer:
            producer.publish("topic", b"body")

    It takes the options of :class:`trionsq.Producer` and keeps its guarantees:
    one trionsq Producer does the work, in a Trio loop on a thread of this
    object's own (started by :meth:`start` or ``with``, ended by :meth:`close`).
    Calls from many threads share its connection and are pipelined, at most
    ``publish_window`` awaiting nsqd's answer at once (a call waits for a
    place).  nsqd's refusals raise their typed errors; a connection lost before
    the answer raises :class:`~trionsq.ConnectionClosedError` (the message may or
    may not have been published); a call on a closed producer raises
    :class:`~trionsq.hosting.producer.ClientClosedError`.

    A blocking ``publish()``, ``multi_publish()`` or ``deferred_publish()`` is
    done by the calling thread itself: it takes a connection no other thread
    publishes on, writes the command and reads the answer there, then puts
    the connection back (:mod:`trionsq.blocking.direct`: no hop to the loop's
    thread, a round trip and little more).  Threads publishing at once open
    a connection each, up to ``max_connections`` (32); past it they share
    busy ones, pipelined (one of them writing their commands together and
    reading the answers for all); ``max_connections=1`` shares one
    connection between every thread.  What a
    caller may assume when the connection dies during a call is said there:
    a publish never written whole is retried once on a new connection (failing
    over), one written whole and not answered raises
    :class:`~trionsq.ConnectionClosedError`, never published twice behind the
    caller's back.  (With a ``connector`` of one's own, the blocking calls go
    through the loop's thread as the ``*_async`` ones do.)

    ``timeout`` (seconds) bounds how long a call waits for the answer; past it,
    :class:`TimeoutError` is raised (the publish is not taken back).  The
    ``*_async`` methods return a :class:`concurrent.futures.Future` at once (after
    waiting for a place in the window), so one thread can keep many publishes in
    flight.

    After ``os.fork()``, a producer started in the parent is dead in the child
    (threads do not survive a fork): ``after_fork="reconnect"`` (the default)
    starts a fresh thread and connection in the child on its first call, never
    using the parent's socket; ``"error"`` raises :class:`~trionsq.blocking.ForkedError`.
    """

    def __init__(
        self,
        nsqd_tcp_addresses: Sequence[str] | None = None,
        *,
        config: Config | None = None,
        after_fork: AfterFork = "reconnect",
        max_connections: int = 32,
        **options: Any,
    ) -> None:
        if after_fork not in ("reconnect", "error"):
            raise ValueError("after_fork must be 'reconnect' or 'error'")
        if isinstance(max_connections, bool) or not isinstance(max_connections, int):
            raise TypeError("max_connections must be an int")
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections!r}")
        self.max_connections = max_connections
        # The async Producer validates the arguments (it is not entered here).
        self.config = _core.Producer(nsqd_tcp_addresses, config=config, **options).config
        self.after_fork = after_fork
        self._hosted: HostedProducer | None = None
        # The blocking calls' own path (None: through the hosted producer).
        self._direct: DirectPublisher | None = None
        self._life = Lifecycle(MOVES)
        self._pid = os.getpid()
        self._reset_locks()

    def _reset_locks(self) -> None:
        # The window on this side: places taken by submissions (under the lock,
        # which also orders them against close()) and given back by answers
        # (written by the loop's thread alone, without the lock: it never waits
        # for a caller that holds it).  In flight: taken - released.
        self._lock = threading.Lock()
        self._taken = 0
        self._released = 0  # HostedProducer.completed, as last seen
        #: callers asleep while the window is full, woken all at once when
        #: answers have freed half of it (not one wake-up a place: each woken
        #: thread costs a switch and turns of the GIL; half the window still
        #: in flight keeps nsqd busy meanwhile)
        self._sleepers: deque[threading.Lock] = deque()
        self._wake_at = max(1, self.config.publish_window // 2)
        self._flushers: deque[threading.Lock] = deque()
        self._start_lock = threading.Lock()
        self._instrumented = False  # trionsq.telemetry's wrappers put on

    def __repr__(self) -> str:
        return (
            f"<blocking.Producer {self._life.state.value} {list(self.config.nsqd_tcp_addresses)}>"
        )

    # --- life ---

    def start(self) -> Producer:
        """Start the thread and connect lazily (the first publish connects);
        returns the producer.  Calling it again while open does nothing."""
        check_not_in_trio("blocking.Producer.start()")
        with self._start_lock:
            state = self._life.state
            if state is CLOSED:
                raise ClientClosedError("the Producer is closed")
            if state is OPEN:
                return self
            hosted = HostedProducer(
                self.config, name="trionsq-blocking-producer", end_of_batch=self._answered
            )
            hosted.start()
            hosted.runner.on_fork(self._after_fork_in_child)
            if not self._instrumented:  # once (a start after a fork: done)
                self._instrumented = True
                traced = telemetry.for_producer(self.config, lambda: self.address)
                if traced is not None:
                    traced.instrument_blocking(self)  # its publish methods
            self._pid = os.getpid()
            direct = None
            if self.config.connector is tcp_connector:  # (a socket this thread can use)
                direct = DirectPublisher(self.config, _closed_error, self.max_connections)
            with self._lock:
                self._hosted = hosted
                self._direct = direct
                self._life.move(OPEN)
        return self

    def close(self, timeout: float | None = None) -> None:
        """Wait for the publishes in flight (up to ``close_timeout``), close the
        connection and end the thread.  Later calls raise ClientClosedError."""
        check_not_in_trio("blocking.Producer.close()")
        with self._start_lock:
            with self._lock:
                hosted, self._hosted = self._hosted, None
                direct, self._direct = self._direct, None
                if self._life.state is not CLOSED:
                    self._life.move(CLOSED)
                # Callers waiting for a place or a flush: let them see it closed.
                _release_all(self._sleepers)
                _release_all(self._flushers)
            if direct is not None:
                direct.close(self.config.close_timeout if timeout is None else timeout)
            if hosted is not None and not hosted.runner.forked:
                hosted.close(timeout)

    def _leave(self, interrupted: bool) -> None:
        # (Interrupted or not: close() waits only for what nsqd is answering,
        # up to close_timeout.)
        self.close()

    def _after_fork_in_child(self) -> None:
        # In the child, right after fork(), with one thread: the parent's locks may
        # have been held by threads that do not exist here.
        self._reset_locks()
        self._hosted = None
        direct, self._direct = self._direct, None
        if direct is not None:
            direct.forget()  # the parent's socket: left alone
        if self._life.state is OPEN:
            self._life.move(FORKED)

    def _reconnect_after_fork(self) -> None:
        if self.after_fork == "error":
            raise ForkedError(
                f"this Producer was started in process {self._pid}, before a fork(); "
                f"create (or start) it in this process ({os.getpid()}), or pass "
                "after_fork='reconnect'"
            )
        with self._start_lock:
            if self._life.state is FORKED:
                self._life.move(NEW)
        self.start()

    # --- publishing ---

    def _answered(self) -> None:
        # In the loop's thread, after each run of answers: their places go back
        # to the window all at once; the sleepers are woken once half of it is
        # free (each then publishes until it is full again), and flushers once
        # none is in flight.
        #
        # No sleeper is stranded without a lock: a sleeper appends its lock
        # before it reads _released (and sleeps only if no place is free), and
        # this stores _released before it reads the sleepers; under the GIL
        # one of the two sees the other's store.  A sleeper not woken here
        # (less than half free) is woken by a later run: the places in flight
        # all come back, as answers or as failures at close.
        hosted = self._hosted
        if hosted is None:
            return
        released = self._released = hosted.completed
        in_flight = self._taken - released
        if self._sleepers and self.config.publish_window - in_flight >= self._wake_at:
            _release_all(self._sleepers)
        if self._flushers and in_flight <= 0:
            _release_all(self._flushers)

    def _submit(self, method: str, args: tuple[Any, ...], reply: Completion) -> None:
        if _sniffio.name == "trio":  # (check_not_in_trio's first test, without its call)
            check_not_in_trio(f"blocking.Producer.{method}()")
        lock, window = self._lock, self.config.publish_window
        while True:
            # Between acquire and release: no call of a Python function, no
            # loop, no system call: nothing at which the GIL may pass to
            # another thread, which would then queue on the lock (and the
            # callers, once queued, would hand it over by thread switches).
            lock.acquire()
            hosted = self._hosted
            if hosted is None:
                lock.release()
                state = self._life.state
                if state is FORKED:
                    self._reconnect_after_fork()
                    continue
                if state is NEW:
                    raise RuntimeError("start the Producer first (with ... or .start())")
                raise ClientClosedError("the Producer is closed")
            if self._taken - self._released < window:
                self._taken += 1
                inbox = hosted.inbox
                job: Job = (method, args, reply)
                inbox.items.append(job)  # Inbox.put, its wake-up after the release
                asleep = not inbox.awake
                lock.release()
                if asleep:
                    inbox.wake()  # a write to the loop's wake-up socket
                return
            # The window is full: sleep until answers free places (or close).
            sleep = threading.Lock()
            sleep.acquire()
            self._sleepers.append(sleep)
            lock.release()
            if self._taken - self._released < window:  # freed before we were there
                _forget(self._sleepers, sleep)
                continue
            try:
                sleep.acquire()
            except BaseException:  # KeyboardInterrupt: no place was taken
                _forget(self._sleepers, sleep)
                raise

    def _call(self, method: str, args: tuple[Any, ...], timeout: float | None) -> None:
        reply: Waiter[None] = Waiter()
        self._submit(method, args, reply)
        if not reply.wait(timeout):
            raise TimeoutError(f"nsqd did not answer within {timeout} s (it may still publish)")
        reply.unwrap()

    def publish(self, topic: str, body: bytes, *, timeout: float | None = None) -> None:
        """PUB one message; returns once nsqd acknowledged it."""
        direct = self._direct
        if direct is None or _sniffio.name == "trio":
            return self._call("publish", (topic, body), timeout)
        direct.publish(direct.core.pub(topic, body), 0, timeout)

    def multi_publish(
        self, topic: str, bodies: Iterable[bytes], *, timeout: float | None = None
    ) -> None:
        """MPUB several messages atomically; returns once nsqd acknowledged them."""
        direct = self._direct
        if direct is None or _sniffio.name == "trio":
            return self._call("multi_publish", (topic, list(bodies)), timeout)
        direct.publish(*direct.core.mpub(topic, bodies), timeout)

    def deferred_publish(
        self, topic: str, body: bytes, delay: float, *, timeout: float | None = None
    ) -> None:
        """DPUB: the message becomes visible after ``delay`` seconds."""
        direct = self._direct
        if direct is None or _sniffio.name == "trio":
            return self._call("deferred_publish", (topic, body, delay), timeout)
        direct.publish(direct.core.dpub(topic, body, delay), 0, timeout)

    @property
    def stats(self) -> ProducerStats:
        """The counters of :class:`trionsq.ProducerStats`: the blocking calls'
        and the ``*_async`` ones' together (``in_flight`` counts both)."""
        stats = super().stats
        direct = self._direct
        if direct is None:
            return stats
        counted = direct.counters()
        return ProducerStats(
            published=stats.published + counted.published,
            batches=stats.batches + counted.batches,
            errors=stats.errors + counted.errors,
            in_flight=stats.in_flight + direct.in_flight(),
            window=stats.window,
        )

    @property
    def address(self) -> str | None:
        """The nsqd currently connected to, if any (the blocking calls' first)."""
        direct = self._direct
        if direct is not None and direct.address is not None:
            return direct.address
        return super().address

    def _call_async(self, method: str, args: tuple[Any, ...]) -> concurrent.futures.Future[None]:
        # Running from the start: a publish handed over cannot be taken back.
        future: LightFuture[None] = LightFuture()
        self._submit(method, args, future)
        return future

    def publish_async(self, topic: str, body: bytes) -> concurrent.futures.Future[None]:
        """PUB without waiting for the answer: the future completes when nsqd
        acknowledged (or fails with its error).  Waits only for a window place."""
        future: LightFuture[None] = LightFuture()  # (_call_async, inlined)
        self._submit("publish", (topic, body), future)
        return future

    def multi_publish_async(
        self, topic: str, bodies: Iterable[bytes]
    ) -> concurrent.futures.Future[None]:
        """MPUB without waiting for the answer (see :meth:`publish_async`)."""
        return self._call_async("multi_publish", (topic, list(bodies)))

    def deferred_publish_async(
        self, topic: str, body: bytes, delay: float
    ) -> concurrent.futures.Future[None]:
        """DPUB without waiting for the answer (see :meth:`publish_async`)."""
        return self._call_async("deferred_publish", (topic, body, delay))

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every publish handed to the producer before this call
        has its outcome (nsqd's answer, or its failure): the ``*_async`` ones
        and the blocking calls of other threads queued on the connection by
        then (one still connecting is not among them); returns False if
        ``timeout`` passed first."""
        check_not_in_trio("blocking.Producer.flush()")
        deadline = None if timeout is None else time.monotonic() + timeout
        direct = self._direct
        marks = direct.marks() if direct is not None else []
        if not self._flush_async(timeout):
            return False
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        return direct is None or direct.flush(marks, left)

    def _flush_async(self, timeout: float | None) -> bool:
        if self._hosted is None or self._taken <= self._released:
            return True
        idle = threading.Lock()
        idle.acquire()
        self._flushers.append(idle)
        if self._hosted is None or self._taken <= self._released:  # as in _submit
            _forget(self._flushers, idle)
            return True
        if idle.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
            return True
        _forget(self._flushers, idle)
        return self._taken <= self._released


def _closed_error() -> ClientClosedError:
    return ClientClosedError("the Producer is closed")


def _release_all(locks: deque[threading.Lock]) -> None:
    """Wake every thread asleep on one of ``locks`` (any thread)."""
    while True:
        try:
            locks.popleft().release()
        except IndexError:
            return


def _forget(locks: deque[threading.Lock], lock: threading.Lock) -> None:
    """Take ``lock`` out of ``locks`` unless a waker took it first."""
    try:
        locks.remove(lock)
    except ValueError:
        pass
