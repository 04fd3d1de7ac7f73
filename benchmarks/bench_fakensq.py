"""fakensq's end-to-end throughput and start-to-ready time, with same-run baselines.

End to end: a raw publisher MPUBs 100-byte bodies while a raw consumer (SUB, RDY
2500, a FIN for every message) drains the channel, all in one Trio loop on one
core, server included.  The baseline moves the same bytes through the same kind
of loopback sockets with a trivial server that does no NSQ work at all (it
discards what publishers send and replays pre-encoded message frames), so the
ratio is what fakensq's queueing costs over bare Trio socket I/O.

CPU: the process's CPU time a message (clients and server alike, all in one
process), steadier than the rates on a shared machine; its ratio is the bare
loop's CPU a message over fakensq's.

Start-to-ready: entering ``async with fakensq.NSQD(...)`` (TCP and HTTP listening,
ready to serve) against opening and closing two bare TCP listeners.

    python benchmarks/bench_fakensq.py [--messages N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import NamedTuple

import trio

sys.path.insert(0, str(Path(__file__).parent))

import rawclient

import fakensq
from trionsq.protocol import frames

BODY = b"x" * 100
BATCH = 1000


class Run(NamedTuple):
    rate: float  # messages per wall-clock second
    cpu_us: float  # the process's CPU microseconds a message (clients included)


async def end_to_end(messages: int) -> Run:
    """Messages per second through a fakensq nsqd, MPUB in and SUB/FIN out."""
    async with fakensq.NSQD(tcp_address="127.0.0.1:0", http_address="") as nsqd:
        # Create the channel first, so the published messages fan out at once.
        await nsqd_channel(nsqd.tcp_address)
        start, cpu = time.perf_counter(), time.process_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                rawclient.publish_mpub, nsqd.tcp_address, "bench", [BODY] * messages, BATCH
            )
            nursery.start_soon(rawclient.consume, nsqd.tcp_address, "bench", "c", messages)
        run = Run(
            messages / (time.perf_counter() - start),
            (time.process_time() - cpu) * 1e6 / messages,
        )
        await check_drained(nsqd, messages)
        return run


async def check_drained(nsqd: fakensq.NSQD, messages: int) -> None:
    """The run is only a result if the node's stats account for every message:
    published once, sent once, finished, nothing left, requeued or timed out."""
    expected = {"depth": 0, "in_flight_count": 0, "message_count": messages}
    expected.update(requeue_count=0, timeout_count=0)
    with trio.fail_after(30):
        while True:
            (topic,) = nsqd.stats(topic="bench")["topics"]
            (channel,) = topic["channels"]
            got = {key: channel[key] for key in expected}
            if got == expected and topic["message_count"] == messages:
                return
            if got["in_flight_count"] == 0 and got["depth"] == 0:
                raise SystemExit(f"fakensq's stats after the run: {got}, expected {expected}")
            await trio.sleep(0.01)  # the last FINs are still on their way


async def nsqd_channel(address: str) -> None:
    stream, parser = await rawclient.connect(address)
    async with stream:
        await stream.send_all(rawclient.cmd.sub("bench", "c"))
        await rawclient.expect_ok(stream, parser)


async def bare_sockets(messages: int) -> Run:
    """The same bytes through loopback Trio sockets, with no NSQ work in between."""
    message = frames.encode_message(time.time_ns(), 1, b"0123456789abcdef", BODY)
    fin = rawclient.cmd.fin(b"0123456789abcdef")
    ok = frames.encode_response(b"OK")
    mpub_size = len(rawclient.cmd.mpub("bench", [BODY] * BATCH))
    got_everything = trio.Event()

    async def server(stream: trio.SocketStream) -> None:
        # "  V2" then one byte naming the role (not NSQ: this server does no NSQ).
        hello = b""
        while len(hello) < 5:
            hello += await stream.receive_some(5 - len(hello))
        role = hello[4:]
        if role == b"P":  # publisher: swallow MPUBs, answer OK each
            pending = 0
            async for data in stream:
                pending += len(data)
                while pending >= mpub_size:
                    pending -= mpub_size
                    await stream.send_all(ok)
        else:  # consumer: stream message frames, read FINs
            async with trio.open_nursery() as nursery:

                async def reader() -> None:
                    fins = 0
                    async for data in stream:
                        fins += len(data) // len(fin)
                        if fins >= messages:
                            got_everything.set()
                            return

                nursery.start_soon(reader)
                for _ in range(0, messages, 2500):
                    await stream.send_all(message * 2500)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, server, 0)
        port = listeners[0].socket.getsockname()[1]
        start, cpu = time.perf_counter(), time.process_time()

        async def publisher() -> None:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(b"  V2P")
            for _ in range(0, messages, BATCH):
                await stream.send_all(rawclient.cmd.mpub("bench", [BODY] * BATCH))
                await stream.receive_some(len(ok))
            await stream.aclose()

        async def consumer() -> None:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(b"  V2C")
            parser = frames.FrameParser()
            received = 0
            while received < messages:
                batch = parser.feed(await stream.receive_some(256 * 1024))
                received += len(batch)
                await stream.send_all(fin * len(batch))
            await got_everything.wait()
            await stream.aclose()

        async with trio.open_nursery() as clients:
            clients.start_soon(publisher)
            clients.start_soon(consumer)
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        nursery.cancel_scope.cancel()
    return Run(messages / elapsed, cpu * 1e6 / messages)


async def start_to_ready(runs: int) -> tuple[float, float]:
    """Median seconds to a ready NSQD, and to two bare listeners (the baseline)."""
    node, bare = [], []
    for _ in range(runs):
        start = time.perf_counter()
        async with fakensq.NSQD(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0"):
            node.append(time.perf_counter() - start)
        start = time.perf_counter()
        listeners = [
            *(await trio.open_tcp_listeners(0, host="127.0.0.1")),
            *(await trio.open_tcp_listeners(0, host="127.0.0.1")),
        ]
        bare.append(time.perf_counter() - start)
        for listener in listeners:
            await listener.aclose()
    return statistics.median(node), statistics.median(bare)


async def main(messages: int) -> None:
    # Warm up both paths once, then take the best of three runs each: the
    # highest rate, and (apart) the least CPU a message.
    await end_to_end(messages // 10)
    await bare_sockets(messages // 10)
    fakes = [await end_to_end(messages) for _ in range(3)]
    bares = [await bare_sockets(messages) for _ in range(3)]
    fake, base = max(r.rate for r in fakes), max(r.rate for r in bares)
    fake_cpu, base_cpu = min(r.cpu_us for r in fakes), min(r.cpu_us for r in bares)
    ready, bare_ready = await start_to_ready(30)
    print(f"end to end, {messages:,} messages of {len(BODY)} bytes, one core:")
    print(f"  {'':20}{'msg/s':>10}  {'CPU us/msg':>10}")
    print(f"  {'fakensq nsqd':20}{fake:>10,.0f}  {fake_cpu:>10.2f}")
    print(f"  {'bare Trio sockets':20}{base:>10,.0f}  {base_cpu:>10.2f}   (same run, no NSQ work)")
    print(f"  {'ratio':20}{fake / base:>10.2f}  {base_cpu / fake_cpu:>10.2f}")
    print("start to ready (median of 30):")
    print(f"  fakensq nsqd        {ready * 1000:>10.2f} ms")
    print(f"  two bare listeners  {bare_ready * 1000:>10.2f} ms   (same run)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=200_000)
    trio.run(main, parser.parse_args().messages)
