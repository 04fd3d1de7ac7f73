"""The asyncio Consumer: ``async for message in consumer:`` or a handler, in asyncio."""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import threading
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from typing import Any, TypeVar, cast

import outcome
import trio

from ..config import Config
from ..hosting.consumer import (
    HandedMessage,
    HostedConsumer,
    HostedConsumerState,
    check_requeue_delay,
)
from ..hosting.handover import LoopPost
from ..hosting.producer import ClientClosedError
from ..hosting.trio_thread import ForkedError, LoopStoppedError
from ..lifecycle import CLOSED, CLOSING, NEW, OPEN, OPENING, AsyncClient, Lifecycle, Moves
from ..message import Message as CoreMessage
from .guest import GuestRunner
from .lifecycle import DirectPost, LoopCalls, calls_for, enter, leave, new_runner

__all__ = ["Consumer", "Message"]

log = logging.getLogger("trionsq.aio")

R = TypeVar("R")

#: ``async for`` hands out this many ready messages between two yields to the
#: asyncio loop (which delivers the next batches meanwhile).
_YIELD_EVERY = 256


class _Done:
    """An awaitable that is already complete: ``await`` returns None at once,
    without a coroutine (settling is a hand-over, done when called)."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, Any, None]:
        # Any iterator will do for ``await``; an empty one ends it at once,
        # and an exhausted one stays so: one serves every await.
        return _EXHAUSTED


_EXHAUSTED = cast("Generator[Any, Any, None]", iter(()))
_DONE = _Done()


class Message(HandedMessage):
    """One delivery of a message, as :class:`trionsq.Message` but for asyncio.

    Exactly one of :meth:`finish` and :meth:`requeue` takes effect (the first);
    later calls of either do nothing.  They act when called (the client's loop
    sends the command) and return an awaitable that is already complete, so
    ``await message.finish()`` never suspends.  Messages are never touched
    automatically.
    """

    __slots__ = ()

    # In guest mode, on the loop's thread (where the client's Trio code runs
    # too, between its steps), a settle is applied to the core message at once,
    # through the core's non-blocking paths (what the hosted consumer's settler
    # task does for settles from other threads), not handed to that task.

    def _settles_here(self) -> bool:
        """Whether a settle may be applied at once: guest mode, on the loop's thread."""
        runner = self._hosted.runner
        return (
            type(runner) is GuestRunner
            and runner.direct
            and threading.get_ident() == runner.host_ident
        )

    def _apply_here(self, apply: Callable[[CoreMessage], None]) -> None:
        """Settle the core message by ``apply`` (which does nothing if it was)."""
        apply(self._core)
        self._hosted.settled()

    def _finish(self) -> None:
        if not self._settles_here():
            HandedMessage._finish(self)
            return
        if self._claim("finished"):
            self._apply_here(CoreMessage.finish_now)

    def _requeue(self, delay: float | None, backoff: bool) -> None:
        if not self._settles_here():
            HandedMessage._requeue(self, delay, backoff)
            return
        check_requeue_delay(delay)
        if self._claim("requeued"):
            self._delay = delay
            self._backoff = backoff
            self._requeued(delay)
            self._apply_here(lambda core: core.requeue_now(delay, backoff))

    def finish(self) -> Awaitable[None]:
        """FIN: nsqd forgets the message."""
        self._finish()
        return _DONE

    def requeue(self, delay: float | None = None, backoff: bool = True) -> Awaitable[None]:
        """REQ: nsqd redelivers the message after ``delay`` seconds (``None``:
        from the attempts); ``backoff=True`` counts it as a handler failure."""
        self._requeue(delay, backoff)
        return _DONE

    def touch(self) -> Awaitable[None]:
        """TOUCH: reset nsqd's timeout for this message (while unanswered)."""
        self._touch()
        return _DONE


def _requeue_for_backoff(message: Message) -> None:
    """What a handler's exception does to its message (see Consumer._worker)."""
    message._requeue(None, True)


#: ``handler(message)``: sync or async; returning finishes, raising requeues.
Handler = Callable[[Message], Awaitable[object] | object]
GiveUp = Callable[[Message], Awaitable[object] | object]


#: An asyncio Consumer's life: entered once, closed once.
MOVES = Moves(
    "aio.Consumer",
    NEW,
    {
        NEW: {OPENING, CLOSED},
        OPENING: {OPEN, CLOSED},
        OPEN: {CLOSING},
        CLOSING: {CLOSED},
    },
    refusals={OPENING: "a Consumer can be entered only once"},
)


class Consumer(HostedConsumerState, AsyncClient):
    """Consumes ``topic`` on ``channel`` from asyncio code.

    ::

        async with trionsq.aio.Consumer("topic", "channel", nsqd_tcp_addresses=[...]) as c:
            async for message in c:
                ...
                await message.finish()

    or pass ``handler`` (a coroutine function or a plain one, run as tasks of the
    asyncio loop, at most ``max_in_flight`` at once): returning finishes the
    message, raising requeues it with backoff.  ``give_up`` is called likewise
    for messages past ``max_attempts``.  The options and guarantees are
    :class:`trionsq.Consumer`'s: one trionsq Consumer does the work, in the Trio
    guest run of the asyncio loop (see :mod:`trionsq.aio`), or with
    ``guest=False`` in a Trio loop on a thread started by the ``async with`` and
    joined before it is left.

    Leaving hands out nothing more and requeues at once (REQ 0, no backoff) what
    was received and not handed out, and what ``async for`` handed out and
    nobody settled; handler tasks still running get ``close_timeout`` seconds,
    then are cancelled and their messages requeued.  When the task holding the
    ``async with`` is cancelled nothing waits.  No task, thread or Trio run of
    the consumer outlives the block.
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        *,
        handler: Handler | None = None,
        give_up: GiveUp | None = None,
        config: Config | None = None,
        rng: random.Random | None = None,
        guest: bool = True,
        **options: Any,
    ) -> None:
        if handler is not None and not callable(handler):
            raise TypeError("handler must be callable")
        if give_up is not None and not callable(give_up):
            raise TypeError("give_up must be callable")
        config = Config(**options) if config is None else config.replace(**options)
        # The messages ready to hand out: appended to straight from the Trio
        # loop's thread, taken from the left in asyncio's (deque operations are
        # atomic); _end_of_batch then wakes the asyncio loop once for a batch.
        self._ready: deque[Message] = deque()
        self._handler = handler
        self._user_give_up = give_up
        self._hosted = HostedConsumer(
            topic,
            channel,
            config,
            wrap=Message,
            deliver=self._ready.append,  # type: ignore[arg-type]  # wrap=Message
            on_end=self._on_end,
            give_up=self._give_up if give_up is not None else None,
            end_of_batch=self._end_of_batch,
            rng=rng,
            name="trionsq-asyncio-consumer",
            runner=new_runner("trionsq-asyncio-consumer", guest),
        )
        self.topic = topic
        self.channel = channel
        self.config = self._hosted.consumer.config
        self._life = Lifecycle(MOVES)
        self._stopping = False
        self._end: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._calls: LoopCalls | None = None
        self._arrivals: LoopPost[Message] | None = None
        self._exited: asyncio.Future[None] | None = None
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._workers: set[asyncio.Task[None]] = set()
        self._idle: deque[asyncio.Future[None]] = deque()  # handler workers with nothing to do
        self._waking = 0  # workers started or woken that have not run yet
        self._tasks: set[asyncio.Task[None]] = set()
        self._since_yield = 0

    def __repr__(self) -> str:
        return f"<aio.Consumer {self.topic}/{self.channel} {self._life.state.value}>"

    # --- life (AsyncClient: __aenter__, __aexit__ and aclose move it) ---

    async def _open(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._calls = calls_for(self._hosted.runner, loop)
        post = DirectPost if isinstance(self._calls, DirectPost) else LoopPost
        self._arrivals = post(loop, self._arrive, self._ready)
        self._exited = await enter(self._hosted, self._calls)
        traced = self._hosted.telemetry
        if traced is not None and self._handler is not None:
            # a span a call; answered as _worker answers
            self._handler = traced.wrap_handler(
                self._handler, finish=Message._finish, requeue=_requeue_for_backoff
            )

    async def _close(self, interrupted: bool) -> None:
        """Close as described in the class doc (what leaving the block does);
        ``interrupted=True`` does not wait for running handlers."""
        self._stopping = True
        self._wake_all()
        hosted, exited = self._hosted, self._exited
        assert exited is not None and self._arrivals is not None
        try:
            try:
                await self._call(hosted.stop_delivery)
                undelivered = self._arrivals.take_all()  # the ready ones
                await self._end_workers(0.0 if interrupted else self.config.close_timeout)
                await self._call(hosted.finish, undelivered, 0.0)
            except LoopStoppedError:
                pass  # the loop ended already
            await leave(hosted.runner, exited, lambda: None)
        except asyncio.CancelledError:
            hosted.request_close()
            await self._cancel_tasks()
            await leave(hosted.runner, exited, lambda: None)
            raise
        finally:
            await self._cancel_tasks()
            if hosted.telemetry is not None:
                hosted.telemetry.close()

    async def _end_workers(self, grace: float) -> None:
        """Let handler tasks finish their messages (up to ``grace`` s), then cancel them."""
        running = {task for task in self._workers if not task.done()}
        if running and grace > 0:
            await asyncio.wait(running, timeout=grace)
        await self._cancel_tasks()

    async def _cancel_tasks(self) -> None:
        tasks = [t for t in (*self._workers, *self._tasks) if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _call(self, fn: Callable[..., Awaitable[R]], *args: Any) -> R:
        """``await fn(*args)`` in the consumer's Trio loop."""
        assert self._loop is not None and self._calls is not None
        future: asyncio.Future[R] = self._loop.create_future()
        calls = self._calls

        def done(result: outcome.Outcome[R]) -> None:
            calls.outcome(future, result)

        cancel = self._hosted.runner.submit(fn, *args, done=done)
        try:
            return await future
        except asyncio.CancelledError:
            cancel()
            raise

    def _check_open(self) -> None:
        state = self._life.state
        if state is OPEN:
            if self._hosted.runner.forked:
                raise ForkedError("this Consumer was opened before a fork()")
            return
        if state is NEW or state is OPENING:
            raise RuntimeError("use the Consumer inside 'async with'")
        raise ClientClosedError("the Consumer is closed")

    # --- delivery ---

    def _end_of_batch(self) -> None:
        # In the Trio loop's thread: one wake-up of the asyncio loop per batch
        # (in guest mode, a call; then Trio lets the woken tasks settle first).
        assert self._arrivals is not None
        self._arrivals.schedule()
        runner = self._hosted.runner
        if isinstance(runner, GuestRunner):
            runner.yield_to_host()

    def _arrive(self, ready: deque[Message]) -> None:
        # In the asyncio loop: a batch from the Trio thread is in ready (the
        # deque the LoopPost shares with us): wake who will take them.
        count = len(ready)
        if self._handler is not None:
            if not self._waking and not self._stopping:
                self._wake_workers(1)
            return
        waiters = self._waiters
        while waiters and count:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                count -= 1

    def _wake_all(self) -> None:
        for waiters in (self._waiters, self._idle):
            while waiters:
                waiter = waiters.popleft()
                if not waiter.done():
                    waiter.set_result(None)

    def _on_end(self, error: BaseException | None) -> None:
        # In the Trio loop's thread, as the consumer's service ends.
        if error is not None and self._calls is not None:
            log.error("the consumer's loop failed: %r", error)
            self._calls.put((self._ended, error))

    def _ended(self, error: BaseException) -> None:
        self._end = error
        self._wake_all()

    async def _next(self) -> Message:
        ready = self._ready
        while not ready:
            if self._stopping:
                raise StopAsyncIteration
            if self._end is not None:
                raise self._end
            assert self._loop is not None
            waiter: asyncio.Future[None] = self._loop.create_future()
            self._waiters.append(waiter)
            await waiter
            self._since_yield = 0
        if self._stopping:
            raise StopAsyncIteration
        return ready.popleft()

    def __aiter__(self) -> AsyncIterator[Message]:
        if self._handler is not None:
            raise RuntimeError("a Consumer with a handler cannot be iterated")
        traced = self._hosted.telemetry  # instrumented: a span an iteration
        return self if traced is None else traced.iterate(self)

    async def __anext__(self) -> Message:
        self._since_yield += 1
        if self._since_yield < _YIELD_EVERY and self._ready and self._life.state is OPEN:
            if not self._stopping:
                return self._ready.popleft()  # the common case: one ready
        self._check_open()
        if self._since_yield >= _YIELD_EVERY:
            self._since_yield = 0
            await asyncio.sleep(0)
        return await self._next()

    # --- handlers ---

    # Handlers run in a pool of worker tasks that grows on demand up to
    # max_in_flight, woken sparingly as in trionsq.Consumer: one wake-up per
    # batch of arrivals, and a worker just woken that finds more messages ready
    # than workers on their way wakes two more.  A quick handler drains a batch
    # in one task step; a handler that waits fans the pool out in a few steps.

    def _wake_workers(self, count: int) -> None:
        for _ in range(count):
            idle = self._idle
            while idle and idle[0].done():
                idle.popleft()
            if idle:
                idle.popleft().set_result(None)
            elif len(self._workers) < max(1, self.config.max_in_flight) and self._loop:
                task = self._loop.create_task(self._worker(), name="trionsq-handler")
                self._workers.add(task)
                task.add_done_callback(self._workers.discard)
            else:
                return
            self._waking += 1

    async def _worker(self) -> None:
        handler = self._handler
        assert handler is not None and self._loop is not None
        ready = self._ready
        woken = True  # counted in _waking until it runs
        fresh = False
        try:
            while True:
                if woken:
                    woken = False
                    fresh = True
                    self._waking -= 1
                if self._stopping:
                    return
                if not ready:
                    idle: asyncio.Future[None] = self._loop.create_future()
                    self._idle.append(idle)
                    await idle
                    woken = True
                    continue
                message = ready.popleft()
                if fresh:
                    fresh = False
                    spare = len(ready) - self._waking
                    if spare > 0:
                        self._wake_workers(min(2, spare))
                try:
                    result = handler(message)
                    if result is not None and inspect.isawaitable(result):
                        await result
                except asyncio.CancelledError:
                    message._requeue(0, False)  # cut off by the close: back at once
                    raise
                except Exception as exc:
                    log.warning("handler failed for %r: %r", message, exc, exc_info=True)
                    message._requeue(None, True)
                else:
                    message._finish()
        finally:
            if woken:
                self._waking -= 1

    async def _give_up(self, message: HandedMessage) -> None:
        """In the Trio loop: run the user's give_up in the asyncio loop, wait for it."""
        assert self._calls is not None and self._loop is not None
        done = trio.Event()
        token = trio.lowlevel.current_trio_token()
        loop = self._loop

        def notify() -> None:
            try:
                token.run_sync_soon(done.set)
            except trio.RunFinishedError:
                pass

        def start(_: object) -> None:
            task = loop.create_task(self._run_give_up(message, notify))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        self._calls.put((start, None))
        await done.wait()

    async def _run_give_up(self, message: HandedMessage, notify: Callable[[], None]) -> None:
        assert self._user_give_up is not None
        try:
            result = self._user_give_up(message)  # type: ignore[arg-type]
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("give_up callback failed for %r", message)
        finally:
            notify()

    # --- control and state ---

    async def wait_connected(self) -> None:
        """Wait until at least one nsqd subscription is up."""
        self._check_open()
        await self._call(self._hosted.consumer.wait_connected)

    async def set_max_in_flight(self, max_in_flight: int) -> None:
        """Change ``max_in_flight`` at run time (0 pauses the flow)."""
        self._check_open()
        await self._call(self._hosted.consumer.set_max_in_flight, max_in_flight)

    def is_starved(self) -> bool:
        """See :meth:`trionsq.Consumer.is_starved`."""
        self._check_open()
        return self._hosted.runner.run_sync(self._hosted.consumer.is_starved)
