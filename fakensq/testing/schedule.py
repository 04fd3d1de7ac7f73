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
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

__all__ = [
    "DEFAULT_REDELIVERIES",
    "KINDS",
    "Direction",
    "LEVELS",
    "REDELIVERING",
    "FaultEvent",
    "FaultSchedule",
    "Level",
    "draw_schedule",
    "kinds_for",
    "parse_kinds",
    "parse_level",
    "seed_for",
]

Level = Literal["safe", "harsh", "lossy"]
Direction = Literal["in", "out", "both"]

#: The levels, mildest first; each allows the faults of the ones before it.
LEVELS: Final[tuple[Level, ...]] = ("safe", "harsh", "lossy")

#: Fault kinds by the level that first allows them.
_KINDS_BY_LEVEL: Final[dict[Level, tuple[str, ...]]] = {
    "safe": (
        "drop",
        "delay",
        "stall",
        "swallow_heartbeats",
        "time_out",
        "requeue_storm",
        "restart",
        "lookupd_outage",
    ),
    "harsh": ("corrupt", "truncate", "partition", "fail_publishes"),
    "lossy": ("kill",),
}

#: Every fault kind a schedule may hold.
KINDS: Final[tuple[str, ...]] = tuple(k for level in LEVELS for k in _KINDS_BY_LEVEL[level])

#: The kinds after which nsqd hands the messages in flight out again.
REDELIVERING: Final[frozenset[str]] = frozenset(
    {"drop", "time_out", "requeue_storm", "restart", "corrupt", "truncate", "kill", "partition"}
)

#: How many redelivering faults a schedule holds at most, by default.
DEFAULT_REDELIVERIES: Final = 3

#: Relative weights of the kinds when drawn (the redelivering ones are rationed
#: by the budget anyway).
_WEIGHTS: Final[dict[str, float]] = {
    "drop": 3.0,
    "delay": 2.0,
    "stall": 2.0,
    "swallow_heartbeats": 1.0,
    "time_out": 3.0,
    "requeue_storm": 1.0,
    "restart": 1.0,
    "lookupd_outage": 1.0,
    "corrupt": 1.0,
    "truncate": 1.0,
    "partition": 1.0,
    "fail_publishes": 1.0,
    "kill": 1.0,
}


def parse_level(text: str) -> Level:
    """A level's name, checked (``ValueError`` naming the choices)."""
    for level in LEVELS:
        if text == level:
            return level
    raise ValueError(f"unknown fault level {text!r} (choose from {', '.join(LEVELS)})")


def kinds_for(level: Level) -> tuple[str, ...]:
    """The fault kinds ``level`` allows."""
    upto = LEVELS.index(level) + 1
    return tuple(k for lv in LEVELS[:upto] for k in _KINDS_BY_LEVEL[lv])


def parse_kinds(names: Iterable[str]) -> tuple[str, ...]:
    """Fault kind names, checked (``ValueError`` naming the unknown one)."""
    kinds = []
    for name in names:
        name = name.strip()
        if name not in KINDS:
            raise ValueError(f"unknown fault {name!r} (known: {', '.join(KINDS)})")
        kinds.append(name)
    return tuple(kinds)


def seed_for(seed: int, key: str) -> int:
    """A stable 63-bit seed for ``key`` (a test's node id) under ``seed``: the same
    in every process and on every machine (unlike ``hash()``)."""
    digest = hashlib.sha256(f"{seed}\0{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


@dataclass(frozen=True)
class FaultEvent:
    """One fault of a schedule.

    ``at``: seconds after the run starts.  ``node``: the nsqd's index (for
    ``lookupd_outage``, the nsqlookupd's).  ``duration``: how long a lasting
    fault (delay, stall, swallowed heartbeats, partition, lookupd outage,
    failing publishes) lasts.  ``seconds``: a delay's hold on each write.
    ``direction``: ``"in"`` (towards nsqd), ``"out"`` (from it) or ``"both"``.
    ``rounds``/``interval``: a requeue storm's time-outs and the time between.
    ``everyone``: the fault hits producers' connections too (``"harsh"``),
    not only consumers'.
    """

    at: float
    kind: str
    node: int = 0
    duration: float = 0.0
    seconds: float = 0.0
    direction: Direction = "both"
    rounds: int = 1
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
        if self.everyone and self.kind in ("drop", "stall", "swallow_heartbeats", "restart"):
            return "harsh"
        for level in LEVELS:
            if self.kind in _KINDS_BY_LEVEL[level]:
                return level
        raise AssertionError(self.kind)

    @property
    def lasting(self) -> bool:
        return self.kind in (
            "delay",
            "stall",
            "swallow_heartbeats",
            "partition",
            "lookupd_outage",
            "fail_publishes",
        )

    def target(self) -> str:
        """The node it acts on, by name."""
        return f"lookupd-{self.node}" if self.kind == "lookupd_outage" else f"nsqd-{self.node}"

    def describe(self) -> str:
        """One line: the kind, its target and parameters (no time)."""
        parts = [self.kind, self.target()]
        if self.kind == "delay":
            parts.append(f"{self.seconds:g}s/write")
        if self.kind in ("delay", "stall"):
            parts.append(f"direction={self.direction}")
        if self.lasting:
            parts.append(f"for {self.duration:g}s")
        if self.kind == "requeue_storm":
            parts.append(f"{self.rounds} rounds {self.interval:g}s apart")
        if self.everyone:
            parts.append("(producers too)")
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """The event as JSON-ready data (the fields that differ from the defaults)."""
        doc: dict[str, Any] = {"at": self.at, "kind": self.kind}
        defaults = FaultEvent(0.0, self.kind)
        for name in ("node", "duration", "seconds", "direction", "rounds", "interval", "everyone"):
            value = getattr(self, name)
            if value != getattr(defaults, name):
                doc[name] = value
        return doc

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
    count = _poisson(rng, rate)
    events: list[FaultEvent] = []
    budget = redeliveries
    for _ in range(count):
        usable = [k for k in candidates if k not in REDELIVERING or budget > 0]
        if not usable:
            break
        kind = rng.choices(usable, [_WEIGHTS[k] for k in usable])[0]
        event = _draw_event(rng, kind, horizon, nsqd, lookupd, level, budget)
        budget -= event.redelivers
        events.append(event)
    return FaultSchedule(tuple(events))


def _poisson(rng: random.Random, mean: float) -> int:
    # Knuth's method: fine for the small means used here.
    if mean <= 0:
        return 0
    limit, k, p = pow(2.718281828459045, -min(mean, 50.0)), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def _draw_event(
    rng: random.Random,
    kind: str,
    horizon: float,
    nsqd: int,
    lookupd: int,
    level: Level,
    budget: int,
) -> FaultEvent:
    at = round(rng.uniform(0.02, 1.0) * horizon, 3)
    node = rng.randrange(lookupd if kind == "lookupd_outage" else max(nsqd, 1))
    # A lasting fault holds for up to a third of the horizon.
    duration = round(rng.uniform(0.05, 0.34) * horizon, 3)
    harsh = LEVELS.index(level) >= LEVELS.index("harsh")
    everyone = harsh and kind in ("drop", "stall", "swallow_heartbeats", "restart")
    everyone = everyone and rng.random() < 0.5
    directions: tuple[Direction, ...] = ("in", "out", "both")
    if kind == "delay":
        seconds = round(rng.uniform(0.01, 0.1) * horizon, 3)
        return FaultEvent(at, kind, node, duration, seconds, rng.choice(directions))
    if kind == "stall":
        direction = rng.choice(directions)
        return FaultEvent(at, kind, node, duration, direction=direction, everyone=everyone)
    if kind == "requeue_storm":
        rounds = rng.randint(1, max(1, min(3, budget)))
        interval = round(rng.uniform(0.02, 0.1) * horizon, 3)
        return FaultEvent(at, kind, node, rounds=rounds, interval=interval)
    if kind in ("swallow_heartbeats", "partition", "lookupd_outage", "fail_publishes"):
        return FaultEvent(at, kind, node, duration, everyone=everyone)
    return FaultEvent(at, kind, node, everyone=everyone)
