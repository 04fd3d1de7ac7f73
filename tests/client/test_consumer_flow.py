"""Consumer flow control across connections, and backoff timelines (virtual time)."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

import trionsq

from ..support.waiting import wait_until
from .minisrv import Cluster, MiniNSQD
from .minisrv import consumer as node_consumer

NO_JITTER = trionsq.BackoffPolicy(base=1.0, max=8.0, multiplier=2.0, jitter=0.0)


def cluster_consumer(cluster: Cluster, **options: Any) -> trionsq.Consumer:
    return node_consumer(cluster, nsqd_tcp_addresses=sorted(cluster.nodes), **options)


async def test_max_in_flight_is_spread_and_never_exceeded(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    cluster = Cluster(nursery)
    nodes = [cluster.add(f"n{i}:4150") for i in range(3)]
    for i, node in enumerate(nodes):
        node.put(*[b"%d-%d" % (i, j) for j in range(30)])
    in_flight = 0
    peak = 0

    async def handler(message: trionsq.Message) -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await trio.sleep(0.5)
        in_flight -= 1

    async with cluster_consumer(cluster, handler=handler, max_in_flight=7) as c:
        await wait_until(lambda: c.stats.finished == 90, limit=300)
        rdys = {address: s.rdy for address, s in c.stats.connections.items()}
    assert peak == 7
    assert sorted(rdys.values()) == [2, 2, 3]
    for node in nodes:
        # Server side: no connection was ever asked for more than its share + 1.
        assert max(value for _, _, value in node.rdy_history) <= 3


async def test_rdy_rotates_when_fewer_max_in_flight_than_connections(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    cluster = Cluster(nursery)
    nodes = [cluster.add(f"n{i}:4150") for i in range(4)]
    for i, node in enumerate(nodes):
        node.put(*[b"%d-%d" % (i, j) for j in range(3)])

    async with cluster_consumer(
        cluster, handler=lambda m: None, max_in_flight=1, low_rdy_idle_timeout=2.0
    ) as c:
        await wait_until(lambda: c.stats.finished == 12, limit=600)
    # Never more than one RDY out at a time, across all nsqds.
    current: dict[str, int] = {}
    for address, value in cluster.rdy_log:
        current[address] = value
        assert sum(current.values()) <= 1
    assert all(not node.queue for node in nodes)  # every nsqd was drained


async def test_backoff_timeline(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    cluster = Cluster(nursery)
    a = cluster.add("a:4150")
    b = cluster.add("b:4150")

    async def handler(message: trionsq.Message) -> None:
        if message.body == b"fail":
            raise RuntimeError("downstream is down")

    async with cluster_consumer(cluster, handler=handler, max_in_flight=4, backoff=NO_JITTER) as c:
        a.put(b"warm-a")
        b.put(b"warm-b")
        await wait_until(lambda: c.stats.finished == 2 and c.stats.rdy == 4)
        a.put(b"fail")
        await wait_until(lambda: c.stats.requeued == 1)
        t0 = trio.current_time()
        assert c.stats.backoff_state == "paused"
        await wait_until(lambda: c.stats.rdy == 0)
        assert [v for _, _, v in a.rdy_history][-1] == 0
        assert [v for _, _, v in b.rdy_history][-1] == 0
        # Paused for 1s, then exactly one connection gets RDY 1 to test.
        await wait_until(lambda: c.stats.backoff_state == "testing")
        assert trio.current_time() - t0 == pytest.approx(1.0, abs=0.002)
        await wait_until(lambda: c.stats.rdy == 1)
        tester = next(s.address for s in c.stats.connections.values() if s.rdy == 1)
        cluster.nodes[tester].put(b"ok")
        await wait_until(lambda: c.stats.finished == 3)
        await wait_until(lambda: c.stats.backoff_state == "normal" and c.stats.rdy == 4)
    assert b.conns  # both nsqds were used


async def test_results_during_a_pause_are_ignored(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    node = MiniNSQD(nursery)
    node.put(b"1", b"2", b"3")
    release = trio.Event()

    async def handler(message: trionsq.Message) -> None:
        await release.wait()
        raise RuntimeError

    async with node_consumer(node, handler=handler, max_in_flight=3, backoff=NO_JITTER) as c:
        await wait_until(lambda: c.stats.received == 3)
        release.set()
        await wait_until(lambda: c.stats.requeued == 3)
        # Three failures, but they all fell in one window: level 1.
        assert c.stats.backoff_level == 1
        assert c.stats.backoff_state == "paused"


async def test_disabled_backoff_keeps_rdy(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    node = MiniNSQD(nursery)
    node.put(b"1", b"2")

    def handler(message: trionsq.Message) -> None:
        raise RuntimeError

    async with node_consumer(node, handler=handler, max_in_flight=2, backoff=False) as c:
        await wait_until(lambda: c.stats.requeued == 2)
        assert c.stats.backoff_state == "normal"
        assert 0 not in [v for _, _, v in node.rdy_history]


async def test_set_max_in_flight_at_run_time(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    node = MiniNSQD(nursery)
    async with node_consumer(node, max_in_flight=5) as c:
        await c.wait_connected()
        node.put(b"x")
        message = await c.__anext__()
        await message.finish()
        await wait_until(lambda: c.stats.rdy == 5 and node.rdy_history[-1][2] == 5)
        await c.set_max_in_flight(0)
        assert c.stats.rdy == 0
        await wait_until(lambda: node.rdy_history[-1][2] == 0)
        await c.set_max_in_flight(2)
        assert c.stats.rdy == 2
        await wait_until(lambda: node.rdy_history[-1][2] == 2)
    assert [v for _, _, v in node.rdy_history] == [1, 5, 0, 2]


async def test_handler_pool_is_bounded_by_max_in_flight(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    """Handlers run in a pool of at most max_in_flight workers, which shrinks
    when max_in_flight is lowered at run time."""
    node = MiniNSQD(nursery)
    node.put(*[b"%d" % i for i in range(60)])
    running = 0
    peak = 0
    peak_workers = 0

    async def handler(message: trionsq.Message) -> None:
        nonlocal running, peak, peak_workers
        running += 1
        peak = max(peak, running)
        peak_workers = max(peak_workers, consumer._workers)
        await trio.sleep(0.5)
        running -= 1

    async with node_consumer(node, handler=handler, max_in_flight=6) as consumer:
        await wait_until(lambda: consumer.stats.finished >= 24, limit=300)
        assert (peak, peak_workers) == (6, 6)
        await consumer.set_max_in_flight(2)
        await wait_until(lambda: consumer._workers <= 2, limit=300)
        peak = peak_workers = 0
        await wait_until(lambda: consumer.stats.finished == 60, limit=300)
    assert 0 < peak <= 2 and 0 < peak_workers <= 2


async def test_quick_handlers_need_few_workers(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    """A handler that never waits drains what arrives in one worker: the pool
    does not grow to max_in_flight (nor take a task switch per message)."""
    node = MiniNSQD(nursery)
    node.put(*[b"%d" % i for i in range(500)])
    workers = 0

    def handler(message: trionsq.Message) -> None:
        nonlocal workers
        workers = max(workers, consumer._workers)

    async with node_consumer(node, handler=handler, max_in_flight=100) as consumer:
        await wait_until(lambda: consumer.stats.finished == 500, limit=300)
    assert workers <= 3
