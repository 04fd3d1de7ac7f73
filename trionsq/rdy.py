"""RDY bookkeeping for one consumer over many connections (sans-IO).

nsqd treats a connection's RDY count as a cap on its messages in flight.  The
client guide's rules, as implemented here:

- a new connection starts at RDY 1 (how many connections there will be is not
  known yet), and gets its share once a message shows it is alive;
- ``max_in_flight`` is spread evenly over the connections (the remainder goes to
  the first ones), never above a connection's ``max_rdy_count``;
- the sum over connections never exceeds ``max_in_flight``: a raise is only
  decided when ``sum(max(rdy, in_flight))`` stays within it, counting messages
  still in flight on connections whose RDY was lowered (what nsqd sent under
  the old RDY before reading the lowering can still arrive: the messages in
  flight may then exceed ``max_in_flight`` for a moment, by what was in
  transit; the consumer never runs more handlers than ``max_in_flight``);
- a RDY is sent only when a connection's decision changes: nsqd (v1 and
  later) takes RDY as a cap on the messages in flight, not as a count it uses
  up, so an unchanged RDY is never re-sent (go-nsq's rule too; the guide's
  older advice, re-sending when 25% of it remains, is for servers that
  counted RDY down, and costs a RDY per read over many connections);
- with fewer ``max_in_flight`` than connections, RDY 1 rotates: a connection
  that has held RDY for ``low_rdy_idle_timeout`` while others wait gives it up,
  and the longest-waiting connection gets it, so every nsqd is drained;
- backoff (see :mod:`trionsq.backoff`) forces RDY 0 everywhere, or RDY 1 on a
  single connection while testing.

:class:`RdyController` decides; the consumer sends.  :meth:`RdyController.rebalance`
returns the connections whose RDY was decided anew (lowered ones first, so the
budget is freed on the wire before it is spent elsewhere).

Rebalancing looks at every connection, so the per-message events say whether
one is due: :meth:`~RdyController.on_messages` and :meth:`~RdyController.on_settled`
return False exactly when :meth:`~RdyController.rebalance` would decide nothing,
which in the steady state is always (O(1) per read and per message instead of
O(connections), however many connections there are).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from .backoff import BackoffState
from .protocol.handshake import DEFAULT_MAX_RDY_COUNT

__all__ = ["ConnRdy", "RdyController", "DEFAULT_MAX_RDY_COUNT", "STARVED_FRACTION", "starved"]

#: The client guide's ``is_starved`` threshold, as a fraction of the last RDY sent.
STARVED_FRACTION = 0.85


def starved(in_flight: int, last_rdy: int) -> bool:
    """The client guide's starvation rule for one connection: ``in_flight``
    messages held unanswered reach 85% of the last RDY sent to it, so nsqd will
    send (almost) nothing more until some are answered.

    A connection at RDY 0 holding any message is starved too (go-nsq's rule).
    """
    return in_flight > 0 and in_flight >= last_rdy * STARVED_FRACTION


K = TypeVar("K", bound=Hashable)


@dataclass(slots=True)
class ConnRdy:
    """RDY state of one connection."""

    max_rdy_count: int
    #: the last RDY decided for this connection (nsqd's cap on its in-flight)
    rdy: int = 0
    in_flight: int = 0
    #: bumped on every decision, so the sender re-sends an unchanged value too
    generation: int = 0
    #: true until the first message arrives: hold the connection at RDY 1
    bootstrapping: bool = True
    granted_at: float = 0.0
    waiting_since: float = 0.0
    last_message_at: float = 0.0

    @property
    def committed(self) -> int:
        """How much of ``max_in_flight`` this connection may be using."""
        return max(self.rdy, self.in_flight)


class RdyController(Generic[K]):
    """Decides every connection's RDY count for one consumer."""

    def __init__(self, max_in_flight: int, low_rdy_idle_timeout: float) -> None:
        self.max_in_flight = max_in_flight
        self.low_rdy_idle_timeout = low_rdy_idle_timeout
        self.mode = BackoffState.NORMAL
        self.conns: dict[K, ConnRdy] = {}
        #: whether a rebalance could decide anything (set by events, recomputed
        #: by rebalance; read on every message's answer, so an attribute)
        self.due = True

    # --- events ---

    def add(self, key: K, max_rdy_count: int, now: float) -> None:
        self.conns[key] = ConnRdy(
            max_rdy_count=max(0, max_rdy_count), waiting_since=now, last_message_at=now
        )
        self.due = True

    def remove(self, key: K) -> None:
        if self.conns.pop(key, None) is not None:
            self.due = True

    def on_message(self, key: K, now: float) -> bool:
        """A message arrived on ``key``; returns whether a rebalance is due."""
        return self.on_messages(key, 1, now)

    def on_messages(self, key: K, count: int, now: float) -> bool:
        """``count`` messages arrived on ``key`` (one read's worth); returns
        whether a rebalance is due."""
        conn = self.conns.get(key)
        if conn is None:
            return self.due
        conn.in_flight += count
        conn.last_message_at = now
        if conn.bootstrapping:
            conn.bootstrapping = False  # its target grows from 1 to its share
            self.due = True
        return self.due

    def on_settled(self, key: K) -> bool:
        """A message from ``key`` was finished or requeued (or given up); returns
        whether a rebalance is due."""
        conn = self.conns.get(key)
        if conn is not None and conn.in_flight > 0:
            conn.in_flight -= 1
        # Fewer in flight only frees budget, which matters only to a connection
        # still below its target: then due is already set.
        return self.due

    def set_mode(self, mode: BackoffState) -> None:
        self.mode = mode
        self.due = True

    def set_max_in_flight(self, max_in_flight: int) -> None:
        self.max_in_flight = max_in_flight
        self.due = True

    # --- queries ---

    @property
    def total_rdy(self) -> int:
        return sum(c.rdy for c in self.conns.values())

    @property
    def total_in_flight(self) -> int:
        return sum(c.in_flight for c in self.conns.values())

    # --- decisions ---

    def _set(self, key: K, count: int, now: float, changed: list[K]) -> None:
        conn = self.conns[key]
        if count == 0 and conn.rdy > 0:
            conn.waiting_since = now
        elif count > 0 and conn.rdy == 0:
            conn.granted_at = now
        conn.rdy = count
        conn.generation += 1
        if key not in changed:
            changed.append(key)

    def _targets(self, now: float) -> dict[K, int]:
        conns = self.conns
        if self.mode is BackoffState.PAUSED or self.max_in_flight == 0:
            return dict.fromkeys(conns, 0)
        if self.mode is BackoffState.TESTING:
            # One RDY 1, rotating like a low max_in_flight: a test on an nsqd with
            # nothing to send must move on, or the consumer would test forever.
            return self._rotation(now, 1)
        count = len(conns)
        # Fewer places than connections: RDY 1 rotates among them; else an
        # even spread.  Either is then bounded by each connection's own limits.
        rotated = self._rotation(now, self.max_in_flight) if self.max_in_flight < count else None
        base, extra = divmod(self.max_in_flight, count)
        targets = {}
        # One pass (run as each connection joins and as each gets its first
        # message: O(connections) each time, so its constant counts at 50).
        for index, (key, conn) in enumerate(conns.items()):
            if rotated is not None:
                target = rotated[key]
            else:
                target = base + 1 if index < extra else base
            if target > conn.max_rdy_count:
                target = conn.max_rdy_count
            if conn.bootstrapping and target > 1:
                target = 1
            targets[key] = target
        return targets

    def _rotation(self, now: float, limit: int) -> dict[K, int]:
        """RDY 1 for at most ``limit`` connections, rotating fairly."""
        conns = self.conns
        holders = [k for k, c in conns.items() if c.rdy > 0]
        waiting = sorted(
            (k for k, c in conns.items() if c.rdy == 0), key=lambda k: conns[k].waiting_since
        )
        if waiting:
            expired = [k for k in holders if now - conns[k].granted_at >= self.low_rdy_idle_timeout]
            holders = [k for k in holders if k not in expired]
            # Those giving RDY up queue behind the ones already waiting.
            waiting += expired
        chosen = set(holders[:limit])
        for key in waiting:
            if len(chosen) >= limit:
                break
            chosen.add(key)
        return {k: (1 if k in chosen else 0) for k in conns}

    def rebalance(self, now: float) -> list[K]:
        """Decide RDY for every connection; returns the keys to (re)send, lowered
        ones first."""
        if not self.conns:
            self.due = False
            return []
        conns = self.conns
        changed: list[K] = []
        targets = self._targets(now)
        short = False
        for key, target in targets.items():
            if conns[key].rdy > target:
                self._set(key, target, now, changed)
        committed = 0
        for conn in conns.values():
            rdy, in_flight = conn.rdy, conn.in_flight
            committed += rdy if rdy > in_flight else in_flight
        for key, target in targets.items():
            conn = conns[key]
            if conn.rdy < target:
                others = committed - conn.committed
                allowed = min(target, self.max_in_flight - others)
                if allowed > conn.rdy:
                    self._set(key, allowed, now, changed)
                    committed = others + conn.committed
            short = short or conn.rdy < target
        # With every connection at its target and the targets fixed, only an
        # event that moves the targets can change anything.  Rotation and
        # backoff depend on the clock or on which connection holds RDY: always
        # due there.
        self.due = (
            short or self.mode is not BackoffState.NORMAL or self.max_in_flight < len(self.conns)
        )
        return changed
