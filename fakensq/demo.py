"""The main job: at-least-once delivery through a small NSQ cluster, with a fault.

``python -m fakensq.demo`` starts an embedded :class:`fakensq.Cluster` (three
nsqds and an nsqlookupd on free loopback ports) and then, all in one Trio run:

- **producers** publish ``--messages`` numbered messages across the nsqds
  (MPUBs, one pinned Producer per nsqd, round-robin; a failed publish is retried
  on the next nsqd, so it may arrive twice but is never lost);
- **consumers** (``--consumers`` of them, sharing one channel) find the nsqds
  through nsqlookupd and process messages with a handler that fails
  deterministically: from ``--seed``, about ``--fail-rate`` of the attempts
  raise (the message is requeued, with backoff), and ``--poison-rate`` of the
  messages always fail, so they are given up after ``--max-attempts``;
- midway, a **fault**: publishing moves away from one nsqd, it drains, it is
  stopped (its consumers' connections drop), then restarted on the same ports
  with its data path kept; the consumers find it again through nsqlookupd.

The run ends with a table: published, delivered, finished, requeued, given up,
duplicates, and missing, which must be 0: every published message was finished
or given up, at least once.  Progress is live while it runs (rich on a
terminal, plain lines on stderr otherwise).  Exit 0 when nothing is missing, 1
otherwise.

The node is stopped cleanly: like a real nsqd, fakensq's writes what it holds to
its data path and reads it back at the restart.  It is drained first anyway;
``--no-drain`` stops it under load (nothing is lost either way).

The first SIGINT (Ctrl-C) or SIGTERM stops the run where it is: the table so
far, a line saying so, exit 130; a second one stops it at once.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

import trio

import fakensq
import trionsq
from trionsq.stopping import EXIT_ABORTED, TrioStopSignals
from trionsq.tools.flags import plain_text
from trionsq.tools.progress import Progress

TOPIC = "demo"
CHANNEL = "main"


@dataclass
class Settings:
    """The run's knobs (the command line's flags)."""

    messages: int = 3000
    batch: int = 50
    nsqds: int = 3
    consumers: int = 2
    max_in_flight: int = 50
    max_attempts: int = 3
    fail_rate: float = 0.05
    poison_rate: float = 0.005
    seed: int = 1
    fault: bool = True
    drain: bool = True
    timeout: float = 60.0
    publish_rate: float = 4000.0
    live: bool | None = None


@dataclass
class Ledger:
    """What happened to every message, by body."""

    published: set[bytes] = field(default_factory=set)
    publish_retries: int = 0
    deliveries: Counter[bytes] = field(default_factory=Counter)
    processed: Counter[bytes] = field(default_factory=Counter)
    failed_attempts: int = 0
    given_up: set[bytes] = field(default_factory=set)
    #: bodies finished or given up (kept as they happen, to end the run in O(1))
    done: set[bytes] = field(default_factory=set)
    fault_log: list[str] = field(default_factory=list)
    #: quarter-second samples of a consumer in backoff (paused or testing)
    backoff_samples: int = 0
    seconds: float = 0.0
    #: the signal that stopped the run before its end ("SIGINT"), or None
    stopped_by: str | None = None

    @property
    def missing(self) -> set[bytes]:
        return self.published - self.done

    @property
    def duplicates(self) -> int:
        """Successful processings beyond the first (at-least-once's price)."""
        return sum(n - 1 for n in self.processed.values() if n > 1)


class Failures:
    """Deterministic handler failures: a function of the seed, the body and the attempt."""

    def __init__(self, seed: int, fail_rate: float, poison_rate: float) -> None:
        self.seed = seed
        self.fail_rate = fail_rate
        self.poison_rate = poison_rate

    def is_poison(self, body: bytes) -> bool:
        return random.Random(f"{self.seed}:poison:{body!r}").random() < self.poison_rate

    def fails(self, body: bytes, attempt: int) -> bool:
        if self.is_poison(body):
            return True
        return random.Random(f"{self.seed}:{body!r}:{attempt}").random() < self.fail_rate


class HandlerError(Exception):
    """The demo's simulated processing failure."""


@dataclass
class _Traffic:
    """What the publisher and the fault share: the cluster, the run's settings,
    ledger and progress, which nodes take publishes, and whether half the
    messages are out (the fault waits for it)."""

    cluster: fakensq.Cluster
    settings: Settings
    ledger: Ledger
    progress: Progress
    healthy: list[bool]
    half_published: trio.Event = field(default_factory=trio.Event)


async def _publish_all(traffic: _Traffic) -> None:
    settings, ledger = traffic.settings, traffic.ledger
    bodies = [f"message {i:08d}".encode() for i in range(settings.messages)]
    addresses = traffic.cluster.nsqd_tcp_addresses
    producers = [
        trionsq.Producer(nsqd_tcp_addresses=[a], connect_timeout=1.0, publish_window=64)
        for a in addresses
    ]
    interval = settings.batch / settings.publish_rate if settings.publish_rate else 0.0
    next_at = trio.current_time()
    async with AsyncExitStack() as stack:
        for producer in producers:
            await stack.enter_async_context(producer)
        turn = 0
        for start in range(0, len(bodies), settings.batch):
            batch = bodies[start : start + settings.batch]
            # Round-robin over the nodes taking traffic; a failure moves on.
            for step in range(len(addresses) * 3):
                index = (turn + step) % len(addresses)
                if not traffic.healthy[index]:
                    continue
                try:
                    await producers[index].multi_publish(TOPIC, batch)
                except trionsq.NSQError:
                    ledger.publish_retries += 1
                    await trio.sleep(0.05)
                    continue
                break
            else:
                raise RuntimeError("no nsqd accepted a publish")
            turn += 1
            ledger.published.update(batch)
            traffic.progress.add("published", len(batch))
            if len(ledger.published) * 2 >= len(bodies):
                traffic.half_published.set()
            if interval:
                next_at += interval
                await trio.sleep_until(next_at)
    traffic.half_published.set()


def _channel_backlog(nsqd: fakensq.NSQD) -> int:
    # Not filtered by channel: before consumers subscribe, the topic holds them all.
    stats = nsqd.stats(TOPIC, "", False, False)
    total = 0
    for topic in stats["topics"] or []:
        total += topic["depth"]  # messages not yet copied to a channel
        for channel in topic["channels"]:
            total += channel["depth"] + channel["in_flight_count"] + channel["deferred_count"]
    return total


async def _inject_fault(traffic: _Traffic) -> None:
    cluster, settings = traffic.cluster, traffic.settings
    await traffic.half_published.wait()
    victim = 1 % settings.nsqds
    start = time.monotonic()

    def note(text: str) -> None:
        traffic.ledger.fault_log.append(f"+{time.monotonic() - start:.2f}s {text}")
        traffic.progress.info["fault"] = text

    traffic.healthy[victim] = False
    note(f"nsqd {victim}: publishing moved away")
    if settings.drain:
        node = cluster.nsqd(victim)
        # Polling: the node's queues have no "became empty" event to wait on.
        while _channel_backlog(node) > 0:  # noqa: ASYNC110
            await trio.sleep(0.02)
        note(f"nsqd {victim}: drained")
    await cluster.stop_nsqd(victim)
    note(f"nsqd {victim}: stopped")
    await trio.sleep(0.3)  # an outage long enough for consumers to notice
    await cluster.start_nsqd(victim, keep_data=True)
    note(f"nsqd {victim}: restarted on {cluster.nsqd_tcp_addresses[victim]}")
    traffic.healthy[victim] = True


async def run(settings: Settings, signals: TrioStopSignals | None = None) -> Ledger:
    """Run the whole job and return its ledger.

    With ``signals`` (installed around the ``trio.run``), the first SIGINT or
    SIGTERM ends the run cleanly where it is (the consumers leave, requeueing
    what they hold; the ledger says so in ``stopped_by``), a second at once.
    """
    ledger = Ledger()
    failures = Failures(settings.seed, settings.fail_rate, settings.poison_rate)
    progress = Progress(
        "demo",
        ["published", "delivered", "finished", "requeued", "given up"],
        rate_of="finished",
        backlog=lambda: max(0, len(ledger.published) - len(ledger.done)),
        interval=1.0,
        live=settings.live,
    )
    all_done = trio.Event()
    publishing_over = trio.Event()
    fault_over = trio.Event()

    def check_done() -> None:
        # Everything is published once publishing is over: then counts suffice.
        over = publishing_over.is_set() and fault_over.is_set()
        if over and len(ledger.done) >= len(ledger.published):
            if not ledger.missing:
                all_done.set()

    async def handler(message: trionsq.Message) -> None:
        ledger.deliveries[message.body] += 1
        progress.add("delivered")
        if failures.fails(message.body, message.attempts):
            ledger.failed_attempts += 1
            progress.add("requeued")
            raise HandlerError(f"simulated failure of {message.body!r}")
        ledger.processed[message.body] += 1
        ledger.done.add(message.body)
        progress.add("finished")
        check_done()

    def give_up(message: trionsq.Message) -> None:
        ledger.given_up.add(message.body)
        ledger.done.add(message.body)
        progress.add("given up")
        check_done()

    backoff = trionsq.BackoffPolicy(base=0.02, max=0.2, multiplier=2.0, jitter=0.3)
    started = time.monotonic()
    stop = trio.Event()
    with trio.CancelScope() as everything:
        if signals is not None:
            signals.attach(stop, everything)
        await _run_cluster(
            settings,
            ledger,
            progress,
            handler,
            give_up,
            backoff,
            stop,
            all_done,
            check_done,
            publishing_over,
            fault_over,
        )
    if signals is not None:
        ledger.stopped_by = signals.received
    ledger.seconds = time.monotonic() - started
    return ledger


async def _run_cluster(
    settings: Settings,
    ledger: Ledger,
    progress: Progress,
    handler: Callable[[trionsq.Message], Awaitable[None]],
    give_up: Callable[[trionsq.Message], None],
    backoff: trionsq.BackoffPolicy,
    stop: trio.Event,
    all_done: trio.Event,
    check_done: Callable[[], None],
    publishing_over: trio.Event,
    fault_over: trio.Event,
) -> None:
    async with fakensq.Cluster(nsqd=settings.nsqds, lookupd=1) as cluster:
        traffic = _Traffic(cluster, settings, ledger, progress, [True] * settings.nsqds)
        progress.info["cluster"] = f"{settings.nsqds} nsqd, 1 lookupd"
        async with trio.open_nursery() as nursery:
            nursery.start_soon(progress.run)
            workers: list[trionsq.Consumer | None] = [None] * settings.consumers

            async def worker(i: int, task_status: trio.TaskStatus[None]) -> None:
                async with trionsq.Consumer(
                    TOPIC,
                    CHANNEL,
                    handler=handler,
                    give_up=give_up,
                    lookupd_http_addresses=cluster.lookupd_http_addresses,
                    lookupd_poll_interval=0.25,
                    lookupd_poll_jitter=0.1,
                    max_in_flight=settings.max_in_flight,
                    max_attempts=settings.max_attempts,
                    default_requeue_delay=0.02,
                    max_requeue_delay=0.2,
                    backoff=backoff,
                    low_rdy_idle_timeout=0.1,
                    connect_timeout=1.0,
                    close_timeout=5.0,
                    rng=random.Random(settings.seed * 1000 + i),
                ) as consumer:
                    workers[i] = consumer
                    task_status.started()
                    await all_done.wait()
                workers[i] = None

            async def sample_backoff() -> None:
                """Show each consumer's backoff state, and add up time spent in it."""
                while True:
                    await trio.sleep(0.25)
                    states = [c.stats.backoff_state if c else "-" for c in workers]
                    progress.info["backoff"] = ",".join(states)
                    ledger.backoff_samples += sum(1 for x in states if x not in ("normal", "-"))

            async def publish() -> None:
                await _publish_all(traffic)
                publishing_over.set()
                check_done()

            async def stop_on_signal() -> None:
                await stop.wait()
                all_done.set()  # the workers leave as at the end: cleanly

            async with trio.open_nursery() as work:
                work.start_soon(stop_on_signal)
                for i in range(settings.consumers):
                    await work.start(worker, i)
                work.start_soon(publish)
                work.start_soon(sample_backoff)
                if settings.fault and settings.nsqds > 1:

                    async def fault() -> None:
                        await _inject_fault(traffic)
                        fault_over.set()
                        check_done()

                    work.start_soon(fault)
                else:
                    fault_over.set()
                with trio.move_on_after(settings.timeout):
                    await all_done.wait()
                all_done.set()  # on a timeout too: the workers leave
                work.cancel_scope.cancel()
            nursery.cancel_scope.cancel()


def report(ledger: Ledger, settings: Settings) -> str:
    """The closing table (plain text, the same on a terminal and in a log)."""
    failures = Failures(settings.seed, 0, settings.poison_rate)
    poison = sum(1 for body in ledger.published if failures.is_poison(body))
    rows = [
        ("published", len(ledger.published), "distinct messages acknowledged by an nsqd"),
        ("delivered", sum(ledger.deliveries.values()), "deliveries to handlers, retries included"),
        ("finished", len(ledger.processed), "distinct messages processed and FINed"),
        ("requeued", ledger.failed_attempts, "handler failures, each REQ'd with backoff"),
        ("given up", len(ledger.given_up), f"past --max-attempts ({poison} poison)"),
        ("duplicates", ledger.duplicates, "processed again (at-least-once)"),
        (
            "missing",
            len(ledger.missing),
            f"not processed yet: stopped by {ledger.stopped_by}"
            if ledger.stopped_by
            else "published, never finished nor given up",
        ),
    ]
    lines = ["", f"{'':2}{'outcome':<12}{'count':>8}   meaning", f"{'':2}{'-' * 64}"]
    for name, count, meaning in rows:
        lines.append(f"  {name:<12}{count:>8}   {meaning}")
    lines.append("")
    for event in ledger.fault_log:
        lines.append(f"  fault {event}")
    lines.append(f"  time consumers spent backing off: ~{ledger.backoff_samples * 0.25:.2f}s")
    if ledger.publish_retries:
        lines.append(f"  publishes retried on another nsqd: {ledger.publish_retries}")
    rate = len(ledger.published) / ledger.seconds if ledger.seconds else 0.0
    lines.append(f"  {ledger.seconds:.1f}s, {rate:,.0f} msg/s end to end")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fakensq.demo",
        description=plain_text(__doc__ or ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d = Settings()
    parser.add_argument(
        "-n", "--messages", type=int, default=d.messages, help="how many to publish"
    )
    parser.add_argument("--batch", type=int, default=d.batch, help="messages per MPUB")
    parser.add_argument("--nsqds", type=int, default=d.nsqds, help="nsqds in the cluster")
    parser.add_argument("--consumers", type=int, default=d.consumers, help="consumers")
    parser.add_argument("--max-in-flight", type=int, default=d.max_in_flight)
    parser.add_argument("--max-attempts", type=int, default=d.max_attempts)
    parser.add_argument("--fail-rate", type=float, default=d.fail_rate)
    parser.add_argument("--poison-rate", type=float, default=d.poison_rate)
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument(
        "--publish-rate",
        type=float,
        default=d.publish_rate,
        help="messages/s (0: as fast as possible)",
    )
    parser.add_argument("--timeout", type=float, default=d.timeout, help="give up after (seconds)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log handler failures")
    parser.add_argument("--no-fault", dest="fault", action="store_false", help="no nsqd restart")
    parser.add_argument(
        "--no-drain", dest="drain", action="store_false", help="stop the nsqd without draining it"
    )
    args = parser.parse_args(argv)
    if min(args.messages, args.batch, args.nsqds, args.consumers, args.max_in_flight) < 1:
        parser.error(
            "--messages, --batch, --nsqds, --consumers and --max-in-flight must be positive"
        )
    if not (0 <= args.fail_rate < 1 and 0 <= args.poison_rate <= 1):
        parser.error("--fail-rate must be in [0, 1) and --poison-rate in [0, 1]")
    if args.max_attempts < 1:
        parser.error("--max-attempts must be positive")
    if not args.verbose:
        # Handler failures are the point of the demo: counted, not logged one by one.
        logging.getLogger("trionsq").setLevel(logging.ERROR)
    settings = Settings(**{k: v for k, v in vars(args).items() if k != "verbose"})
    signals = TrioStopSignals()
    with signals.installed():
        ledger = trio.run(run, settings, signals)
    print(report(ledger, settings))
    if ledger.stopped_by is not None:
        # Cut short: the table is the run so far, and there is no verdict.
        left = len(ledger.published) - len(ledger.done)
        how = "aborted by a second signal" if signals.aborted else "stopped cleanly"
        print(
            f"\n{how} on {ledger.stopped_by} before the end: {left} published message(s)"
            " not yet processed (they were in the embedded nsqds, gone with them)"
        )
        return EXIT_ABORTED
    if ledger.missing:
        print(
            f"\nMISSING {len(ledger.missing)} message(s): published, never processed nor given up"
        )
        return 1
    print("\nevery published message was processed at least once (or given up after retries)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
