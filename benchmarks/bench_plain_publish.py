"""Publishing as plain code publishes (issue 29): one call at a time, from 1 thread or many.

Against one real nsqd v1.3.0 (``--output-buffer-timeout=10ms``; found by
tests/reference.py: NSQ_BIN or shared/reference/nsq-bin; without it the script
says so and stops), ``--publishes`` bodies of 100 bytes (20,000) a case, every
case in this process, one after the other, rounds interleaving them (``--rounds``,
3: the best round of each case is shown, as the issue's table shows the better of two):

- raw blocking socket, 1 thread: PUB, wait for OK, next (the physical baseline);
- HTTP: POST /pub on one keep-alive ``http.client`` connection, 1 thread;
- ``trionsq.blocking.Producer``, ``publish()`` from 1 thread;
- raw blocking sockets, one per thread, 8 threads; the blocking Producer shared
  by 8 threads; the same with 32 threads;
- ``trionsq.aio.Producer``: 256 tasks awaiting in turn; ``asyncio.gather``
  over chunks of 1,000 publishes (in guest mode, and with ``guest=False``); a
  ``TaskGroup`` over chunks of 1,000 publishes, a task each;
- the Trio ``trionsq.Producer`` with 256 tasks (the aio cases' baseline);
- asyncio's other usual shapes beside their Trio twins: a ``TaskGroup`` of 32
  tasks each publishing in turn against a nursery of 32 tasks; one task
  publishing in a loop against one Trio task.

Each row gives this process's CPU time a message (the client's cost: nsqd's
is its own) and, besides the best rates' ratio, the ratio in each round (the
case and its baseline measured minutes apart at most).

Latency: the p50 and p99 of one publish (``--latency-publishes``, 5,000, one at a
time, 1 thread or task) on the raw socket, the blocking Producer and the aio one,
in blocks of 250 taking turns.
Every case's messages are counted by nsqd's /stats (a topic each).

    python benchmarks/bench_plain_publish.py [--publishes N] [--rounds R] [--cases aio,Trio]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trionsq
from tests import reference
from trionsq import aio, blocking

BODY = b"x" * 100
SIZE = struct.Struct(">l")
OK_FRAME = SIZE.pack(6) + SIZE.pack(0) + b"OK"


def _raw_socket(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    body = json.dumps({"feature_negotiation": True}).encode()
    sock.sendall(b"  V2IDENTIFY\n" + SIZE.pack(len(body)) + body)
    (size,) = SIZE.unpack(_exactly(sock, 4))
    _exactly(sock, size)
    return sock


def _exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError("nsqd closed the connection")
        data += chunk
    return data


def _pub(topic: str) -> bytes:
    return b"PUB " + topic.encode() + b"\n" + SIZE.pack(len(BODY)) + BODY


def _raw_loop(sock: socket.socket, command: bytes, count: int) -> None:
    for _ in range(count):
        sock.sendall(command)
        if sock.recv(64) != OK_FRAME:
            raise AssertionError("not OK")


class Clock:
    """A case's timed part: its wall time, and the CPU time of this process
    (the client's work, Trio thread included; nsqd's is its own) kept in
    :attr:`last_cpu` for the table's CPU column."""

    last_cpu = 0.0

    def __init__(self) -> None:
        self.wall = time.perf_counter()
        self.cpu = time.process_time()

    def stop(self) -> float:
        Clock.last_cpu = time.process_time() - self.cpu
        return time.perf_counter() - self.wall


def _threads(count: int, work: Callable[[], None]) -> float:
    threads = [threading.Thread(target=work) for _ in range(count)]
    start = Clock()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return start.stop()


# --- the cases: (address, http address, topic, count) -> seconds -------------


def raw_threads(threads: int) -> Callable[[str, str, str, int], float]:
    def case(address: str, http_address: str, topic: str, count: int) -> float:
        socks = [_raw_socket(address) for _ in range(threads)]
        command = _pub(topic)
        share = iter(socks)
        lock = threading.Lock()

        def work() -> None:
            with lock:
                sock = next(share)
            _raw_loop(sock, command, count // threads)

        took = _threads(threads, work)
        for sock in socks:
            sock.close()
        return took

    return case


def http_keep_alive(address: str, http_address: str, topic: str, count: int) -> float:
    host, port = http_address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port))
    path = f"/pub?topic={topic}"
    start = Clock()
    for _ in range(count):
        conn.request("POST", path, body=BODY)
        response = conn.getresponse()
        if response.read() != b"OK":
            raise AssertionError("not OK")
    took = start.stop()
    conn.close()
    return took


def blocking_threads(threads: int) -> Callable[[str, str, str, int], float]:
    def case(address: str, http_address: str, topic: str, count: int) -> float:
        with blocking.Producer([address]) as producer:
            # Connected before the clock starts, as the raw sockets are: each
            # thread publishes once, all at once (a connection each, as an
            # app's request threads have after their first requests).
            start = threading.Barrier(threads)

            def warm() -> None:
                start.wait()
                producer.publish(topic, BODY)

            _threads(threads, warm)
            share = count // threads

            def work() -> None:
                for _ in range(share):
                    producer.publish(topic, BODY)

            if threads == 1:
                start = Clock()
                work()
                return start.stop()
            return _threads(threads, work)

    return case


def aio_tasks(tasks: int, group: bool = False) -> Callable[[str, str, str, int], float]:
    """``tasks`` asyncio tasks, each awaiting its publishes in turn (made by
    ``gather`` over coroutines, or by a ``TaskGroup``)."""

    def case(address: str, http_address: str, topic: str, count: int) -> float:
        async def main() -> float:
            async with aio.Producer([address]) as producer:
                await producer.publish(topic, BODY)
                share = count // tasks

                async def work() -> None:
                    for _ in range(share):
                        await producer.publish(topic, BODY)

                if tasks == 1:
                    start = Clock()
                    await work()
                    return start.stop()
                start = Clock()
                if group:
                    async with asyncio.TaskGroup() as task_group:
                        for _ in range(tasks):
                            task_group.create_task(work())
                else:
                    await asyncio.gather(*(work() for _ in range(tasks)))
                return start.stop()

        return asyncio.run(main())

    return case


def aio_gather(guest: bool = True) -> Callable[[str, str, str, int], float]:
    """``asyncio.gather`` over chunks of 1,000 publishes (their futures, no Task each)."""

    def case(address: str, http_address: str, topic: str, count: int) -> float:
        async def main() -> float:
            async with aio.Producer([address], guest=guest) as producer:
                await producer.publish(topic, BODY)
                start = Clock()
                for done in range(0, count, 1000):
                    n = min(1000, count - done)
                    await asyncio.gather(*(producer.publish(topic, BODY) for _ in range(n)))
                return start.stop()

        return asyncio.run(main())

    return case


def aio_task_per_publish(address: str, http_address: str, topic: str, count: int) -> float:
    """A ``TaskGroup`` over chunks of 1,000 publishes, a task each (``create_task``)."""

    async def main() -> float:
        async with aio.Producer([address]) as producer:
            await producer.publish(topic, BODY)
            start = Clock()
            for done in range(0, count, 1000):
                n = min(1000, count - done)
                async with asyncio.TaskGroup() as group:
                    for _ in range(n):
                        group.create_task(producer.publish(topic, BODY))
            return start.stop()

    return asyncio.run(main())


def trio_tasks(tasks: int) -> Callable[[str, str, str, int], float]:
    """The Trio Producer: ``tasks`` tasks of a nursery, each publishing in turn."""

    def case(address: str, http_address: str, topic: str, count: int) -> float:
        async def main() -> float:
            async with trionsq.Producer([address]) as producer:
                await producer.publish(topic, BODY)
                share = count // tasks

                async def work() -> None:
                    for _ in range(share):
                        await producer.publish(topic, BODY)

                start = Clock()
                if tasks == 1:
                    await work()
                    return start.stop()
                async with trio.open_nursery() as nursery:
                    for _ in range(tasks):
                        nursery.start_soon(work)
                return start.stop()

        return trio.run(main)

    return case


RAW1 = "raw socket, 1 thread"
HTTP = "HTTP keep-alive, 1 thread"
BLOCKING1 = "blocking publish(), 1 thread"
RAW8 = "raw sockets, 8 threads"
BLOCKING8 = "blocking publish(), 8 threads"
RAW32 = "raw sockets, 32 threads"
BLOCKING32 = "blocking publish(), 32 threads"
AIO256 = "aio, 256 tasks"
GATHER = "aio, gather of 1,000"
GATHER_THREAD = "aio guest=False, gather of 1,000"
TASK_EACH = "aio, TaskGroup, a task a publish"
TRIO = "Trio Producer, 256 tasks"
GROUP32 = "aio, TaskGroup of 32 tasks"
TRIO32 = "Trio Producer, nursery of 32 tasks"
AIO1 = "aio, 1 task in a loop"
TRIO1 = "Trio Producer, 1 task in a loop"

CASES: dict[str, Callable[[str, str, str, int], float]] = {
    RAW1: raw_threads(1),
    HTTP: http_keep_alive,
    BLOCKING1: blocking_threads(1),
    RAW8: raw_threads(8),
    BLOCKING8: blocking_threads(8),
    RAW32: raw_threads(32),
    BLOCKING32: blocking_threads(32),
    AIO256: aio_tasks(256),
    GATHER: aio_gather(),
    GATHER_THREAD: aio_gather(guest=False),
    TASK_EACH: aio_task_per_publish,
    TRIO: trio_tasks(256),
    GROUP32: aio_tasks(32, group=True),
    TRIO32: trio_tasks(32),
    AIO1: aio_tasks(1),
    TRIO1: trio_tasks(1),
}
#: publishes a case makes before its clock starts, where not 1 (0 for raw and HTTP)
WARM_UPS = {BLOCKING8: 8, BLOCKING32: 32}
#: (case, its baseline, the issue's target ratio or None)
ROWS = [
    (RAW1, None, None),
    (HTTP, RAW1, None),
    (BLOCKING1, RAW1, 0.7),
    (BLOCKING1, HTTP, 2.0),
    (RAW8, None, None),
    (BLOCKING8, RAW8, 0.9),
    (RAW32, None, None),
    (BLOCKING32, RAW32, None),
    (TRIO, None, None),
    (AIO256, TRIO, None),
    (GATHER, TRIO, 0.8),
    (GATHER_THREAD, TRIO, None),
    (TASK_EACH, TRIO, None),
    (TRIO32, None, None),
    (GROUP32, TRIO32, None),
    (TRIO1, None, None),
    (AIO1, TRIO1, None),
]


# --- latency -------------------------------------------------------------------


def _percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return (
        ordered[len(ordered) // 2] * 1e6,
        ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e6,
    )


def latencies(address: str, topic: str, count: int) -> dict[str, list[float]]:
    """One publish at a time on the raw socket, the blocking Producer and the
    aio one, in blocks of 250 taking turns (a burst of load on the shared
    machine falls on all three alike)."""
    samples: dict[str, list[float]] = {
        "raw socket": [],
        "blocking publish()": [],
        "aio publish()": [],
    }
    sock = _raw_socket(address)
    command = _pub(topic)
    loop = asyncio.new_event_loop()
    aio_producer = aio.Producer([address])
    try:
        with blocking.Producer([address]) as producer:
            producer.publish(topic, BODY)
            loop.run_until_complete(aio_producer.__aenter__())
            loop.run_until_complete(aio_producer.publish(topic, BODY))

            async def aio_block(n: int) -> None:
                for _ in range(n):
                    start = time.perf_counter()
                    await aio_producer.publish(topic, BODY)
                    samples["aio publish()"].append(time.perf_counter() - start)

            for done in range(0, count, 250):
                n = min(250, count - done)
                for _ in range(n):
                    start = time.perf_counter()
                    _raw_loop(sock, command, 1)
                    samples["raw socket"].append(time.perf_counter() - start)
                for _ in range(n):
                    start = time.perf_counter()
                    producer.publish(topic, BODY)
                    samples["blocking publish()"].append(time.perf_counter() - start)
                loop.run_until_complete(aio_block(n))
    finally:
        loop.run_until_complete(aio_producer.aclose())
        loop.close()
        sock.close()
    return samples


# --- running -------------------------------------------------------------------


class Topics:
    """A topic per run, its messages counted by nsqd."""

    def __init__(self, http_address: str) -> None:
        self.http = httpx.Client(base_url=f"http://{http_address}", timeout=30)
        self.serial = 0

    def new(self) -> str:
        self.serial += 1
        return f"plain{self.serial}"

    def count(self, topic: str) -> int:
        stats = self.http.get("/stats", params={"format": "json", "topic": topic}).json()
        for entry in stats.get("topics") or []:
            if entry["topic_name"] == topic:
                return int(entry["message_count"])
        return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--publishes", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency-publishes", type=int, default=5_000)
    parser.add_argument(
        "--cases",
        default="",
        help="only the cases whose name contains one of these comma-separated words "
        "(e.g. 'aio,Trio'); the rows whose case or baseline is left out are not shown",
    )
    args = parser.parse_args()
    words = [word.strip() for word in args.cases.split(",") if word.strip()]
    cases = {
        name: case
        for name, case in CASES.items()
        if not words or any(word in name for word in words)
    }
    if reference.binary("nsqd") is None:
        print(f"no real nsqd: {reference.skip_reason()}")
        return 1
    count = args.publishes - args.publishes % (32 * 256)  # whole shares for every case
    count = max(count, 32 * 256)
    daemon = reference.RealDaemon(
        "nsqd", ["--output-buffer-timeout=10ms", "--mem-queue-size=10000000"]
    )
    daemon.start()
    try:
        topics = Topics(daemon.http_address)
        load = os.getloadavg()
        rates: dict[str, list[float]] = {name: [] for name in cases}
        cpu: dict[str, list[float]] = {name: [] for name in cases}
        names = list(cases)
        for round_ in range(args.rounds):
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            for name in order:
                topic = topics.new()
                before = 0
                took = cases[name](daemon.tcp_address, daemon.http_address, topic, count)
                counted = topics.count(topic) - before
                warm = WARM_UPS.get(name, 0 if name.startswith(("raw", "HTTP")) else 1)
                if counted != count + warm:
                    raise AssertionError(f"{name}: nsqd counted {counted}, expected {count + warm}")
                rates[name].append(count / took)
                cpu[name].append(Clock.last_cpu / count * 1e6)
            print(f"  round {round_ + 1}/{args.rounds} done", file=sys.stderr)
        measured = (
            {
                name: _percentiles(values)
                for name, values in latencies(
                    daemon.tcp_address, topics.new(), args.latency_publishes
                ).items()
            }
            if args.latency_publishes > 0
            else {}
        )
        load_after = os.getloadavg()
    finally:
        daemon.close()
    best = {name: max(values) for name, values in rates.items()}
    least_cpu = {name: min(values) for name, values in cpu.items()}
    print(
        f"{count:,} publishes of 100 bytes a case, real nsqd v1.3.0 "
        f"(--output-buffer-timeout=10ms), the better of {args.rounds} rounds; "
        f"load average {load[0]:.1f} at the start, {load_after[0]:.1f} at the end"
    )
    print(
        "  (cpu: this process's CPU time a message, the least of the rounds; "
        "per round: the case's rate over its baseline's in that round)"
    )
    print(
        f"  {'pattern':<34} {'msg/s':>9} {'cpu us':>6}  {'against':<34} {'ratio':>6}  "
        "target      per round"
    )
    for name, baseline, target in ROWS:
        if name not in best or (baseline is not None and baseline not in best):
            continue
        used = f"{least_cpu[name]:>6.2f}"
        if baseline is None:
            print(f"  {name:<34} {best[name]:>9,.0f} {used}  {'(baseline)':<34}")
            continue
        ratio = best[name] / best[baseline]
        mark = (
            ""
            if target is None
            else (f">={target:g} ok" if ratio >= target else f">={target:g} MISSED")
        )
        rounds = " ".join(f"{a / b:.2f}" for a, b in zip(rates[name], rates[baseline], strict=True))
        print(
            f"  {name:<34} {best[name]:>9,.0f} {used}  {baseline:<34} {ratio:>6.2f}  "
            f"{mark:<11} {rounds}"
        )
    if not measured:
        return 0
    print(
        f"latency of one publish, {args.latency_publishes:,} one at a time, "
        "in blocks of 250 taking turns (microseconds):"
    )
    raw_p99 = measured["raw socket"][1]
    for name, (p50, p99) in measured.items():
        times = p99 / raw_p99
        print(f"  {name:<22} p50 {p50:>7.1f}  p99 {p99:>7.1f}  ({times:.2f} x the raw p99)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
