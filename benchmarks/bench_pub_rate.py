"""``trionsq pub --rate N`` against Go's ``to_nsq --rate N``: the rate each holds.

For each N, each tool publishes ``--seconds`` worth of N a second (N x seconds
lines of 100 bytes on stdin) to a fresh real nsqd v1.3.0, in turns (who goes
first alternates by round).  nsqd's ``/stats`` is polled every 10 ms while the
tool runs; the rate achieved is read between the 10th and the 90th percentile
of the messages (so neither the tool's start-up nor its last partial second
counts): ``(count at 90% - count at 10%) / (time at 90% - time at 10%)``.

Reported per N, medians over rounds: ours and Go's rate, each over N (1.00 is
the rate asked for, held), and ours over Go's within each round.

    python benchmarks/bench_pub_rate.py [--rates 5000,10000,20000] [--rounds 3] [--seconds 4]

The real binaries come from ``NSQ_BIN`` or ``shared/reference/nsq-bin`` above
the checkout (see ``tests/reference.py``); without them the script says so and
stops.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import reference  # noqa: E402

TOPIC = "rate"
BODY_SIZE = 100
POLL = 0.01


def lines(count: int) -> bytes:
    """``count`` lines of 100 bytes (newline included), each different."""
    return b"".join(b"%010d " % i + b"x" * (BODY_SIZE - 12) + b"\n" for i in range(count))


def command(impl: str, address: str, rate: int) -> list[str]:
    flags = [f"--topic={TOPIC}", f"--nsqd-tcp-address={address}", f"--rate={rate}"]
    if impl == "go":
        path = reference.binary("to_nsq")
        assert path is not None
        return [str(path), *flags]
    return [sys.executable, "-m", "trionsq.cli", "pub", *flags]


def topic_count(client: httpx.Client, http_address: str) -> int:
    doc = client.get(
        f"http://{http_address}/stats", params={"format": "json", "topic": TOPIC}
    ).json()
    for topic in doc.get("topics") or []:
        if topic["topic_name"] == TOPIC:
            return int(topic["message_count"])
    return 0


def achieved(samples: list[tuple[float, int]], total: int) -> float:
    """The rate between the samples that first reach 10% and 90% of ``total``."""
    low = next(s for s in samples if s[1] >= total * 0.1)
    high = next(s for s in samples if s[1] >= total * 0.9)
    return (high[1] - low[1]) / (high[0] - low[0])


def run_one(impl: str, rate: int, stdin: Path, total: int, client: httpx.Client) -> float:
    with reference.RealDaemon("nsqd", ["--mem-queue-size=10000000", "--log-level=warn"]) as nsqd:
        samples: list[tuple[float, int]] = []
        with stdin.open("rb") as source:
            process = subprocess.Popen(
                command(impl, nsqd.tcp_address, rate),
                stdin=source,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                deadline = time.monotonic() + total / rate * 10 + 30
                while True:
                    count = topic_count(client, nsqd.http_address)
                    samples.append((time.monotonic(), count))
                    if count >= total:
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{impl} --rate {rate}: stuck at {count}/{total}")
                    time.sleep(POLL)
            finally:
                process.terminate()
                process.wait(timeout=30)
        return achieved(samples, total)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="5000,10000,20000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args()
    if reference.nsq_bin() is None or reference.binary("to_nsq") is None:
        print(f"bench_pub_rate: no real NSQ binaries to compare: {reference.skip_reason()}")
        return 1
    rates = [int(r) for r in args.rates.split(",")]
    head = ("--rate N", "ours msg/s", "Go msg/s", "ours/N", "Go/N", "ours/Go")
    print(" ".join(f"{h:>11}" for h in head))
    with tempfile.TemporaryDirectory() as folder, httpx.Client() as client:
        for rate in rates:
            total = int(rate * args.seconds)
            stdin = Path(folder) / f"{rate}.txt"
            stdin.write_bytes(lines(total))
            ours: list[float] = []
            go: list[float] = []
            for round_ in range(args.rounds):
                order = ["ours", "go"] if round_ % 2 == 0 else ["go", "ours"]
                got = {impl: run_one(impl, rate, stdin, total, client) for impl in order}
                ours.append(got["ours"])
                go.append(got["go"])
            ratio = statistics.median(o / g for o, g in zip(ours, go, strict=True))
            o, g = statistics.median(ours), statistics.median(go)
            row = (f"{rate:,}", f"{o:,.0f}", f"{g:,.0f}", f"{o / rate:.3f}", f"{g / rate:.3f}")
            print(" ".join(f"{c:>11}" for c in (*row, f"{ratio:.2f}")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
