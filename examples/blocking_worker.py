"""A worker script: a blocking handler on a pool of threads, until SIGTERM or Ctrl-C.

Each message is a job; the handler does blocking work (here: hashing the body a
number of times) on one of ``--concurrency`` threads.  Returning finishes the
message, raising requeues it with backoff.  SIGTERM (what systemd, Docker or
Kubernetes send) and Ctrl-C (SIGINT) stop it cleanly, alike: nothing more is
taken, the jobs running get ``close_timeout`` seconds, every job not done is
requeued for another worker, and the last line says how many were done (exit
0).  A second signal stops at once, without waiting for running jobs (their
messages are requeued too; exit 130).

    python examples/blocking_worker.py --nsqd 127.0.0.1:4150 --topic jobs --channel workers

With no --nsqd or --lookupd it starts an embedded fakensq nsqd, publishes a few
jobs, works through them and exits.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import sys
import threading

from trionsq import blocking
from trionsq.stopping import EXIT_ABORTED, StopOnSignals

log = logging.getLogger("worker")


def work(body: bytes, rounds: int = 1000) -> str:
    digest = body
    for _ in range(rounds):
        digest = hashlib.sha256(digest).digest()
    return digest.hex()[:16]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nsqd", action="append", default=[], help="nsqd TCP address")
    parser.add_argument("--lookupd", action="append", default=[], help="nsqlookupd HTTP address")
    parser.add_argument("--topic", default="jobs")
    parser.add_argument("--channel", default="workers")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--count", type=int, default=0, help="stop after this many jobs (0: never)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(threadName)s %(message)s")
    if not args.nsqd and not args.lookupd:
        return demo(args)
    return run(args.nsqd, args.lookupd, args.topic, args.channel, args.concurrency, args.count)


def run(
    nsqd: list[str], lookupd: list[str], topic: str, channel: str, concurrency: int, count: int
) -> int:
    done = 0
    lock = threading.Lock()

    def handler(message: blocking.Message) -> None:
        nonlocal done
        result = work(message.body)
        with lock:
            done += 1
            log.info("job %s -> %s (%d done)", message.body.decode(errors="replace"), result, done)
            if count and done >= count:
                consumer.stop()

    consumer = blocking.Consumer(
        topic,
        channel,
        handler=handler,
        concurrency=concurrency,
        nsqd_tcp_addresses=nsqd,
        lookupd_http_addresses=lookupd,
    )

    # The first SIGINT or SIGTERM: consumer.stop() (safe in a signal handler);
    # a second: KeyboardInterrupt, and the with closes without waiting.  Set
    # before the consumer starts: a signal while it starts stops it too.
    try:
        with StopOnSignals(consumer.stop) as signals, consumer:
            print("ready", flush=True)
            consumer.run()
    except KeyboardInterrupt:
        print(f"aborted after {done} job(s)", flush=True)
        return EXIT_ABORTED
    how = f", on {signals.received}" if signals.received else ""
    print(f"stopped after {done} job(s){how}", flush=True)
    return 0


def demo(args: argparse.Namespace) -> int:
    from fakensq import NSQD
    from fakensq.testing.threaded import BackgroundNode

    with BackgroundNode(lambda: NSQD(tcp_address="127.0.0.1:0", http_address="")) as nsqd:
        with blocking.Producer([nsqd.tcp_address]) as producer:
            producer.multi_publish(args.topic, [b"job-%d" % i for i in range(20)])
        return run([nsqd.tcp_address], [], args.topic, args.channel, args.concurrency, 20)


if __name__ == "__main__":
    sys.exit(main())
