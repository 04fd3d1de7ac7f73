"""Consumer backoff as a sans-IO state machine.

NSQ's client guide: when handlers fail, a consumer stops the flow (RDY 0 on every
connection) for a time that grows with consecutive failures and shrinks with
successes.  When the pause expires, one connection gets RDY 1 to "test the
waters"; the first result after that decides what happens next, and results
that arrive while a pause is running are ignored (one result counts per window).

:class:`Backoff` holds no timers and does no I/O: it is fed results and the
current time, and exposes :attr:`~Backoff.state` and :attr:`~Backoff.deadline`
for the consumer to act on.  That keeps every timeline unit-testable.
"""

from __future__ import annotations

import enum
import random

from .config import BackoffPolicy

__all__ = ["BackoffState", "Backoff"]


class BackoffState(enum.Enum):
    #: not backing off: full RDY
    NORMAL = "normal"
    #: a pause is running until :attr:`Backoff.deadline`: RDY 0 everywhere
    PAUSED = "paused"
    #: the pause expired: one connection at RDY 1 awaits the next result
    TESTING = "testing"


class Backoff:
    """Backoff level and state; ``policy=None`` disables backoff entirely."""

    def __init__(self, policy: BackoffPolicy | None, rng: random.Random | None = None) -> None:
        self.policy = policy
        self._rng = rng if rng is not None else random.Random()
        self.level = 0
        self.state = BackoffState.NORMAL
        self.deadline: float | None = None
        self.max_level = self._max_level(policy) if policy is not None else 0

    @staticmethod
    def _max_level(policy: BackoffPolicy) -> int:
        # Beyond the level whose duration reaches the cap, more failures would only
        # make recovery slower without lengthening any pause.
        level = 1
        while policy.base * policy.multiplier ** (level - 1) < policy.max and level < 64:
            level += 1
        return level

    @property
    def enabled(self) -> bool:
        return self.policy is not None

    def duration(self, level: int) -> float:
        """The (jittered) pause for ``level`` consecutive net failures."""
        policy = self.policy
        if policy is None or level <= 0:
            return 0.0
        raw = min(policy.max, policy.base * policy.multiplier ** (level - 1))
        return raw * (1.0 - policy.jitter * self._rng.random())

    def _pause(self, now: float) -> None:
        self.state = BackoffState.PAUSED
        self.deadline = now + self.duration(self.level)

    def on_success(self, now: float) -> bool:
        """Record a handler success; returns True if the state changed."""
        if self.policy is None or self.state is not BackoffState.TESTING:
            # While NORMAL successes mean nothing; while PAUSED they are ignored.
            return False
        self.level -= 1
        if self.level <= 0:
            self.level = 0
            self.state = BackoffState.NORMAL
            self.deadline = None
        else:
            self._pause(now)
        return True

    def on_failure(self, now: float) -> bool:
        """Record a handler failure; returns True if the state changed."""
        if self.policy is None or self.state is BackoffState.PAUSED:
            return False
        self.level = min(self.level + 1, self.max_level)
        self._pause(now)
        return True

    def on_timer(self, now: float) -> bool:
        """Call when the clock reaches :attr:`deadline`; returns True if the
        state changed (PAUSED -> TESTING)."""
        if self.state is BackoffState.PAUSED and self.deadline is not None and now >= self.deadline:
            self.state = BackoffState.TESTING
            self.deadline = None
            return True
        return False
