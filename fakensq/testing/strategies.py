"""Hypothesis strategies for fault schedules (:mod:`fakensq.testing.schedule`).

::

    from hypothesis import given
    from fakensq.testing.strategies import fault_schedules

    @given(fault_schedules(nsqd=2, lookupd=1))
    def test_my_consumer(schedule):
        fakensq.testing.atleastonce.check_at_least_once(schedule, {"billing": my_consumer})

Times and durations are drawn on a grid of ``step`` seconds and shrink towards
zero, kinds towards the mildest (``drop``), nodes towards 0, and schedules
towards fewer events: a failure shrinks to a short schedule of early, simple
faults, which :func:`fakensq.testing.atleastonce.check_at_least_once` replays exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, TypedDict, Unpack

from hypothesis import strategies as st

from .schedule import (
    DEFAULT_REDELIVERIES,
    KINDS,
    Direction,
    FaultEvent,
    FaultSchedule,
    Level,
    build_event,
    kinds_for,
    parse_kinds,
)

__all__ = ["EventOptions", "fault_events", "fault_schedules"]


def _seconds(low: float, high: float, step: float) -> st.SearchStrategy[float]:
    """Multiples of ``step`` from ``low`` to ``high``; shrinks towards ``low``."""
    top = max(round((high - low) / step), 0)
    return st.integers(0, top).map(lambda n: round(low + n * step, 6))


class _HypothesisDraw:
    """An event's values drawn by hypothesis, on a grid of ``step`` seconds."""

    _DIRECTIONS: Final[tuple[Direction, ...]] = ("both", "in", "out")

    def __init__(self, draw: st.DrawFn, horizon: float, step: float, longest: float) -> None:
        self.draw = draw
        self.horizon = horizon
        self.step = step
        self.longest = longest

    def at(self) -> float:
        return self.draw(_seconds(0.0, self.horizon, self.step))

    def node(self, count: int) -> int:
        return self.draw(st.integers(0, count - 1))

    def duration(self) -> float:
        return self.draw(_seconds(self.step, max(self.longest, self.step), self.step))

    def coin(self) -> bool:
        return self.draw(st.booleans())

    def seconds(self, duration: float) -> float:
        step = self.step
        return self.draw(_seconds(step / 10, max(step, duration / 2), step / 10))

    def direction(self) -> Direction:
        return self.draw(st.sampled_from(self._DIRECTIONS))

    def rounds(self) -> int:
        return self.draw(st.integers(1, 3))

    def interval(self) -> float:
        step = self.step
        return self.draw(_seconds(step, max(step, self.horizon / 20), step))


def fault_events(
    *,
    level: Level = "safe",
    kinds: Sequence[str] | None = None,
    nsqd: int = 1,
    lookupd: int = 1,
    horizon: float = 120.0,
    step: float = 0.5,
    max_duration: float | None = None,
) -> st.SearchStrategy[FaultEvent]:
    """Single fault events of the kinds ``level`` allows (or only ``kinds``), at
    times up to ``horizon`` seconds, on ``nsqd`` nsqds and ``lookupd``
    nsqlookupds; lasting faults last up to ``max_duration`` (default: a quarter
    of the horizon)."""
    allowed = [k for k in kinds_for(level) if kinds is None or k in parse_kinds(kinds)]
    if lookupd < 1 and "lookupd_outage" in allowed:
        allowed.remove("lookupd_outage")
    if not allowed:
        raise ValueError(f"no fault kind left (level {level!r}, kinds {kinds!r})")
    allowed.sort(key=KINDS.index)
    longest = max_duration if max_duration is not None else horizon / 4

    @st.composite
    def event(draw: st.DrawFn) -> FaultEvent:
        kind = draw(st.sampled_from(allowed))
        values = _HypothesisDraw(draw, horizon, step, longest)
        return build_event(kind, values, level=level, nsqd=nsqd, lookupd=lookupd)

    return event()


class EventOptions(TypedDict, total=False):
    """:func:`fault_events`' options, which :func:`fault_schedules` passes on."""

    level: Level
    kinds: Sequence[str] | None
    nsqd: int
    lookupd: int
    horizon: float
    step: float
    max_duration: float | None


def fault_schedules(
    *,
    max_faults: int = 6,
    redeliveries: int = DEFAULT_REDELIVERIES,
    **options: Unpack[EventOptions],
) -> st.SearchStrategy[FaultSchedule]:
    """Schedules of up to ``max_faults`` events (drawn by :func:`fault_events`
    with ``options``: ``level``, ``kinds``, ``nsqd``, ``lookupd``, ``horizon``,
    ``step``, ``max_duration``), with at most ``redeliveries`` redelivering
    faults (those beyond are left out)."""

    def within_budget(drawn: list[FaultEvent]) -> FaultSchedule:
        kept, budget = [], redeliveries
        for event in drawn:
            if event.redelivers <= budget:
                kept.append(event)
                budget -= event.redelivers
        return FaultSchedule(tuple(kept))

    return st.lists(fault_events(**options), max_size=max_faults).map(within_budget)
