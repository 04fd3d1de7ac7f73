"""A Trio event loop on a daemon thread, driven from synchronous code.

Spark calls the source's methods (on the driver) and the sink's ``write`` (on
executors) from plain threads; the NSQ connections they need live in a Trio loop
of their own, on a thread started here.  :meth:`LoopThread.run` is the portal.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio
import trio.lowlevel

__all__ = ["LoopThread", "LoopStoppedError"]

R = TypeVar("R")

_START_TIMEOUT = 30.0


class LoopStoppedError(RuntimeError):
    """The loop thread is not running (never started, stopped, or crashed)."""


class LoopThread:
    """``trio.run`` on a daemon thread; tasks started in it live until :meth:`close`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self._thread: threading.Thread | None = None
        #: why the loop ended, if a task crashed it
        self.error: BaseException | None = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._token is not None

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("already started")
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        if not self._ready.wait(_START_TIMEOUT):  # pragma: no cover - a wedged machine
            raise LoopStoppedError(f"{self.name}: the event loop did not start")
        self._check()

    def _check(self) -> None:
        if self._token is None or self.error is not None:
            raise LoopStoppedError(f"{self.name}: the event loop is not running") from self.error

    def run(self, fn: Callable[..., Awaitable[R]], *args: Any) -> R:
        """``await fn(*args)`` in the loop; its exceptions are raised here."""
        self._check()
        try:
            return trio.from_thread.run(fn, *args, trio_token=self._token)
        except trio.RunFinishedError:
            raise LoopStoppedError(f"{self.name}: the event loop stopped") from self.error

    def run_sync(self, fn: Callable[..., R], *args: Any) -> R:
        """``fn(*args)`` in the loop's thread (for reading its state safely)."""
        self._check()
        try:
            return trio.from_thread.run_sync(fn, *args, trio_token=self._token)
        except trio.RunFinishedError:
            raise LoopStoppedError(f"{self.name}: the event loop stopped") from self.error

    def start_service(
        self, fn: Callable[..., Awaitable[object]], *args: Any
    ) -> Any:  # whatever fn passes to task_status.started()
        """``nursery.start(fn, *args)`` in the loop: a task that runs until :meth:`close`
        (it is cancelled then); returns what it reported as started."""

        async def start() -> Any:
            assert self._nursery is not None
            return await self._nursery.start(fn, *args)

        return self.run(start)

    def close(self, timeout: float = 30.0) -> None:
        """Cancel the loop's tasks and wait (up to ``timeout``) for the thread to end."""
        thread = self._thread
        if thread is None:
            return
        if self._token is not None and self._stop is not None:
            try:
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
            except trio.RunFinishedError:
                pass
        thread.join(timeout)

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # kept for whoever calls run() next
            self.error = exc
        finally:
            self._token = None
            self._ready.set()

    async def _main(self) -> None:
        self._stop = trio.Event()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._token = trio.lowlevel.current_trio_token()
            self._ready.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()
