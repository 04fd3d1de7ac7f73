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
concurrent ``publish`` calls sharing one connection; raw: windows of PUBs
written at once, their OKs read together, the server's ceiling) and MPUB.

Rates are given per wall-clock second and per CPU second of this process.
Client, server and baseline share one process and talk over loopback, so the
loop never waits on anything but itself: on a quiet machine the two agree, and
on a shared one the CPU figure is the steadier, so ratios use it: the median,
over rounds, of the ratio within a round (the figures shown are the bests).

Memory (``--memory``): a consumer drains a million messages while a publisher
keeps the channel's backlog bounded; RSS and Python's allocated blocks (and
with ``--tracemalloc`` traced bytes and peaks, whole process) are sampled every
100k messages, so growth over the run shows leaks.

    python benchmarks/bench_client.py [--messages N] [--publishes N] [--runs N]
    python benchmarks/bench_client.py --memory [--messages N] [--tracemalloc]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import NamedTuple

import trio

sys.path.insert(0, str(Path(__file__).parent))

import rawclient

import fakensq
import trionsq
from trionsq.protocol import commands, frames

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


class Rate(NamedTuple):
    """Messages per wall-clock second and per CPU second of this process."""

    wall: float
    cpu: float


class _Stopwatch:
    def __init__(self) -> None:
        self.wall = time.perf_counter()
        self.cpu = time.process_time()

    def rate(self, messages: int) -> Rate:
        wall = time.perf_counter() - self.wall
        cpu = time.process_time() - self.cpu
        return Rate(messages / wall, messages / max(cpu, 1e-9))


async def _timed_drain(messages: int, drain: Callable[[str], Awaitable[None]]) -> Rate:
    """The rate of ``drain(address)`` emptying a channel pre-filled with ``messages``."""
    async with _nsqd() as nsqd:
        await _prefill(nsqd.tcp_address, "bench", "c", messages)
        gc.collect()
        watch = _Stopwatch()
        await drain(nsqd.tcp_address)
        rate = watch.rate(messages)
    return rate


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


async def _timed_publish(messages: int, publish: Callable[[str], Awaitable[None]]) -> Rate:
    async with _nsqd() as nsqd:
        gc.collect()
        watch = _Stopwatch()
        await publish(nsqd.tcp_address)
        rate = watch.rate(messages)
    return rate


async def _bare_pub_server(stream: trio.SocketStream) -> None:
    """Answers IDENTIFY, then an OK for every PUB of BODY to "bench", all the
    OKs of one read in one write: what pipelining can gain with no NSQ work."""
    data = b""
    header = len(commands.MAGIC_V2) + len(b"IDENTIFY\n") + 4
    while len(data) < header:
        data += await stream.receive_some(65536)
    size = header + int.from_bytes(data[header - 4 : header], "big")
    while len(data) < size:
        data += await stream.receive_some(65536)
    ok = frames.encode_response(b"OK")
    await stream.send_all(ok)
    pub_size = len(commands.pub("bench", BODY))
    pending = len(data) - size
    async for chunk in stream:
        pending += len(chunk)
        if pending >= pub_size:
            await stream.send_all(ok * (pending // pub_size))
            pending %= pub_size


async def _timed_bare(messages: int, publish: Callable[[str], Awaitable[None]]) -> Rate:
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, _bare_pub_server, 0)
        port = listeners[0].socket.getsockname()[1]
        gc.collect()
        watch = _Stopwatch()
        await publish(f"127.0.0.1:{port}")
        rate = watch.rate(messages)
        nursery.cancel_scope.cancel()
    return rate


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


def raw_pipelined(messages: int) -> Callable[[str], Awaitable[None]]:
    async def publish(address: str) -> None:
        stream, parser = await rawclient.connect(address)
        async with stream:
            for start in range(0, messages, PIPELINE):
                count = min(PIPELINE, messages - start)
                await stream.send_all(commands.pub("bench", BODY) * count)
                await rawclient.expect_ok(stream, parser, count)

    return publish


def raw_mpub(messages: int) -> Callable[[str], Awaitable[None]]:
    async def publish(address: str) -> None:
        await rawclient.publish_mpub(address, "bench", [BODY] * messages, BATCH)

    return publish


Timed = Callable[[int, Callable[[str], Awaitable[None]]], Awaitable[Rate]]
Maker = Callable[[int], Callable[[str], Awaitable[None]]]


class Measured(NamedTuple):
    best: Rate  # the best wall and CPU rates over the rounds
    rounds: list[float]  # the CPU rate of each round


async def best_of(
    runs: int, timed: Timed, cases: Mapping[str, tuple[int, Maker]]
) -> dict[str, Measured]:
    """Each case's rates over ``runs`` rounds, each run on a fresh nsqd.

    Rounds interleave the cases, so a burst of load on the machine hurts them
    alike rather than one of them, and ratios (see :func:`ratio`) compare the
    cases of one round.
    """
    best = dict.fromkeys(cases, Rate(0.0, 0.0))
    rounds: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(runs):
        for name, (count, make) in cases.items():
            rate = await timed(count, make(count))
            best[name] = Rate(max(best[name].wall, rate.wall), max(best[name].cpu, rate.cpu))
            rounds[name].append(rate.cpu)
    return {name: Measured(best[name], rounds[name]) for name in cases}


def ratio(case: Measured, baseline: Measured) -> float:
    """The median over rounds of the case's CPU rate over the baseline's in the
    same round: steadier than a ratio of bests when the machine's load drifts."""
    return statistics.median(c / b for c, b in zip(case.rounds, baseline.rounds, strict=True))


def _row(name: str, case: Measured, baseline: Measured | None = None, against: str = "") -> None:
    rate = case.best
    shown = f"   {ratio(case, baseline):5.2f} x {against}" if baseline is not None else ""
    print(f"  {name:<32} {rate.wall:>9,.0f} {rate.cpu:>9,.0f}{shown}")


def _header(title: str) -> None:
    print(title)
    print(f"  {'':<32} {'msg/s':>9} {'msg/cpu-s':>9}")


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
    raw = rates["raw"]
    _header(f"consume: drain {messages:,} pre-filled messages of {len(BODY)} bytes, FIN each")
    _row(f"raw loop (RDY {IN_FLIGHT})", raw)
    _row(f"Consumer, handler ({IN_FLIGHT} in flight)", rates["handler"], raw, "raw")
    _row(f"Consumer, async for ({IN_FLIGHT})", rates["iterator"], raw, "raw")


async def publish_section(messages: int, runs: int) -> None:
    cases = {
        "raw PUB, sequential": raw_sequential,
        "Producer PUB, sequential": producer_sequential,
        f"Producer PUB, {PIPELINE} concurrent": producer_pipelined,
        f"raw PUB, windows of {PIPELINE}": raw_pipelined,
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
    _header(f"publish: {messages:,} PUBs ({messages * 10:,} for MPUB) of {len(BODY)} bytes")
    raw_seq = figures["raw PUB, sequential"]
    seq = figures["Producer PUB, sequential"]
    raw_pipe = figures[f"raw PUB, windows of {PIPELINE}"]
    _row("raw PUB, sequential", raw_seq)
    _row("Producer PUB, sequential", seq, raw_seq, "raw sequential")
    _row(f"Producer PUB, {PIPELINE} concurrent", figures[f"Producer PUB, {PIPELINE} concurrent"])
    _row(f"raw PUB, windows of {PIPELINE}", raw_pipe, raw_seq, "raw sequential")
    _row(f"raw MPUB x{BATCH}", figures[f"raw MPUB x{BATCH}"])
    _row(
        f"Producer MPUB x{BATCH}",
        figures[f"Producer MPUB x{BATCH}"],
        figures[f"raw MPUB x{BATCH}"],
        "raw",
    )
    pipelined = figures[f"Producer PUB, {PIPELINE} concurrent"]
    print(f"  pipelined / sequential PUB (Producer)  {ratio(pipelined, seq):5.2f}")
    print(f"  pipelined Producer / raw windows       {ratio(pipelined, raw_pipe):5.2f}")

    # fakensq answers every PUB with a write of its own, so the server bounds
    # pipelining above; a bare server that answers a read's PUBs at once shows
    # what the Producer itself can do.
    bare = await best_of(
        runs,
        _timed_bare,
        {
            "sequential": (messages, producer_sequential),
            "pipelined": (messages, producer_pipelined),
        },
    )
    _header(f"publish: {messages:,} PUBs to a bare server (OK for each, no NSQ work)")
    _row("Producer PUB, sequential", bare["sequential"])
    _row(
        f"Producer PUB, {PIPELINE} concurrent", bare["pipelined"], bare["sequential"], "sequential"
    )


def _rss() -> int:
    """Resident set size in bytes (Linux), 0 where unknown."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class _Sample(NamedTuple):
    received: int
    rss: int
    blocks: int  # sys.getallocatedblocks(): objects alive in Python's allocator
    traced: int  # tracemalloc's current and peak since the last sample (or 0)
    peak: int


async def memory_section(messages: int, checkpoint: int, backlog: int, traced: bool) -> None:
    """Drain ``messages`` through a handler Consumer; sample memory at checkpoints.

    A raw publisher MPUBs alongside, never more than ``backlog`` messages ahead
    of the consumer, so the server's queue (in the same process) stays bounded
    and any growth is the client's (or a leak in either).  RSS and the count of
    allocated blocks cost nothing to sample; tracemalloc (``traced``) adds
    byte-exact figures and peaks but slows everything several times over.
    """
    samples: list[_Sample] = []
    done = trio.Event()
    received = 0
    progressed = trio.Event()

    def sample() -> None:
        current, peak = tracemalloc.get_traced_memory() if traced else (0, 0)
        if traced:
            tracemalloc.reset_peak()
        samples.append(_Sample(received, _rss(), sys.getallocatedblocks(), current, peak))

    async def handler(message: trionsq.Message) -> None:
        nonlocal received, progressed
        received += 1
        if received % BATCH == 0:
            progressed.set()
            progressed = trio.Event()
        if received % checkpoint == 0:
            sample()
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
        if traced:
            tracemalloc.start()
        watch = _Stopwatch()
        async with trionsq.Consumer(
            "bench",
            "c",
            handler=handler,
            nsqd_tcp_addresses=[nsqd.tcp_address],
            max_in_flight=IN_FLIGHT,
        ) as consumer:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(publisher, nsqd.tcp_address)
                await done.wait()
            workers = consumer._workers
        rate = watch.rate(messages)
        if traced:
            tracemalloc.stop()
    mib = 1024 * 1024
    print(
        f"memory: a handler Consumer drains {messages:,} messages"
        f" ({rate.wall:,.0f} msg/s, {rate.cpu:,.0f} msg/cpu-s{', traced' if traced else ''}),"
        f" backlog at most {backlog:,}, {workers} handler workers at the end"
    )
    print(f"  {'received':>9}  {'RSS':>9}  {'blocks':>10}" + ("  traced now  peak since" * traced))
    for s in samples:
        line = f"  {s.received:>9,}  {s.rss / mib:>5.1f} MiB  {s.blocks:>10,}"
        if traced:
            line += f"  {s.traced / mib:>6.2f} MiB  {s.peak / mib:>6.2f} MiB"
        print(line)
    if len(samples) >= 2:
        first, last = samples[0], samples[-1]
        span = f"from {first.received:,} to {last.received:,} messages"
        print(f"  growth {span}: RSS {(last.rss - first.rss) / mib:+.1f} MiB,", end="")
        print(f" blocks {last.blocks - first.blocks:+,}", end="")
        print(f", traced {(last.traced - first.traced) / mib:+.2f} MiB" if traced else "")


async def main(args: argparse.Namespace) -> None:
    if args.memory:
        messages = args.messages or 1_000_000
        await memory_section(messages, args.checkpoint, 5 * IN_FLIGHT, args.tracemalloc)
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
    parser.add_argument("--publishes", type=int, default=3_000, help="publish: PUBs")
    parser.add_argument("--runs", type=int, default=4, help="rounds of every case")
    parser.add_argument(
        "--memory", action="store_true", help="run only the memory section (a few minutes)"
    )
    parser.add_argument("--checkpoint", type=int, default=100_000)
    parser.add_argument(
        "--tracemalloc", action="store_true", help="memory: also trace allocations (slow)"
    )
    trio.run(main, parser.parse_args())
