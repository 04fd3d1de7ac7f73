"""``async with node:`` for every node fakensq serves (nsqd, nsqlookupd,
nsqadmin, and the test machinery's cluster and restartable nsqd)."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any, Self

import trio

__all__ = ["ServingNode"]


class ServingNode:
    """A node served by tasks of its own: ``async with node:`` starts them in a
    nursery that belongs to the node and returns once they are up (listening);
    leaving the block cancels them and waits for them to end.

    A subclass defines :meth:`serve` (``task_status.started()`` once up), or
    overrides :meth:`_start_serving` when starting is more than one task.
    The body's own exception propagates as it is, never wrapped in an
    ``ExceptionGroup``; only a failure of the node's tasks comes out of the
    ``async with`` that way.
    """

    _serving: tuple[AbstractAsyncContextManager[trio.Nursery], trio.Nursery] | None = None

    async def serve(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; ``task_status.started()`` once up."""
        raise NotImplementedError

    async def _start_serving(self, nursery: trio.Nursery) -> None:
        """Start the node's tasks in ``nursery``; return once they are up."""
        await nursery.start(self.serve)

    def _stopped(self, *, started: bool) -> None:
        """Called once the node's tasks have ended: after ``async with``, or after
        a start that failed (``started`` False); even when they failed."""

    async def __aenter__(self) -> Self:
        manager = trio.open_nursery()
        nursery = await manager.__aenter__()
        try:
            await self._start_serving(nursery)
        except BaseException:
            nursery.cancel_scope.cancel()
            try:
                await manager.__aexit__(None, None, None)
            finally:
                self._stopped(started=False)
            raise
        self._serving = (manager, nursery)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        # The body's exception (exc_info) is not the node's to handle: it
        # propagates by itself once the node's tasks have ended.
        assert self._serving is not None, "the node was not started"
        manager, nursery = self._serving
        self._serving = None
        nursery.cancel_scope.cancel()
        try:
            await manager.__aexit__(None, None, None)
        finally:
            self._stopped(started=True)
