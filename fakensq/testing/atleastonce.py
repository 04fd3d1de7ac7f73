"""Property tests of at-least-once consumers under faults, in virtual time.

:func:`check_at_least_once` runs a user's consumers on a
:class:`fakensq.testing.simulation.SimCluster` while a
:class:`~fakensq.testing.schedule.FaultSchedule` plays, publishes messages
through a producer that retries until nsqd acknowledges, lets the run settle,
and checks the at-least-once invariants on
what the nodes saw (their trace):

- every published message was finished (FIN; a consumer giving up FINs too);
- no message was handed to a consumer while it was in flight at another (or at
  the same one, on another connection) within its timeout;
- no consumer ever held more RDY, summed over its live connections, than the
  ``max_in_flight`` it declared (while a fault delays or stalls what a client
  sends to a node, its RDY changes reach the nodes out of order: a sum over the
  limit then is the fault's doing, not the client's, and is forgiven).

A violation raises :class:`AtLeastOnceError` (an ``AssertionError``), whose text
holds the schedule as code, so a failing hypothesis example (see
:mod:`fakensq.testing.strategies`) shrinks to a short schedule and replays::

    from hypothesis import given
    import trionsq
    from fakensq.testing.atleastonce import check_at_least_once
    from fakensq.testing.strategies import fault_schedules

    @given(fault_schedules())
    def test_billing(schedule):
        async def billing(env):
            async with trionsq.Consumer(env.topic, env.channel, handler=handle,
                                        max_in_flight=3, **env.trionsq_options()):
                await trio.sleep_forever()

        check_at_least_once(schedule, {"billing": billing}, max_in_flight={"billing": 3})

The pieces serve stepwise tests too (a hypothesis state machine):
:class:`SimDriver` runs a Trio loop in virtual time one step at a time,
:class:`AtLeastOnceChecker` checks a trace as it grows, and :func:`publish`
publishes and traces what it published.
"""

from __future__ import annotations

import math
import random
import re
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import trio
import trio.testing

from .faultplayer import FaultPlayer, MetFault
from .schedule import FaultSchedule

if TYPE_CHECKING:
    from .simulation import SimCluster

__all__ = [
    "AtLeastOnceChecker",
    "AtLeastOnceError",
    "ClientEnv",
    "Delivery",
    "RunReport",
    "SimDriver",
    "check_at_least_once",
    "publish",
    "run_at_least_once",
]

T = TypeVar("T")

_FAILED = re.compile(r"^E_(FIN|REQ|TOUCH)_FAILED (?:FIN|REQ|TOUCH) (\S+)")


class AtLeastOnceError(AssertionError):
    """An at-least-once invariant did not hold; the text says which, and how to
    replay the run."""


@dataclass
class Delivery:
    """A message handed to a connection: on ``node``, to ``peer`` (the
    connection, ``"name:serial"``), at ``t``, with ``attempts``."""

    node: str
    id: str
    body: str
    peer: str
    t: float
    attempts: int
    deadline: float
    #: how it ended: "fin", "req", "timeout", "node stopped"... ("" while open)
    ended: str = ""
    ended_at: float = math.inf

    @property
    def client(self) -> str:
        """The client's name (the connector's name: the peer without its serial)."""
        return self.peer.rpartition(":")[0] or self.peer


@dataclass
class _Connection:
    rdy: int = 0
    msg_timeout: float | None = None
    live: bool = True


class AtLeastOnceChecker:
    """Checks a fault trace (:class:`fakensq.faults.Tracer` events) against the
    at-least-once invariants, event by event (:meth:`feed` as the trace grows).

    ``msg_timeout`` is the nodes' (a client's IDENTIFY may set its own);
    ``max_in_flight`` maps client names to the RDY they may hold in all;
    ``slack`` forgives a redelivery that early (nsqd's output buffering delays
    a message frame after its timeout started; default: its 250 ms).
    ``requeue_on_disconnect``: the nodes opted in to requeueing a gone
    client's messages at once (fakensq's option, not nsqd's behaviour).
    """

    def __init__(
        self,
        *,
        msg_timeout: float = 60.0,
        max_in_flight: Mapping[str, int] | None = None,
        slack: float = 0.25,
        requeue_on_disconnect: bool = False,
    ) -> None:
        self.msg_timeout = msg_timeout
        self.max_in_flight = dict(max_in_flight or {})
        self.slack = slack
        self.requeue_on_disconnect = requeue_on_disconnect
        #: what went wrong, one line each, in order
        self.violations: list[str] = []
        #: every delivery, in order
        self.deliveries: list[Delivery] = []
        #: bodies published (acknowledged), with the node and time
        self.published: dict[str, list[tuple[str, float]]] = {}
        #: (node, id) of finished messages
        self.finished_ids: set[tuple[str, str]] = set()
        #: bodies a kill may have lost (published there, unfinished at the kill)
        self.maybe_lost: set[str] = set()
        self._open: dict[tuple[str, str], Delivery] = {}
        self._by_id: dict[tuple[str, str], list[Delivery]] = {}
        self._conns: dict[tuple[str, str], _Connection] = {}
        self._void: set[tuple[str, str, int]] = set()
        #: faults holding up what clients send to a node: id -> (node, seconds)
        self._holds: dict[int, tuple[str, float]] = {}
        #: node -> until when frames a healed hold delayed may still arrive
        self._held_until: dict[str, float] = {}
        self._seen = 0

    # -- feeding -------------------------------------------------------------

    def feed(self, events: Sequence[dict[str, Any]]) -> None:
        """Check the events not seen yet (``events`` is the whole trace so far)."""
        for event in events[self._seen :]:
            self._event(event)
        self._seen = len(events)

    def _event(self, e: dict[str, Any]) -> None:
        kind = e.get("event")
        t = float(e.get("t", 0.0))
        node = str(e.get("node") or "")
        peer = str(e.get("peer") or "")
        if kind == "frame":
            if e.get("dir") == "out":
                self._frame_out(e, t, node, peer)
            else:
                self._command(e, t, node, peer)
        elif kind == "connect":
            self._conns[(node, peer)] = _Connection()
        elif kind in ("eof", "dropped", "closed"):
            conn = self._conns.get((node, peer))
            if conn is not None and conn.live:
                conn.live = False
                if self.requeue_on_disconnect:
                    self._end_all(lambda d: d.node == node and d.peer == peer, "disconnect", t)
        elif kind == "time_out_in_flight":
            for n, msg_id, attempts in e.get("messages", []):
                delivery = self._open.get((n, msg_id))
                if delivery is not None and delivery.attempts == attempts:
                    delivery.ended, delivery.ended_at = "forced time-out", t
                    del self._open[(n, msg_id)]
                else:
                    # Still in the node's output buffer: void once it shows.
                    self._void.add((n, msg_id, attempts))
        elif kind in ("stop", "kill"):
            self._end_all(lambda d: d.node == node, f"{node} {kind}ped", t)
            for conn_key, conn in self._conns.items():
                if conn_key[0] == node:
                    conn.live = False
            if kind == "kill":
                self._killed(node, t)
        elif kind in ("fault", "heal"):
            self._hold(e, t, kind == "fault")
        elif kind == "published":
            body = str(e.get("body"))
            self.published.setdefault(body, []).append((node, t))

    def _hold(self, e: dict[str, Any], t: float, added: bool) -> None:
        """Track delays and stalls of what clients send to a node."""
        if e.get("kind") not in ("delay", "stall") or e.get("direction") == "out":
            return
        fault_id = int(e.get("id", 0))
        if added:
            self._holds[fault_id] = (str(e.get("node") or "*"), float(e.get("seconds", 0.0)))
            return
        held = self._holds.pop(fault_id, None)
        if held is not None:
            # A read the fault held goes on sleeping its delay after the heal.
            node, seconds = held
            until = t + seconds + self.slack
            self._held_until[node] = max(self._held_until.get(node, 0.0), until)

    def _held(self, t: float, node: str) -> bool:
        """Whether what clients send to ``node`` may be held up by a fault at ``t``."""
        if any(n in (node, "*") for n, _ in self._holds.values()):
            return True
        return max(self._held_until.get(node, 0.0), self._held_until.get("*", 0.0)) >= t

    def _frame_out(self, e: dict[str, Any], t: float, node: str, peer: str) -> None:
        if e.get("frame") == "message":
            self._delivered(e, t, node, peer)
        elif e.get("frame") == "error":
            match = _FAILED.match(str(e.get("data", "")))
            if match is not None:
                # The FIN/REQ/TOUCH came too late: it changed nothing.
                if match.group(1) == "FIN":
                    self.finished_ids.discard((node, match.group(2)))

    def _delivered(self, e: dict[str, Any], t: float, node: str, peer: str) -> None:
        msg_id, body = str(e.get("id")), str(e.get("body", ""))
        key = (node, msg_id)
        if key in self.finished_ids:
            self.violations.append(f"{t:.3f}s {node}: {body!r} delivered to {peer} after its FIN")
        previous = self._open.get(key)
        if previous is not None and t + self.slack < previous.deadline:
            self.violations.append(
                f"{t:.3f}s {node}: {body!r} handed to {peer} while in flight at "
                f"{previous.peer} until {previous.deadline:.3f}s (since {previous.t:.3f}s)"
            )
        if previous is not None:
            previous.ended, previous.ended_at = previous.ended or "timed out", t
        conn = self._conns.setdefault((node, peer), _Connection())
        timeout = conn.msg_timeout if conn.msg_timeout is not None else self.msg_timeout
        attempts = int(e.get("attempts", 0))
        delivery = Delivery(node, msg_id, body, peer, t, attempts, t + timeout)
        self._by_id.setdefault(key, []).append(delivery)
        self.deliveries.append(delivery)
        if (node, msg_id, attempts) in self._void:
            self._void.discard((node, msg_id, attempts))
            delivery.ended, delivery.ended_at = "forced time-out", t
        else:
            self._open[key] = delivery

    def _command(self, e: dict[str, Any], t: float, node: str, peer: str) -> None:
        words = str(e.get("cmd", "")).split(" ")
        verb = words[0]
        conn = self._conns.setdefault((node, peer), _Connection())
        if verb == "IDENTIFY" and "msg_timeout" in e:
            conn.msg_timeout = int(e["msg_timeout"]) / 1000
        elif verb == "RDY" and len(words) > 1 and words[1].isdigit():
            conn.rdy = int(words[1])
            self._check_rdy(t, node, peer)
        elif verb in ("FIN", "REQ", "TOUCH") and len(words) > 1:
            key = (node, words[1])
            delivery = self._open.get(key)
            if delivery is None or delivery.peer != peer or delivery.ended:
                return  # not in flight there: nsqd answers E_*_FAILED
            if verb == "TOUCH":
                timeout = conn.msg_timeout if conn.msg_timeout is not None else self.msg_timeout
                delivery.deadline = t + timeout
                return
            delivery.ended, delivery.ended_at = verb.lower(), t
            del self._open[key]
            if verb == "FIN":
                self.finished_ids.add(key)

    def _check_rdy(self, t: float, node: str, peer: str) -> None:
        client = peer.rpartition(":")[0] or peer
        limit = self.max_in_flight.get(client)
        if limit is None:
            return
        mine = [
            (n, c)
            for (n, p), c in self._conns.items()
            if c.live and (p.rpartition(":")[0] or p) == client
        ]
        total = sum(c.rdy for _, c in mine)
        if total > limit and not any(self._held(t, n) for n, _ in mine):
            self.violations.append(
                f"{t:.3f}s {client}: RDY {total} over its connections > max_in_flight {limit}"
            )

    def _end_all(self, which: Callable[[Delivery], bool], why: str, t: float) -> None:
        for key, delivery in list(self._open.items()):
            if which(delivery):
                delivery.ended, delivery.ended_at = why, t
                del self._open[key]

    def _killed(self, node: str, t: float) -> None:
        finished = self.finished
        for body, where in self.published.items():
            if body not in finished and any(n == node and at <= t for n, at in where):
                self.maybe_lost.add(body)

    # -- results -------------------------------------------------------------

    @property
    def finished(self) -> set[str]:
        """Bodies of finished messages (FINed, and the FIN not refused)."""
        return {self._by_id[k][0].body for k in self.finished_ids}

    def unfinished(self, *, allow_lost: bool = True) -> list[str]:
        """Published bodies never finished (those a kill may have lost left out
        unless ``allow_lost`` is False), sorted."""
        missing = set(self.published) - self.finished
        if allow_lost:
            missing -= self.maybe_lost
        return sorted(missing)

    def check(self) -> None:
        """Raise :class:`AtLeastOnceError` if an invariant broke so far."""
        if self.violations:
            raise AtLeastOnceError("\n".join(self.violations))


# -- publishing ---------------------------------------------------------------


async def publish(
    cluster: SimCluster,
    topic: str,
    bodies: Sequence[bytes],
    *,
    node: int = 0,
    multi: bool = True,
    name: str = "producer",
    retry_delay: float = 1.0,
    give_up_after: float = 3600.0,
) -> None:
    """Publish ``bodies`` to nsqd ``node`` as a correct producer does: retry
    until nsqd acknowledges (a duplicate is possible when an acknowledgement was
    lost, as in production).  Each acknowledged body is traced as a
    ``"published"`` event, for :class:`AtLeastOnceChecker`."""
    import trionsq

    address = cluster.nsqd_tcp_addresses[node]
    pending = list(bodies)
    with trio.fail_after(give_up_after):
        while pending:
            try:
                async with trionsq.Producer(
                    nsqd_tcp_addresses=[address],
                    connector=cluster.connector_for(name),
                    connect_timeout=retry_delay * 5,
                ) as producer:
                    while pending:
                        if multi:
                            await producer.multi_publish(topic, pending)
                            done, pending = pending, []
                        else:
                            await producer.publish(topic, pending[0])
                            done, pending = pending[:1], pending[1:]
                        for body in done:
                            cluster.faults.trace(
                                "published", node=f"nsqd-{node}", body=body.decode("latin-1")
                            )
            except (trionsq.NSQError, OSError, trio.BrokenResourceError, trio.TooSlowError) as exc:
                cluster.faults.trace("publish_failed", node=f"nsqd-{node}", error=str(exc))
                await trio.sleep(retry_delay)
            except BaseExceptionGroup as group:
                if group.subgroup((trionsq.NSQError, OSError, trio.BrokenResourceError)) is None:
                    raise
                await trio.sleep(retry_delay)


# -- the one-shot runner ----------------------------------------------------------


@dataclass
class ClientEnv:
    """What a consumer function gets: its name, the cluster's addresses, and
    the in-memory connector and HTTP transport its connections must use (named
    after it, for the faults and the checks)."""

    name: str
    cluster: SimCluster
    topic: str
    channel: str
    rng: random.Random

    @property
    def nsqd_tcp_addresses(self) -> list[str]:
        return self.cluster.nsqd_tcp_addresses

    @property
    def lookupd_http_addresses(self) -> list[str]:
        return self.cluster.lookupd_http_addresses

    @property
    def connector(self) -> Any:
        return self.cluster.connector_for(self.name)

    @property
    def http_transport(self) -> Any:
        return self.cluster.http_transport_for(self.name)

    def trionsq_options(self) -> dict[str, Any]:
        """Keywords for a ``trionsq.Consumer``: discovery through the lookupds
        (the nsqds when there is none), this client's connector, transport and
        seeded ``rng``."""
        options: dict[str, Any] = {
            "connector": self.connector,
            "http_transport": self.http_transport,
            "rng": self.rng,
        }
        if self.lookupd_http_addresses:
            options["lookupd_http_addresses"] = self.lookupd_http_addresses
        else:
            options["nsqd_tcp_addresses"] = self.nsqd_tcp_addresses
        return options


ConsumerFn = Callable[[ClientEnv], Awaitable[None]]


@dataclass
class RunReport:
    """What :func:`run_at_least_once` saw."""

    schedule: FaultSchedule
    met: list[MetFault]
    checker: AtLeastOnceChecker
    trace: list[dict[str, Any]]
    #: virtual seconds until every message was finished (inf: never)
    finished_at: float = math.inf
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        lines = list(self.problems) or ["every invariant held"]
        lines.append("faults met:")
        lines += [m.describe() for m in sorted(self.met, key=lambda m: m.at)] or ["  (none)"]
        lines.append("replay with this schedule:")
        lines.append(f"  FaultSchedule.from_list({self.schedule.to_list()!r})")
        return "\n".join(lines)


async def run_at_least_once(
    schedule: FaultSchedule,
    consumers: Mapping[str, ConsumerFn],
    *,
    messages: Sequence[bytes] | int = 20,
    topic: str = "t",
    channel: str = "c",
    nsqd: int = 1,
    lookupd: int = 1,
    seed: int = 0,
    max_in_flight: Mapping[str, int] | None = None,
    publish_over: float = 30.0,
    batches: int = 5,
    deadline: float = 3600.0,
    nsqd_options: Mapping[str, Any] | None = None,
) -> RunReport:
    """:func:`check_at_least_once`'s run, inside a Trio run on a MockClock;
    returns the report without raising."""
    from .simulation import SimCluster

    bodies = (
        [b"m%03d" % i for i in range(messages)] if isinstance(messages, int) else list(messages)
    )
    options = dict(nsqd_options or {})
    trace: list[dict[str, Any]] = []
    cluster = SimCluster(nsqd, lookupd, seed=seed, trace=trace, nsqd_options=options)
    checker = AtLeastOnceChecker(
        msg_timeout=float(options.get("msg_timeout", 60.0)),
        max_in_flight=max_in_flight,
        requeue_on_disconnect=bool(options.get("requeue_on_disconnect", False)),
    )
    player = FaultPlayer(schedule, cluster.faults, nsqd=nsqd, lookupd=lookupd)
    report = RunReport(schedule, player.met, checker, trace)
    async with cluster, trio.open_nursery() as nursery:
        # The topic and channel exist before anyone connects, as in a deployment:
        # consumers find them at once, messages wait in the channel.
        for i in range(nsqd):
            cluster.nsqd(i).get_topic(topic).get_channel(channel)
        await cluster.wait_registered()
        for name, consume in consumers.items():
            env = ClientEnv(name, cluster, topic, channel, random.Random(f"{seed}:{name}"))
            nursery.start_soon(consume, env)
        await nursery.start(player.run)
        nursery.start_soon(_publish_batches, cluster, topic, bodies, nsqd, publish_over, batches)
        start = trio.current_time()
        published = len(set(bodies))
        with trio.move_on_after(deadline):
            await _until(lambda: len(set(checker.published)) == published, checker, trace)
            await _until(lambda: not checker.unfinished(), checker, trace)
            report.finished_at = trio.current_time() - start
            # Play the rest of the schedule: a fault after the last FIN may
            # still break a consumer (one that cannot reconnect, say).
            await trio.sleep_until(start + schedule.end + 1.0)
            await _until(lambda: not checker.unfinished(), checker, trace)
        if math.isinf(report.finished_at):
            # Heal, bring every node back, and give the consumers time.
            await player.settle()
            with trio.move_on_after(2 * checker.msg_timeout + 120):
                await _until(lambda: not checker.unfinished(), checker, trace)
        checker.feed(trace)
        nursery.cancel_scope.cancel()
    report.problems += checker.violations
    missing = checker.unfinished()
    if missing:
        report.problems.append(
            f"never finished ({len(missing)} of {len(checker.published)}): "
            + ", ".join(repr(b) for b in missing[:20])
        )
    return report


async def _publish_batches(
    cluster: SimCluster, topic: str, bodies: list[bytes], nsqd: int, over: float, batches: int
) -> None:
    batches = max(1, min(batches, len(bodies)))
    size = math.ceil(len(bodies) / batches)
    for i in range(batches):
        chunk = bodies[i * size : (i + 1) * size]
        if chunk:
            await publish(cluster, topic, chunk, node=i % nsqd, name=f"producer-{i % nsqd}")
        if i + 1 < batches:
            await trio.sleep(over / batches)


async def _until(
    done: Callable[[], bool], checker: AtLeastOnceChecker, trace: list[dict[str, Any]]
) -> None:
    # Virtual time: looking once a second costs nothing.
    while True:
        checker.feed(trace)
        if done():
            return
        await trio.sleep(1.0)


def check_at_least_once(
    schedule: FaultSchedule,
    consumers: Mapping[str, ConsumerFn],
    **options: Any,
) -> RunReport:
    """Run ``consumers`` (async functions of a :class:`ClientEnv`, running until
    cancelled, by name) on a :class:`fakensq.testing.simulation.SimCluster` in virtual
    time while ``schedule`` plays, publish ``messages`` (a count or bodies) to
    ``topic`` over ``publish_over`` seconds in ``batches``, and check the
    invariants (see the module doc).  Raises :class:`AtLeastOnceError` with the
    report; returns it when every invariant held.

    Keywords: ``messages``, ``topic``, ``channel``, ``nsqd``, ``lookupd``
    (the cluster's shape), ``seed``, ``max_in_flight`` (by consumer name),
    ``publish_over``, ``batches``, ``deadline`` (virtual seconds to finish),
    ``nsqd_options``.  Runs its own ``trio.run``: call it from synchronous
    code (a hypothesis test); inside Trio, await :func:`run_at_least_once`.
    """

    async def main() -> RunReport:
        return await run_at_least_once(schedule, consumers, **options)

    report = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    if not report.ok:
        raise AtLeastOnceError(report.describe())
    return report


# -- a Trio loop fed one step at a time (state machines) ------------------------------


class SimDriver:
    """A ``trio.run`` on a thread of its own, on a ``MockClock``, fed one step at
    a time (for hypothesis state machines, whose rules are synchronous).

    ``main(nursery)`` sets the run up (start a cluster, consumers...).  Each
    :meth:`run` sends one step into the loop, with autojump on, and returns once
    the step is done and every task is blocked, with virtual time frozen
    between steps: every step starts from the same state in every replay.
    """

    def __init__(self, main: Callable[[trio.Nursery], Awaitable[None]]) -> None:
        self.clock = trio.testing.MockClock(autojump_threshold=math.inf)
        self._main = main
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="fakensq-sim")
        self._thread.start()
        self._ready.wait(60)
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        try:
            trio.run(self._body, clock=self.clock)
        except BaseException as exc:  # reported by run() / close()
            self._error = exc
        finally:
            self._ready.set()

    async def _body(self) -> None:
        self._stop = trio.Event()
        async with trio.open_nursery() as nursery:
            self.clock.autojump_threshold = 0
            try:
                await self._main(nursery)
            finally:
                self.clock.autojump_threshold = math.inf
            await trio.testing.wait_all_tasks_blocked()
            self._token = trio.lowlevel.current_trio_token()
            self._ready.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    def run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``await fn(*args)`` in virtual time; returns once quiescent."""
        if self._token is None:
            raise RuntimeError(f"the simulation is not running ({self._error!r})")

        async def step() -> T:
            self.clock.autojump_threshold = 0
            try:
                return await fn(*args)
            finally:
                self.clock.autojump_threshold = math.inf
                await trio.testing.wait_all_tasks_blocked()

        return trio.from_thread.run(step, trio_token=self._token)

    def sleep(self, seconds: float) -> None:
        """Let ``seconds`` of virtual time pass."""
        self.run(trio.sleep, seconds)

    def close(self) -> None:
        """End the run (cancelling what ``main`` started) and its thread."""
        if self._token is not None and self._stop is not None:
            try:
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
            except trio.RunFinishedError:
                pass
        self._thread.join(60)
        if self._error is not None:
            raise self._error
