"""Starting and ending a hosted client from an asyncio task, and its calls
into the asyncio loop.

A client runs in its loop's Trio guest run (:mod:`trionsq.aio.guest`, the
default) or on a Trio thread of its own (``guest=False``).  In guest mode Trio
code runs on the asyncio loop's thread, so its calls into asyncio are made at
once (:class:`DirectCalls`, :class:`DirectPost`); from a Trio thread they go
through ``call_soon_threadsafe``, a batch at a time (:class:`LoopCalls`).

Nothing here blocks the asyncio loop for longer than a thread's start or its
very end: the client reports that it is ready and, later, that its task (or
thread's run) has ended; only then is its guest run released (the last
client ends it) or its thread joined, so that no thread or Trio run outlives
the ``async with``.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import outcome

from ..hosting.handover import LoopPost
from ..hosting.trio_thread import TrioThread
from . import guest
from .guest import GuestRunner

__all__ = [
    "DirectCalls",
    "DirectPost",
    "Hosted",
    "LoopCalls",
    "enter",
    "leave",
    "new_runner",
    "settle_future",
]

T = TypeVar("T")

#: ``(fn, arg)``: ``fn(arg)`` called in the asyncio loop
LoopCall = tuple[Callable[[Any], None], Any]


class Hosted(Protocol):
    runner: TrioThread

    def launch(
        self,
        on_started: Callable[[BaseException | None], None],
        on_exit: Callable[[], None] | None = None,
    ) -> None: ...


def settle_future(item: tuple[asyncio.Future[Any], BaseException | None, Any]) -> None:
    """In the asyncio loop: complete a future (unless its awaiter gave up)."""
    future, error, value = item
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


class LoopCalls(LoopPost[LoopCall]):
    """Calls from the Trio thread into the asyncio loop, batched."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop, _calls)

    def future(self, future: asyncio.Future[Any], error: BaseException | None, value: Any) -> None:
        """(Any thread) complete ``future`` in the asyncio loop."""
        self.put((settle_future, (future, error, value)))

    def outcome(self, future: asyncio.Future[Any], result: outcome.Outcome[Any]) -> None:
        if isinstance(result, outcome.Error):
            self.future(future, result.error, None)
        elif isinstance(result, outcome.Value):
            self.future(future, None, result.value)


class DirectPost(LoopPost[T]):
    """A :class:`~trionsq.hosting.handover.LoopPost` for a guest run: items put from the
    asyncio loop's thread (where the guest run's Trio code runs) are handed to
    ``on_items`` at once; from another thread, as a LoopPost does.  It is made
    in the loop's thread (:attr:`LoopPost.made_in`)."""

    def put(self, item: T) -> None:
        self._items.append(item)
        self.schedule()

    def add(self, item: T) -> None:
        self._items.append(item)
        self.schedule()

    def schedule(self) -> None:
        if threading.get_ident() == self.made_in:
            self._on_items(self._items)
        else:
            super().schedule()


class DirectCalls(DirectPost[LoopCall], LoopCalls):
    """:class:`LoopCalls` for a guest run: made at once from the loop's thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        DirectPost.__init__(self, loop, _calls)


def new_runner(name: str, use_guest: bool) -> TrioThread | None:
    """The runner for a new client: a :class:`GuestRunner` in guest mode,
    ``None`` (a thread of its own, made by the hosted client) otherwise."""
    return GuestRunner(name) if use_guest else None


def calls_for(runner: TrioThread, loop: asyncio.AbstractEventLoop) -> LoopCalls:
    return DirectCalls(loop) if isinstance(runner, GuestRunner) else LoopCalls(loop)


def _calls(items: deque[LoopCall]) -> None:
    while items:
        fn, arg = items.popleft()
        fn(arg)


async def enter(hosted: Hosted, calls: LoopCalls) -> asyncio.Future[None]:
    """Start ``hosted``'s thread and wait until it serves; returns the future
    that completes when its run has ended (for :func:`leave`)."""
    loop = asyncio.get_running_loop()
    started: asyncio.Future[None] = loop.create_future()
    exited: asyncio.Future[None] = loop.create_future()
    runner = hosted.runner
    if isinstance(runner, GuestRunner):
        runner.run_ = await guest.acquire()
    try:
        hosted.launch(
            lambda error: calls.future(started, error, None),
            lambda: calls.future(exited, None, None),
        )
    except BaseException:
        await _release(runner)
        raise
    try:
        await started
    except BaseException:
        hosted.runner.request_stop()
        await leave(hosted.runner, exited, lambda: None)
        raise
    return exited


async def leave(
    runner: TrioThread, exited: asyncio.Future[None], request: Callable[[], None]
) -> None:
    """Ask the hosted client to end (``request()``), wait for its run to end,
    join its thread.  Cancelled meanwhile, it stops the run the hard way and
    waits for the thread (briefly) before letting the cancellation through.
    A guest runner's task ends promptly once stopped: it is waited for, then
    the guest run released, even when cancelled."""
    request()
    if isinstance(runner, GuestRunner):
        cancelled: asyncio.CancelledError | None = None
        while not exited.done():
            try:
                await asyncio.shield(exited)
            except asyncio.CancelledError as exc:
                cancelled = exc
                runner.request_stop()
        try:
            await _release(runner)
        finally:
            if cancelled is not None:
                raise cancelled
        return
    try:
        await asyncio.shield(exited)
    except asyncio.CancelledError:
        runner.request_stop()
        runner.join(10.0)
        raise
    runner.join()


async def _release(runner: TrioThread) -> None:
    """Release a guest runner's run (once; the last client ends it)."""
    if isinstance(runner, GuestRunner) and runner.run_ is not None:
        run, runner.run_ = runner.run_, None
        await guest.release(run)
