"""nsqd's queue scan acts on a deadline at the first tick at or after it:
never at a tick before it, which float rounding gave for deadlines a hair
above a tick (the channel's timer then woke, found nothing due, and slept
until the same instant again: a loop without end in virtual time)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from fakensq import NSQD


@given(st.floats(0, 100), st.integers(0, 100_000), st.booleans(), st.floats(0, 1))
def test_a_deadline_is_acted_on_at_the_first_tick_at_or_after_it(
    epoch: float, ticks: int, above: bool, known_from: float
) -> None:
    nsqd = NSQD()
    nsqd._scan_epoch = epoch
    interval = nsqd.options.queue_scan_interval
    deadline = epoch + ticks * interval
    if above:
        deadline = math.nextafter(deadline, math.inf)
    when = nsqd.scan_time(deadline, epoch + known_from)
    assert when >= deadline
    assert when < max(deadline, epoch + known_from) + interval + 1e-6
    assert nsqd.scan_time(when, epoch) == when  # a tick maps to itself


def test_the_rounding_that_made_the_timer_spin() -> None:
    nsqd = NSQD()
    nsqd._scan_epoch = 1.3436424411240122
    deadline = 208.14364244112406  # one ulp above a tick: the old answer was below it
    assert nsqd.scan_time(deadline, 0.0) >= deadline
