"""How fast simulation runs: a faulty scenario in virtual time, and fixture set-up.

1. 1,000 messages through two nsqds and two consumers found via lookupd, with 50
   injected faults (drops, partitions, swallowed heartbeats, timeouts, corrupt
   frames, node restarts) and 60-second message timeouts, on a MockClock; against
   the same-run baseline of the same message flow without faults.
2. A one-nsqd SimCluster's set-up and tear-down (what the ``sim_cluster`` fixture
   costs); against a bare ``trio.run`` of an empty nursery.

Run: ``python benchmarks/bench_simulation.py``.
"""

from __future__ import annotations

import logging
import random
import statistics
import time
from typing import Any

import trio
import trio.testing

import trionsq
from fakensq.testing.simulation import SimCluster

MESSAGES = 1000
FAULTS = 50


async def scenario(faults: bool) -> dict[str, Any]:
    done: set[bytes] = set()

    async def handler(message: trionsq.Message) -> None:
        await trio.sleep(0.5)
        done.add(message.body)

    async with SimCluster(nsqd=2, lookupd=2, seed=1) as cluster:
        consumers = [
            trionsq.Consumer(
                "t",
                "c",
                lookupd_http_addresses=cluster.lookupd_http_addresses,
                lookupd_poll_interval=10.0,
                connector=cluster.connector_for(name),
                http_transport=cluster.http_transport_for(name),
                rng=random.Random(name),
                max_in_flight=50,
                max_attempts=0,
                heartbeat_interval=10.0,
                read_timeout=25.0,
                handler=handler,
                close_timeout=0.0,
            )
            for name in ("c1", "c2")
        ]
        async with consumers[0], consumers[1]:
            for node in range(2):
                async with trionsq.Producer(
                    nsqd_tcp_addresses=[cluster.nsqd_tcp_addresses[node]],
                    connector=cluster.connector_for("producer"),
                ) as producer:
                    bodies = [b"%d-%d" % (node, i) for i in range(MESSAGES // 2)]
                    for start in range(0, len(bodies), 50):
                        await producer.multi_publish("t", bodies[start : start + 50])
            if faults:
                rng = random.Random(7)
                f = cluster.faults
                for i in range(FAULTS):
                    kind = i % 6
                    client = rng.choice(["c1", "c2"])
                    target = f"nsqd-{rng.randrange(2)}"
                    if kind == 0:
                        await f.drop(client=client)
                    elif kind == 1:
                        fault = f.partition(client, target)
                        await trio.sleep(30)
                        fault.heal()
                    elif kind == 2:
                        fault = f.swallow_heartbeats(client=client)
                        await trio.sleep(30)
                        fault.heal()
                    elif kind == 3:
                        f.time_out_in_flight(node=target)
                    elif kind == 4:
                        f.corrupt_next_frame(client=client, node=target)
                    else:
                        await f.restart(target)
                    await trio.sleep(2)
            with trio.fail_after(24 * 3600):
                while len(done) < MESSAGES:  # noqa: ASYNC110 (virtual time)
                    await trio.sleep(1)
        return {"virtual_seconds": trio.current_time(), "injected": cluster.faults.injected}


def timed_run(faults: bool) -> tuple[float, dict[str, Any]]:
    start = time.perf_counter()
    clock = trio.testing.MockClock(autojump_threshold=0)
    result = trio.run(scenario, faults, clock=clock)
    return time.perf_counter() - start, result


async def one_nsqd() -> None:
    async with SimCluster(nsqd=1, lookupd=0):
        pass


async def empty() -> None:
    async with trio.open_nursery():
        pass


def fixture_times(rounds: int = 30) -> tuple[float, float]:
    sim, bare = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        trio.run(one_nsqd, clock=trio.testing.MockClock(autojump_threshold=0))
        sim.append(time.perf_counter() - start)
        start = time.perf_counter()
        trio.run(empty)
        bare.append(time.perf_counter() - start)
    return statistics.median(sim), statistics.median(bare)


def main() -> None:
    logging.disable(logging.CRITICAL)  # the faults make clients log; not timed here
    base_wall, base = timed_run(faults=False)
    wall, faulty = timed_run(faults=True)
    print(
        f"scenario: {MESSAGES} messages, {faulty['injected']} faults, 60 s timeouts: "
        f"{wall:.2f} s wall for {faulty['virtual_seconds']:.0f} s virtual "
        f"(baseline without faults: {base_wall:.2f} s wall, "
        f"{base['virtual_seconds']:.0f} s virtual)"
    )
    sim, bare = fixture_times()
    print(
        f"one-nsqd SimCluster set-up + tear-down: {sim * 1000:.2f} ms "
        f"(bare trio.run of an empty nursery: {bare * 1000:.2f} ms)"
    )


if __name__ == "__main__":
    main()
