"""One Trio run on a background thread, driven from any other thread.

Code that is not Trio (a synchronous program, an asyncio one, Spark's driver, a
test fixture) reaches trionsq's and fakensq's Trio code through a
:class:`TrioThread`: ``trio.run`` on a daemon thread of its own, with a nursery
for long-lived tasks ("services") and a portal for calls from other threads::

    runner = TrioThread("my-client")
    runner.start()
    try:
        producer = runner.start_service(serve_producer)   # nursery.start() in the loop
        runner.run(producer.publish, "topic", b"body", timeout=5)
    finally:
        runner.close()                                   # cancels the services, joins

A call made with :meth:`TrioThread.run` carries its result or exception back to
the caller.  If the caller gives up (``timeout``, or ``KeyboardInterrupt`` in the
main thread), the call is cancelled in the loop before the caller goes on, so no
work continues behind its back.  A blocking call made from inside a Trio run
raises :class:`BlockingInTrioError` at once: it would block that run (and, in the
loop's own thread, wait for itself forever).

After ``os.fork()`` the child has the parent's memory but not its threads: a
runner started before the fork is dead there.  Every call on it raises
:class:`ForkedError`, its inherited sockets (those registered with
:meth:`TrioThread.track_socket`) are closed in the child without touching the
parent's connection, and the callbacks given to :meth:`TrioThread.on_fork` run
in the child, so that an owner can start afresh.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import outcome
import trio
import trio.lowlevel
import trio.socket
from sniffio import thread_local as _sniffio

__all__ = [
    "BlockingInTrioError",
    "ForkedError",
    "LoopStoppedError",
    "TrioThread",
    "check_not_in_trio",
]

# (the logger keeps its name from before the hosting package: configurations stay valid)
log = logging.getLogger("trionsq.trio_thread")

R = TypeVar("R")

_START_TIMEOUT = 30.0


class LoopStoppedError(RuntimeError):
    """The loop thread is not running (never started, stopped, crashed or forked)."""


class ForkedError(LoopStoppedError):
    """The runner was started in a parent process; this is a child of a ``fork()``."""


class BlockingInTrioError(RuntimeError):
    """A blocking call was made from inside a Trio run (it would block the run,
    or deadlock if it is the run the call needs)."""


def check_not_in_trio(what: str = "this blocking call") -> None:
    """Raise :class:`BlockingInTrioError` if the current thread is running Trio."""
    # sniffio's thread-local name is a fast first filter (trio.run sets it);
    # in_trio_run() alone costs microseconds when the answer is no.
    if _sniffio.name == "trio" and trio.lowlevel.in_trio_run():
        raise BlockingInTrioError(
            f"{what} was made from inside a Trio run: it would block the event loop "
            "(and deadlock if it needs that loop); use trionsq's async API "
            "(trionsq.Producer, trionsq.Consumer) from Trio code"
        )


# --- fork detection ---
#
# A counter bumped in every child right after fork(): a runner compares it with
# the value it was started under (cheaper than os.getpid() on every call).

_fork_generation = 0
_live: weakref.WeakSet[TrioThread] = weakref.WeakSet()
#: Runners forked away, kept so that their Trio objects are never garbage
#: collected in the child: collecting them would run coroutine finalizers of a
#: run that does not exist here.
_abandoned: list[TrioThread] = []


def _after_fork_in_child() -> None:
    global _fork_generation
    _fork_generation += 1
    for runner in list(_live):
        runner._forked_in_child()


if hasattr(os, "register_at_fork"):  # pragma: no branch - POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)


class _Call(Generic[R]):
    """One call into the loop: its cancel scope and outcome, and a lock the
    caller blocks on until the outcome is there."""

    __slots__ = ("callback", "cancel_requested", "done", "result", "scope")

    def __init__(self, callback: Callable[[outcome.Outcome[R]], None] | None = None) -> None:
        self.done = threading.Lock()
        self.done.acquire()
        self.result: outcome.Outcome[R] | None = None
        self.scope: trio.CancelScope | None = None
        self.cancel_requested = False
        #: called with the outcome instead of releasing ``done`` (non-blocking calls)
        self.callback = callback

    def finish(self, result: outcome.Outcome[R]) -> None:
        self.result = result
        if self.callback is not None:
            self.callback(result)
        else:
            self.done.release()

    def cancel(self) -> None:
        """In the loop: cancel the call (now, or as soon as it starts)."""
        self.cancel_requested = True
        if self.scope is not None:
            self.scope.cancel()


class TrioThread:
    """``trio.run`` on a daemon thread; services started in it live until :meth:`close`.

    ``name`` names the thread.  Start it with :meth:`start` (blocking) or
    :meth:`launch` (returns at once; ``on_ready`` is called from the loop's thread
    once calls can be made, ``on_exit`` after the run ended, whichever way).
    """

    def __init__(self, name: str = "trionsq") -> None:
        self.name = name
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self._thread: threading.Thread | None = None
        self._generation = _fork_generation
        self._pid = os.getpid()
        self._sockets: weakref.WeakSet[trio.socket.SocketType] = weakref.WeakSet()
        self._fork_callbacks: list[Callable[[], None]] = []
        self._on_ready: Callable[[], None] | None = None
        self._on_exit: Callable[[], None] | None = None
        self._helpers: set[threading.Thread] = set()
        #: why the loop ended, if a service crashed it (or it failed to start)
        self.error: BaseException | None = None

    def __repr__(self) -> str:
        state = "running" if self.alive else "forked" if self.forked else "stopped"
        return f"<TrioThread {self.name!r} {state}>"

    # --- state ---

    @property
    def alive(self) -> bool:
        """True while calls can be made (started, not stopped, same process)."""
        return (
            self._thread is not None
            and self._token is not None
            and not self.forked
            and self._thread.is_alive()
        )

    @property
    def started(self) -> bool:
        return self._thread is not None

    @property
    def forked(self) -> bool:
        """True in a child process of a ``fork()`` made while this runner existed."""
        return self._generation != _fork_generation

    @property
    def in_loop_thread(self) -> bool:
        """True when called from the loop's own thread."""
        return self._thread is not None and threading.current_thread() is self._thread

    @property
    def token(self) -> trio.lowlevel.TrioToken:
        """The run's token (for ``run_sync_soon``); raises if the loop is not running."""
        self._check()
        assert self._token is not None
        return self._token

    def _check(self) -> None:
        if self.forked:
            raise ForkedError(
                f"{self.name}: started in process {self._pid}, before a fork(); its thread "
                f"does not exist in this process ({os.getpid()}): start a new one here"
            )
        if self._token is None or self.error is not None:
            raise LoopStoppedError(f"{self.name}: the event loop is not running") from self.error

    # --- starting and stopping ---

    def launch(
        self,
        on_ready: Callable[[], None] | None = None,
        on_exit: Callable[[], None] | None = None,
    ) -> None:
        """Start the thread and return at once (see the class doc for the callbacks)."""
        if self._thread is not None:
            raise RuntimeError(f"{self.name}: already started")
        self._on_ready = on_ready
        self._on_exit = on_exit
        self._mark_launched()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def _mark_launched(self) -> None:
        """For :meth:`launch` (this class's and a subclass's): the process and
        fork generation it runs in, and its place among the runners a fork
        stops."""
        self._generation = _fork_generation
        self._pid = os.getpid()
        _live.add(self)

    def launch_service(
        self,
        fn: Callable[..., Awaitable[object]],
        on_started: Callable[[BaseException | None], None],
        on_exit: Callable[[], None] | None = None,
    ) -> None:
        """:meth:`launch`, then ``nursery.start(fn)`` in the loop, without
        blocking: ``on_started(error)`` is called from the loop's thread once
        ``fn`` reported that it started (``None``) or failed to (its exception;
        the loop then stops), ``on_exit()`` once the loop has ended."""

        async def start() -> None:
            assert self._nursery is not None
            try:
                await self._nursery.start(fn)
            except Exception as exc:
                on_started(exc)
                self.request_stop()
                return
            on_started(None)

        def ready() -> None:
            nursery = self._nursery
            if self.error is not None or nursery is None:
                on_started(self.error or LoopStoppedError("the loop did not start"))
                return
            nursery.start_soon(start)

        self.launch(on_ready=ready, on_exit=on_exit)

    def start(self, timeout: float = _START_TIMEOUT) -> None:
        """Start the thread and block until the loop runs (or failed to start)."""
        check_not_in_trio(f"{self.name}: starting a TrioThread")
        self.launch()
        if not self._ready.wait(timeout):  # pragma: no cover - a wedged machine
            self.close(0)
            raise LoopStoppedError(f"{self.name}: the event loop did not start in {timeout} s")
        self._check()

    def close(self, timeout: float | None = 30.0) -> bool:
        """Cancel the loop's services and wait (up to ``timeout``) for the thread to
        end; returns whether it did.  Safe to call more than once, from any thread
        but the loop's own, and in a forked child (where it only lets go)."""
        thread = self._thread
        if thread is None or self.forked:
            return True
        if threading.current_thread() is thread:
            raise RuntimeError(f"{self.name}: close() from the loop's own thread would deadlock")
        self.request_stop()
        return self.join(timeout)

    def request_stop(self) -> None:
        """Ask the loop to cancel its services and end, without waiting."""
        token, stop = self._token, self._stop
        if token is None or stop is None or self.forked:
            return
        try:
            token.run_sync_soon(stop.set, idempotent=True)
        except trio.RunFinishedError:
            pass

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread to end (after :meth:`request_stop`)."""
        thread = self._thread
        if thread is None or self.forked:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        thread.join(timeout)
        for helper in list(self._helpers):
            helper.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if not helper.is_alive():
                self._helpers.discard(helper)
            else:
                log.warning("%s: %s is still running; left behind", self.name, helper.name)
        return not thread.is_alive()

    def __enter__(self) -> TrioThread:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # kept for whoever calls next
            self.error = exc
            log.debug("%s: the event loop ended with %r", self.name, exc)
        finally:
            self._token = None
            self._ready.set()
            on_ready, self._on_ready = self._on_ready, None
            if on_ready is not None:  # never got ready: let the waiter see the error
                on_ready()
            on_exit, self._on_exit = self._on_exit, None
            if on_exit is not None:
                on_exit()

    async def _main(self) -> None:
        self._stop = trio.Event()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._token = trio.lowlevel.current_trio_token()
            self._ready.set()
            on_ready, self._on_ready = self._on_ready, None
            if on_ready is not None:
                on_ready()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    # --- calls from other threads ---

    def run(self, fn: Callable[..., Awaitable[R]], *args: Any, timeout: float | None = None) -> R:
        """``await fn(*args)`` in the loop and return its result (or raise its
        exception) here.

        With ``timeout`` (seconds), a call still running then is cancelled and
        :class:`TimeoutError` raised.  An exception that interrupts the wait
        (``KeyboardInterrupt``) cancels the call too before it propagates.  If the
        loop stops while the call runs, :class:`LoopStoppedError` is raised.
        """
        check_not_in_trio(f"{self.name}: a blocking call")
        token = self.token
        call: _Call[R] = _Call()
        try:
            # Both steps inside the try: a KeyboardInterrupt may land in either.
            token.run_sync_soon(self._spawn_call, call, fn, args)
            finished = call.done.acquire(timeout=-1 if timeout is None else max(timeout, 0))
        except trio.RunFinishedError:
            raise LoopStoppedError(f"{self.name}: the event loop stopped") from self.error
        except BaseException:
            self._cancel_call(call)
            raise
        if not finished:
            self._cancel_call(call)
            call.done.acquire()
        result = call.result
        assert result is not None
        if isinstance(result, outcome.Error) and isinstance(result.error, trio.Cancelled):
            if not finished:
                raise TimeoutError(f"{self.name}: the call took more than {timeout} s")
            raise LoopStoppedError(f"{self.name}: the event loop stopped during the call")
        return result.unwrap()

    def _cancel_call(self, call: _Call[Any]) -> None:
        try:
            self.token.run_sync_soon(call.cancel)
        except (trio.RunFinishedError, LoopStoppedError):
            pass  # the run is over: the call has been (or is being) cancelled with it

    def _spawn_call(self, call: _Call[R], fn: Callable[..., Awaitable[R]], args: Any) -> None:
        # In the loop, from run_sync_soon: a task in the services' nursery.
        try:
            assert self._nursery is not None
            self._nursery.start_soon(self._call_task, call, fn, args, name=fn)
        except RuntimeError as exc:  # the nursery is closed: the loop is ending
            stopped = LoopStoppedError(f"{self.name}: the event loop stopped")
            stopped.__cause__ = exc
            call.finish(outcome.Error(stopped))

    async def _call_task(self, call: _Call[R], fn: Callable[..., Awaitable[R]], args: Any) -> None:
        result: outcome.Outcome[R] = outcome.Error(LoopStoppedError(f"{self.name}: cancelled"))
        try:
            with trio.CancelScope() as scope:
                call.scope = scope
                if call.cancel_requested:
                    scope.cancel()
                result = await outcome.acapture(fn, *args)
        finally:
            call.finish(result)

    def submit(
        self,
        fn: Callable[..., Awaitable[R]],
        *args: Any,
        done: Callable[[outcome.Outcome[R]], None],
    ) -> Callable[[], None]:
        """``await fn(*args)`` in the loop without waiting for it (any thread);
        ``done(outcome)`` is called in the loop's thread when it ends (an
        ``Error(LoopStoppedError)`` if the loop stops first).  Returns a function
        that cancels the call (safe from any thread, at any time)."""

        def finish(result: outcome.Outcome[R]) -> None:
            if isinstance(result, outcome.Error) and isinstance(result.error, trio.Cancelled):
                result = outcome.Error(LoopStoppedError(f"{self.name}: the call was cancelled"))
            done(result)

        call: _Call[R] = _Call(finish)
        self.run_sync_soon(self._spawn_call, call, fn, args)

        def cancel() -> None:
            try:
                self.run_sync_soon(call.cancel)
            except LoopStoppedError:
                pass

        return cancel

    def run_sync(self, fn: Callable[..., R], *args: Any) -> R:
        """``fn(*args)`` in the loop's thread (to read or change its state safely)."""
        check_not_in_trio(f"{self.name}: a blocking call")
        token = self.token
        call: _Call[R] = _Call()

        def run() -> None:
            call.finish(outcome.capture(fn, *args))

        try:
            token.run_sync_soon(run)
        except trio.RunFinishedError:
            raise LoopStoppedError(f"{self.name}: the event loop stopped") from self.error
        call.done.acquire()
        assert call.result is not None
        return call.result.unwrap()

    def run_sync_soon(self, fn: Callable[..., object], *args: Any) -> None:
        """Queue ``fn(*args)`` to run in the loop's thread and return at once.

        ``fn`` must not raise (an exception would crash the loop); raises
        :class:`LoopStoppedError` if the loop has ended.
        """
        try:
            self.token.run_sync_soon(fn, *args)
        except trio.RunFinishedError:
            raise LoopStoppedError(f"{self.name}: the event loop stopped") from self.error

    def start_service(
        self, fn: Callable[..., Awaitable[object]], *args: Any, timeout: float | None = None
    ) -> Any:  # whatever fn passes to task_status.started()
        """``nursery.start(fn, *args)`` in the loop: a task that runs until
        :meth:`close` (it is cancelled then) or until it returns; returns what it
        reported as started.  If it fails before starting, its exception is
        raised here."""

        async def start() -> Any:
            assert self._nursery is not None
            return await self._nursery.start(fn, *args)

        return self.run(start, timeout=timeout)

    async def run_in_thread(self, fn: Callable[..., R], *args: Any) -> R:
        """In the loop: ``fn(*args)`` on a new thread (for blocking user code the
        loop must not run itself); returns its result or raises its exception.

        The thread cannot be cancelled: a cancelled caller stops waiting and the
        thread runs to its end; :meth:`close` joins it.  Unlike
        ``trio.to_thread``, no cached worker thread outlives the runner.
        """
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()
        box: list[outcome.Outcome[R]] = []

        def target() -> None:
            box.append(outcome.capture(fn, *args))
            try:
                token.run_sync_soon(done.set)
            except trio.RunFinishedError:
                pass

        helper = threading.Thread(target=target, name=f"{self.name}-helper", daemon=True)
        self._helpers.add(helper)
        helper.start()
        await done.wait()
        helper.join()  # it is past its last step: only its exit is left
        self._helpers.discard(helper)
        return box[0].unwrap()

    # --- fork ---

    def track_socket(self, sock: trio.socket.SocketType) -> None:
        """Remember a socket of this run: in a forked child it is closed (the
        child's copy only; the parent's connection goes on)."""
        self._sockets.add(sock)

    def on_fork(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` in the child, right after a ``fork()`` (while the
        child has a single thread: it may replace locks and state, nothing more)."""
        self._fork_callbacks.append(callback)

    def _forked_in_child(self) -> None:
        if not self.started:
            return
        _abandoned.append(self)
        for sock in list(self._sockets):
            try:
                # detach() marks the object closed without closing the descriptor,
                # which is then closed here: no finalizer can close it again later.
                os.close(sock.detach())
            except OSError:
                pass
        self._sockets = weakref.WeakSet()
        for callback in self._fork_callbacks:
            try:
                callback()
            except Exception:  # the child must go on
                log.exception("%s: a fork callback failed", self.name)
