"""Hypothesis stateful tests over a simulated cluster: trionsq consumers against
fakensq nsqds and lookupds, with publishes, time passing, dropped connections,
partitions, clean and unclean node restarts, lookupd outages, and any safe
fault of a schedule (:mod:`fakensq.testing.strategies`, played by
:class:`fakensq.testing.faultplayer.FaultPlayer`).

Built on fakensq's public property-test helpers (:mod:`fakensq.testing.atleastonce`):
:class:`~fakensq.testing.atleastonce.SimDriver` runs one long-lived ``trio.run`` on a
``MockClock`` and feeds it one step at a time, with virtual time frozen between
steps, so every step starts from the same state in every replay and failures
shrink to short step lists; :func:`~fakensq.testing.atleastonce.publish` publishes as a
correct producer does and traces what nsqd acknowledged; and
:class:`~fakensq.testing.atleastonce.AtLeastOnceChecker` checks the nodes' trace after
every step (never handed out while in flight elsewhere within its timeout, RDY
within max_in_flight) and at the end (every message finished or given up).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import trio
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import trionsq
from fakensq.testing.atleastonce import AtLeastOnceChecker, SimDriver, publish
from fakensq.testing.faultplayer import FaultPlayer
from fakensq.testing.schedule import FaultEvent, FaultSchedule
from fakensq.testing.simulation import SimCluster
from fakensq.testing.strategies import fault_events

NSQDS = 2
LOOKUPDS = 2
CONSUMERS = ("c1", "c2")
MSG_TIMEOUT = 60.0
MAX_IN_FLIGHT = 3
MAX_RDY_COUNT = 2


@dataclass
class World:
    """What the test did, to check the cluster's counts against."""

    published: dict[bytes, int] = field(default_factory=dict)  # body -> nsqd index
    held: list[int] = field(default_factory=lambda: [0] * NSQDS)  # per nsqd, expected
    fin_seen: list[int] = field(default_factory=lambda: [0] * NSQDS)


async def _call(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


class ClusterMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.world = World()
        self.counter = 0
        self.trace: list[dict[str, Any]] = []
        self.checker = AtLeastOnceChecker(
            msg_timeout=MSG_TIMEOUT, max_in_flight=dict.fromkeys(CONSUMERS, MAX_IN_FLIGHT)
        )
        self.cluster: SimCluster | None = None
        self.consumers: dict[str, trionsq.Consumer] = {}
        self.partitions: dict[tuple[str, str], Any] = {}
        self.nsqd_up = [True] * NSQDS
        self.lookupd_up = [True] * LOOKUPDS
        self.driver = SimDriver(self._start)

    # -- the cluster and the consumers, inside the trio run -------------------

    async def _start(self, nursery: trio.Nursery) -> None:
        cluster = SimCluster(
            nsqd=NSQDS,
            lookupd=LOOKUPDS,
            seed=1,
            trace=self.trace,
            nsqd_options={
                "msg_timeout": MSG_TIMEOUT,
                "max_rdy_count": MAX_RDY_COUNT,
                # Real nsqd's behaviour: a dropped consumer's messages stay in
                # flight until their timeout (what the double-delivery check needs).
                "requeue_on_disconnect": False,
            },
        )
        self.cluster = await nursery.start(self._hold, cluster)
        for name in CONSUMERS:
            consumer = trionsq.Consumer(
                "t",
                "c",
                lookupd_http_addresses=cluster.lookupd_http_addresses,
                lookupd_poll_interval=10.0,
                connector=cluster.connector_for(name),
                http_transport=cluster.http_transport_for(name),
                rng=random.Random(name),
                max_in_flight=MAX_IN_FLIGHT,
                max_attempts=6,
                default_requeue_delay=1.0,
                heartbeat_interval=10.0,
                read_timeout=25.0,
                handler=self._handler(name),
                give_up=self._give_up,
                close_timeout=0.0,
            )
            await nursery.start(self._hold, consumer)
            self.consumers[name] = consumer

    @staticmethod
    async def _hold(cm: Any, *, task_status: trio.TaskStatus[Any]) -> None:
        async with cm as value:
            task_status.started(value)
            await trio.sleep_forever()

    def _handler(self, name: str) -> Callable[[trionsq.Message], Awaitable[None]]:
        async def handle(message: trionsq.Message) -> None:
            kind = message.body[:1]
            if kind == b"r" and message.attempts == 1:
                raise RuntimeError("fails once")
            if kind == b"s":
                await trio.sleep(20)
            elif kind == b"t":
                for _ in range(3):  # 75 s of work, kept alive by TOUCH
                    await trio.sleep(25)
                    await message.touch()

        return handle

    def _give_up(self, message: trionsq.Message) -> None:
        pass  # trionsq FINs what it gives up on: the checker counts it finished

    # -- rules -----------------------------------------------------------------

    def _bodies(self, kinds: list[str]) -> list[bytes]:
        out = []
        for kind in kinds:
            self.counter += 1
            out.append(b"%s-%d" % (kind.encode(), self.counter))
        return out

    @rule(
        node=st.integers(0, NSQDS - 1),
        kinds=st.lists(st.sampled_from("frst"), min_size=1, max_size=4),
        multi=st.booleans(),
    )
    def publish(self, node: int, kinds: list[str], multi: bool) -> None:
        if not self.nsqd_up[node]:
            return
        bodies = self._bodies(kinds)
        assert self.cluster is not None
        self.driver.run(
            functools.partial(publish, self.cluster, "t", bodies, node=node, multi=multi)
        )
        for body in bodies:
            self.world.published[body] = node
        self.world.held[node] += len(bodies)

    @rule(seconds=st.sampled_from([1.0, 5.0, 30.0, 90.0]))
    def let_time_pass(self, seconds: float) -> None:
        self.driver.run(trio.sleep, seconds)

    @rule(consumer=st.sampled_from(CONSUMERS))
    def disconnect(self, consumer: str) -> None:
        assert self.cluster is not None
        self.driver.run(functools.partial(self.cluster.faults.drop, client=consumer))

    @rule(consumer=st.sampled_from(CONSUMERS), node=st.integers(0, NSQDS - 1))
    def partition(self, consumer: str, node: int) -> None:
        assert self.cluster is not None
        key = (consumer, f"nsqd-{node}")
        # (in the Trio run: the trace takes its virtual time)
        if key in self.partitions:
            self.driver.run(_call, self.partitions.pop(key).heal)
        else:
            self.partitions[key] = self.driver.run(_call, self.cluster.faults.partition, *key)

    @rule(node=st.integers(0, NSQDS - 1), kill=st.booleans())
    def stop_or_start_nsqd(self, node: int, kill: bool) -> None:
        assert self.cluster is not None
        name = f"nsqd-{node}"
        if self.nsqd_up[node]:
            self._count_finishes()
            if kill:
                self.world.held[node] = 0  # what it held in memory is gone
                self.driver.run(self.cluster.faults.kill, name)
            else:
                self.driver.run(self.cluster.faults.stop, name)
            self.nsqd_up[node] = False
            self.world.fin_seen[node] = 0
        else:
            self.driver.run(self.cluster.faults.start, name)
            self.nsqd_up[node] = True

    @rule(
        event=fault_events(
            nsqd=NSQDS,
            lookupd=LOOKUPDS,
            kinds=["drop", "delay", "stall", "swallow_heartbeats", "time_out", "requeue_storm"],
            horizon=0.0,
            step=5.0,
            max_duration=60.0,
        )
    )
    def scheduled_fault(self, event: FaultEvent) -> None:
        """One fault as a schedule plays it (lasting ones last their duration)."""
        assert self.cluster is not None
        if not self.nsqd_up[event.node]:
            return
        player = FaultPlayer(
            FaultSchedule((replace(event, at=0.0),)),
            self.cluster.faults,
            nsqd=NSQDS,
            lookupd=LOOKUPDS,
        )
        self.driver.run(player.run)
        assert len(player.met) == 1 and not player.met[0].outcome.startswith("failed")

    @precondition(lambda self: sum(self.lookupd_up) > 0)
    @rule(lookupd=st.integers(0, LOOKUPDS - 1))
    def lookupd_outage(self, lookupd: int) -> None:
        assert self.cluster is not None
        name = f"lookupd-{lookupd}"
        if self.lookupd_up[lookupd]:
            self.driver.run(self.cluster.faults.stop, name)
        else:
            self.driver.run(self.cluster.faults.start, name)
        self.lookupd_up[lookupd] = not self.lookupd_up[lookupd]

    # -- invariants ------------------------------------------------------------

    @invariant()
    def at_least_once_so_far(self) -> None:
        self.checker.feed(self.trace)
        self.checker.check()

    @invariant()
    def rdy_within_limits(self) -> None:
        for name, consumer in self.consumers.items():
            conns = consumer.stats.connections
            total = sum(c.rdy for c in conns.values())
            assert total <= MAX_IN_FLIGHT, (name, conns)
            for conn in conns.values():
                assert conn.rdy <= min(conn.max_rdy_count, MAX_RDY_COUNT), (name, conn)

    def _count_finishes(self) -> None:
        assert self.cluster is not None
        for i, up in enumerate(self.nsqd_up):
            if not up:
                continue
            topic = self.cluster.nsqd(i).get_existing_topic("t")
            channel = topic.channels.get("c") if topic is not None else None
            done = channel.finished_count if channel is not None else 0
            self.world.held[i] -= done - self.world.fin_seen[i]
            self.world.fin_seen[i] = done

    @invariant()
    def stats_agree_with_the_test(self) -> None:
        if self.cluster is None:
            return
        self._count_finishes()
        for i, up in enumerate(self.nsqd_up):
            if not up:
                continue
            stats = self.cluster.nsqd(i).stats(topic="t")
            held = 0
            for topic in stats["topics"] or []:
                held += topic["depth"]
                for ch in topic["channels"]:
                    held += ch["depth"] + ch["in_flight_count"] + ch["deferred_count"]
            assert held == self.world.held[i], (i, stats, self.world.held)

    def teardown(self) -> None:
        try:
            if self.cluster is not None:
                # Heal everything, bring every node back: then nothing may vanish.
                for fault in list(self.partitions.values()):
                    self.driver.run(_call, fault.heal)
                for i, up in enumerate(self.lookupd_up):
                    if not up:
                        self.driver.run(self.cluster.faults.start, f"lookupd-{i}")
                for i, up in enumerate(self.nsqd_up):
                    if not up:
                        self.driver.run(self.cluster.faults.start, f"nsqd-{i}")
                self.driver.run(trio.sleep, 900)
                self.checker.feed(self.trace)
                self.checker.check()
                missing = self.checker.unfinished()  # (a kill may lose what it held)
                assert not missing, f"never finished: {missing}"
                assert set(self.checker.published) == {b.decode() for b in self.world.published}
        finally:
            self.driver.close()


ClusterMachine.TestCase.settings = settings(
    max_examples=10,
    stateful_step_count=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCluster = ClusterMachine.TestCase
