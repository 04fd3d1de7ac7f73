"""Run a fakensq node in a background thread, for code that is not Trio.

A synchronous test, an asyncio test, or a test of a client in another language
needs an nsqd that keeps serving while the test's own code blocks.  A
:class:`BackgroundNode` runs any fakensq async context manager (an ``NSQD``, an
``NSQLookupd``, a ``Cluster``) inside trionsq's thread runner
(:class:`trionsq.hosting.trio_thread.TrioThread`: ``trio.run`` on a thread of its own),
and hands the started node back once it is listening.

    with BackgroundNode(lambda: NSQD(tcp_address="127.0.0.1:0")) as nsqd:
        connect_to(nsqd.tcp_address)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Generic, TypeVar

import trio

from trionsq.hosting.trio_thread import LoopStoppedError, TrioThread

__all__ = ["BackgroundNode"]

T = TypeVar("T")
R = TypeVar("R")


class BackgroundNode(Generic[T]):
    """A node started by ``factory()`` and served on a thread of its own."""

    def __init__(
        self, factory: Callable[[], AbstractAsyncContextManager[T]], name: str = "fakensq"
    ) -> None:
        self._factory = factory
        self._name = name
        self._runner: TrioThread | None = None
        self._node: T | None = None
        self._stop: trio.Event | None = None
        self._stopped: trio.Event | None = None

    @property
    def node(self) -> T:
        if self._node is None:
            raise RuntimeError("the node is not running")
        return self._node

    @property
    def runner(self) -> TrioThread:
        """The thread runner serving the node."""
        if self._runner is None:
            raise RuntimeError("the node is not running")
        return self._runner

    def start(self) -> T:
        """Start the thread and block until the node is ready (or failed to start)."""
        if self._runner is not None:
            raise RuntimeError("already started")
        runner = TrioThread(self._name)
        self._runner = runner
        runner.start()
        try:
            self._node = runner.start_service(self._serve)
        except BaseException as exc:
            runner.close()
            raise RuntimeError(f"{self._name} failed to start") from exc
        return self._node

    async def _serve(self, *, task_status: trio.TaskStatus[T] = trio.TASK_STATUS_IGNORED) -> None:
        self._stop = trio.Event()
        self._stopped = trio.Event()
        try:
            async with self._factory() as node:
                task_status.started(node)
                await self._stop.wait()
        finally:
            self._stopped.set()

    async def _shutdown(self) -> None:
        assert self._stop is not None and self._stopped is not None
        self._stop.set()
        await self._stopped.wait()

    def call(self, fn: Callable[..., Awaitable[R]], *args: object) -> R:
        """Run ``await fn(*args)`` in the node's event loop and return its result."""
        return self.runner.run(fn, *args)

    def call_sync(self, fn: Callable[..., R], *args: object) -> R:
        """Run ``fn(*args)`` in the node's event loop (e.g. a fault of
        ``cluster.faults``) and return its result."""
        return self.runner.run_sync(fn, *args)

    def stop(self) -> None:
        """Shut the node down cleanly (its ``async with`` is left, not cancelled)
        and wait for its thread to end."""
        runner = self._runner
        if runner is None:
            return
        try:
            if runner.alive:
                runner.run(self._shutdown)
        except LoopStoppedError:
            pass  # it crashed: reported below
        finally:
            runner.close()
            self._runner = None
        if runner.error is not None:
            raise RuntimeError(f"{self._name} failed") from runner.error

    def __enter__(self) -> T:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        # Stopped the same way whatever the block raised (it propagates as is).
        self.stop()
