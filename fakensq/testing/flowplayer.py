"""Playing a :class:`fakensq.testing.flow.FlowSchedule` as the messages flow.

A :class:`FlowPlayer` watches the streams of one or more
:class:`~fakensq.testing.faults.Faults` (:meth:`Faults.watch`): each message
sent to a consumer, each FIN, each message published is counted on its nsqd,
and a fault whose point is reached strikes there and then, in the stream that
met the point, before the node acts on the command (or right after the message
went out).  What only takes a moment (a drop, timing out what is in flight, a
frame spoiled) is done at once; what lasts (a stall, a delay, swallowed
heartbeats, a partition, an nsqlookupd outage) ends after its multiple of the
run's timeouts; restarts run in the player's own task.

The ``"safe"`` level's promise is kept as the time-placed player keeps it: a
clean restart waits until no producer is connected (at most ``restart_wait``
seconds, else it is skipped) unless it was placed at a publish (harsh).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from ..faultkinds import KINDS
from .faults import Fault, Faults
from .flow import FlowFault, FlowSchedule
from .stream import FaultyStream

__all__ = ["FlowPlayer", "MetFlowFault"]

log = logging.getLogger("fakensq.faults")


@dataclass
class MetFlowFault:
    """A fault as it struck: the point of the flow it met (``count``: the
    event's count then, which an MPUB may carry past the point), when (seconds
    since the player started), what it did."""

    fault: FlowFault
    label: str
    count: int
    at: float
    outcomes: list[str] = field(default_factory=list)
    nsqd: str = ""
    lookupd: str = ""

    @property
    def key(self) -> str:
        """Its name for ``--nsq-faults-only``: ``LABEL:N``."""
        return f"{self.label}:{self.fault.id}"

    def describe(self) -> str:
        what = self.fault.describe(self.nsqd, self.lookupd)
        did = "; ".join(self.outcomes) or "struck"
        return f"  #{self.fault.id} [{self.label}] {what}: {did} ({self.at:.3f}s in)"


class FlowPlayer:
    """Plays ``schedule`` on the streams of ``faults`` (one Faults, or several:
    one per proxy in front of real nsqds), whose nsqds are named
    ``nsqd_names`` (a fault's node index picks one, wrapping around) and
    nsqlookupds ``lookupd_names``.  ``msg_timeout`` and ``heartbeat``: the
    run's timeouts (seconds) that lasting faults' durations multiply."""

    def __init__(
        self,
        schedule: FlowSchedule,
        faults: Faults | Sequence[Faults],
        *,
        nsqd_names: Sequence[str],
        lookupd_names: Sequence[str] = (),
        label: str = "",
        msg_timeout: float = 60.0,
        heartbeat: float = 30.0,
        restart_wait: float | None = None,
    ) -> None:
        self.schedule = schedule
        self.all_faults = [faults] if isinstance(faults, Faults) else list(faults)
        self.nsqd_names = list(nsqd_names) or ["nsqd-0"]
        self.lookupd_names = list(lookupd_names)
        self.label = label
        self.msg_timeout = msg_timeout
        self.heartbeat = heartbeat
        #: how long a safe restart waits for producers to leave
        self.restart_wait = msg_timeout if restart_wait is None else restart_wait
        #: the faults met, in the order they struck
        self.met: list[MetFlowFault] = []
        #: events seen so far, by (nsqd, event)
        self.counts: dict[tuple[str, str], int] = {}
        # Faults waiting for their point: (nsqd, event) -> [(count, fault, round)]
        self._pending: dict[tuple[str, str], list[tuple[int, FlowFault, int]]] = {}
        for fault in schedule:
            self._wait_for(fault, fault.anchor.count, 0)
            if fault.again:
                # A held answer's second point: a publish command.
                self._wait_for(fault, fault.again, 1, event="publish")
        self._met_by_id: dict[int, MetFlowFault] = {}
        self._lasting: list[Fault] = []
        # Stalls of a publish's answer, healed at that nsqd's next publish.
        # (the fault, its report, from when a publish heals it)
        self._until_publish: dict[str, list[tuple[Fault, MetFlowFault, float]]] = {}
        self._down: set[str] = set()
        self._nursery: trio.Nursery | None = None
        self._start = 0.0

    # -- what the report needs --------------------------------------------------

    def nsqd_of(self, fault: FlowFault) -> str:
        return self.nsqd_names[fault.node % len(self.nsqd_names)]

    def lookupd_of(self, fault: FlowFault) -> str:
        if not self.lookupd_names:
            return f"lookupd-{fault.lookupd}"
        return self.lookupd_names[fault.lookupd % len(self.lookupd_names)]

    def not_met(self) -> list[tuple[FlowFault, str]]:
        """The faults whose point the flow never reached, each with why."""
        left = []
        for fault in self.schedule:
            if fault.id in self._met_by_id:
                continue
            node = self.nsqd_of(fault)
            seen = self.counts.get((node, fault.anchor.event), 0)
            what = {
                "sent": "message(s) sent to consumers",
                "fin": "FIN(s)",
                "publish": "publish command(s)",
            }.get(fault.anchor.event, "message(s) published")
            left.append((fault, f"{node} saw {seen} {what}"))
        return left

    # -- running ---------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Watch the streams until cancelled; heals what lasts when it ends."""
        self._start = trio.current_time()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for faults in self.all_faults:
                    faults.watch(self.observe)
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            for faults in self.all_faults:
                faults.unwatch(self.observe)
            for fault in self._lasting:
                fault.heal()

    async def settle(self) -> None:
        """Heal every fault and start the nodes the faults left down."""
        for fault in self._lasting:
            fault.heal()
        for name in sorted(self._down):
            try:
                await self.all_faults[0].start(name)
            except Exception as exc:  # reported, not raised: this runs at teardown
                log.warning("could not start %s again: %s", name, exc)
            self._down.discard(name)

    def observe(self, stream: FaultyStream, event: str, count: int) -> str:
        """Count ``count`` events on ``stream``'s node; strike the faults whose
        point they reach (see :meth:`Faults.observe`)."""
        key = (stream.node, event)
        if event == "published" and self._until_publish.get(stream.node):
            # A publish once half the hold has passed: the late answer has
            # done its work (a publisher that gave up on it published again).
            # Not earlier: the next publish of one that publishes several at
            # a time, each with its own patience, comes at once.
            now = trio.current_time()
            held = self._until_publish.pop(stream.node)
            for lasting, met, since in held:
                if lasting.active and now >= since:
                    lasting.heal()
                    met.outcomes.append("healed at the next publish")
            left = [h for h in held if h[0].active]
            if left:
                self._until_publish[stream.node] = left
        before = self.counts.get(key, 0)
        after = self.counts[key] = before + count
        waiting = self._pending.get(key)
        if not waiting:
            return "pass"
        due = [w for w in waiting if before < w[0] <= after]
        if not due:
            return "pass"
        self._pending[key] = [w for w in waiting if w not in due]
        verdicts = set()
        for _point, fault, round_ in sorted(due, key=lambda w: (w[0], w[1].id)):
            try:
                verdicts.add(self._strike(fault, round_, stream, after))
            except Exception as exc:  # a fault that fails is reported, never fatal
                log.warning("fault %s failed: %r", fault.describe(), exc)
                self._met(fault, after).outcomes.append(f"failed: {exc!r}")
        return next((v for v in ("withhold", "drop") if v in verdicts), "pass")

    def _wait_for(
        self, fault: FlowFault, count: int, round_: int, *, event: str | None = None
    ) -> None:
        # Only the nsqd's own events place it; the name is known once a stream
        # of that node reports, so the key is by name.
        key = (self.nsqd_of(fault), event or fault.anchor.event)
        self._pending.setdefault(key, []).append((count, fault, round_))

    def _met(self, fault: FlowFault, count: int) -> MetFlowFault:
        met = self._met_by_id.get(fault.id)
        if met is None:
            met = MetFlowFault(
                fault,
                self.label,
                count,
                round(trio.current_time() - self._start, 3),
                nsqd=self.nsqd_of(fault),
                lookupd=self.lookupd_of(fault) if fault.kind == "lookupd_outage" else "",
            )
            self._met_by_id[fault.id] = met
            self.met.append(met)
            self.all_faults[0].trace("flow_fault", fault=fault.to_dict(), label=self.label)
        return met

    def _seconds(self, fault: FlowFault) -> float:
        clock = self.heartbeat if KINDS[fault.kind].clock == "heartbeat" else self.msg_timeout
        return fault.duration * clock

    def _strike(self, fault: FlowFault, round_: int, stream: FaultyStream, count: int) -> str:
        met = self._met(fault, count)
        faults = stream.faults
        node = stream.node
        kind = fault.kind
        whose = "consumer's" if fault.anchor.on_consumer else "producer's"
        if kind == "drop":
            met.outcomes.append(f"dropped the {whose} connection ({stream.peer})")
            if fault.anchor.on_consumer and faults.serves(node):
                self._spawn(self._reclaim, met, faults, stream)
            return "withhold" if fault.withhold else "drop"
        if kind in ("time_out", "requeue_storm"):
            timed_out = faults.time_out_in_flight(node=node)
            met.outcomes.append(f"{timed_out} in-flight message(s) timed out")
            if kind == "requeue_storm" and round_ + 1 < fault.rounds:
                self._wait_for(fault, count + fault.gap, round_ + 1)
            return "pass"
        if kind in ("restart", "kill"):
            return self._restart(fault, met, faults, node)
        if kind == "lookupd_outage":
            self._spawn(self._outage, fault, met, faults)
            return "pass"
        if kind in ("corrupt", "truncate"):
            spoil = faults.corrupt_next_frame if kind == "corrupt" else faults.truncate_next_frame
            spoil(node=node, client=stream.peer)
            met.outcomes.append(f"the next frame to the {whose} connection {kind}ed")
            return "pass"
        if kind == "fail_publishes":
            faults.fail_publishes(node=node, count=fault.rounds)
            met.outcomes.append(f"the next {fault.rounds} publish(es) fail")
            return "pass"
        if fault.holds_answer and any(
            held.active and held.peer == stream.peer
            for held, _, _ in self._until_publish.get(node, [])
        ):
            return "pass"  # its two points on one publish: one answer held
        lasting = self._lasting_fault(fault, faults, node, stream)
        self._lasting.append(lasting)
        seconds = self._seconds(fault)
        self._spawn(self._heal_after, lasting, seconds)
        if fault.holds_answer:
            since = trio.current_time() + seconds / 2
            self._until_publish.setdefault(node, []).append((lasting, met, since))
            self._spawn(self._release_when_healed, lasting, stream)
            met.outcomes.append(
                f"held until a publish {seconds / 2:.3g}s on or more, {seconds:.3g}s at most"
            )
        else:
            met.outcomes.append(f"held {seconds:.3g}s")
        return "pass"

    async def _reclaim(self, met: MetFlowFault, faults: Faults, stream: FaultyStream) -> None:
        """Once nsqd has let the dropped consumer go, time out what it held at
        once, as if it came back after ``msg_timeout``: the redeliveries
        happen while the test works, at the same point of its flow (nsqd
        would wait for each message's timeout, which a short test outlives or
        not by the clock).  Not done on a real nsqd (no way in): there they
        come back at their timeout."""
        with trio.move_on_after(self.msg_timeout):
            while stream in faults.connections(node=stream.node):
                await faults.wait_changed()
        count = faults.time_out_in_flight(node=stream.node, client=stream.peer)
        met.outcomes.append(f"the {count} message(s) it held timed out at once")

    def _lasting_fault(
        self, fault: FlowFault, faults: Faults, node: str, stream: FaultyStream
    ) -> Fault:
        client = stream.peer
        if fault.kind == "delay":
            seconds = fault.seconds * self.msg_timeout
            return faults.delay(seconds, node=node, client=client, direction=fault.direction)
        if fault.kind == "stall":
            # A publish's answer held: the node goes on reading (the
            # publisher's next publish ends it), as behind a stalled network.
            return faults.stall(
                node=node, client=client, direction=fault.direction, buffered=fault.holds_answer
            )
        if fault.kind == "swallow_heartbeats":
            return faults.swallow_heartbeats(node=node, client=client)
        if fault.kind == "partition":
            # Every client: on loopback they share a host, and a client's
            # reconnection comes from a new port.
            return faults.partition(node, "*")
        raise ValueError(f"unknown fault {fault.kind!r}")

    def _spawn(self, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        if self._nursery is None:
            raise RuntimeError("the player is not running")

        async def guarded() -> None:
            # A fault that fails is logged, never fatal: the player (and the
            # fixture it runs in) keeps going.
            try:
                await fn(*args)
            except Exception as exc:
                log.warning("fault task %s failed: %r", getattr(fn, "__name__", fn), exc)

        self._nursery.start_soon(guarded)

    async def _release_when_healed(self, fault: Fault, stream: FaultyStream) -> None:
        """Send what a buffered stall held once it heals (the node may write
        nothing more on that connection to carry it)."""
        while fault.active:
            await stream.faults.wait_changed()
        await stream.release_held()

    async def _heal_after(self, fault: Fault, seconds: float) -> None:
        await trio.sleep(seconds)
        fault.heal()

    def _restart(self, fault: FlowFault, met: MetFlowFault, faults: Faults, node: str) -> str:
        kill = fault.kind == "kill"
        if node in self._down:
            met.outcomes.append(f"skipped: {node} is down")
            return "pass"
        if faults.cluster is None:
            met.outcomes.append("skipped: no node control here (a proxy)")
            return "pass"
        safe = fault.anchor.on_consumer and not kill
        if safe and self._producers(faults, node):
            # Safe: no publish may fail; wait for the producers to leave.
            self._spawn(self._restart_later, fault, met, faults, node)
            return "pass"
        self._down.add(node)
        self._spawn(self._do_restart, met, faults, node, kill, "")
        # The command that met the point never reaches the node.
        return "drop"

    async def _restart_later(
        self, fault: FlowFault, met: MetFlowFault, faults: Faults, node: str
    ) -> None:
        start = trio.current_time()
        with trio.move_on_after(self.restart_wait) as scope:
            while self._producers(faults, node):
                with trio.move_on_after(min(0.05, self.restart_wait / 20)):
                    await faults.wait_changed()
        if scope.cancelled_caught:
            met.outcomes.append(f"skipped: a producer stayed connected {self.restart_wait:g}s")
            return
        if node in self._down:
            met.outcomes.append(f"skipped: {node} is down")
            return
        self._down.add(node)
        waited = f" (once no producer was connected, {trio.current_time() - start:.3f}s on)"
        await self._do_restart(met, faults, node, fault.kind == "kill", waited)

    async def _do_restart(
        self, met: MetFlowFault, faults: Faults, node: str, kill: bool, waited: str
    ) -> None:
        try:
            await faults.restart(node, kill=kill)
        except Exception as exc:
            met.outcomes.append(f"failed: {exc!r}")
            log.warning("restarting %s failed: %r; starting it again", node, exc)
            # Once more (a real daemon whose start failed); if that fails too
            # the node stays down until settle() tries at the end.
            await faults.start(node)
        self._down.discard(node)
        met.outcomes.append(
            ("killed and started again" if kill else "stopped cleanly and started again") + waited
        )

    @staticmethod
    def _producers(faults: Faults, node: str) -> bool:
        return any(s.role != "consumer" for s in faults.connections(node=node))

    async def _outage(self, fault: FlowFault, met: MetFlowFault, faults: Faults) -> None:
        name = self.lookupd_of(fault)
        if name in self._down:
            met.outcomes.append(f"skipped: {name} is down")
            return
        seconds = self._seconds(fault)
        self._down.add(name)
        await faults.stop(name)
        await trio.sleep(seconds)
        await faults.start(name)
        self._down.discard(name)
        met.outcomes.append(f"down {seconds:.3g}s")

    def describe(self) -> str:
        """What it did so far, one line per fault met."""
        return "\n".join(m.describe() for m in self.met)
