"""Starting and ending a hosted client (its Trio thread) from an asyncio task.

Nothing here blocks the asyncio loop for longer than a thread's start or its
very end: the Trio thread reports through a :class:`~trionsq.bridge.LoopPost`
(``call_soon_threadsafe``) that it is ready and, later, that its run has
ended; only then is the thread joined, so that no thread outlives the
``async with``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import outcome

from ..bridge import LoopPost
from ..trio_thread import TrioThread

__all__ = ["Hosted", "LoopCalls", "enter", "leave", "settle_future"]

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
    hosted.launch(
        lambda error: calls.future(started, error, None),
        lambda: calls.future(exited, None, None),
    )
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
    waits for the thread (briefly) before letting the cancellation through."""
    request()
    try:
        await asyncio.shield(exited)
    except asyncio.CancelledError:
        runner.request_stop()
        runner.join(10.0)
        raise
    runner.join()
