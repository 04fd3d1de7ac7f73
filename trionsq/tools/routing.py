"""Which destination gets a message: ``--mode`` of nsq_to_http and nsq_to_nsq.

- ``round-robin``: each message to the next destination in turn (the first
  message goes to the second destination, as the Go tools count);
- ``hostpool`` (the Go tools' default): in turn among the destinations that
  work; one that fails is left out for 30 s, then tried again (a failed retry
  doubles the wait, up to 15 min); when all have failed, all are tried again
  (go-hostpool's standard pool);
- ``epsilon-greedy``: mostly the destination that has answered fastest lately,
  sometimes (with a probability that starts at 30% and decays to 1%) another
  one in turn, so that a destination that got faster is noticed
  (go-hostpool's epsilon-greedy pool, in spirit);
- ``multicast`` (to-http only, from older nsq_to_http): every destination.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["MODES", "Router"]

MODES = ("round-robin", "hostpool", "epsilon-greedy")

_INITIAL_RETRY = 30.0
_MAX_RETRY = 900.0
_EPSILON_START = 0.3
_EPSILON_MIN = 0.01
_EPSILON_DECAY = 0.99
#: weight of the newest response time in a destination's moving average
_SMOOTHING = 0.1


@dataclass
class _Host:
    dead: bool = False
    retry_delay: float = 0.0
    next_retry: float = 0.0
    seconds: float = 0.0  # moving average of response times (epsilon-greedy)
    timed: bool = False


class Router:
    """Picks destinations (by index) and learns from how each attempt went."""

    def __init__(
        self,
        count: int,
        mode: str,
        *,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if count < 1:
            raise ValueError("no destinations")
        if mode not in (*MODES, "multicast"):
            raise ValueError(f"unknown mode {mode!r}")
        self.count = count
        self.mode = mode
        self._rng = rng or random.Random()
        self._clock = clock
        self._counter = 0
        self._next = 0
        self._hosts = [_Host() for _ in range(count)]
        self._epsilon = _EPSILON_START

    def pick(self) -> list[int]:
        """The destinations of the next message (one, or all in multicast)."""
        if self.count == 1:
            return [0]  # whatever the mode and however it went (one choice)
        if self.mode == "multicast":
            return list(range(self.count))
        if self.mode == "round-robin":
            self._counter += 1
            return [self._counter % self.count]
        if self.mode == "epsilon-greedy":
            return [self._greedy()]
        return [self._pool()]

    def mark(self, index: int, ok: bool, seconds: float = 0.0) -> None:
        """Report how a delivery to ``index`` went (and how long it took)."""
        host = self._hosts[index]
        if ok:
            host.dead = False
            host.seconds = (
                seconds
                if not host.timed
                else (host.seconds + _SMOOTHING * (seconds - host.seconds))
            )
            host.timed = True
        elif not host.dead:
            host.dead = True
            host.retry_delay = _INITIAL_RETRY
            host.next_retry = self._clock() + host.retry_delay

    def _pool(self) -> int:
        now = self._clock()
        for step in range(self.count):
            index = (self._next + step) % self.count
            host = self._hosts[index]
            if not host.dead:
                self._next = index + 1
                return index
            if host.next_retry < now:
                # One try now; if it fails again, wait twice as long.
                host.retry_delay = min(host.retry_delay * 2, _MAX_RETRY)
                host.next_retry = now + host.retry_delay
                self._next = index + 1
                return index
        for host in self._hosts:  # all failed: start over with all of them
            host.dead = False
        self._next = 1
        return 0

    def _greedy(self) -> int:
        if self._rng.random() < self._epsilon:
            self._epsilon = max(_EPSILON_MIN, self._epsilon * _EPSILON_DECAY)
            return self._pool()
        alive = [i for i, h in enumerate(self._hosts) if not h.dead]
        untimed = [i for i in alive if not self._hosts[i].timed]
        if untimed:
            return untimed[0]
        if not alive:
            return self._pool()
        return min(alive, key=lambda i: self._hosts[i].seconds)
