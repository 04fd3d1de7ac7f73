"""The backoff state machine, fed events and a clock."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trionsq import Backoff, BackoffPolicy, BackoffState

NO_JITTER = BackoffPolicy(base=1.0, max=8.0, multiplier=2.0, jitter=0.0)


def test_failure_pauses_then_tests_then_recovers() -> None:
    b = Backoff(NO_JITTER)
    assert not b.on_success(0.0)  # successes mean nothing when not backing off
    assert b.on_failure(10.0)
    assert (b.state, b.level, b.deadline) == (BackoffState.PAUSED, 1, 11.0)
    # While paused, results are ignored: one result counts per window.
    assert not b.on_failure(10.5)
    assert not b.on_success(10.6)
    assert not b.on_timer(10.9)
    assert b.on_timer(11.0)
    assert b.state is BackoffState.TESTING and b.deadline is None
    assert b.on_success(11.2)
    assert (b.state, b.level, b.deadline) == (BackoffState.NORMAL, 0, None)


def test_failures_grow_the_pause_exponentially_up_to_the_cap() -> None:
    b = Backoff(NO_JITTER)
    now = 0.0
    pauses = []
    for _ in range(6):
        b.on_failure(now)
        assert b.deadline is not None
        pauses.append(b.deadline - now)
        now = b.deadline
        b.on_timer(now)
    assert pauses == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert b.level == b.max_level == 4


def test_successes_shrink_the_level_one_window_at_a_time() -> None:
    b = Backoff(NO_JITTER)
    b.on_failure(0.0)
    b.on_timer(1.0)
    b.on_failure(1.0)  # level 2, pause 2s
    b.on_timer(3.0)
    assert b.on_success(3.0)
    assert (b.state, b.level, b.deadline) == (BackoffState.PAUSED, 1, 4.0)
    b.on_timer(4.0)
    b.on_success(4.0)
    assert b.state is BackoffState.NORMAL


def test_disabled_backoff_never_changes_state() -> None:
    b = Backoff(None)
    assert not b.enabled
    for now in range(5):
        assert not b.on_failure(float(now))
        assert not b.on_timer(float(now))
    assert b.state is BackoffState.NORMAL and b.level == 0


def test_jitter_shortens_by_at_most_its_fraction() -> None:
    b = Backoff(BackoffPolicy(base=10.0, max=100.0, jitter=0.5), random.Random(7))
    durations = [b.duration(1) for _ in range(200)]
    assert all(5.0 <= d <= 10.0 for d in durations)
    assert len(set(durations)) > 1


@given(st.lists(st.sampled_from(["ok", "fail", "tick"]), max_size=60))
def test_state_machine_invariants(events: list[str]) -> None:
    policy = BackoffPolicy(base=0.5, max=30.0, multiplier=3.0, jitter=0.2)
    b = Backoff(policy, random.Random(0))
    now = 0.0
    for event in events:
        now += 0.25
        if event == "ok":
            b.on_success(now)
        elif event == "fail":
            b.on_failure(now)
        elif b.deadline is not None:
            now = max(now, b.deadline)
            b.on_timer(now)
        assert 0 <= b.level <= b.max_level
        assert (b.state is BackoffState.NORMAL) == (b.level == 0)
        assert (b.state is BackoffState.PAUSED) == (b.deadline is not None)
        if b.deadline is not None:
            assert b.deadline - now <= policy.max


def test_policy_validation() -> None:
    with pytest.raises(ValueError):
        BackoffPolicy(base=0)
    with pytest.raises(ValueError):
        BackoffPolicy(base=10, max=1)
    with pytest.raises(ValueError):
        BackoffPolicy(jitter=1.5)
    with pytest.raises(ValueError):
        BackoffPolicy(multiplier=0.5)
