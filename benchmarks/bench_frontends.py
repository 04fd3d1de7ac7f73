"""The blocking and asyncio front ends against the async clients, on the real nsqd.

Every case runs against one real nsqd v1.3.0 (found by tests/reference.py: NSQ_BIN
or shared/reference/nsq-bin; without it the script says so and stops), with
100-byte bodies, on a topic of its own.  Rounds interleave the cases (their order
rotates), so a burst of load on the shared machine hurts them alike; each ratio is
the median over rounds of the case's rate over its baseline's in the same round.
Rates are messages per second of the timed part (after the client is connected;
a first publish or subscription warms it up), per wall-clock second (the
targets: speed) and per CPU second of this process, all its threads counted (how
much a message costs; steadier on a shared machine, and the harder figure for a
front end, whose loop thread's work counts too).  Every case is checked
through nsqd's /stats: the topic received every message published, the channel
ends empty with nothing in flight.

Publish (``--publishes`` messages, 200,000 by default; the four cases with 1
or 8 publishes in flight, a round trip each, ``--round-trip-publishes``,
20,000): the baseline is the async Producer with 256
concurrent publishing tasks (pipelined).  The blocking Producer from one thread
keeps its window full with ``publish_async`` futures (a blocking ``publish`` per
message is a round trip each: shown for reference, against the async Producer
publishing one at a time); from 8 threads, each thread does the same; 8 threads
calling the blocking ``publish`` (8 in flight) are shown too, against the async
Producer with 8 tasks.  The asyncio Producer runs 256 publishing tasks, on
the asyncio loop itself (its default, :mod:`trionsq.aio.direct`) and with
``guest=False`` (a Trio thread per client; docs/frontends.md compares them).
Two reference cases run the async clients unchanged in Trio's guest mode on an
asyncio loop (what an asyncio front end built on guest mode would cost at best,
before any hand-over of its own).  A reference case publishes nothing: 8
threads handing requests one at a time
to one thread through a lock each, without nsqd or Trio (the thread switches
of a blocking call per message, alone: their ceiling on this machine).

Consume (``--messages`` messages pre-filled, the channel full before the clock
starts): the baseline is the async Consumer with ``async for`` (max_in_flight
2500, output_buffer_timeout 25 ms: nsqd's default of 250 ms paces a drain in
steps of 250 ms), FIN each; then the blocking Consumer
(``for``, and a handler on 4 threads) and the asyncio one (``async for``, and a
handler; and ``async for`` with ``guest=False``).

    python benchmarks/bench_frontends.py [--publishes N] [--round-trip-publishes N]
        [--messages N] [--rounds R] [--only publish|consume] [--cases WORD,WORD...]

The defaults (5 rounds; 200,000 publishes, 20,000 for the round-trip cases;
200,000 messages) are what the figures in docs/frontends.md rely on: shorter
rounds let one slow round decide a median.  The default run takes about 3
minutes (3 min 1 s on the 2-core machine shared with other engineers' work).

``--cases`` runs only the cases whose names contain one of the words (and
their baselines), e.g. ``--cases blocking`` for the blocking front end alone.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import AsyncIterable, Awaitable, Callable
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import outcome
import trio
import trio.lowlevel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trionsq
from tests import reference
from trionsq import aio, blocking

BODY = b"x" * 100
IN_FLIGHT = 2500
#: nsqd's smallest output buffer timeout (its default, 250 ms, paces a drain in
#: steps of 250 ms whatever the client does); every consumer uses it
OUTPUT_BUFFER_TIMEOUT = 0.025
PIPELINE = 256
THREADS = 8
#: the reference case that publishes nothing (see handoff_only)
HANDOFF = "8 threads, lock hand-offs only, no I/O"
#: the reference cases of Trio's guest mode (see in_guest_mode)
GUEST_PUBLISH = "async Producer in guest mode, 256 tasks"
GUEST_CONSUME = "async Consumer in guest mode, async for"
#: the asyncio front end with guest=False (a Trio thread per client), for comparison
AIO_THREAD_PUBLISH = "asyncio Producer, guest=False, 256 tasks"
AIO_THREAD_CONSUME = "asyncio Consumer, guest=False, async for"
UNCHECKED = {HANDOFF}
#: the publish cases with 1 or 8 publishes in flight: a round trip each, 10 to
#: 50 times slower than a pipeline, so they publish --round-trip-publishes (at
#: 200,000 these four alone took over a minute and a half a round)
ROUND_TRIP = {
    "async Producer, 8 tasks",
    "async Producer, 1 task",
    "blocking, 8 threads, publish",
    "blocking, 1 thread, publish",
}


class Took(NamedTuple):
    """How long the timed part took: wall-clock seconds, and CPU seconds of this
    process (every thread: the front ends' loop threads count)."""

    wall: float
    cpu: float


class Clock:
    def __init__(self) -> None:
        self.wall = time.perf_counter()
        self.cpu = time.process_time()

    def took(self) -> Took:
        return Took(time.perf_counter() - self.wall, time.process_time() - self.cpu)


#: (address, topic, count) -> how long the timed part took
Case = Callable[[str, str, int], Took]


# --- publishing ---


async def _trio_tasks(address: str, topic: str, count: int, tasks: int) -> Took:
    """The async Producer publishing ``count`` messages from ``tasks`` tasks."""
    async with trionsq.Producer([address]) as producer:
        await producer.publish(topic, BODY)

        async def worker(share: int) -> None:
            for _ in range(share):
                await producer.publish(topic, BODY)

        began = Clock()
        async with trio.open_nursery() as nursery:
            for share in _shares(count, tasks):
                nursery.start_soon(worker, share)
        took = began.took()
    return took


def async_tasks(tasks: int) -> Case:
    def case(address: str, topic: str, count: int) -> Took:
        return trio.run(_trio_tasks, address, topic, count, tasks)

    return case


def blocking_futures(address: str, topic: str, count: int) -> Took:
    with blocking.Producer([address]) as producer:
        producer.publish(topic, BODY)
        began = Clock()
        futures = [producer.publish_async(topic, BODY) for _ in range(count)]
        producer.flush()
        took = began.took()
        assert all(f.exception() is None for f in futures)
    return took


def blocking_sequential(address: str, topic: str, count: int) -> Took:
    with blocking.Producer([address]) as producer:
        producer.publish(topic, BODY)
        began = Clock()
        for _ in range(count):
            producer.publish(topic, BODY)
        return began.took()


def blocking_threads(use_futures: bool) -> Case:
    def case(address: str, topic: str, count: int) -> Took:
        with blocking.Producer([address]) as producer:
            producer.publish(topic, BODY)
            barrier = threading.Barrier(THREADS + 1)

            def worker(share: int) -> None:
                barrier.wait()
                if use_futures:
                    for _ in range(share):
                        producer.publish_async(topic, BODY)
                else:
                    for _ in range(share):
                        producer.publish(topic, BODY)

            threads = [
                threading.Thread(target=worker, args=(share,)) for share in _shares(count, THREADS)
            ]
            for thread in threads:
                thread.start()
            barrier.wait()
            began = Clock()
            for thread in threads:
                thread.join()
            producer.flush()
            return began.took()

    return case


def handoff_only(address: str, topic: str, count: int) -> Took:
    """No nsqd, no Trio: 8 threads each handing ``count / 8`` requests, one at
    a time, to one serving thread through a lock each, as a blocking
    ``publish`` does.  The ceiling of a blocking call per message on this
    machine: the thread switches alone, without any of the work."""
    requests: deque[threading.Lock] = deque()
    ready = threading.Condition()
    served = 0

    def server() -> None:
        nonlocal served
        while served < count:
            with ready:
                while not requests:
                    ready.wait()
                batch = list(requests)
                requests.clear()
            for reply in batch:
                reply.release()
            served += len(batch)

    def worker(share: int) -> None:
        for _ in range(share):
            reply = threading.Lock()
            reply.acquire()
            with ready:
                requests.append(reply)
                ready.notify()
            reply.acquire()

    serving = threading.Thread(target=server)
    threads = [threading.Thread(target=worker, args=(n,)) for n in _shares(count, THREADS)]
    began = Clock()
    serving.start()
    for thread in threads:
        thread.start()
    for thread in (*threads, serving):
        thread.join()
    return began.took()


def in_guest_mode(main: Callable[[], Awaitable[Took]]) -> Took:
    """``main`` run by Trio as a guest of an asyncio loop
    (``trio.lowlevel.start_guest_run``): what an asyncio front end built on
    guest mode would cost at best (the async client, with no hand-over)."""

    async def host() -> Took:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[outcome.Outcome[Took]] = loop.create_future()
        trio.lowlevel.start_guest_run(
            main,
            run_sync_soon_threadsafe=loop.call_soon_threadsafe,
            done_callback=lambda result: loop.call_soon_threadsafe(done.set_result, result),
            host_uses_signal_set_wakeup_fd=True,
        )
        return (await done).unwrap()

    return asyncio.run(host())


def guest_tasks(address: str, topic: str, count: int) -> Took:
    return in_guest_mode(functools.partial(_trio_tasks, address, topic, count, PIPELINE))


def aio_tasks(address: str, topic: str, count: int, guest: bool = True) -> Took:
    async def main() -> Took:
        async with aio.Producer([address], guest=guest) as producer:
            await producer.publish(topic, BODY)

            async def worker(share: int) -> None:
                for _ in range(share):
                    await producer.publish(topic, BODY)

            began = Clock()
            await asyncio.gather(*(worker(share) for share in _shares(count, PIPELINE)))
            return began.took()

    return asyncio.run(main())


# --- consuming ---


def _consuming(address: str) -> dict[str, Any]:
    """The options every consumer here is made with."""
    return {
        "nsqd_tcp_addresses": [address],
        "max_in_flight": IN_FLIGHT,
        "output_buffer_timeout": OUTPUT_BUFFER_TIMEOUT,
    }


async def _finish_each(consumer: AsyncIterable[Any], count: int) -> Took:
    """``async for`` over an async or asyncio Consumer, FIN each, until ``count``."""
    began = Clock()
    seen = 0
    async for message in consumer:
        await message.finish()
        seen += 1
        if seen == count:
            return began.took()
    raise AssertionError("the consumer stopped early")


async def _trio_iterate(address: str, topic: str, count: int) -> Took:
    async with trionsq.Consumer(topic, "c", **_consuming(address)) as consumer:
        took = await _finish_each(consumer, count)
    return took


def async_iterate(address: str, topic: str, count: int) -> Took:
    return trio.run(_trio_iterate, address, topic, count)


def guest_iterate(address: str, topic: str, count: int) -> Took:
    return in_guest_mode(functools.partial(_trio_iterate, address, topic, count))


def blocking_iterate(address: str, topic: str, count: int) -> Took:
    with blocking.Consumer(topic, "c", **_consuming(address)) as consumer:
        began = Clock()
        seen = 0
        for message in consumer:
            message.finish()
            seen += 1
            if seen == count:
                return began.took()
    raise AssertionError("the consumer stopped early")


def blocking_handler(address: str, topic: str, count: int) -> Took:
    seen = 0
    lock = threading.Lock()
    done = threading.Event()

    def handler(message: blocking.Message) -> None:
        nonlocal seen
        with lock:
            seen += 1
            if seen == count:
                done.set()

    with blocking.Consumer(topic, "c", handler=handler, concurrency=4, **_consuming(address)):
        began = Clock()
        done.wait()
        return began.took()


def aio_iterate(address: str, topic: str, count: int, guest: bool = True) -> Took:
    async def main() -> Took:
        async with aio.Consumer(topic, "c", guest=guest, **_consuming(address)) as consumer:
            return await _finish_each(consumer, count)

    return asyncio.run(main())


def aio_handler(address: str, topic: str, count: int) -> Took:
    async def main() -> Took:
        seen = 0
        done = asyncio.Event()

        def handler(message: aio.Message) -> None:
            nonlocal seen
            seen += 1
            if seen == count:
                done.set()

        async with aio.Consumer(topic, "c", handler=handler, **_consuming(address)):
            began = Clock()
            await done.wait()
            return began.took()

    return asyncio.run(main())


# --- running and checking ---


def _shares(count: int, parts: int) -> list[int]:
    share, extra = divmod(count, parts)
    return [share + (1 if i < extra else 0) for i in range(parts)]


class Nsqd:
    def __init__(self, daemon: reference.RealDaemon) -> None:
        self.tcp = daemon.tcp_address
        self.http = httpx.Client(base_url=f"http://{daemon.http_address}", timeout=30)

    def topic(self, name: str) -> dict[str, object]:
        stats = self.http.get("/stats", params={"format": "json", "topic": name}).json()
        for topic in stats.get("topics") or []:
            if topic["topic_name"] == name:
                return dict(topic)
        return {}

    def channel(self, topic: str) -> dict[str, object]:
        for channel in self.topic(topic).get("channels") or []:  # type: ignore[attr-defined]
            return dict(channel)
        return {}

    def prefill(self, topic: str, count: int) -> None:
        self.http.post("/topic/create", params={"topic": topic}).raise_for_status()
        self.http.post(
            "/channel/create", params={"topic": topic, "channel": "c"}
        ).raise_for_status()

        async def main() -> None:
            async with trionsq.Producer([self.tcp]) as producer:
                for start in range(0, count, 1000):
                    await producer.multi_publish(topic, [BODY] * min(1000, count - start))

        trio.run(main)
        # nsqd copies the topic's messages into the channel in the background:
        # time nothing before they are all there.
        deadline = time.monotonic() + 120
        while self.channel(topic).get("depth") != count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{topic}: the channel never held {count} messages")
            time.sleep(0.05)

    def check_published(self, topic: str, count: int) -> None:
        got = self.topic(topic).get("message_count")
        if got != count + 1:  # the warm-up publish too
            raise AssertionError(f"{topic}: nsqd counted {got} messages, expected {count + 1}")

    def check_drained(self, topic: str, count: int) -> None:
        deadline = time.monotonic() + 30
        while True:
            channel = self.channel(topic)
            if channel.get("depth") == 0 and channel.get("in_flight_count") == 0:
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"{topic}: channel not drained: {channel}")
            time.sleep(0.05)
        if channel.get("message_count") != count or channel.get("requeue_count"):
            raise AssertionError(f"{topic}: unexpected channel counts: {channel}")


class Row(NamedTuple):
    name: str
    baseline: str
    target: float | None


class Rates(NamedTuple):
    """Each round's messages per wall-clock second and per CPU second."""

    wall: list[float]
    cpu: list[float]


def run_rounds(
    nsqd: Nsqd,
    cases: dict[str, Case],
    counts: Callable[[str], int],
    rounds: int,
    consume: bool,
) -> dict[str, Rates]:
    """Every case once a round (``counts(name)`` messages), checked on nsqd."""
    rates = {name: Rates([], []) for name in cases}
    names = list(cases)
    for round_ in range(rounds):
        order = names[round_ % len(names) :] + names[: round_ % len(names)]
        for name in order:
            count = counts(name)
            topic = f"bench_{'c' if consume else 'p'}{round_}_{names.index(name)}"
            if consume:
                nsqd.prefill(topic, count)
            took = cases[name](nsqd.tcp, topic, count)
            if consume:
                nsqd.check_drained(topic, count)
            elif name not in UNCHECKED:
                nsqd.check_published(topic, count)
            rates[name].wall.append(count / took.wall)
            rates[name].cpu.append(count / max(took.cpu, 1e-9))
        print(f"  round {round_ + 1}/{rounds} done", file=sys.stderr)
    return rates


def _median_ratio(case: list[float], baseline: list[float]) -> float:
    return statistics.median(c / b for c, b in zip(case, baseline, strict=True))


def report(title: str, rates: dict[str, Rates], rows: list[Row]) -> list[str]:
    """The table: best wall rate, median CPU per message (µs, all threads
    counted); medians of the per-round ratios of wall rates (what the targets
    are about: speed) and of CPU rates (how much CPU a message costs: the
    steadier figure on a shared machine)."""
    print(title)
    head = f"{'msg/s':>9} {'us/msg':>7} {'wall':>6} {'cpu':>6}"
    print(f"  {'case':<40} {head}  {'target':<12} against")
    failures = []
    for row in rows:
        case = rates[row.name]
        # best wall rate; median CPU per message (every thread of the process)
        figures = f"{max(case.wall):>9,.0f} {1e6 / statistics.median(case.cpu):>7.2f}"
        if not row.baseline:
            print(f"  {row.name:<40} {figures} {'':>6} {'':>6}  {'':<12} (baseline)")
            continue
        base = rates[row.baseline]
        wall = _median_ratio(case.wall, base.wall)
        cpu = _median_ratio(case.cpu, base.cpu)
        verdict = ""
        if row.target is not None:
            ok = wall >= row.target
            verdict = f">={row.target:.1f} {'ok' if ok else 'MISSED'}"
            if not ok:
                failures.append(f"{row.name}: {wall:.2f} < {row.target}")
        print(f"  {row.name:<40} {figures} {wall:6.2f} {cpu:6.2f}  {verdict:<12} {row.baseline}")
    return failures


def select(
    cases: dict[str, Case], rows: list[Row], words: list[str]
) -> tuple[dict[str, Case], list[Row]]:
    """The cases whose names contain one of ``words`` (all without words), their
    baselines, and the rows reporting on them."""
    if not words:
        return cases, rows
    chosen = {name for name in cases if any(word in name for word in words)}
    kept = [row for row in rows if row.name in chosen and row.baseline]
    baselines = {row.baseline for row in kept}
    rows = [Row(name, "", None) for name in cases if name in baselines] + kept
    return {name: case for name, case in cases.items() if name in chosen | baselines}, rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--publishes", type=int, default=200_000)
    parser.add_argument(
        "--round-trip-publishes",
        type=int,
        default=20_000,
        help="publishes of the cases with 1 or 8 in flight (a round trip each)",
    )
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", choices=["publish", "consume"])
    parser.add_argument(
        "--cases", default="", help="comma-separated words: run only the cases naming one"
    )
    args = parser.parse_args()
    if reference.binary("nsqd") is None:
        print(f"no real nsqd: {reference.skip_reason()}; nothing measured")
        return 0
    words = [word.strip() for word in args.cases.split(",") if word.strip()]
    failures: list[str] = []
    with reference.running("nsqd", ["--mem-queue-size=10000000"]) as daemon:
        nsqd = Nsqd(daemon)
        if args.only != "consume":
            publish: dict[str, Case] = {
                "async Producer, 256 tasks": async_tasks(PIPELINE),
                "async Producer, 8 tasks": async_tasks(THREADS),
                "async Producer, 1 task": async_tasks(1),
                "blocking, 1 thread, publish_async": blocking_futures,
                "blocking, 8 threads, publish_async": blocking_threads(True),
                "blocking, 8 threads, publish": blocking_threads(False),
                "blocking, 1 thread, publish": blocking_sequential,
                "asyncio Producer, 256 tasks": aio_tasks,
                AIO_THREAD_PUBLISH: functools.partial(aio_tasks, guest=False),
                GUEST_PUBLISH: guest_tasks,
                HANDOFF: handoff_only,
            }
            rows = [
                Row("async Producer, 256 tasks", "", None),
                Row("blocking, 1 thread, publish_async", "async Producer, 256 tasks", 0.5),
                Row("blocking, 8 threads, publish_async", "async Producer, 256 tasks", 0.9),
                Row("asyncio Producer, 256 tasks", "async Producer, 256 tasks", 0.8),
                Row(AIO_THREAD_PUBLISH, "async Producer, 256 tasks", None),
                Row("blocking, 8 threads, publish", "async Producer, 256 tasks", None),
                Row("blocking, 8 threads, publish", "async Producer, 8 tasks", None),
                Row("blocking, 1 thread, publish", "async Producer, 1 task", None),
                Row(GUEST_PUBLISH, "async Producer, 256 tasks", None),
                Row(HANDOFF, "async Producer, 256 tasks", None),
            ]
            publish, rows = select(publish, rows, words)
            rates = run_rounds(
                nsqd,
                publish,
                lambda name: args.round_trip_publishes if name in ROUND_TRIP else args.publishes,
                args.rounds,
                consume=False,
            )
            failures += report(
                f"publish: {args.publishes:,} PUBs of {len(BODY)} bytes "
                f"({args.round_trip_publishes:,} with 1 or 8 in flight), real nsqd, "
                f"median of {args.rounds} per-round ratios",
                rates,
                rows,
            )
        if args.only != "publish":
            consume: dict[str, Case] = {
                "async Consumer, async for": async_iterate,
                "blocking Consumer, for": blocking_iterate,
                "blocking Consumer, handler x4 threads": blocking_handler,
                "asyncio Consumer, async for": aio_iterate,
                AIO_THREAD_CONSUME: functools.partial(aio_iterate, guest=False),
                "asyncio Consumer, handler": aio_handler,
                GUEST_CONSUME: guest_iterate,
            }
            base = "async Consumer, async for"
            rows = [
                Row(base, "", None),
                Row("blocking Consumer, for", base, 0.7),
                Row("blocking Consumer, handler x4 threads", base, 0.7),
                Row("asyncio Consumer, async for", base, 0.7),
                Row(AIO_THREAD_CONSUME, base, None),
                Row("asyncio Consumer, handler", base, 0.7),
                Row(GUEST_CONSUME, base, None),
            ]
            consume, rows = select(consume, rows, words)
            rates = run_rounds(nsqd, consume, lambda name: args.messages, args.rounds, consume=True)
            failures += report(
                f"consume: drain {args.messages:,} messages, FIN each, max_in_flight "
                f"{IN_FLIGHT}, real nsqd, median of {args.rounds} per-round ratios",
                rates,
                rows,
            )
    if failures:
        print("targets missed: " + "; ".join(failures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
