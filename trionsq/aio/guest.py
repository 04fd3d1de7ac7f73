"""Trio as a guest of the asyncio loop: the asyncio front end's default runner.

``trio.lowlevel.start_guest_run`` runs Trio's scheduler in callbacks of the
asyncio loop, on the loop's own thread: Trio code and asyncio code take turns
on one thread, so a message or an answer crosses from one to the other by a
plain call (an ``asyncio.Future`` completed from a Trio task, a Trio task woken
from an asyncio one), never by a thread switch.

One guest run serves every client of an asyncio loop (:class:`GuestRun`):
Trio allows one run per thread, and a run's I/O wait is shared by all its
tasks.  The first client entered starts it, the last one left ends it, before
its ``async with`` is left; each client is a :class:`GuestRunner`, the
:class:`~trionsq.hosting.trio_thread.TrioThread` interface on a task of the shared run
(its own nursery, stopped on its own), so the hosted clients of
:mod:`trionsq.hosting.producer` run unchanged on either.

While Trio waits for I/O it does so on a worker thread of Trio's thread cache
(an idle worker lingers for 10 s after its last use, for reuse).  When the run
ends, the workers it brought into being are retired (:func:`_retire_workers`),
so that no thread outlives the last client's ``async with``.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import outcome
import trio
import trio.lowlevel

from ..hosting.trio_thread import BlockingInTrioError, LoopStoppedError, TrioThread

__all__ = ["GuestRun", "GuestRunner", "GuestUnavailableError", "acquire", "release"]

log = logging.getLogger("trionsq.aio")

R = TypeVar("R")


class GuestUnavailableError(RuntimeError):
    """The asyncio loop's thread runs a Trio run already (not trionsq's)."""


class GuestRun:
    """The Trio guest run of one asyncio loop, shared by its trionsq clients."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.users = 0
        self.stopping = False
        self.ident = threading.get_ident()
        self.token: trio.lowlevel.TrioToken | None = None
        self._stop = trio.Event()
        #: completed (with the run's outcome) when the run has ended
        self.ended: asyncio.Future[outcome.Outcome[None]] = loop.create_future()
        self._threads_before: set[threading.Thread] = set()
        self._yielding = trio.lowlevel.ParkingLot()

    def start(self) -> None:
        """Start the run (in the loop's thread); Trio is usable when this returns."""
        self._threads_before = set(threading.enumerate())
        # Trio installs a SIGINT handler when it finds Python's default one
        # (asyncio.run installs its own first; loop.run_until_complete does
        # not): a guest must not take Ctrl-C from the asyncio program.
        in_main = threading.current_thread() is threading.main_thread()
        sigint = signal.getsignal(signal.SIGINT) if in_main else None
        trio.lowlevel.start_guest_run(
            self._main,
            run_sync_soon_threadsafe=self.loop.call_soon_threadsafe,
            run_sync_soon_not_threadsafe=self.loop.call_soon,
            done_callback=self._done,
            # Trio needs no signal wake-up: it installs no signal handler here.
            host_uses_signal_set_wakeup_fd=True,
        )
        if in_main and signal.getsignal(signal.SIGINT) is not sigint:
            signal.signal(signal.SIGINT, sigint)
        self.token = trio.lowlevel.current_trio_token()
        trio.lowlevel.spawn_system_task(self._yielder, name="trionsq-guest-yielder")

    def yield_to_host(self) -> None:
        """Keep Trio's next step from waiting for I/O before the asyncio
        callbacks already queued have run (call it after waking asyncio tasks).

        When Trio has nothing runnable it waits for I/O on its worker thread,
        and asyncio code that then wakes a Trio task (a publish, a FIN) must
        wake that thread, which wakes the loop's: two thread switches.  With one
        task left runnable, Trio's next step is queued on the loop behind the
        asyncio tasks just woken instead, and whatever they hand to Trio meanwhile
        is taken in that step, without a switch."""
        self._yielding.unpark_all()

    async def _yielder(self) -> None:
        lot = self._yielding
        while True:
            await lot.park()
            await trio.lowlevel.cancel_shielded_checkpoint()

    async def _main(self) -> None:
        # The clients' tasks are system tasks of the run (spawned from asyncio
        # code, see GuestRunner.launch); the main task only keeps the run up.
        await self._stop.wait()

    def _done(self, result: outcome.Outcome[None]) -> None:
        # In the loop's thread (Trio's last tick).
        self.token = None
        if _runs.get(self.loop) is self:
            del _runs[self.loop]
        if isinstance(result, outcome.Error):
            log.error("the Trio guest run ended with %r", result.error)
        try:
            _retire_workers(self._threads_before)
        except Exception:  # pragma: no cover - never let the end go unreported
            log.exception("retiring Trio's worker threads failed")
        if not self.ended.done():
            self.ended.set_result(result)

    def stop(self) -> None:
        """End the run (once its clients' tasks have ended)."""
        token = self.token
        if token is not None:
            try:
                token.run_sync_soon(self._stop.set, idempotent=True)
            except trio.RunFinishedError:
                pass


#: the running guest run of each asyncio loop
_runs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, GuestRun] = weakref.WeakKeyDictionary()


async def acquire() -> GuestRun:
    """The running loop's guest run, started if need be; :func:`release` it."""
    loop = asyncio.get_running_loop()
    while True:
        run = _runs.get(loop)
        if run is None:
            break
        if not run.stopping:
            run.users += 1
            return run
        await _wait_ended(run)  # the last client of the old one is leaving
    if trio.lowlevel.in_trio_run():
        raise GuestUnavailableError(
            "this thread runs a Trio run already (Trio in guest mode on this asyncio "
            "loop?): pass guest=False to run the client's Trio loop on a thread"
        )
    run = GuestRun(loop)
    run.start()
    _runs[loop] = run
    run.users += 1
    return run


async def release(run: GuestRun) -> None:
    """A client is done with ``run``: the last one ends it and waits for its end."""
    run.users -= 1
    if run.users > 0:
        return
    run.stopping = True
    run.stop()
    await _wait_ended(run)


async def _wait_ended(run: GuestRun) -> None:
    """Wait for the run's end, cancelled or not (it comes promptly: the run has
    no tasks left but its main one); a cancellation is raised afterwards."""
    cancelled: asyncio.CancelledError | None = None
    while not run.ended.done():
        try:
            await asyncio.shield(run.ended)
        except asyncio.CancelledError as exc:
            cancelled = exc
    if cancelled is not None:
        raise cancelled


class GuestRunner(TrioThread):
    """One client's part of its loop's :class:`GuestRun`, with the interface of
    a :class:`~trionsq.hosting.trio_thread.TrioThread` (its nursery, its stop, calls
    into it), but no thread: calls from the loop's thread run at once."""

    def __init__(self, name: str = "trionsq") -> None:
        super().__init__(name)
        self.run_: GuestRun | None = None
        self._launched = False
        self._ended = False
        #: the asyncio loop's thread (``threading.get_ident()``)
        self.host_ident = 0
        #: True while this client's task runs: calls from the loop's thread
        #: may then act on the client's Trio objects at once
        self.direct = False

    def __repr__(self) -> str:
        state = "running" if self.alive else "forked" if self.forked else "stopped"
        return f"<GuestRunner {self.name!r} {state}>"

    @property
    def alive(self) -> bool:
        return self._token is not None and not self._ended and not self.forked

    @property
    def started(self) -> bool:
        return self._launched

    @property
    def in_loop_thread(self) -> bool:
        return threading.get_ident() == self.host_ident

    def launch(
        self,
        on_ready: Callable[[], None] | None = None,
        on_exit: Callable[[], None] | None = None,
    ) -> None:
        """Start this client's task in its guest run (set :attr:`run_` first)."""
        run = self.run_
        if run is None or run.token is None:
            raise LoopStoppedError(f"{self.name}: no guest run to start in")
        if self._launched:
            raise RuntimeError(f"{self.name}: already started")
        self._launched = True
        self.host_ident = run.ident
        self._on_ready = on_ready
        self._on_exit = on_exit
        self._mark_launched()
        trio.lowlevel.spawn_system_task(self._task, name=self.name)

    async def _task(self) -> None:
        try:
            self.direct = True
            await self._main()
        except trio.Cancelled:
            pass  # the shared run is ending
        except BaseException as exc:  # kept for whoever calls next, as a thread's
            self.error = exc
            log.debug("%s: the client's task ended with %r", self.name, exc)
        finally:
            self.direct = False
            self._token = None
            self._ended = True
            self._ready.set()
            on_ready, self._on_ready = self._on_ready, None
            if on_ready is not None:
                on_ready()
            on_exit, self._on_exit = self._on_exit, None
            if on_exit is not None:
                on_exit()

    def yield_to_host(self) -> None:
        """See :meth:`GuestRun.yield_to_host` (from the client's Trio code)."""
        run = self.run_
        if run is not None:
            run.yield_to_host()

    def _forked_in_child(self) -> None:
        # The child has the loop's thread (the one that forked) but not the
        # run's I/O worker, nor the right to write on the parent's sockets.
        self.direct = False
        super()._forked_in_child()

    def start(self, timeout: float = 0) -> None:
        raise BlockingInTrioError(f"{self.name}: a guest runner is started with launch()")

    def join(self, timeout: float | None = None) -> bool:
        return not self.alive

    def run(self, fn: Callable[..., Awaitable[R]], *args: Any, timeout: float | None = None) -> R:
        raise BlockingInTrioError(
            f"{self.name}: a blocking call into a guest run would block its own loop"
        )

    def run_sync(self, fn: Callable[..., R], *args: Any) -> R:
        """``fn(*args)`` now: from the loop's thread, between Trio's steps, the
        run's state is consistent.  From another thread, in the loop's thread
        (waiting for it, as a TrioThread's caller does)."""
        if not self.in_loop_thread:
            return super().run_sync(fn, *args)
        self._check()
        return fn(*args)

    def run_sync_soon(self, fn: Callable[..., object], *args: Any) -> None:
        """``fn(*args)``: at once from the loop's thread (Trio's wake-ups work
        from asyncio code in guest mode), queued from any other."""
        if not self.alive:
            self._check()
            raise LoopStoppedError(f"{self.name}: the event loop stopped")
        if threading.get_ident() == self.host_ident:
            fn(*args)
            return
        try:
            self.token.run_sync_soon(fn, *args)
        except trio.RunFinishedError:
            raise LoopStoppedError(f"{self.name}: the event loop stopped") from self.error


class _Refuse:
    """Stands in for a retiring worker's lock: no new job (unless one was
    given meanwhile), so that its next wait times out at once and it exits."""

    __slots__ = ("worker",)

    def __init__(self, worker: Any) -> None:
        self.worker = worker

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self.worker._job is not None

    def release(self) -> None:
        pass


def _nothing() -> None:
    pass


def _ignore(_: object) -> None:
    pass


def _retire_workers(keep: set[threading.Thread]) -> None:
    """End the idle workers of Trio's thread cache that were started after
    ``keep`` was taken (the guest run's I/O waits; ``trio.to_thread`` calls).

    Trio keeps an idle worker for 10 s, for reuse; a worker retired here ends
    now instead.  It is taken out of the cache's idle set (so nobody gives it
    a job), given an empty job, and its lock replaced by one that says "no
    job", so that after the job it leaves as it would after its idle timeout.
    This reaches into trio._core._thread_cache (private, checked on trio 0.35):
    if its shape is not the one expected, the workers are left to end by
    themselves.
    """
    try:
        from trio._core._thread_cache import THREAD_CACHE

        idle: dict[Any, None] = THREAD_CACHE._idle_workers
    except (ImportError, AttributeError):  # pragma: no cover - another trio
        return
    for worker in list(idle):
        thread = getattr(worker, "_thread", None)
        if not isinstance(thread, threading.Thread) or thread in keep:
            continue
        if not all(hasattr(worker, name) for name in ("_job", "_worker_lock")):
            continue  # pragma: no cover - another trio
        try:
            del idle[worker]  # now ours: nobody else gives it a job
        except KeyError:
            continue  # taken meanwhile (or it timed out)
        lock = worker._worker_lock
        worker._job = (_nothing, _ignore, None)
        worker._worker_lock = _Refuse(worker)
        lock.release()  # it wakes, runs the empty job, finds no lock to wait on, ends
        thread.join(1.0)
        if thread.is_alive():  # pragma: no cover - a wedged machine
            log.debug("a Trio worker thread did not end at once: %s", thread.name)
