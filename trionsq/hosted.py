"""trionsq's Trio clients hosted on a :class:`~trionsq.trio_thread.TrioThread`.

The blocking and asyncio front ends share this: each client owns one thread
running one ``trio.run``, in which the ordinary :class:`trionsq.Producer` or
:class:`trionsq.Consumer` does all the work (connections, RDY, backoff,
discovery, TLS, compression, AUTH, failover, the lossless close).  What crosses
between threads is only work to do (an :class:`~trionsq.bridge.Inbox` into the
loop) and its outcome (a completion object each front end supplies).

This module holds the producer side; :mod:`trionsq.hosted_consumer` the consumer.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import trio

from .bridge import Inbox
from .config import Config
from .connection import ConnectionClosedError
from .producer import Producer
from .transport import Connector
from .trio_thread import LoopStoppedError, TrioThread

__all__ = ["ClientClosedError", "Completion", "HostedProducer", "tracking_connector"]

log = logging.getLogger("trionsq.hosted")


class ClientClosedError(ConnectionClosedError):
    """The client is closed (or closed before the request got its answer)."""


class Completion(Protocol):
    """Where the outcome of one job goes; called once, in the loop's thread."""

    def set_result(self, value: Any) -> None: ...

    def set_exception(self, error: BaseException) -> None: ...


#: A job for the loop: ``await fn(*args)``, its outcome to ``done``.
Job = tuple[Callable[..., Awaitable[Any]], tuple[Any, ...], Completion]


def tracking_connector(connector: Connector, runner: TrioThread) -> Connector:
    """``connector``, with every TCP socket it opens registered with ``runner``
    (so that a forked child closes its copy and never talks on it)."""

    async def connect(host: str, port: int) -> trio.abc.Stream:
        stream = await connector(host, port)
        if isinstance(stream, trio.SocketStream):
            runner.track_socket(stream.socket)
        return stream

    return connect


class HostedProducer:
    """A :class:`trionsq.Producer` served on its own thread, running the jobs
    other threads put in :attr:`inbox`.

    Jobs run in a pool of worker tasks, one job each at a time, so that as many
    publishes are pipelined on the connection as jobs are waiting (up to
    ``publish_window`` workers: the front ends bound the jobs outstanding to it).
    Closing lets the jobs already put finish (for up to ``close_timeout``) and
    fails the rest with :class:`ClientClosedError`.
    """

    def __init__(
        self,
        config: Config,
        name: str = "trionsq-producer",
        end_of_batch: Callable[[], None] | None = None,
    ) -> None:
        self.runner = TrioThread(name)
        self.config = config.replace(connector=tracking_connector(config.connector, self.runner))
        self.producer = Producer(config=self.config)
        self.inbox: Inbox[Job] = Inbox(self.runner.run_sync_soon, self._on_wake)
        self._max_workers = self.config.publish_window
        self._workers = 0
        # Workers that will look at the inbox before they sleep or exit (runnable,
        # or woken and not yet run); the others are idle or awaiting an answer.
        self._scanning = 0
        self._idle = trio.lowlevel.ParkingLot()
        self._nursery: trio.Nursery | None = None
        self._closing = False
        self._close_requested: trio.Event | None = None
        self._served: trio.Event | None = None
        # Completions of one scheduler pass are followed by one end_of_batch()
        # (the asyncio front end wakes its loop once for them).
        self._end_of_batch = end_of_batch
        self._in_batch = False
        self._batch_ended = trio.Event()

    # --- life (called from the front end's thread) ---

    def start(self) -> None:
        """Start the thread and the producer; blocks until it is ready."""
        self.runner.start()
        try:
            self.runner.start_service(self._serve)
        except BaseException:
            self.runner.close()
            raise

    def launch(
        self,
        on_started: Callable[[BaseException | None], None],
        on_exit: Callable[[], None] | None = None,
    ) -> None:
        """Start without blocking; ``on_started(error)`` is called from the loop's
        thread once the producer is ready (``None``) or failed to start, and
        ``on_exit()`` once the loop has ended."""

        def ready() -> None:
            if self.runner.error is not None or self.runner._nursery is None:
                on_started(self.runner.error or LoopStoppedError("the loop did not start"))
                return
            self.runner._nursery.start_soon(self._serve_then_report, on_started)

        self.runner.launch(on_ready=ready, on_exit=on_exit)

    async def _serve_then_report(self, on_started: Callable[[BaseException | None], None]) -> None:
        assert self.runner._nursery is not None
        try:
            await self.runner._nursery.start(self._serve)
        except Exception as exc:
            on_started(exc)
            self.runner.request_stop()
            return
        on_started(None)

    def close(self, timeout: float | None = None) -> None:
        """Finish the jobs put so far (up to ``close_timeout``), close, join the thread.

        Call it once no more jobs can be put (the front end's closed flag).
        """
        try:
            if self.runner.alive:
                self.runner.run(self.aclose)
        except LoopStoppedError:
            pass  # it ended already (a crash is in runner.error)
        finally:
            self.runner.close(timeout)
            self.fail_leftovers()

    async def aclose(self) -> None:
        """In the loop: ask the service to finish and wait until it has."""
        if self._close_requested is not None and self._served is not None:
            self._close_requested.set()
            await self._served.wait()

    def request_close(self) -> None:
        """From any thread, without waiting (the asyncio front end's close)."""
        if self.runner.alive:
            try:
                self.runner.run_sync_soon(self._request_close_in_loop)
            except RuntimeError:
                pass

    def _request_close_in_loop(self) -> None:
        if self._close_requested is not None:
            self._close_requested.set()
        else:
            self.runner.request_stop()

    def fail_leftovers(self) -> None:
        """Fail the jobs nobody will run (after the loop ended)."""
        items = self.inbox.items
        while items:
            _, _, done = items.popleft()
            done.set_exception(ClientClosedError("the Producer is closed"))

    # --- the service (in the loop) ---

    async def _serve(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        self._close_requested = trio.Event()
        self._served = trio.Event()
        try:
            async with self.producer, trio.open_nursery() as workers:
                self._nursery = workers
                batcher = trio.CancelScope()
                if self._end_of_batch is not None:
                    workers.start_soon(self._batcher, batcher)
                task_status.started()
                await self._close_requested.wait()
                self._closing = True
                self._idle.unpark_all()
                if self.inbox.items and self._scanning == 0:
                    self._wake_workers(len(self.inbox.items))
                # Jobs already put get their answers; a hung one is cut off.
                workers.cancel_scope.deadline = trio.current_time() + self.config.close_timeout
                batcher.cancel()
            self.fail_leftovers()
        finally:
            self._served.set()
            # The producer was the thread's only purpose.
            self.runner.request_stop()

    async def _batcher(self, scope: trio.CancelScope) -> None:
        """Call ``end_of_batch`` once per scheduler pass that completed jobs."""
        assert self._end_of_batch is not None
        try:
            with scope:
                while True:
                    await self._batch_ended.wait()
                    self._batch_ended = trio.Event()
                    self._in_batch = False
                    self._end_of_batch()
        finally:
            self._end_of_batch()  # the last completions

    def _on_wake(self) -> None:
        """A put found nobody looking at the inbox: get workers going."""
        items = self.inbox.items
        while True:
            self.inbox.awake = True
            self._wake_workers(len(items) - self._scanning)
            if self._scanning > 0:
                return
            self.inbox.awake = False
            if not items or self._workers >= self._max_workers:
                # Nothing to do, or every worker is busy and comes back for it.
                return

    def _wake_workers(self, count: int) -> None:
        """Have up to ``count`` more workers look at the inbox."""
        if count <= 0 or self._nursery is None:
            return
        woken = len(self._idle.unpark(count=count))
        self._scanning += woken
        while woken < count and self._workers < self._max_workers:
            self._workers += 1
            self._scanning += 1
            woken += 1
            self._nursery.start_soon(self._worker)

    async def _worker(self) -> None:
        inbox = self.inbox
        items = inbox.items
        try:
            while True:
                if items:
                    fn, args, done = items.popleft()
                    self._scanning -= 1
                    if items:
                        self._wake_workers(len(items) - self._scanning)
                    elif self._scanning == 0:
                        inbox.awake = False
                        if items:  # put meanwhile (it saw awake set)
                            inbox.awake = True
                            self._wake_workers(len(items))
                    try:
                        result = await fn(*args)
                    except trio.Cancelled:
                        done.set_exception(ClientClosedError("closed before nsqd answered"))
                        raise
                    except Exception as exc:
                        done.set_exception(exc)
                    else:
                        done.set_result(result)
                    if self._end_of_batch is not None:
                        if self._closing:  # the batcher is gone: no batching
                            self._end_of_batch()
                        elif not self._in_batch:
                            self._in_batch = True
                            self._batch_ended.set()
                    self._scanning += 1
                    continue
                if self._closing:
                    self._scanning -= 1
                    return
                self._scanning -= 1
                if self._scanning == 0:
                    inbox.awake = False
                    if items:
                        inbox.awake = True
                        self._scanning += 1
                        continue
                await self._idle.park()  # whoever wakes us counts us as scanning
        finally:
            self._workers -= 1
