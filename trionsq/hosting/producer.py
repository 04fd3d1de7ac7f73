"""trionsq's Trio clients hosted on a :class:`~trionsq.hosting.trio_thread.TrioThread`.

The blocking and asyncio front ends share this: each client owns one thread
running one ``trio.run``, in which the ordinary :class:`trionsq.Producer` or
:class:`trionsq.Consumer` does all the work (connections, RDY, backoff,
discovery, TLS, compression, AUTH, failover, the lossless close).  What crosses
between threads is only work to do (an :class:`~trionsq.hosting.handover.Inbox` into the
loop) and its outcome (a completion object each front end supplies).

This module holds the producer side; :mod:`trionsq.hosting.consumer` the consumer.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import trio

from ..config import Config
from ..connection import Connection, ConnectionClosedError, PendingResponse
from ..producer import Producer
from ..protocol.errors import NSQError, ProtocolError
from ..protocol.frames import OK
from ..publishing import ProducerStats, PublishCore
from .handover import Inbox
from .service import HostedService
from .trio_thread import LoopStoppedError, TrioThread

__all__ = ["ClientClosedError", "Completion", "HostedProducer"]

# (the logger keeps its name from before the hosting package: configurations stay valid)
log = logging.getLogger("trionsq.hosted")


class ClientClosedError(ConnectionClosedError):
    """The client is closed (or closed before the request got its answer)."""


class Completion(Protocol):
    """Where the outcome of one job goes; called once, in the loop's thread."""

    def set_result(self, value: Any) -> None: ...

    def set_exception(self, error: BaseException) -> None: ...


#: A job for the loop: ``(method, args, done)``, ``method`` one of the
#: Producer's (``"publish"``, ``"multi_publish"``, ``"deferred_publish"``), its
#: outcome to ``done``.
Job = tuple[str, tuple[Any, ...], Completion]

#: Bytes queued on the connection after which the pump waits for the writer
#: (as a Producer's own publishes do).
_HIGH_WATER = 1024 * 1024


def encode(core: PublishCore, method: str, args: tuple[Any, ...]) -> tuple[bytes, int]:
    """The command for a job and its batch (see :class:`PublishCore`); raises
    what :class:`trionsq.Producer`'s method raises for the same arguments."""
    if method == "publish":
        return core.pub(*args), 0
    if method == "multi_publish":
        return core.mpub(*args)
    if method == "deferred_publish":
        return core.dpub(*args), 0
    raise ValueError(f"unknown publishing method {method!r}")


class HostedProducer(HostedService):
    """A :class:`trionsq.Producer` served on its own thread, publishing the jobs
    other threads put in :attr:`inbox`.

    The Producer connects (and fails over between nsqds); the publishes
    themselves are pipelined here without a task each, which is what makes a
    hosted producer as fast as the async one driven by hundreds of tasks: a pump
    task takes the jobs, checks and encodes them as the Producer would, and
    queues them on its connection (:meth:`Connection.request_nowait`), at most
    ``publish_window`` awaiting an answer; a collector task takes the answers in
    order (nsqd answers in order), and hands each job its outcome, as the
    Producer's method would have raised or returned it.  Closing lets the jobs
    already put finish (for up to ``close_timeout``) and fails the rest with
    :class:`ClientClosedError`.

    ``end_of_batch`` (optional) is called in the loop after each run of outcomes
    (the asyncio front end wakes its loop once for all of them; the blocking one
    frees their places in its window at once); :attr:`completed` counts the
    jobs given their outcome so far.
    """

    def __init__(
        self,
        config: Config,
        name: str = "trionsq-producer",
        end_of_batch: Callable[[], None] | None = None,
        runner: TrioThread | None = None,
    ) -> None:
        # ``runner``: where the loop runs (default: a thread of its own; the
        # asyncio front end passes a guest run of its loop's).
        super().__init__(config, name, runner)
        self.producer = Producer(config=self.config)
        self.inbox: Inbox[Job] = Inbox(self.runner.run_sync_soon)
        self._end_of_batch = end_of_batch
        # Queued on the connection, awaiting nsqd's answer, in order.
        self._waiting: deque[tuple[PendingResponse, Completion, int]] = deque()
        self._window = self.config.publish_window
        self._room = trio.lowlevel.ParkingLot()  # the pump, while the window is full
        self._answers = trio.lowlevel.ParkingLot()  # the collector, while nothing waits
        self._core = PublishCore()
        #: jobs given their outcome so far (read by ``end_of_batch``)
        self.completed = 0

    @property
    def stats(self) -> ProducerStats:
        """The counters of :class:`trionsq.ProducerStats`, for the hosted publishes."""
        return self._core.stats(len(self._waiting), self._window)

    # --- life (called from the front end's thread) ---

    # (start, launch and aclose: HostedService's)

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
        """Fail the jobs nobody will finish (after the service ended)."""
        error = ClientClosedError("the Producer closed before nsqd answered")
        while self._waiting:
            _, done, _ = self._waiting.popleft()
            self.completed += 1
            done.set_exception(error)
        items = self.inbox.items
        while items:
            _, _, done = items.popleft()
            self.completed += 1
            done.set_exception(ClientClosedError("the Producer is closed"))
        if self._end_of_batch is not None:
            self._end_of_batch()

    # --- the service (in the loop) ---

    async def _serve(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        self._close_requested = trio.Event()
        self._served = trio.Event()
        pumped = trio.Event()
        try:
            async with self.producer, trio.open_nursery() as nursery:
                nursery.start_soon(self._collector)
                nursery.start_soon(self._pump, pumped)
                task_status.started()
                await self._close_requested.wait()
                # Jobs already put get their answers; a hung one is cut off.
                self.inbox.close()
                with trio.move_on_after(self.config.close_timeout):
                    await pumped.wait()
                    while self._waiting:  # until the collector has handed them out
                        last = self._waiting[-1][0]
                        if last.done:
                            await trio.lowlevel.checkpoint()
                        else:
                            await last.event.wait()
                nursery.cancel_scope.cancel()
            self.fail_leftovers()
        finally:
            self._served.set()
            # The producer was the thread's only purpose.
            self.runner.request_stop()

    async def _pump(self, pumped: trio.Event) -> None:
        """Encode the jobs and queue them on the connection, window permitting."""
        inbox, items, waiting = self.inbox, self.inbox.items, self._waiting
        core = self._core
        conn: Connection | None = None
        try:
            while True:
                await inbox.wait()
                if not items:
                    return  # closed, and nothing left
                queued = 0
                while items:
                    if len(waiting) >= self._window:
                        await self._room.park()
                        continue
                    method, args, done = items.popleft()
                    try:
                        data, batch = encode(core, method, args)
                    except Exception as exc:  # refused before reaching nsqd (not an error)
                        self.completed += 1
                        done.set_exception(exc)
                        self._batch_done()
                        continue
                    try:
                        if conn is None or conn.closed:
                            conn = await self.producer.connection()
                        pending = conn.request_nowait(data)
                    except (NSQError, OSError) as exc:
                        core.errors += 1
                        self.completed += 1
                        done.set_exception(exc)
                        self._batch_done()
                        continue
                    waiting.append((pending, done, batch))
                    if len(waiting) == 1:
                        self._answers.unpark()
                    queued += len(data)
                    if queued >= _HIGH_WATER:  # let the writer catch up, as Producer does
                        queued = 0
                        await conn.flush()
        finally:
            pumped.set()

    async def _collector(self) -> None:
        """Hand each queued job its outcome, in order, as the answers come."""
        waiting, core = self._waiting, self._core
        while True:
            if not waiting:
                await self._answers.park()
                continue
            head = waiting[0][0]
            if not head.done:
                await head.event.wait()
            # Every answer that has come, in one go (one read brings many).
            answered = 0
            while waiting and waiting[0][0].done:
                pending, done, batch = waiting.popleft()
                answered += 1
                if pending.error is None and pending.value == OK:  # core.answered, inlined
                    core.published += batch or 1
                    if batch:
                        core.batches += 1
                    done.set_result(None)
                elif pending.error is not None:
                    core.errors += 1
                    done.set_exception(pending.error)
                else:
                    try:
                        core.answered(pending.value, batch)
                    except ProtocolError as exc:
                        done.set_exception(exc)
            self.completed += answered
            if self._room:
                self._room.unpark()
            self._batch_done()

    def _batch_done(self) -> None:
        if self._end_of_batch is not None:
            self._end_of_batch()


class HostedProducerState:
    """A front end Producer's state, read from its hosted producer: the
    properties the blocking and the asyncio Producer share."""

    config: Config
    _hosted: HostedProducer | None

    @property
    def stats(self) -> ProducerStats:
        """The underlying Producer's counters (see :class:`trionsq.ProducerStats`)."""
        hosted = self._hosted
        if hosted is None:
            return ProducerStats(window=self.config.publish_window)
        return hosted.stats

    @property
    def address(self) -> str | None:
        """The nsqd currently connected to, if any."""
        hosted = self._hosted
        return None if hosted is None else hosted.producer.address
