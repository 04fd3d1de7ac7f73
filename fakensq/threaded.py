"""Run a fakensq node in a background thread, for code that is not Trio.

A synchronous test, an asyncio test, or a test of a client in another language
needs an nsqd that keeps serving while the test's own code blocks.  A
:class:`BackgroundNode` runs any fakensq async context manager (an ``NSQD``, an
``NSQLookupd``, a ``Cluster``) inside ``trio.run`` on its own thread, and hands the
started node back once it is listening.

    with BackgroundNode(lambda: NSQD(tcp_address="127.0.0.1:0")) as nsqd:
        connect_to(nsqd.tcp_address)
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Generic, TypeVar

import trio
import trio.lowlevel

__all__ = ["BackgroundNode"]

T = TypeVar("T")
R = TypeVar("R")

_START_TIMEOUT = 30.0


class BackgroundNode(Generic[T]):
    """A node started by ``factory()`` and served on a thread of its own."""

    def __init__(
        self, factory: Callable[[], AbstractAsyncContextManager[T]], name: str = "fakensq"
    ) -> None:
        self._factory = factory
        self._name = name
        self._ready = threading.Event()
        self._node: T | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    @property
    def node(self) -> T:
        if self._node is None:
            raise RuntimeError("the node is not running")
        return self._node

    def start(self) -> T:
        """Start the thread and block until the node is ready (or failed to start)."""
        if self._thread is not None:
            raise RuntimeError("already started")
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()
        if not self._ready.wait(_START_TIMEOUT):
            raise TimeoutError(f"{self._name} did not start within {_START_TIMEOUT} s")
        if self._error is not None:
            self._thread.join()
            raise RuntimeError(f"{self._name} failed to start") from self._error
        return self.node

    def call(self, fn: Callable[..., Awaitable[R]], *args: object) -> R:
        """Run ``await fn(*args)`` in the node's event loop and return its result."""
        if self._token is None:
            raise RuntimeError("the node is not running")
        return trio.from_thread.run(fn, *args, trio_token=self._token)

    def call_sync(self, fn: Callable[..., R], *args: object) -> R:
        """Run ``fn(*args)`` in the node's event loop (e.g. a fault of
        ``cluster.faults``) and return its result."""
        if self._token is None:
            raise RuntimeError("the node is not running")
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    def stop(self) -> None:
        """Shut the node down cleanly and wait for its thread to end."""
        if self._thread is None:
            return
        if self._token is not None and self._stop is not None:
            try:
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
            except trio.RunFinishedError:
                pass
        self._thread.join()
        self._thread = None
        if self._error is not None:
            raise RuntimeError(f"{self._name} failed") from self._error

    def __enter__(self) -> T:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # reported to whoever waits on start/stop
            self._error = exc
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._stop = trio.Event()
        async with self._factory() as node:
            self._node = node
            self._token = trio.lowlevel.current_trio_token()
            self._ready.set()
            await self._stop.wait()
