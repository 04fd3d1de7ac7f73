"""A consumer's RDY and backoff over time: the decisions sent, in order.

:class:`~trionsq.rdy.RdyController` decides each connection's RDY and
:class:`~trionsq.backoff.Backoff` the consumer's backoff state; :class:`Flow`
(which :class:`~trionsq.consumer.Consumer` inherits) sends what they decide:
lowerings before the raises they paid for (a barrier across connections), the
backoff's timer, and the periodic redistribution when ``max_in_flight`` is
below the number of connections.
"""

from __future__ import annotations

import logging
import math

import trio

from .backoff import Backoff
from .config import Config
from .lifecycle import OPEN, Life, Lifecycle
from .rdy import RdyController
from .session import Session

__all__ = ["Flow"]

log = logging.getLogger("trionsq.consumer")

#: How long RDY raises wait for the lowerings that freed their budget to be
#: written (see Consumer._rdy_barrier_loop) before they go out anyway.
_RDY_BARRIER_TIMEOUT = 5.0


class Flow:
    """The RDY and backoff steps, for :class:`~trionsq.consumer.Consumer`
    (which inherits them, and sets these attributes up)."""

    config: Config
    _rdy: RdyController[Session]
    _backoff: Backoff
    _backoff_wakeup: trio.Event
    _rdy_lowered: list[Session]
    _rdy_held: dict[Session, None]
    _rdy_barrier_wakeup: trio.Event
    _life: Lifecycle[Life]

    def _update_rdy(self) -> None:
        if self._life.state is not OPEN:
            return
        for session in self._rdy.rebalance(trio.current_time()):
            if session in self._rdy_held:
                continue  # its latest decision goes out after the barrier
            rdy = self._rdy.conns[session].rdy
            if rdy > session.wire_rdy and self._rdy_lowered:
                # nsqd must see the lowering before the raise it paid for.
                self._rdy_held[session] = None
                continue
            if rdy < session.wire_rdy:
                self._rdy_lowered.append(session)
                self._rdy_barrier_wakeup.set()
            session.flush_rdy()

    @trio.lowlevel.enable_ki_protection
    async def _rdy_barrier_loop(self) -> None:
        """Send held RDY raises once the lowered connections have written their RDY."""
        while True:
            await self._rdy_barrier_wakeup.wait()
            self._rdy_barrier_wakeup = trio.Event()
            # Each stays listed until written: raises decided meanwhile are held
            # too.  Not for ever: an nsqd that reads nothing must not hold
            # back every other connection's RDY.
            with trio.move_on_after(_RDY_BARRIER_TIMEOUT) as waited:
                while self._rdy_lowered:
                    await self._rdy_lowered[0].conn.flush()  # returns early if it closes
                    del self._rdy_lowered[0]
            if waited.cancelled_caught:
                log.warning(
                    "%s: a lowered RDY is still not written after %.0fs (nsqd is not "
                    "reading): the other connections get theirs anyway",
                    ", ".join(s.address for s in self._rdy_lowered),
                    _RDY_BARRIER_TIMEOUT,
                )
                self._rdy_lowered.clear()
            held, self._rdy_held = self._rdy_held, {}
            for session in held:
                session.flush_rdy()

    @trio.lowlevel.enable_ki_protection
    async def _backoff_loop(self) -> None:
        while True:
            self._backoff_wakeup = trio.Event()
            deadline = self._backoff.deadline
            with trio.move_on_at(deadline if deadline is not None else math.inf):
                await self._backoff_wakeup.wait()
            if self._backoff.on_timer(trio.current_time()):
                self._rdy.set_mode(self._backoff.state)
            self._update_rdy()

    @trio.lowlevel.enable_ki_protection
    async def _rdy_loop(self) -> None:
        """Periodic redistribution (RDY rotation when max_in_flight < connections)."""
        interval = min(5.0, self.config.low_rdy_idle_timeout / 2)
        while True:
            await trio.sleep(interval)
            self._update_rdy()
