"""Hypothesis stateful tests over a simulated cluster: trionsq consumers against
fakensq nsqds and lookupds, with publishes, time passing, dropped connections,
partitions, clean and unclean node restarts and lookupd outages.

How Trio is driven from hypothesis's synchronous state machine: each example
gets a long-lived ``trio.run`` on a thread of its own (:class:`TrioDriver`), on a
``MockClock`` whose autojump is switched on only while a step runs.  A rule sends
its step into that run with ``trio.from_thread.run`` and blocks until it is done;
each step ends with ``wait_all_tasks_blocked`` so the run is quiescent (and
virtual time frozen) while hypothesis decides the next step.  So every step
starts from the same state in every replay: the run is deterministic, failures
shrink to short step lists and replay from hypothesis's seed.  (A guest run would
also work but needs a host loop; a ``trio.run`` per step would lose the cluster.)
"""

from __future__ import annotations

import functools
import math
import random
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import trio
import trio.testing
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import trionsq
from fakensq.testing.simulation import SimCluster

T = TypeVar("T")

NSQDS = 2
LOOKUPDS = 2
CONSUMERS = ("c1", "c2")
MSG_TIMEOUT = 60.0
MAX_IN_FLIGHT = 3
MAX_RDY_COUNT = 2


class TrioDriver:
    """A ``trio.run`` on its own thread, fed one step at a time."""

    def __init__(self, main: Callable[[trio.Nursery], Awaitable[None]]) -> None:
        self.clock = trio.testing.MockClock(autojump_threshold=math.inf)
        self._main = main
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(30)
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
            await self._main(nursery)
            self._token = trio.lowlevel.current_trio_token()
            self._ready.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    def run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run one step in virtual time; returns once the cluster is quiescent."""
        assert self._token is not None

        async def step() -> T:
            self.clock.autojump_threshold = 0
            try:
                return await fn(*args)
            finally:
                self.clock.autojump_threshold = math.inf
                await trio.testing.wait_all_tasks_blocked()

        return trio.from_thread.run(step, trio_token=self._token)

    def close(self) -> None:
        if self._token is not None and self._stop is not None:
            try:
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
            except trio.RunFinishedError:
                pass
        self._thread.join(30)
        if self._error is not None:
            raise self._error


@dataclass
class Delivery:
    consumer: str
    start: float
    deadline: float
    settled: bool = False


@dataclass
class World:
    """What the test did and saw, to check the cluster against."""

    published: dict[bytes, int] = field(default_factory=dict)  # body -> nsqd index
    finished: set[bytes] = field(default_factory=set)
    given_up: set[bytes] = field(default_factory=set)
    lost: set[bytes] = field(default_factory=set)  # held by a killed node
    deliveries: dict[bytes, Delivery] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    held: list[int] = field(default_factory=lambda: [0] * NSQDS)  # per nsqd, expected
    fin_seen: list[int] = field(default_factory=lambda: [0] * NSQDS)


class ClusterMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.world = World()
        self.counter = 0
        self.cluster: SimCluster | None = None
        self.consumers: dict[str, trionsq.Consumer] = {}
        self.partitions: dict[tuple[str, str], Any] = {}
        self.nsqd_up = [True] * NSQDS
        self.lookupd_up = [True] * LOOKUPDS
        self.driver = TrioDriver(self._start)

    # -- the cluster and the consumers, inside the trio run -------------------

    async def _start(self, nursery: trio.Nursery) -> None:
        cluster = SimCluster(
            nsqd=NSQDS,
            lookupd=LOOKUPDS,
            seed=1,
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
        world = self.world

        async def handle(message: trionsq.Message) -> None:
            now = trio.current_time()
            body = message.body
            previous = world.deliveries.get(body)
            if previous is not None and not previous.settled and now < previous.deadline:
                world.violations.append(
                    f"{body!r} at {name} at {now:.1f} while in flight at "
                    f"{previous.consumer} until {previous.deadline:.1f}"
                )
            delivery = world.deliveries[body] = Delivery(name, now, now + MSG_TIMEOUT)
            kind = body[:1]
            try:
                if kind == b"r" and message.attempts == 1:
                    raise RuntimeError("fails once")
                if kind == b"s":
                    await trio.sleep(20)
                elif kind == b"t":
                    for _ in range(3):  # 75 s of work, kept alive by TOUCH
                        await trio.sleep(25)
                        await message.touch()
                        delivery.deadline = trio.current_time() + MSG_TIMEOUT
            finally:
                delivery.settled = True
            world.finished.add(body)

        return handle

    def _give_up(self, message: trionsq.Message) -> None:
        self.world.given_up.add(message.body)
        self.world.finished.add(message.body)

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
        cluster = self.cluster

        async def step() -> None:
            async with trionsq.Producer(
                nsqd_tcp_addresses=[cluster.nsqd_tcp_addresses[node]],
                connector=cluster.connector_for("producer"),
            ) as producer:
                if multi:
                    await producer.multi_publish("t", bodies)
                else:
                    for body in bodies:
                        await producer.publish("t", body)

        self.driver.run(step)
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
        if key in self.partitions:
            self.partitions.pop(key).heal()
        else:
            self.partitions[key] = self.cluster.faults.partition(*key)

    @rule(node=st.integers(0, NSQDS - 1), kill=st.booleans())
    def stop_or_start_nsqd(self, node: int, kill: bool) -> None:
        assert self.cluster is not None
        name = f"nsqd-{node}"
        if self.nsqd_up[node]:
            self._count_finishes()
            # Deliveries from a stopping node may come again right after it
            # restarts (its messages are flushed, in flight or not), as with nsqd.
            for body, where in self.world.published.items():
                if where == node and body in self.world.deliveries:
                    self.world.deliveries[body].settled = True
            if kill:
                lost = {
                    b
                    for b, n in self.world.published.items()
                    if n == node and b not in self.world.finished
                }
                self.world.lost |= lost
                self.world.held[node] = 0
                self.driver.run(self.cluster.faults.kill, name)
            else:
                self.driver.run(self.cluster.faults.stop, name)
            self.nsqd_up[node] = False
            self.world.fin_seen[node] = 0
        else:
            self.driver.run(self.cluster.faults.start, name)
            self.nsqd_up[node] = True

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
    def never_in_flight_twice(self) -> None:
        assert not self.world.violations, self.world.violations

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
                    fault.heal()
                for i, up in enumerate(self.lookupd_up):
                    if not up:
                        self.driver.run(self.cluster.faults.start, f"lookupd-{i}")
                for i, up in enumerate(self.nsqd_up):
                    if not up:
                        self.driver.run(self.cluster.faults.start, f"nsqd-{i}")
                self.driver.run(trio.sleep, 900)
                world = self.world
                missing = set(world.published) - world.finished - world.lost
                assert not missing, f"never finished: {sorted(missing)}"
        finally:
            self.driver.close()


ClusterMachine.TestCase.settings = settings(
    max_examples=10,
    stateful_step_count=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCluster = ClusterMachine.TestCase
