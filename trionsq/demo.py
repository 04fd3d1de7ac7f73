"""The main job: messages through an embedded fakensq node, end to end.

``python -m trionsq.demo`` starts an in-process fakensq nsqd on free loopback
ports, publishes a batch with a Producer (MPUB in chunks, plus single PUBs),
consumes it with a Consumer, and prints what happened.  It exits 0 only if every
published message was received and finished.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import trio

import fakensq
import trionsq

TOPIC = "demo"
CHANNEL = "main"


@dataclass
class Outcome:
    published: int = 0
    received: int = 0
    finished: int = 0
    publish_seconds: float = 0.0
    consume_seconds: float = 0.0


async def run(messages: int, batch: int, max_in_flight: int) -> Outcome:
    outcome = Outcome()
    bodies = [f"message {i:08d}".encode() for i in range(messages)]
    seen: set[bytes] = set()
    all_in = trio.Event()

    async with fakensq.NSQD(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0") as nsqd:
        print(f"fakensq nsqd: TCP {nsqd.tcp_address}, HTTP {nsqd.http_address}")

        start = time.perf_counter()
        async with trionsq.Producer(nsqd_tcp_addresses=[nsqd.tcp_address]) as producer:
            singles = min(10, messages)
            for body in bodies[:singles]:
                await producer.publish(TOPIC, body)
            for i in range(singles, messages, batch):
                await producer.multi_publish(TOPIC, bodies[i : i + batch])
        outcome.published = messages
        outcome.publish_seconds = time.perf_counter() - start

        async def handler(message: trionsq.Message) -> None:
            outcome.received += 1
            seen.add(message.body)
            if len(seen) == messages:
                all_in.set()

        start = time.perf_counter()
        async with trionsq.Consumer(
            TOPIC,
            CHANNEL,
            nsqd_tcp_addresses=[nsqd.tcp_address],
            max_in_flight=max_in_flight,
            handler=handler,
        ) as consumer:
            with trio.move_on_after(60):
                await all_in.wait()
        outcome.consume_seconds = time.perf_counter() - start
        outcome.finished = consumer.stats.finished
    return outcome


def report(outcome: Outcome) -> None:
    def rate(count: int, seconds: float) -> str:
        return f"{count / seconds:,.0f} msg/s" if seconds > 0 else "-"

    rows = [
        ("published", f"{outcome.published:,}", rate(outcome.published, outcome.publish_seconds)),
        ("received", f"{outcome.received:,}", rate(outcome.received, outcome.consume_seconds)),
        ("finished", f"{outcome.finished:,}", ""),
    ]
    print()
    for name, count, speed in rows:
        print(f"  {name:<10} {count:>10}   {speed}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trionsq.demo", description=__doc__)
    parser.add_argument("-n", "--messages", type=int, default=20_000, help="how many to publish")
    parser.add_argument("--batch", type=int, default=500, help="messages per MPUB")
    parser.add_argument("--max-in-flight", type=int, default=200)
    args = parser.parse_args(argv)
    if args.messages < 1 or args.batch < 1 or args.max_in_flight < 1:
        parser.error("--messages, --batch and --max-in-flight must be positive")
    outcome = trio.run(run, args.messages, args.batch, args.max_in_flight)
    report(outcome)
    ok = outcome.finished >= outcome.published and outcome.received >= outcome.published
    print("\nevery message was received and finished" if ok else "\nMESSAGES MISSING")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
