"""Memory of a trionsq consumer over a long run against the real nsqd.

A child process drains ``messages`` messages with ``async for`` (max_in_flight
2500, FIN each) while this process feeds nsqd with MPUBs, keeping the
channel's backlog under ``BACKLOG`` (so nsqd's own memory stays bounded and the
run needs no pre-fill).  Every ``messages // 10`` messages the child collects
garbage and reports its RSS, Python's allocated blocks and live objects: a
leak of even a few bytes a message shows as growth between the samples.  The
run is checked against nsqd's ``/stats`` (exactly ``messages`` sent and
finished, none requeued or timed out).

Run it through ``bench_client.py --sections memory [--memory-messages N]``, or
directly: ``python benchmarks/memory_client.py [N]``.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import rawsocket  # noqa: E402

from tests import reference  # noqa: E402

BODY = b"x" * 100
BATCH = 100
IN_FLIGHT = 2500
#: the channel's depth above which the feeder waits
BACKLOG = 200_000
TOPIC = "memory"
CHANNEL = "c"


def _rss() -> int:
    """Resident set size now, in bytes (Linux: /proc; else the peak)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _sample(received: int) -> None:
    gc.collect()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    sample = {
        "messages": received,
        "rss": _rss(),
        "blocks": sys.getallocatedblocks(),
        "objects": len(gc.get_objects()),
        "cpu": usage.ru_utime + usage.ru_stime,
    }
    print(json.dumps(sample), flush=True)


def consume(address: str, count: int) -> None:
    """The child: drain ``count`` messages, sampling ten times on the way."""
    import trio

    import trionsq

    every = max(1, count // 10)

    async def main() -> None:
        received = 0
        _sample(0)
        async with trionsq.Consumer(
            TOPIC, CHANNEL, nsqd_tcp_addresses=[address], max_in_flight=IN_FLIGHT
        ) as consumer:
            async for message in consumer:
                await message.finish()
                received += 1
                if received % every == 0:
                    _sample(received)
                if received == count:
                    break

    trio.run(main)


def _depth(http: httpx.Client) -> int:
    stats = http.get("/stats", params={"format": "json", "topic": TOPIC}).json()
    for topic in stats.get("topics") or []:
        for channel in topic.get("channels") or []:
            if channel["channel_name"] == CHANNEL:
                return int(channel["depth"]) + int(topic["depth"])
    return 0


def _channel(http: httpx.Client) -> dict[str, int]:
    stats = http.get("/stats", params={"format": "json", "topic": TOPIC}).json()
    for topic in stats.get("topics") or []:
        for channel in topic.get("channels") or []:
            if channel["channel_name"] == CHANNEL:
                return dict(channel)
    return {}


def run(count: int) -> list[dict[str, float]]:
    """Feed and drain ``count`` messages; print and return the samples."""
    # Room for the backlog (nsqd allocates the queue whole: 8 bytes a message).
    flags = [f"--mem-queue-size={2 * BACKLOG}", f"--max-rdy-count={IN_FLIGHT}"]
    with reference.RealDaemon("nsqd", flags) as daemon:
        http = httpx.Client(base_url=f"http://{daemon.http_address}", timeout=60)
        http.post("/topic/create", params={"topic": TOPIC}).raise_for_status()
        http.post("/channel/create", params={"topic": TOPIC, "channel": CHANNEL}).raise_for_status()
        child = subprocess.Popen(
            [sys.executable, __file__, "--child", daemon.tcp_address, str(count)],
            stdout=subprocess.PIPE,
            text=True,
        )
        started = time.perf_counter()
        feeder = rawsocket.Link(daemon.tcp_address)
        full = rawsocket.mpub_command(TOPIC, [BODY] * BATCH)
        published = 0
        buf = b""
        while published < count:
            if published % (BATCH * 500) == 0:
                while _depth(http) > BACKLOG:
                    time.sleep(0.02)  # polling nsqd: the consumer catches up
            size = min(BATCH, count - published)
            feeder.send(full if size == BATCH else rawsocket.mpub_command(TOPIC, [BODY] * size))
            _, buf = rawsocket.read_oks(feeder, buf)
            published += size
        feeder.close()
        assert child.stdout is not None
        lines = child.stdout.read().splitlines()
        if child.wait() != 0:
            raise RuntimeError(f"the consumer failed ({child.returncode})")
        wall = time.perf_counter() - started
        deadline = time.monotonic() + 60
        while _channel(http).get("in_flight_count") and time.monotonic() < deadline:
            time.sleep(0.05)  # polling nsqd for the last FINs
        channel = _channel(http)
        http.close()
    expected = {"depth": 0, "in_flight_count": 0, "message_count": count}
    expected |= {"requeue_count": 0, "timeout_count": 0}
    got = {key: channel.get(key) for key in expected}
    if got != expected:
        raise AssertionError(f"nsqd's channel has {got}, expected {expected}")
    samples = [json.loads(line) for line in lines]
    print(
        f"memory: trionsq (async for) drains {count:,} messages from the real nsqd in {wall:.0f}s"
    )
    print(f"  {'messages':>11} {'RSS MB':>8} {'blocks':>9} {'objects':>9} {'us/msg':>7}")
    previous = None
    for sample in samples:
        cost = ""
        if previous is not None and sample["messages"] > previous["messages"]:
            spent = sample["cpu"] - previous["cpu"]
            cost = f"{spent / (sample['messages'] - previous['messages']) * 1e6:7.2f}"
        print(
            f"  {sample['messages']:>11,} {sample['rss'] / 2**20:>8.1f} "
            f"{sample['blocks']:>9,} {sample['objects']:>9,} {cost:>7}"
        )
        previous = sample
    if len(samples) >= 3:
        # Growth after the first tenth (warm-up: buffers and caches reach size).
        first, last = samples[1], samples[-1]
        span = last["messages"] - first["messages"]
        grown = last["rss"] - first["rss"]
        print(
            f"  RSS from {first['messages']:,} to {last['messages']:,} messages: "
            f"{grown / 2**20:+.1f} MB ({grown / span:+.3f} bytes/message); "
            f"blocks {last['blocks'] - first['blocks']:+,}, "
            f"objects {last['objects'] - first['objects']:+,}"
        )
    return samples


def main() -> int:
    if len(sys.argv) >= 2 and sys.argv[1] == "--child":
        consume(sys.argv[2], int(sys.argv[3]))
        return 0
    if reference.binary("nsqd") is None:
        print(f"no real nsqd: {reference.skip_reason()}; nothing measured")
        return 0
    run(int(sys.argv[1]) if len(sys.argv) > 1 else 10_000_000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
