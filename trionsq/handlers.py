"""A consumer's handler pool: the tasks that run its ``handler``.

Handlers run in a pool of worker tasks taking messages from the queue, not
in a task per message: spawning a task costs more than handing a message
to a parked worker.  The pool grows on demand, never beyond max_in_flight
(which bounds what nsqd hands out), and workers are woken sparingly: at
most one wake-up is outstanding for new messages, and a worker just woken
that finds more queued than workers on their way wakes two more.  A quick
handler thus drains a whole read with a few workers (no task switch per
message), while a handler that waits has the pool fan out exponentially,
in a few scheduler passes.

:class:`HandlerPool` (which :class:`~trionsq.consumer.Consumer` inherits) holds
the workers, and the ``give_up`` calls for messages past ``max_attempts``.
"""

from __future__ import annotations

import inspect
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from types import CoroutineType
from typing import TYPE_CHECKING

import trio

from .config import Config
from .lifecycle import OPEN, Life, Lifecycle
from .message import Message
from .protocol import commands
from .session import Session

if TYPE_CHECKING:
    from .telemetry import ConsumerTelemetry

__all__ = ["HandlerPool"]

log = logging.getLogger("trionsq.consumer")


class HandlerPool:
    """The handler pool's steps, for :class:`~trionsq.consumer.Consumer`
    (which inherits them, and sets these attributes up)."""

    config: Config
    _life: Lifecycle[Life]
    _handler: Callable[[Message], Awaitable[object] | object] | None
    _give_up_handler: Callable[[Message], Awaitable[object] | object] | None
    _handlers: trio.Nursery | None
    _queue: deque[Message]
    _queue_waiters: trio.lowlevel.ParkingLot
    _workers: int
    _pool_limit: int
    _waking: int
    _given_up: int
    _giving_up: set[Message]
    _telemetry: ConsumerTelemetry | None
    _interrupt: Callable[[BaseException], None]
    _settle: Callable[..., None]

    def _wake_workers(self, count: int) -> None:
        assert self._handlers is not None
        for _ in range(count):
            if self._queue_waiters:
                self._queue_waiters.unpark()
            elif self._workers < self._pool_limit and self._life.state is OPEN:
                self._workers += 1
                self._handlers.start_soon(self._worker)
            else:
                return
            self._waking += 1

    async def _worker(self) -> None:
        """Run the handler on queued messages, one at a time, until closing; a
        worker over a lowered ``max_in_flight`` leaves once its message is settled."""
        woken = True  # counted in _waking until it runs
        fresh = False
        handler = self._handler
        assert handler is not None
        try:
            while self._workers <= self._pool_limit:
                if woken:
                    woken = False
                    fresh = True
                    self._waking -= 1
                    # A worker woken as the consumer is cancelled must not start
                    # a handler it cannot finish.
                    await trio.lowlevel.checkpoint_if_cancelled()
                if self._queue:
                    message = self._queue.popleft()
                    message.responder.out[message] = None
                    if fresh:
                        fresh = False
                        spare = len(self._queue) - self._waking
                        if spare > 0:
                            self._wake_workers(min(2, spare))
                    # _handle, inline: a coroutine less per message.
                    try:
                        result = handler(message)
                        if type(result) is CoroutineType:
                            await result
                        elif result is not None and inspect.isawaitable(result):
                            await result
                    except Exception as exc:
                        log.warning("handler failed for %r: %r", message, exc, exc_info=True)
                        await message.requeue()
                    else:
                        if message.responded is None:
                            # finish(), minus its cancellation point: the
                            # handler is done, its answer must not be lost.
                            message.responded = "finished"
                            message.responder.fin(message)
                elif self._life.state is not OPEN:
                    return
                else:
                    await self._queue_waiters.park()
                    woken = True
        except (KeyboardInterrupt, SystemExit) as exc:
            # Workers run unprotected (handlers must stay interruptible), so a
            # Ctrl-C may land here: the consumer leaves and re-raises it.
            self._interrupt(exc)
        finally:
            self._workers -= 1
            if woken:
                self._waking -= 1
            if self._queue and not self._waking and self._queue_waiters:
                # Leaving over the limit: pass the queue on to a parked worker.
                self._queue_waiters.unpark()
                self._waking += 1

    async def _give_up(self, message: Message) -> None:
        self._given_up += 1
        try:
            if self._telemetry is None:
                await self._call_give_up(message)
            else:
                await self._telemetry.given_up(message, self._call_give_up)
        except (KeyboardInterrupt, SystemExit) as exc:
            self._interrupt(exc)
            return
        finally:
            self._giving_up.discard(message)
        if not message.has_responded:
            message.responded = "finished"
            session = message.responder
            assert isinstance(session, Session)
            # A give-up is a FIN: as in go-nsq it counts as a success, so a give-up
            # during a backoff test ends the test instead of leaving it open.
            self._settle(session, message, commands.fin(message.id), True, True, count=False)

    async def _call_give_up(self, message: Message) -> None:
        try:
            if self._give_up_handler is None:
                log.warning(
                    "giving up on %r after %d attempts (max_attempts=%d)",
                    message,
                    message.attempts,
                    self.config.max_attempts,
                )
            else:
                result = self._give_up_handler(message)
                if inspect.isawaitable(result):
                    await result
        except Exception:
            log.exception("give_up callback failed for %r", message)
