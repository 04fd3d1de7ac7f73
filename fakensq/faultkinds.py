"""The registry of fault kinds: one entry per kind, read by everything that
names one.

The injector (:mod:`fakensq.testing.faults`), the schedules and their hypothesis
strategies (:mod:`fakensq.testing.schedule`, :mod:`fakensq.testing.strategies`),
the proxy (:mod:`fakensq.testing.proxy`, ``fakensq proxy``), the pytest plugin's
options and the admin's fault pages all take a kind's name, level, needs,
parameters and effect on the messages in flight from here; both kinds of
schedule take the fields of those parameters from :class:`FaultParams`.  It imports nothing
of fakensq, so the daemons (the admin) read it without importing the test
machinery.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import MISSING, Field, dataclass, fields
from typing import Any, Final, Literal

__all__ = [
    "KINDS",
    "Anchoring",
    "LEVELS",
    "REDELIVERING",
    "SCHEDULE_KINDS",
    "WIRE_KINDS",
    "Direction",
    "FaultKind",
    "FaultParams",
    "InFlight",
    "Level",
    "Needs",
    "Role",
    "kind",
    "kinds_for",
    "parse_kinds",
    "parse_level",
]

#: How rough a fault may be, mildest first (see :mod:`fakensq.testing.schedule`).
Level = Literal["safe", "harsh", "lossy"]
LEVELS: Final[tuple[Level, ...]] = ("safe", "harsh", "lossy")

#: ``"in"``: towards the node (what it reads); ``"out"``: from the node.
Direction = Literal["in", "out", "both"]

#: What a connection is to the node: it subscribed, it published, or neither yet.
Role = Literal["consumer", "producer", "unknown"]

#: What a kind needs to be injected: ``"wire"``, only the bytes of a connection
#: (so ``fakensq proxy`` in front of a real nsqd can do it too); ``"nsqd"``,
#: fakensq's own nsqd (it acts inside the node); ``"nodes"``, something that
#: stops and starts nodes (a ``Cluster``, or a restartable lone nsqd).
Needs = Literal["wire", "nsqd", "nodes"]

#: What a kind does to the messages in flight when it strikes: ``"kept"``
#: (nothing: they are finished as usual, if later), ``"redelivered"`` (nsqd hands
#: them out again, with one more attempt), ``"lost"`` (what nsqd held in memory
#: is gone, as after ``kill -9``).
InFlight = Literal["kept", "redelivered", "lost"]

#: Where a fault placed by the message flow strikes: at a consumer's event (a
#: message sent to it, its FIN) or at a publish.
Anchoring = Literal["consumer", "publish"]

#: The parameters a schedule's event may carry (see
#: :class:`fakensq.testing.schedule.FaultEvent`).
Param = Literal["duration", "seconds", "direction", "rounds", "interval"]


@dataclass(frozen=True, kw_only=True, repr=False)
class FaultParams:
    """The parameters a scheduled fault carries besides its kind and where it
    strikes, shared by a clock-placed schedule's events
    (:class:`fakensq.testing.schedule.FaultEvent`) and a flow-placed one's faults
    (:class:`fakensq.testing.flow.FlowFault`), each of which says in what unit:
    ``duration``, how long a lasting fault lasts; ``seconds``, a delay's hold on
    each write; ``direction``, ``"in"`` (towards the node), ``"out"`` (from it)
    or ``"both"``; ``rounds``, a requeue storm's time-outs.

    Keyword-only, so that a subclass's own positional fields (its time or
    anchor, its kind, its node) keep their places in the constructor.  The
    repr and :meth:`non_defaults` list the fields in the constructor's order
    (a dataclass puts a base's fields first): a subclass is declared with
    ``repr=False`` so that it keeps this repr.
    """

    duration: float = 0.0
    seconds: float = 0.0
    direction: Direction = "both"
    rounds: int = 1

    def non_defaults(self) -> dict[str, Any]:
        """The fields that have a default and differ from it, in the
        constructor's order: what a fault's JSON form writes besides the
        fields every fault has."""
        found: dict[str, Any] = {}
        for f in _in_constructor_order(self):
            value = getattr(self, f.name)
            if f.default is not MISSING and value != f.default:
                found[f.name] = value
        return found

    def __repr__(self) -> str:
        inner = ", ".join(
            f"{f.name}={getattr(self, f.name)!r}" for f in _in_constructor_order(self) if f.repr
        )
        return f"{type(self).__qualname__}({inner})"


def _in_constructor_order(fault: FaultParams) -> list[Field[Any]]:
    # The positional fields first, then the keyword-only ones, each in the
    # order declared: as ``__init__`` takes them (sorted() is stable).
    return sorted(fields(fault), key=lambda f: f.kw_only is True)


@dataclass(frozen=True)
class FaultKind:
    """One kind of fault."""

    name: str
    #: the mildest level a schedule draws it at (None: never drawn; injected by hand)
    level: Level | None
    needs: Needs
    in_flight: InFlight
    #: a short label (the admin's buttons)
    label: str
    #: what it does, one line
    summary: str
    #: it lasts until healed (or for a schedule event's ``duration``)
    lasting: bool = False
    #: it acts on whole NSQ frames (not on a TLS or compressed connection)
    frame: bool = False
    #: the parameters of its schedule events, besides time and node
    params: tuple[Param, ...] = ()
    #: from level ``"harsh"`` on, a schedule may aim it at producers too
    hits_producers: bool = False
    #: the node it acts on: an nsqd or an nsqlookupd
    target: Literal["nsqd", "lookupd"] = "nsqd"
    #: its relative weight when a schedule draws kinds
    weight: float = 1.0
    #: placed by the message flow (:mod:`fakensq.testing.flow`): whether it may
    #: strike at a consumer's event (a message sent to it, its FIN) ...
    consumer_anchor: bool = True
    #: ... and from which level on at a publish (None: never); a kind that
    #: leaves the publish unharmed (a delay, a stall of its answer) is "safe"
    publish_anchor: Level | None = None
    #: the run's own timeout its duration is a multiple of, on the TCP fixtures
    clock: Literal["msg_timeout", "heartbeat"] = "msg_timeout"
    #: its weight in a flow schedule's draw, where it differs from ``weight``
    flow_weight: float | None = None

    @property
    def redelivers(self) -> bool:
        """Whether the messages in flight when it strikes come back (or go)."""
        return self.in_flight != "kept"

    def allowed_at(self, level: Level) -> bool:
        """Whether a schedule of ``level`` may hold it."""
        return self.level is not None and LEVELS.index(self.level) <= LEVELS.index(level)

    def anchors_at(self, level: Level) -> tuple[Anchoring, ...]:
        """Where a flow schedule of ``level`` may place it: ``"consumer"`` (a
        message sent, a FIN), ``"publish"``."""
        at: list[Anchoring] = ["consumer"] if self.consumer_anchor else []
        if self.publish_anchor is not None and LEVELS.index(self.publish_anchor) <= LEVELS.index(
            level
        ):
            at.append("publish")
        return tuple(at)

    def hits_producers_at(self, level: Level) -> bool:
        """Whether a schedule of ``level`` may aim it at producers' connections."""
        return self.hits_producers and LEVELS.index(level) >= LEVELS.index("harsh")


def _by_hand(name: str, label: str, summary: str) -> FaultKind:
    """A kind no schedule draws: a lasting fault inside fakensq's nsqd."""
    return FaultKind(name, None, "nsqd", "kept", label, summary, lasting=True)


_ALL: Final[tuple[FaultKind, ...]] = (
    # -- safe: a correct at-least-once consumer gets every message, no publish fails
    FaultKind(
        "drop", "safe", "wire", "redelivered", "Drop connections",
        "connections aborted: the peer sees EOF; what they held comes back at its timeout",
        hits_producers=True, weight=3.0, publish_anchor="harsh",
    ),
    FaultKind(
        "delay", "safe", "wire", "kept", "Delay",
        "every write held for some seconds", lasting=True,
        params=("duration", "seconds", "direction"), weight=2.0, publish_anchor="safe",
    ),
    FaultKind(
        "stall", "safe", "wire", "kept", "Stall",
        "the bytes stop (the connections stay open)", lasting=True,
        params=("duration", "direction"), hits_producers=True, weight=2.0,
        publish_anchor="safe",
    ),
    FaultKind(
        "swallow_heartbeats", "safe", "wire", "kept", "Swallow heartbeats",
        "nsqd's heartbeats never reach the client", lasting=True, frame=True,
        params=("duration",), hits_producers=True, publish_anchor="harsh", clock="heartbeat",
    ),
    FaultKind(
        "time_out", "safe", "nsqd", "redelivered", "Time out in-flight messages",
        "the messages in flight time out now, as at their msg_timeout", weight=3.0,
    ),
    FaultKind(
        "requeue_storm", "safe", "nsqd", "redelivered", "Requeue storm",
        "the messages in flight time out, some rounds in a row",
        params=("rounds", "interval"),
    ),
    FaultKind(
        "restart", "safe", "nodes", "redelivered", "Kill / restart nsqd",
        "nsqd stops cleanly (its messages kept on disk) and starts again",
        hits_producers=True, publish_anchor="harsh",
    ),
    FaultKind(
        "lookupd_outage", "safe", "nodes", "kept", "nsqlookupd outage",
        "an nsqlookupd goes down for a while", lasting=True, params=("duration",),
        target="lookupd",
    ),
    # -- harsh: a correct producer must retry what nsqd did not acknowledge
    FaultKind(
        "corrupt", "harsh", "wire", "redelivered", "Corrupt next frame",
        "the next frame from nsqd gets an invalid frame type", frame=True,
        publish_anchor="harsh",
    ),
    FaultKind(
        "truncate", "harsh", "wire", "redelivered", "Truncate next frame",
        "the next frame from nsqd is cut in half, then the connection drops", frame=True,
        publish_anchor="harsh",
    ),
    FaultKind(
        "partition", "harsh", "wire", "redelivered", "Partition",
        "no bytes between the two ends, and no new connection", lasting=True,
        params=("duration",), publish_anchor="harsh",
    ),
    FaultKind(
        "fail_publishes", "harsh", "nsqd", "kept", "Fail publishes",
        "publishes fail with E_PUB_FAILED", lasting=True, params=("duration",),
        consumer_anchor=False, publish_anchor="harsh", flow_weight=2.0,
    ),
    # -- lossy: what nsqd held in memory is lost
    FaultKind(
        "kill", "lossy", "nodes", "lost", "Kill nsqd",
        "nsqd killed (no clean stop) and started again", publish_anchor="lossy",
    ),
    # -- by hand only (the Faults API): inside fakensq's nsqd, until healed
    *(
        _by_hand(name, label, summary)
        for name, label, summary in (
            ("fail_backend", "Fail the backend",
             "nsqd's store refuses writes: publishes fail, /ping says unhealthy"),
            ("refuse_auth", "Refuse auth", "the auth server refuses connections: AUTH fails"),
            ("hang_auth", "Hang auth", "the auth server never answers: AUTH hangs"),
            ("pause_channel", "Pause channel", "a channel paused until healed"),
        )
    ),
)  # fmt: skip

#: Every kind, by name.
KINDS: Final[dict[str, FaultKind]] = {k.name: k for k in _ALL}

#: The kinds a schedule may hold, mildest level first.
SCHEDULE_KINDS: Final[tuple[str, ...]] = tuple(
    k.name for level in LEVELS for k in _ALL if k.level == level
)

#: The kinds that act on the wire only: what ``fakensq proxy`` can inject.
WIRE_KINDS: Final[tuple[str, ...]] = tuple(k.name for k in _ALL if k.needs == "wire")

#: The kinds after which nsqd hands the messages in flight out again (or loses them).
REDELIVERING: Final[frozenset[str]] = frozenset(k.name for k in _ALL if k.redelivers)


def kind(name: str) -> FaultKind:
    """The kind named ``name`` (``ValueError`` naming the known ones)."""
    found = KINDS.get(name)
    if found is None:
        raise ValueError(f"unknown fault {name!r} (known: {', '.join(SCHEDULE_KINDS)})")
    return found


def parse_level(text: str) -> Level:
    """A level's name, checked (``ValueError`` naming the choices)."""
    for level in LEVELS:
        if text == level:
            return level
    raise ValueError(f"unknown fault level {text!r} (choose from {', '.join(LEVELS)})")


def kinds_for(level: Level) -> tuple[str, ...]:
    """The kinds a schedule of ``level`` may hold."""
    return tuple(name for name in SCHEDULE_KINDS if KINDS[name].allowed_at(level))


def parse_kinds(names: Iterable[str]) -> tuple[str, ...]:
    """Schedule kind names, checked (``ValueError`` naming the unknown one)."""
    kinds = []
    for name in names:
        name = name.strip()
        if name not in SCHEDULE_KINDS:
            raise ValueError(f"unknown fault {name!r} (known: {', '.join(SCHEDULE_KINDS)})")
        kinds.append(name)
    return tuple(kinds)
