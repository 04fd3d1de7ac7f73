"""Fault schedules: which faults happen when, drawn from a seed or by hypothesis.

A :class:`FaultSchedule` is a list of :class:`FaultEvent` in time order; each
event is a fault of :data:`KINDS` at ``at`` seconds after the run starts (real
or virtual seconds: whatever clock the run uses), with its parameters.  Nodes
are named by index (``node=1`` is ``"nsqd-1"``); an index beyond a run's node
count wraps around, so one schedule fits any cluster shape.

Levels say how rough the faults may be:

- ``"safe"`` (the default): faults after which a correct at-least-once consumer
  still gets every message, and no publish is lost or refused: consumer
  connections dropped, delayed and stalled, heartbeats swallowed, in-flight
  messages timed out (redelivered with a higher attempt count), requeue storms,
  clean nsqd restarts (once no producer is connected), nsqlookupd outages.
- ``"harsh"``: adds faults a correct *producer* must survive too (it retries a
  publish nsqd did not acknowledge): producer connections dropped and stalled,
  corrupt and truncated frames, client/nsqd partitions, failing publishes,
  restarts while producers are connected.
- ``"lossy"``: adds unclean nsqd kills, which lose what nsqd held in memory, as
  ``kill -9`` does.

Every fault that makes nsqd hand a message out again (a drop, a time-out, a
storm round, a restart...) adds at most one attempt to the messages in flight
then; a schedule holds at most ``redeliveries`` of them (default
:data:`DEFAULT_REDELIVERIES`), so that a consumer giving up after nsqd's usual
5 attempts never gives up because of the faults alone.

:func:`draw_schedule` draws a schedule from a ``random.Random`` (the pytest
plugin's ``--nsq-faults=SEED``); :mod:`fakensq.testing.strategies` draws the same
events with hypothesis, which shrinks a failing schedule to a short one.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import Any, Final, Protocol, TypeVar

from ..faultkinds import KINDS as _REGISTRY
from ..faultkinds import (
    LEVELS,
    REDELIVERING,
    SCHEDULE_KINDS,
    Direction,
    FaultParams,
    Level,
    kinds_for,
    parse_kinds,
    parse_level,
)

__all__ = [
    "DEFAULT_REDELIVERIES",
    "KINDS",
    "Direction",
    "EventDraw",
    "LEVELS",
    "REDELIVERING",
    "FaultEvent",
    "FaultSchedule",
    "Level",
    "build_event",
    "draw_faults",
    "draw_schedule",
    "kinds_for",
    "parse_kinds",
    "parse_level",
    "seed_for",
]

#: Every fault kind a schedule may hold (:data:`fakensq.faultkinds.SCHEDULE_KINDS`).
KINDS: Final = SCHEDULE_KINDS

#: How many redelivering faults a schedule holds at most, by default.
DEFAULT_REDELIVERIES: Final = 3


def seed_for(seed: int, key: str) -> int:
    """A stable 63-bit seed for ``key`` (a test's node id) under ``seed``: the same
    in every process and on every machine (unlike ``hash()``)."""
    digest = hashlib.sha256(f"{seed}\0{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


@dataclass(frozen=True, repr=False)
class FaultEvent(FaultParams):
    """One fault of a schedule.

    ``at``: seconds after the run starts.  ``node``: the nsqd's index (for
    ``lookupd_outage``, the nsqlookupd's).  ``duration``: how long a lasting
    fault (delay, stall, swallowed heartbeats, partition, lookupd outage,
    failing publishes) lasts.  ``seconds``: a delay's hold on each write.
    ``direction``: ``"in"`` (towards nsqd), ``"out"`` (from it) or ``"both"``.
    ``rounds``/``interval``: a requeue storm's time-outs and the time between.
    ``everyone``: the fault hits producers' connections too (``"harsh"``),
    not only consumers'.  The parameters after ``node`` are keyword-only;
    ``duration``, ``seconds``, ``direction`` and ``rounds`` are
    :class:`~fakensq.faultkinds.FaultParams`'.
    """

    at: float
    kind: str
    node: int = 0
    _: KW_ONLY
    interval: float = 0.0
    everyone: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown fault {self.kind!r} (known: {', '.join(KINDS)})")
        if self.at < 0 or self.duration < 0 or self.seconds < 0 or self.interval < 0:
            raise ValueError("fault times must not be negative")
        if self.node < 0 or self.rounds < 1:
            raise ValueError("node must be >= 0 and rounds >= 1")

    @property
    def redelivers(self) -> int:
        """How many times this fault may make nsqd hand a message out again."""
        if self.kind == "requeue_storm":
            return self.rounds
        return 1 if self.kind in REDELIVERING else 0

    @property
    def level(self) -> Level:
        """The mildest level that allows this event."""
        spec = _REGISTRY[self.kind]
        assert spec.level is not None
        return "harsh" if self.everyone and spec.hits_producers_at("harsh") else spec.level

    @property
    def lasting(self) -> bool:
        return _REGISTRY[self.kind].lasting

    def target(self) -> str:
        """The node it acts on, by name."""
        return f"{_REGISTRY[self.kind].target}-{self.node}"

    def describe(self) -> str:
        """One line: the kind, its target and parameters (no time)."""
        params = _REGISTRY[self.kind].params
        parts = [self.kind, self.target()]
        if "seconds" in params:
            parts.append(f"{self.seconds:g}s/write")
        if "direction" in params:
            parts.append(f"direction={self.direction}")
        if self.lasting:
            parts.append(f"for {self.duration:g}s")
        if "rounds" in params:
            parts.append(f"{self.rounds} rounds {self.interval:g}s apart")
        if self.everyone:
            parts.append("(producers too)")
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """The event as JSON-ready data (the fields that differ from the defaults)."""
        return {"at": self.at, "kind": self.kind, **self.non_defaults()}

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> FaultEvent:
        return cls(**doc)


@dataclass(frozen=True)
class FaultSchedule(Sequence[FaultEvent]):
    """Fault events in time order (sorted on creation)."""

    events: tuple[FaultEvent, ...] = field(default=())

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.events, key=lambda e: e.at))
        object.__setattr__(self, "events", ordered)

    def __len__(self) -> int:
        return len(self.events)

    def __iter__(self) -> Iterator[FaultEvent]:
        return iter(self.events)

    def __getitem__(self, index: Any) -> Any:
        return self.events[index]

    @property
    def redeliveries(self) -> int:
        """How many redeliveries the schedule may cause a message, at most."""
        return sum(e.redelivers for e in self.events)

    @property
    def end(self) -> float:
        """When its last fault is over."""
        return max(
            (e.at + e.duration + e.interval * (e.rounds - 1) for e in self.events), default=0
        )

    def shifted(self, offset: float) -> FaultSchedule:
        """The same faults, ``offset`` seconds later."""
        return FaultSchedule(tuple(replace(e, at=e.at + offset) for e in self.events))

    def describe(self) -> str:
        """One line per event, with its time."""
        return "\n".join(f"{e.at:8.3f}s  {e.describe()}" for e in self.events) or "(no faults)"

    def to_list(self) -> list[dict[str, Any]]:
        return [e.to_dict() for e in self.events]

    @classmethod
    def from_list(cls, docs: Iterable[dict[str, Any]]) -> FaultSchedule:
        return cls(tuple(FaultEvent.from_dict(d) for d in docs))


class EventDraw(Protocol):
    """Where an event's values come from: :func:`draw_schedule`'s random
    generator, or the hypothesis strategies (:mod:`fakensq.testing.strategies`).
    :func:`build_event` asks for them in a fixed order, so a seed draws the same
    events whichever parameters a kind has."""

    def at(self) -> float: ...

    def node(self, count: int) -> int: ...

    def duration(self) -> float: ...

    def coin(self) -> bool: ...

    def seconds(self, duration: float) -> float: ...

    def direction(self) -> Direction: ...

    def rounds(self) -> int: ...

    def interval(self) -> float: ...


def build_event(kind: str, draw: EventDraw, *, level: Level, nsqd: int, lookupd: int) -> FaultEvent:
    """An event of ``kind`` for a schedule of ``level`` on ``nsqd`` nsqds and
    ``lookupd`` nsqlookupds, its values taken from ``draw``: the time, the node,
    a duration (drawn for every kind, so the draws that follow line up), whether
    it hits producers too (where the level lets it), then the kind's own
    parameters (:attr:`fakensq.faultkinds.FaultKind.params`)."""
    spec = _REGISTRY[kind]
    at = draw.at()
    node = draw.node(max(lookupd if spec.target == "lookupd" else nsqd, 1))
    duration = draw.duration()
    everyone = spec.hits_producers_at(level) and draw.coin()
    params = spec.params
    seconds = draw.seconds(duration) if "seconds" in params else 0.0
    direction: Direction = draw.direction() if "direction" in params else "both"
    rounds = draw.rounds() if "rounds" in params else 1
    interval = draw.interval() if "interval" in params else 0.0
    return FaultEvent(
        at,
        kind,
        node,
        duration=duration if "duration" in params else 0.0,
        seconds=seconds,
        direction=direction,
        rounds=rounds,
        interval=interval,
        everyone=everyone,
    )


class _RandomDraw:
    """An event's values from a ``random.Random``, scaled to ``horizon``."""

    _DIRECTIONS: Final[tuple[Direction, ...]] = ("in", "out", "both")

    def __init__(self, rng: random.Random, horizon: float, budget: int) -> None:
        self.rng = rng
        self.horizon = horizon
        self.budget = budget

    def at(self) -> float:
        return round(self.rng.uniform(0.02, 1.0) * self.horizon, 3)

    def node(self, count: int) -> int:
        return self.rng.randrange(count)

    def duration(self) -> float:
        # A lasting fault holds for up to a third of the horizon.
        return round(self.rng.uniform(0.05, 0.34) * self.horizon, 3)

    def coin(self) -> bool:
        return self.rng.random() < 0.5

    def seconds(self, duration: float) -> float:
        return round(self.rng.uniform(0.01, 0.1) * self.horizon, 3)

    def direction(self) -> Direction:
        return self.rng.choice(self._DIRECTIONS)

    def rounds(self) -> int:
        return self.rng.randint(1, max(1, min(3, self.budget)))

    def interval(self) -> float:
        return round(self.rng.uniform(0.02, 0.1) * self.horizon, 3)


def draw_schedule(
    rng: random.Random,
    *,
    rate: float = 4.0,
    horizon: float = 3.0,
    level: Level = "safe",
    kinds: Sequence[str] | None = None,
    nsqd: int = 1,
    lookupd: int = 1,
    redeliveries: int = DEFAULT_REDELIVERIES,
) -> FaultSchedule:
    """A schedule of about ``rate`` faults (a Poisson count with that mean)
    spread over ``horizon`` seconds, of the kinds ``level`` allows (or only
    ``kinds``), on ``nsqd`` nsqds and ``lookupd`` nsqlookupds, with at most
    ``redeliveries`` redelivering faults.  Times and durations scale with the
    horizon: a 3-second real-time test gets sub-second stalls, a simulated
    10-minute run gets longer ones."""
    if rate < 0 or horizon <= 0:
        raise ValueError("rate must be >= 0 and horizon > 0")
    allowed = set(kinds_for(level))
    if kinds is not None:
        allowed &= set(kinds)
    if lookupd < 1:
        allowed.discard("lookupd_outage")
    candidates = sorted(allowed, key=KINDS.index)
    events = draw_faults(
        rng,
        rate,
        candidates,
        redeliveries,
        usable=lambda kind, budget: kind not in REDELIVERING or budget > 0,
        weight=lambda kind: _REGISTRY[kind].weight,
        make=lambda i, kind, budget: build_event(
            kind, _RandomDraw(rng, horizon, budget), level=level, nsqd=nsqd, lookupd=lookupd
        ),
    )
    return FaultSchedule(tuple(events))


class Redelivering(Protocol):
    """A drawn fault: how many redeliveries it may cause."""

    @property
    def redelivers(self) -> int: ...


_F = TypeVar("_F", bound=Redelivering)


def draw_faults(
    rng: random.Random,
    rate: float,
    kinds: Sequence[str],
    redeliveries: int,
    *,
    usable: Callable[[str, int], bool],
    weight: Callable[[str], float],
    make: Callable[[int, str, int], _F],
    count: int | None = None,
) -> list[_F]:
    """The draw loop of a clock-placed and a flow-placed schedule alike:
    about ``rate`` faults (a Poisson count with that mean), each of a kind of
    ``kinds`` drawn by ``weight`` among those ``usable`` with the redelivery
    budget left, made by ``make(number, kind, budget)``; what each may
    redeliver is taken from the budget (``redeliveries`` at first).  It stops
    early when no kind is usable.  ``count``: that many faults, not a
    number drawn."""
    if count is None:
        count = poisson(rng, rate)
    faults: list[_F] = []
    budget = redeliveries
    for i in range(count):
        fits = [k for k in kinds if usable(k, budget)]
        if not fits:
            break
        kind = rng.choices(fits, [weight(k) for k in fits])[0]
        fault = make(i + 1, kind, budget)
        budget -= fault.redelivers
        faults.append(fault)
    return faults


def poisson(rng: random.Random, mean: float) -> int:
    # Knuth's method: fine for the small means used here.
    if mean <= 0:
        return 0
    limit, k, p = math.exp(-min(mean, 50.0)), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1
