"""Fault schedules placed by the message flow, for nodes served in real time.

A :class:`FlowSchedule` says what happens at which point of a test's own
message flow, counted per nsqd: "drop the consumer's connection at the 12th
FIN", "time out what is in flight after the 7th message sent to a consumer",
"stall the answer to the publish of the 3rd message", "restart nsqd-0 at the
20th FIN".  The events counted (:data:`EVENTS`):

- ``"sent"``: a message frame nsqd writes to a consumer;
- ``"fin"``: a consumer's ``FIN`` (before nsqd reads it);
- ``"published"``: a message published (``PUB``, ``DPUB``: one; ``MPUB``: as
  many as it carries), before nsqd reads the command;
- ``"publish"``: a publish command (``PUB``, ``MPUB``, ``DPUB``: one each),
  counted right after its messages.

So the same test with the same seed meets the same faults at the same points
of its flow however fast the machine is, where faults placed by the clock land
wherever the flow happens to stand at that millisecond.  What must last in real
time (a stall, a delay, swallowed heartbeats, a partition, an nsqlookupd
outage) lasts a multiple of the run's own timeouts: the nsqd's
``msg_timeout`` (or its heartbeat interval, for heartbeats), never a fixed
number of seconds.

A schedule holds first one fault for each way a fault reveals a bug (where
the kinds and level allow it): a message lost on its way to the consumer (it
comes back with attempts 2 though nobody handled it), a message handled whose
FIN nsqd never reads (it is handled again), and a publish's answer held back
until the publisher publishes again (a late answer); then faults of any kind
drawn by weight, so that the mean count stays ``rate``.  The ordinals are drawn
over ``horizon`` events (default :data:`DEFAULT_HORIZON`; the first three within
its first quarter), log-uniformly: early points as often as late ones within each
scale, so a test of 5 messages meets about half of them and one of 40 nearly
all.  Kinds, levels and the redelivery budget are those of
:mod:`fakensq.testing.schedule` (read from :mod:`fakensq.faultkinds`).

A fault is named by its fixture's label and its number in the schedule
(``nsqd-0:2``); :func:`parse_only` reads a ``--nsq-faults-only`` list of them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Final, Literal

from ..faultkinds import KINDS, Direction, FaultParams, Level, Needs, kinds_for
from .schedule import DEFAULT_REDELIVERIES, draw_faults, poisson

__all__ = [
    "DEFAULT_HORIZON",
    "EVENTS",
    "Anchor",
    "Event",
    "FlowFault",
    "FlowSchedule",
    "draw_flow_schedule",
    "format_only",
    "parse_only",
]

#: What the flow counts, per nsqd.
Event = Literal["sent", "fin", "published", "publish"]
EVENTS: Final[tuple[Event, ...]] = ("sent", "fin", "published", "publish")

#: Over how many events of a kind the faults' points are spread, by default.
DEFAULT_HORIZON: Final = 40

_ORDINALS: Final = {1: "st", 2: "nd", 3: "rd"}


def ordinal(n: int) -> str:
    """``1st``, ``2nd``, ``12th``..."""
    suffix = "th" if 10 <= n % 100 <= 20 else _ORDINALS.get(n % 10, "th")
    return f"{n}{suffix}"


@dataclass(frozen=True)
class Anchor:
    """The ``count``-th ``event`` on an nsqd."""

    event: Event
    count: int

    def describe(self) -> str:
        if self.event == "sent":
            return f"after the {ordinal(self.count)} message sent to a consumer"
        if self.event == "fin":
            return f"at the {ordinal(self.count)} FIN (before nsqd reads it)"
        if self.event == "publish":
            return f"at the {ordinal(self.count)} publish command (before nsqd reads it)"
        return f"at the publish of the {ordinal(self.count)} message (before nsqd reads it)"

    @property
    def on_consumer(self) -> bool:
        return self.event not in ("published", "publish")


@dataclass(frozen=True, repr=False)
class FlowFault(FaultParams):
    """One fault of a flow schedule.

    ``node``: the nsqd whose events place it (and which it strikes; for an
    ``lookupd_outage``, ``lookupd`` is the nsqlookupd taken down).
    ``duration``: how long a lasting fault lasts, in multiples of its kind's
    clock (``msg_timeout`` or the heartbeat interval); ``seconds``: a delay's
    hold on each write, in multiples of ``msg_timeout``.  ``rounds``: a
    requeue storm's time-outs (one at the anchor, then one every ``gap``
    events of the same kind), or how many publishes in a row fail.  The
    parameters after ``lookupd`` are keyword-only; ``duration``, ``seconds``,
    ``direction`` and ``rounds`` are :class:`~fakensq.faultkinds.FaultParams`'.
    """

    id: int
    kind: str
    anchor: Anchor
    node: int = 0
    lookupd: int = 0
    _: KW_ONLY
    gap: int = 0
    #: a drop at a message sent: before it goes (the client never gets it)
    withhold: bool = False
    #: a held answer (:attr:`holds_answer`) strikes again at this publish
    #: command (0: no second point)
    again: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS or KINDS[self.kind].level is None:
            raise ValueError(f"unknown fault {self.kind!r}")
        if self.anchor.count < 1 or self.rounds < 1 or self.id < 1 or self.again < 0:
            raise ValueError("anchors count from 1; rounds and ids are >= 1")
        if self.again and not self.holds_answer:
            raise ValueError("only a held answer strikes again at a publish command")

    @property
    def redelivers(self) -> int:
        """How many times it may make nsqd hand a consumed message out again
        (a fault at a publish strikes the producer: none)."""
        if not KINDS[self.kind].redelivers or not self.anchor.on_consumer:
            return 0
        return self.rounds if self.kind == "requeue_storm" else 1

    @property
    def holds_answer(self) -> bool:
        """A stall of a publish's answer: it ends at that nsqd's first
        publish once half of it has passed (the publisher gave up waiting and
        published again), or after ``duration`` x ``msg_timeout`` at most."""
        return self.kind == "stall" and not self.anchor.on_consumer and self.direction != "in"

    @property
    def level(self) -> Level:
        """The mildest level that allows it."""
        spec = KINDS[self.kind]
        assert spec.level is not None
        if self.anchor.on_consumer:
            return spec.level
        assert spec.publish_anchor is not None
        return spec.publish_anchor

    def describe(self, nsqd: str | None = None, lookupd: str | None = None) -> str:
        """One line: what, on which node, where in the flow (``nsqd`` and
        ``lookupd``: the nodes' names where the fixture has others)."""
        spec = KINDS[self.kind]
        node = nsqd or f"nsqd-{self.node}"
        parts = [self.kind]
        if self.kind == "lookupd_outage":
            parts.append(lookupd or f"lookupd-{self.lookupd}")
        elif spec.needs == "wire":
            whose = "consumer's" if self.anchor.on_consumer else "producer's"
            parts.append(f"{node}, the {whose} connection,")
        else:
            parts.append(node)
        if self.withhold:
            parts.append(
                f"as the {ordinal(self.anchor.count)} message to a consumer goes out "
                "(it never gets it)"
            )
        else:
            parts.append(self.anchor.describe())
        if self.again:
            parts.append(f"and at the {ordinal(self.again)} publish command")
        if self.holds_answer:
            parts.append(f"until a publish, {self.duration:g} x msg_timeout at most")
        elif spec.lasting and self.kind != "fail_publishes":
            clock = "heartbeat intervals" if spec.clock == "heartbeat" else "msg_timeout"
            parts.append(f"for {self.duration:g} x {clock}")
        if self.kind == "delay":
            parts.append(f"({self.seconds:g} x msg_timeout a write)")
        if "direction" in spec.params:
            parts.append(f"direction={self.direction}")
        if self.kind == "requeue_storm":
            parts.append(f"{self.rounds} rounds, {self.gap} {self.anchor.event} events apart")
        if self.kind == "fail_publishes":
            parts.append(f"{self.rounds} publish(es) in a row")
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """The fault as JSON-ready data (the fields that differ from the defaults)."""
        return {
            "id": self.id,
            "kind": self.kind,
            "event": self.anchor.event,
            "count": self.anchor.count,
            **self.non_defaults(),
        }


@dataclass(frozen=True)
class FlowSchedule(Sequence[FlowFault]):
    """A fixture's faults, numbered from 1 in the order drawn."""

    faults: tuple[FlowFault, ...] = field(default=())

    def __len__(self) -> int:
        return len(self.faults)

    def __iter__(self) -> Iterator[FlowFault]:
        return iter(self.faults)

    def __getitem__(self, index: Any) -> Any:
        return self.faults[index]

    def only(self, ids: Iterable[int] | None) -> FlowSchedule:
        """The faults numbered ``ids`` (all of them for None), numbers kept."""
        if ids is None:
            return self
        wanted = set(ids)
        return FlowSchedule(tuple(f for f in self.faults if f.id in wanted))

    @property
    def ids(self) -> tuple[int, ...]:
        return tuple(f.id for f in self.faults)


def draw_flow_schedule(
    rng: random.Random,
    *,
    rate: float = 4.0,
    level: Level = "safe",
    kinds: Sequence[str] | None = None,
    nsqd: int = 1,
    lookupd: int = 0,
    needs: Collection[Needs] = ("wire", "nsqd", "nodes"),
    redeliveries: int = DEFAULT_REDELIVERIES,
    horizon: int = DEFAULT_HORIZON,
) -> FlowSchedule:
    """About ``rate`` faults (a Poisson count with that mean) of the kinds
    ``level`` allows (or only ``kinds``), placed over the first ``horizon``
    events of ``nsqd`` nsqds, with at most ``redeliveries`` redeliveries.
    Only kinds whose needs are in ``needs``: a real nsqd behind a proxy has
    the wire and node control (restarts), not fakensq's insides (time-outs);
    without an nsqlookupd, no outage."""
    if rate < 0 or horizon < 1:
        raise ValueError("rate must be >= 0 and horizon >= 1")
    allowed = [
        k for k in kinds_for(level) if (kinds is None or k in kinds) and KINDS[k].needs in needs
    ]
    if lookupd < 1:
        allowed = [k for k in allowed if k != "lookupd_outage"]
    # The faults that reveal a class of bug each, first (see _core); the
    # rest drawn by weight, so that the mean stays ``rate``.
    core = _core(rng, allowed, level, horizon, redeliveries)
    if rate >= len(core):
        count = len(core) + poisson(rng, rate - len(core))
    else:
        count = poisson(rng, rate)
    faults = [
        FlowFault(i + 1, kind, anchor, node=rng.randrange(max(nsqd, 1)), **extra)
        for i, (kind, anchor, extra) in enumerate(core[:count])
    ]
    budget = redeliveries - sum(f.redelivers for f in faults)
    rest = draw_faults(
        rng,
        -1.0,  # exactly count - len(faults): the count is drawn above
        allowed,
        budget,
        usable=lambda k, left: left > 0 or not KINDS[k].redelivers or _publish_only(k, level),
        weight=lambda k: KINDS[k].flow_weight or KINDS[k].weight,
        make=lambda i, kind, left: _draw(
            rng, len(faults) + i, kind, level, nsqd, lookupd, horizon, left
        ),
        count=max(0, count - len(faults)),
    )
    return FlowSchedule(tuple(faults + rest))


def _log_uniform(rng: random.Random, top: int) -> int:
    # As many points among the first 5 as among the next 35 (of 40), so a
    # short test meets its faults too.
    return max(1, min(top, math.ceil(math.pow(top, rng.random()))))


def _core(
    rng: random.Random, allowed: Sequence[str], level: Level, horizon: int, redeliveries: int
) -> list[tuple[str, Anchor, dict[str, Any]]]:
    """The faults a schedule holds first, one for each way a fault reveals a
    bug, in an order drawn (each within the first quarter of the horizon, where
    a short test's flow still is):

    - a message lost on its way (the consumer's connection dropped as the
      message goes out): it comes back with attempts 2 though the consumer
      never handled it (a consumer that skips redeliveries loses it);
    - a message handled, its FIN never read (in-flight messages timed out at
      a FIN, or the consumer's connection dropped there): it is handled
      again (counting deliveries, a side effect a delivery, a running total);
    - a publish's answer held back (a stall of the producer's connection,
      out, until that nsqd sees a publish once half of it has passed, or at
      most ``duration`` x ``msg_timeout``): a publisher that publishes again when an answer is
      late duplicates the message, one with too short a patience fails;
      at the k-th message published and again at the j-th publish command
      (j >= 2), so that both a batch publisher and one that publishes as it
      consumes meet one.

    Those the kinds and level allow, within the redelivery budget."""
    top = max(1, horizon // 4)
    core: list[tuple[str, Anchor, dict[str, Any]]] = []
    budget = redeliveries
    if "drop" in allowed and budget > 0:
        core.append(("drop", Anchor("sent", _log_uniform(rng, top)), {"withhold": True}))
        budget -= 1
    handled = [k for k in ("time_out", "drop") if k in allowed]
    if handled and budget > 0:
        core.append((rng.choice(handled), Anchor("fin", _log_uniform(rng, top)), {}))
        budget -= 1
    if "stall" in allowed and "publish" in KINDS["stall"].anchors_at(level):
        # At the k-th message published (a batch publisher meets it in its
        # one MPUB), and again at the j-th publish command, j >= 2 (one that
        # publishes as it works, after a first batch, meets it there).
        extra = {
            "duration": round(rng.uniform(0.4, 1.0), 2),
            "direction": "out",
            "again": max(2, _log_uniform(rng, top)),
        }
        core.append(("stall", Anchor("published", _log_uniform(rng, top)), extra))
    rng.shuffle(core)
    return core


def _publish_only(kind: str, level: Level) -> bool:
    return KINDS[kind].anchors_at(level) == ("publish",)


def _draw(
    rng: random.Random,
    id: int,
    kind: str,
    level: Level,
    nsqd: int,
    lookupd: int,
    horizon: int,
    budget: int,
) -> FlowFault:
    spec = KINDS[kind]
    places = spec.anchors_at(level)
    # At a publish when allowed: more often than not for what harms a
    # producer (a harsh fault's point), 40% of the time for what only slows
    # one down (a late answer: a publisher that publishes again when one is
    # late must meet it); a kind that redelivers goes to a publish once the
    # budget is spent.
    at_publish = "publish" in places and (
        "consumer" not in places
        or (spec.redelivers and budget <= 0)
        or rng.random() < (0.75 if spec.publish_anchor != "safe" else 0.4)
    )
    event: Event = "published" if at_publish else rng.choice(("sent", "fin"))
    count = _log_uniform(rng, horizon)
    node = rng.randrange(max(nsqd, 1))
    target = rng.randrange(lookupd) if kind == "lookupd_outage" and lookupd else 0
    duration = 0.0
    if spec.lasting:
        span = (1.0, 1.5) if spec.clock == "heartbeat" else (0.1, 0.5)
        duration = round(rng.uniform(*span), 2)
    seconds = round(rng.uniform(0.005, 0.02), 4) if kind == "delay" else 0.0
    direction: Direction = "both"
    if "direction" in spec.params:
        # A publish's answer is held (its command gets through).
        direction = "out" if at_publish else rng.choice(("in", "out", "both"))
    # A drop at a message sent: before it goes three times in four (the
    # client never sees it: it comes back later, with attempts 2, the first
    # the consumer handles: a consumer that takes attempts > 1 for "done"
    # loses it), else after it (the client has it, its FIN cannot reach
    # nsqd: handled twice, as a drop at a FIN does).
    withhold = kind == "drop" and event == "sent" and rng.random() < 0.75
    rounds, gap = 1, 0
    if kind == "requeue_storm":
        rounds, gap = rng.randint(1, max(1, min(3, budget))), rng.randint(1, 5)
    elif kind == "fail_publishes":
        rounds = rng.randint(1, 3)
    return FlowFault(
        id,
        kind,
        Anchor(event, count),
        node=node,
        lookupd=target,
        duration=duration,
        seconds=seconds,
        direction=direction,
        rounds=rounds,
        gap=gap,
        withhold=withhold,
    )


def parse_only(text: str) -> dict[str, frozenset[int]] | None:
    """A ``--nsq-faults-only`` list: ``LABEL:N,...`` (the faults numbered N of
    the fixture LABEL: ``nsqd-0:2,nsqd-0:5``), or ``none``.  The labels and
    their chosen numbers; ``{}`` for none.  ``ValueError`` (one line) for a
    malformed list."""
    text = text.strip()
    if text == "none":
        return {}
    chosen: dict[str, set[int]] = {}
    for part in text.split(","):
        label, sep, number = part.strip().rpartition(":")
        if not sep or not label or not number.isdigit() or int(number) < 1:
            raise ValueError(
                f"--nsq-faults-only wants LABEL:N[,LABEL:N...] (as a report prints it, "
                f"e.g. nsqd-0:2) or none, not {part.strip()!r}"
            )
        chosen.setdefault(label, set()).add(int(number))
    return {label: frozenset(ids) for label, ids in chosen.items()}


def format_only(chosen: Iterable[tuple[str, int]]) -> str:
    """The ``--nsq-faults-only`` value that keeps the faults ``chosen``
    (``(label, number)`` pairs); ``none`` for none."""
    parts = [f"{label}:{number}" for label, number in sorted(set(chosen))]
    return ",".join(parts) or "none"
