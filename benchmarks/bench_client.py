"""trionsq's Consumer and Producer throughput and memory, against same-run baselines.

Everything runs in one Trio loop on one core, a fakensq nsqd included, with
100-byte bodies.  The baseline is :mod:`rawclient`, a minimal raw-socket NSQ
client, run in the same process against the same kind of server, so the
server's cost is common to both and the ratio is what trionsq's own machinery
(connection object, RDY logic, handler dispatch, stats) costs.

Consume: the channel is pre-filled with N messages by MPUB, then the time to
drain it (SUB, FIN each message) is measured for the raw loop and for a
``trionsq.Consumer`` with a handler and with ``async for``.

Publish: PUB awaited one at a time (trionsq and raw), pipelined PUB (many
concurrent ``publish`` calls sharing one connection) and MPUB.

Memory (``--memory``): a consumer drains a million messages while a publisher
keeps the channel's backlog bounded; traced memory (tracemalloc, whole process)
is sampled every 100k messages, so growth over the run shows leaks.

    python benchmarks/bench_client.py [--messages N] [--publishes N]
    python benchmarks/bench_client.py --memory [--messages N]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).parent))

import rawclient

import fakensq
import trionsq
from trionsq.protocol import commands

BODY = b"x" * 100
BATCH = 1000
#: the raw loop's RDY, and the Consumer's max_in_flight (nsqd's max_rdy_count)
IN_FLIGHT = 2500
#: concurrent publishers in the pipelined PUB run (the Producer's default window)
PIPELINE = 256


def _nsqd() -> fakensq.NSQD:
    return fakensq.NSQD(tcp_address="127.0.0.1:0", http_address="")


async def _prefill(address: str, topic: str, channel: str, messages: int) -> None:
    """Create the channel, then MPUB ``messages`` bodies into it."""
    stream, parser = await rawclient.connect(address)
    async with stream:
        await stream.send_all(commands.sub(topic, channel))
        await rawclient.expect_ok(stream, parser)
    await rawclient.publish_mpub(address, topic, [BODY] * messages, BATCH)


async def _timed_drain(messages: int, drain: Callable[[str], Awaitable[None]]) -> float:
    """Messages per second for ``drain(address)`` emptying a pre-filled channel."""
    async with _nsqd() as nsqd:
        await _prefill(nsqd.tcp_address, "bench", "c", messages)
        gc.collect()
        start = time.perf_counter()
        await drain(nsqd.tcp_address)
        elapsed = time.perf_counter() - start
    return messages / elapsed


def raw_consume(messages: int) -> Callable[[str], Awaitable[None]]:
    async def drain(address: str) -> None:
        await rawclient.consume(address, "bench", "c", messages, rdy=IN_FLIGHT)

    return drain


def handler_consume(messages: int) -> Callable[[str], Awaitable[None]]:
    async def drain(address: str) -> None:
        done = trio.Event()
        count = 0

        async def handler(message: trionsq.Message) -> None:
            nonlocal count
            count += 1
            if count == messages:
                done.set()

        async with trionsq.Consumer(
            "bench", "c", handler=handler, nsqd_tcp_addresses=[address], max_in_flight=IN_FLIGHT
        ):
            await done.wait()

    return drain


def iterator_consume(messages: int) -> Callable[[str], Awaitable[None]]:
    async def drain(address: str) -> None:
        count = 0
        async with trionsq.Consumer(
            "bench", "c", nsqd_tcp_addresses=[address], max_in_flight=IN_FLIGHT
        ) as consumer:
            async for message in consumer:
                await message.finish()
                count += 1
                if count == messages:
                    break

    return drain


async def _timed_publish(messages: int, publish: Callable[[str], Awaitable[None]]) -> float:
    async with _nsqd() as nsqd:
        gc.collect()
        start = time.perf_counter()
        await publish(nsqd.tcp_address)
        elapsed = time.perf_counter() - start
    return messages / elapsed


def producer_sequential(messages: int) -> Callable[[str], Awaitable[None]]:
    async def publish(address: str) -> None:
        async with trionsq.Producer([address]) as producer:
            for _ in range(messages):
                await producer.publish("bench", BODY)

    return publish


def producer_pipelined(messages: int) -> Callable[[str], Awaitable[None]]:
    async def publish(address: str) -> None:
        async with trionsq.Producer([address]) as producer:

            async def worker(count: int) -> None:
                for _ in range(count):
                    await producer.publish("bench", BODY)

            async with trio.open_nursery() as nursery:
                share, extra = divmod(messages, PIPELINE)
                for i in range(PIPELINE):
                    nursery.start_soon(worker, share + (1 if i < extra else 0))

    return publish


def producer_mpub(messages: int) -> Callable[[str], Awaitable[None]]:
    async def publish(address: str) -> None:
        async with trionsq.Producer([address]) as producer:
            for start in range(0, messages, BATCH):
                await producer.multi_publish("bench", [BODY] * min(BATCH, messages - start))

    return publish


def raw_sequential(messages: int) -> Callable[[str], Awaitable[None]]:
    async def publish(address: str) -> None:
        await rawclient.publish_sequential(address, "bench", [BODY] * messages)

    return publish


def raw_mpub(messages: int) -> Callable[[str], Awaitable[None]]:
    async def publish(address: str) -> None:
        await rawclient.publish_mpub(address, "bench", [BODY] * messages, BATCH)

    return publish


Timed = Callable[[int, Callable[[str], Awaitable[None]]], Awaitable[float]]
Maker = Callable[[int], Callable[[str], Awaitable[None]]]


async def best_of(
    runs: int, timed: Timed, cases: Mapping[str, tuple[int, Maker]]
) -> dict[str, float]:
    """The best rate of each case over ``runs`` rounds, each on a fresh nsqd.

    Rounds interleave the cases, so a burst of load on the machine hurts them
    alike rather than one of them.
    """
    best = dict.fromkeys(cases, 0.0)
    for _ in range(runs):
        for name, (count, make) in cases.items():
            best[name] = max(best[name], await timed(count, make(count)))
    return best


async def consume_section(messages: int, runs: int) -> None:
    # Warm up every path once (imports, caches, allocator), then best of ``runs``.
    for make in (raw_consume, handler_consume, iterator_consume):
        await _timed_drain(messages // 10, make(messages // 10))
    cases = {
        "raw": (messages, raw_consume),
        "handler": (messages, handler_consume),
        "iterator": (messages, iterator_consume),
    }
    rates = await best_of(runs, _timed_drain, cases)
    raw, handler, iterator = rates["raw"], rates["handler"], rates["iterator"]
    print(f"consume: drain {messages:,} pre-filled messages of {len(BODY)} bytes, FIN each")
    print(f"  raw loop (RDY {IN_FLIGHT})       {raw:>10,.0f} msg/s")
    print(f"  Consumer, handler         {handler:>10,.0f} msg/s   {handler / raw:6.2f} x raw")
    print(f"  Consumer, async for       {iterator:>10,.0f} msg/s   {iterator / raw:6.2f} x raw")


async def publish_section(messages: int, runs: int) -> None:
    cases = {
        "raw PUB, sequential": raw_sequential,
        "Producer PUB, sequential": producer_sequential,
        f"Producer PUB, {PIPELINE} concurrent": producer_pipelined,
        f"raw MPUB x{BATCH}": raw_mpub,
        f"Producer MPUB x{BATCH}": producer_mpub,
    }
    for make in cases.values():
        await _timed_publish(messages // 10, make(messages // 10))
    # MPUB moves BATCH messages per round trip: give it more to time.
    figures = await best_of(
        runs,
        _timed_publish,
        {
            name: (messages * 10 if "MPUB" in name else messages, make)
            for name, make in cases.items()
        },
    )
    print(f"publish: {messages:,} PUBs ({messages * 10:,} for MPUB) of {len(BODY)} bytes")
    for name, rate in figures.items():
        print(f"  {name:<30} {rate:>10,.0f} msg/s")
    sequential = figures["Producer PUB, sequential"]
    pipelined = figures[f"Producer PUB, {PIPELINE} concurrent"]
    print(f"  pipelined / sequential PUB     {pipelined / sequential:>10.2f}")
    print(f"  Producer / raw, sequential PUB {sequential / figures['raw PUB, sequential']:>10.2f}")
    mpub = figures[f"Producer MPUB x{BATCH}"] / figures[f"raw MPUB x{BATCH}"]
    print(f"  Producer / raw, MPUB           {mpub:>10.2f}")


def _rss() -> int:
    """Resident set size in bytes (Linux), 0 where unknown."""
    try:
        with open("/proc/self/statm") as statm:
            import os

            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


async def memory_section(messages: int, checkpoint: int, backlog: int) -> None:
    """Drain ``messages`` through a handler Consumer; sample memory at checkpoints.

    A raw publisher MPUBs alongside, never more than ``backlog`` messages ahead
    of the consumer, so the server's queue (in the same process) stays bounded
    and any growth is the client's (or a leak in either).
    """
    samples: list[tuple[int, int, int, int]] = []  # received, current, peak, rss
    done = trio.Event()
    received = 0
    progressed = trio.Event()

    async def handler(message: trionsq.Message) -> None:
        nonlocal received, progressed
        received += 1
        if received % BATCH == 0:
            progressed.set()
            progressed = trio.Event()
        if received % checkpoint == 0:
            current, peak = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            samples.append((received, current, peak, _rss()))
        if received == messages:
            done.set()

    async def publisher(address: str) -> None:
        stream, parser = await rawclient.connect(address)
        async with stream:
            published = 0
            while published < messages:
                while published - received >= backlog:
                    await progressed.wait()
                count = min(BATCH, messages - published)
                await stream.send_all(commands.mpub("bench", [BODY] * count))
                await rawclient.expect_ok(stream, parser)
                published += count

    async with _nsqd() as nsqd:
        await _prefill(nsqd.tcp_address, "bench", "c", 0)
        tracemalloc.start()
        start = time.perf_counter()
        async with trionsq.Consumer(
            "bench",
            "c",
            handler=handler,
            nsqd_tcp_addresses=[nsqd.tcp_address],
            max_in_flight=IN_FLIGHT,
        ):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(publisher, nsqd.tcp_address)
                await done.wait()
        elapsed = time.perf_counter() - start
        tracemalloc.stop()
    mib = 1024 * 1024
    print(f"memory: a handler Consumer drains {messages:,} messages ({elapsed:.1f}s, traced)")
    print("  received      traced now   peak since last   RSS")
    for count, current, peak, rss in samples:
        sizes = f"{current / mib:>9.2f} MiB  {peak / mib:>9.2f} MiB  {rss / mib:>8.1f} MiB"
        print(f"  {count:>9,}  {sizes}")
    if len(samples) >= 2:
        first, last = samples[0], samples[-1]
        growth = (last[1] - first[1]) / mib
        print(f"  traced growth from {first[0]:,} to {last[0]:,}: {growth:+.2f} MiB")
        print(f"  RSS growth over the same span: {(last[3] - first[3]) / mib:+.1f} MiB")


async def main(args: argparse.Namespace) -> None:
    if args.memory:
        messages = args.messages or 1_000_000
        await memory_section(messages, args.checkpoint, backlog=5 * IN_FLIGHT)
        return
    await consume_section(args.messages or 100_000, args.runs)
    await publish_section(args.publishes, args.runs)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--messages",
        type=int,
        help="messages to consume (default 100,000; 1,000,000 with --memory)",
    )
    parser.add_argument("--publishes", type=int, default=10_000, help="publish: PUBs")
    parser.add_argument("--runs", type=int, default=3, help="best of this many runs")
    parser.add_argument(
        "--memory", action="store_true", help="run only the memory section (a few minutes)"
    )
    parser.add_argument("--checkpoint", type=int, default=100_000)
    trio.run(main, parser.parse_args())
