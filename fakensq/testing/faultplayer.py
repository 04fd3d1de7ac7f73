"""Playing a :class:`fakensq.testing.schedule.FaultSchedule` on a running cluster.

:class:`FaultPlayer` runs in the cluster's event loop (a task of its own): it
waits until each event's time, counted from when it started, and does it
through a :class:`fakensq.faults.Faults` (a :class:`fakensq.Cluster`'s, a lone
node's, or :mod:`fakensq.testing.proxy`'s), healing lasting faults after their
duration.  It keeps what it did, with the time and the outcome
(:attr:`FaultPlayer.met`), for a failing test's report.

What the ``"safe"`` level promises is kept here: drops, stalls and swallowed
heartbeats hit consumers' connections only, and a clean restart waits until no
producer is connected (up to ``restart_wait`` seconds, else it is skipped), so
that no publish fails because of a fault.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

import trio

from .faults import Fault, Faults, Role
from .schedule import FaultEvent, FaultSchedule

__all__ = ["FaultPlayer", "MetFault", "not_yet_met"]

log = logging.getLogger("fakensq.faults")


@dataclass(frozen=True)
class MetFault:
    """A fault as it happened: when (seconds since the player started), what,
    and its outcome (``"3 message(s) timed out"``, ``"skipped: ..."``)."""

    at: float
    event: FaultEvent
    outcome: str
    #: the player's label (which node or fixture), for reports with several
    source: str = ""
    #: the node it acted on, by name
    target: str = ""

    def describe(self) -> str:
        where = f"[{self.source}] " if self.source else ""
        what = self.event.describe()
        if self.target and self.target != self.event.target():
            what = what.replace(self.event.target(), self.target, 1)
        return f"{self.at:8.3f}s  {where}{what}: {self.outcome}"


class FaultPlayer:
    """Plays ``schedule`` on ``faults``, whose nodes are ``nsqd`` nsqds named
    ``nsqd-N`` and ``lookupd`` nsqlookupds named ``lookupd-N`` (event node
    indexes wrap around).  ``on_met`` is called with each :class:`MetFault`
    (from the player's thread); ``label`` tags them."""

    def __init__(
        self,
        schedule: FaultSchedule,
        faults: Faults,
        *,
        nsqd: int = 1,
        lookupd: int = 0,
        label: str = "",
        on_met: Callable[[MetFault], None] | None = None,
        restart_wait: float | None = None,
        nsqd_names: list[str] | None = None,
    ) -> None:
        self.schedule = schedule
        self.faults = faults
        #: the nsqds' names in ``faults`` (default ``nsqd-0``, ``nsqd-1``...)
        self.nsqd_names = nsqd_names or [f"nsqd-{i}" for i in range(max(nsqd, 1))]
        self.nsqd = len(self.nsqd_names)
        self.lookupd = lookupd
        self.label = label
        self.on_met = on_met
        #: how long a safe restart waits for producers to leave (default: a
        #: tenth of the schedule's span, at least a second)
        self.restart_wait = restart_wait
        self.met: list[MetFault] = []
        self._lock = threading.Lock()
        self._start: float | None = None
        #: nodes a fault took down, to bring back when the player stops
        self._down: set[str] = set()
        self._lasting: list[Fault] = []
        self.finished = trio.Event()

    @property
    def elapsed(self) -> float:
        """Seconds since the player started (0 before)."""
        return 0.0 if self._start is None else trio.current_time() - self._start

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Play the schedule; returns when every fault is done (lasting ones healed).
        Cancelled, it heals what it started (nodes it took down stay down: call
        :meth:`settle` to bring them back)."""
        self._start = trio.current_time()
        task_status.started()
        try:
            async with trio.open_nursery() as nursery:
                for event in self.schedule:
                    await trio.sleep_until(self._start + event.at)
                    nursery.start_soon(self._play, event)
        finally:
            for fault in self._lasting:
                fault.heal()
            self.finished.set()

    async def settle(self) -> None:
        """Heal every fault and start the nodes the faults left down."""
        for fault in self._lasting:
            fault.heal()
        for name in sorted(self._down):
            try:
                await self.faults.start(name)
            except Exception as exc:  # reported, not raised: this runs at teardown
                log.warning("could not start %s again: %s", name, exc)
            self._down.discard(name)

    def _record(self, event: FaultEvent, outcome: str, at: float | None = None) -> None:
        when = round(self.elapsed if at is None else at, 3)
        met = MetFault(when, event, outcome, self.label, self.target_of(event))
        with self._lock:
            self.met.append(met)
        if self.on_met is not None:
            self.on_met(met)
        self.faults.trace("scheduled_fault", **event.to_dict(), outcome=outcome)

    async def _play(self, event: FaultEvent) -> None:
        at = self.elapsed
        try:
            outcome = await self._do(event)
        except Exception as exc:  # a fault that fails is reported, never fatal
            log.warning("fault %s failed: %r", event.describe(), exc)
            outcome = f"failed: {exc!r}"
        if outcome:
            self._record(event, outcome, at)

    def _nsqd_name(self, event: FaultEvent) -> str:
        return self.nsqd_names[event.node % self.nsqd]

    def target_of(self, event: FaultEvent) -> str:
        """The name of the node ``event`` acts on here."""
        if event.kind == "lookupd_outage":
            return f"lookupd-{event.node % max(self.lookupd, 1)}"
        return self._nsqd_name(event)

    async def _do(self, event: FaultEvent) -> str:
        faults = self.faults
        node = self._nsqd_name(event)
        role: Role | None = None if event.everyone else "consumer"
        kind = event.kind
        if kind == "lookupd_outage":
            if self.lookupd < 1:
                return "skipped: no nsqlookupd"
            return await self._outage(event, self.target_of(event))
        if node in self._down:
            return f"skipped: {node} is down"
        if kind == "drop":
            count = await faults.drop(node=node, role=role)
            who = "connection(s)" if role is None else "consumer connection(s)"
            return f"dropped {count} {who}"
        if kind == "time_out":
            return f"{faults.time_out_in_flight(node=node)} in-flight message(s) timed out"
        if kind == "requeue_storm":
            counts = []
            for i in range(event.rounds):
                if i:
                    await trio.sleep(event.interval)
                counts.append(faults.time_out_in_flight(node=node))
            return "timed out " + "+".join(map(str, counts)) + " in-flight message(s)"
        if kind in ("restart", "kill"):
            return await self._restart(event, node, kill=kind == "kill")
        if kind == "corrupt":
            faults.corrupt_next_frame(node=node)
            return "the next frame corrupted"
        if kind == "truncate":
            faults.truncate_next_frame(node=node)
            return "the next frame truncated"
        fault = self._lasting_fault(event, node, role)
        self._lasting.append(fault)
        await trio.sleep(event.duration)
        fault.heal()
        return f"held {event.duration:g}s"

    def _lasting_fault(self, event: FaultEvent, node: str, role: Role | None) -> Fault:
        faults = self.faults
        if event.kind == "delay":
            return faults.delay(event.seconds, node=node, direction=event.direction)
        if event.kind == "stall":
            return faults.stall(node=node, direction=event.direction, role=role)
        if event.kind == "swallow_heartbeats":
            return faults.swallow_heartbeats(node=node, role=role)
        if event.kind == "partition":
            return faults.partition(node, "*")
        if event.kind == "fail_publishes":
            return faults.fail_publishes(node=node)
        raise ValueError(f"unknown fault {event.kind!r}")

    async def _outage(self, event: FaultEvent, name: str) -> str:
        if name in self._down:
            return f"skipped: {name} is down"
        self._down.add(name)
        await self.faults.stop(name)
        await trio.sleep(event.duration)
        await self.faults.start(name)
        self._down.discard(name)
        return f"down {event.duration:g}s"

    async def _restart(self, event: FaultEvent, node: str, *, kill: bool) -> str:
        waited = ""
        if not event.everyone and not kill:
            # Safe: no producer may be connected (its publish would fail).
            limit = self.restart_wait
            if limit is None:
                limit = max(1.0, self.schedule.end / 10)
            start = trio.current_time()
            with trio.move_on_after(limit) as scope:
                while self._producers(node):
                    # Closes wake it; a role learnt (a SUB behind TLS) does not.
                    with trio.move_on_after(min(0.05, limit / 20)):
                        await self.faults.wait_changed()
            if scope.cancelled_caught:
                return f"skipped: a producer stayed connected for {limit:g}s"
            if trio.current_time() - start >= 0.001:
                waited = f" (once no producer was connected, {trio.current_time() - start:.3f}s on)"
        self._down.add(node)
        try:
            await self.faults.restart(node, kill=kill)
        finally:
            self._down.discard(node)
        return (
            "killed and started again" if kill else "stopped cleanly and started again"
        ) + waited

    def _producers(self, node: str) -> bool:
        return any(s.role != "consumer" for s in self.faults.connections(node=node))

    def describe(self) -> str:
        """What it did so far, one line per fault."""
        with self._lock:
            met = sorted(self.met, key=lambda m: m.at)
        return "\n".join(m.describe() for m in met)


def not_yet_met(schedule: FaultSchedule, met: list[MetFault]) -> list[FaultEvent]:
    """The events of ``schedule`` that ``met`` does not hold (the run ended first)."""
    done = [m.event for m in met]
    left = []
    for event in schedule:
        if event in done:
            done.remove(event)
        else:
            left.append(event)
    return left
