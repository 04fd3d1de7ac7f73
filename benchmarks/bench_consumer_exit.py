"""How long leaving a Consumer takes, against the real nsqd v1.3.0, and what it leaves.

Each case is run ``--runs`` times (fresh nsqds each time, default msg_timeout
60 s, the consumer's default close_timeout 30 s); the time is from the moment
the block is left (or cancelled, or interrupted) until the ``async with`` has
returned.  After each run, nsqd's ``/stats`` must show nothing of the consumer
in flight (checked within a second: a message left behind would stay in
flight for the whole msg_timeout), nothing timed out, and every message
published ready again (the channel's depth, or the topic's where the consumer
never subscribed); the script fails otherwise.

Cases:

- ``async for, unanswered``: break out of ``async for`` with one message
  handed out and not answered, two more waiting in the consumer;
- ``handler cancelled``: three nsqds, max_in_flight=2, handlers blocked, the
  nursery around the consumer cancelled;
- ``nsqd SIGKILLed``: two nsqds, a handler blocked on a message of one of them,
  that nsqd SIGKILLed, then the block left;
- ``handler past close_timeout``: close_timeout=1 s, a handler that never
  returns (the one case that waits, by design);
- ``Ctrl-C``: a consumer process with a blocked handler gets SIGINT; the time
  is until the process has exited.

    python benchmarks/bench_consumer_exit.py [--runs N]

Needs the real binaries (``NSQ_BIN`` or ``shared/reference/nsq-bin`` above the
checkout, see tests/reference.py).
"""

from __future__ import annotations

import argparse
import logging
import signal
import statistics
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import httpx
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import trionsq  # noqa: E402
from tests import reference  # noqa: E402

TOPIC, CHANNEL = "topic", "chan"


class Outcome:
    def __init__(self, seconds: float, in_flight: int, timed_out: int, held: int) -> None:
        self.seconds = seconds
        self.in_flight = in_flight
        self.timed_out = timed_out
        #: messages nsqd holds ready again (channel depth, or the topic's
        #: where the consumer never subscribed): all of them, after every case
        self.held = held


@asynccontextmanager
async def nsqds(count: int) -> AsyncIterator[list[reference.RealDaemon]]:
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(reference.open_nsqd()) for _ in range(count)]


async def publish(nsqd: reference.RealDaemon, bodies: list[bytes]) -> None:
    async with trionsq.Producer([nsqd.tcp_address]) as producer:
        await producer.multi_publish(TOPIC, bodies)


async def left_behind(daemons: list[reference.RealDaemon]) -> tuple[int, int, int]:
    """(in flight, timed out, held ready) summed over the nsqds, once in
    flight is 0 or 1 s passed."""
    async with httpx.AsyncClient() as client:
        with trio.move_on_after(1.0):
            while True:
                in_flight, timed_out, held = 0, 0, 0
                for daemon in daemons:
                    stats = (
                        await client.get(f"http://{daemon.http_address}/stats?format=json")
                    ).json()
                    for topic in stats["topics"]:
                        held += sum(c["depth"] for c in topic["channels"]) or topic["depth"]
                        for channel in topic["channels"]:
                            in_flight += channel["in_flight_count"]
                            timed_out += channel["timeout_count"]
                if in_flight == 0:
                    break
                await trio.sleep(0.01)
    return in_flight, timed_out, held


async def until(predicate: Callable[[], bool]) -> None:
    """Poll a condition spread over the client and nsqd (no single event)."""
    with trio.fail_after(30):
        while not predicate():  # noqa: ASYNC110
            await trio.sleep(0.01)


def consumer(daemons: list[reference.RealDaemon], **options: object) -> trionsq.Consumer:
    return trionsq.Consumer(
        TOPIC, CHANNEL, nsqd_tcp_addresses=[d.tcp_address for d in daemons], **options
    )


async def case_async_for() -> Outcome:
    async with nsqds(1) as daemons:
        await publish(daemons[0], [b"a", b"b", b"c"])
        async with consumer(daemons, max_in_flight=3) as c:
            async for _message in c:
                break
            await until(lambda: c.stats.received == 3)
            start = trio.current_time()
        seconds = trio.current_time() - start
        return Outcome(seconds, *await left_behind(daemons))


async def blocked(message: trionsq.Message) -> None:
    await trio.sleep_forever()


async def case_cancelled_handler() -> Outcome:
    async with nsqds(3) as daemons:
        for index, daemon in enumerate(daemons):
            await publish(daemon, [b"%d-%d" % (index, i) for i in range(5)])
        entered: list[trionsq.Message] = []

        async def handler(message: trionsq.Message) -> None:
            entered.append(message)
            await trio.sleep_forever()

        async with trio.open_nursery() as outer:

            async def consume() -> None:
                async with consumer(daemons, handler=handler, max_in_flight=2):
                    await trio.sleep_forever()

            outer.start_soon(consume)
            await until(lambda: len(entered) == 2)
            start = trio.current_time()
            outer.cancel_scope.cancel()
        seconds = trio.current_time() - start
        return Outcome(seconds, *await left_behind(daemons))


async def case_sigkilled_nsqd() -> Outcome:
    async with nsqds(2) as daemons:
        doomed, other = daemons
        await publish(doomed, [b"doomed"])
        entered = trio.Event()

        async def handler(message: trionsq.Message) -> None:
            entered.set()
            await trio.sleep_forever()

        async with consumer(daemons, handler=handler, max_in_flight=4) as c:
            await entered.wait()
            await trio.to_thread.run_sync(doomed.kill)
            await until(lambda: c.connections == [other.tcp_address])
            start = trio.current_time()
        seconds = trio.current_time() - start
        return Outcome(seconds, *await left_behind([other]))


async def case_close_timeout() -> Outcome:
    async with nsqds(1) as daemons:
        await publish(daemons[0], [b"stuck"])
        async with consumer(daemons, handler=blocked, close_timeout=1.0) as c:
            await until(lambda: c.stats.in_flight == 1)
            start = trio.current_time()
        seconds = trio.current_time() - start
        return Outcome(seconds, *await left_behind(daemons))


CTRL_C_SCRIPT = textwrap.dedent(
    """
    import signal, sys, trio, trionsq

    # As from a terminal, even when this script inherits SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    async def handler(message):
        print("holding", flush=True)
        await trio.sleep_forever()

    async def main(address):
        async with trionsq.Consumer(
            "topic", "chan", nsqd_tcp_addresses=[address], handler=handler, max_in_flight=3
        ):
            await trio.sleep_forever()

    trio.run(main, sys.argv[1])
    """
)


async def case_ctrl_c() -> Outcome:
    async with nsqds(1) as daemons:
        await publish(daemons[0], [b"1", b"2", b"3"])
        process = await trio.lowlevel.open_process(
            [sys.executable, "-c", CTRL_C_SCRIPT, daemons[0].tcp_address],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert process.stdout is not None
        try:
            seen = b""
            while b"holding" not in seen:
                chunk = await process.stdout.receive_some()
                if not chunk:
                    raise RuntimeError("the consumer process ended early")
                seen += chunk
            start = trio.current_time()
            process.send_signal(signal.SIGINT)
            await process.wait()
            seconds = trio.current_time() - start
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        return Outcome(seconds, *await left_behind(daemons))


#: Each case, and how many messages nsqd must hold ready again after it (the
#: SIGKILLed nsqd's are not counted: it is gone).
CASES: dict[str, tuple[Callable[[], Awaitable[Outcome]], int]] = {
    "async for, unanswered": (case_async_for, 3),
    "handler cancelled": (case_cancelled_handler, 15),
    "nsqd SIGKILLed": (case_sigkilled_nsqd, 0),
    "handler past close_timeout (1 s)": (case_close_timeout, 1),
    "Ctrl-C (process exit)": (case_ctrl_c, 3),
}


async def main(runs: int) -> None:
    print(f"leaving a Consumer, real nsqd v1.3.0, {runs} runs each (close_timeout 30 s)")
    print(f"  {'case':36} {'median':>9} {'max':>9}  left in flight / timed out")
    failed = False
    for name, (case, held) in CASES.items():
        outcomes = [await case() for _ in range(runs)]
        times = [o.seconds for o in outcomes]
        left = sum(o.in_flight for o in outcomes)
        timed_out = sum(o.timed_out for o in outcomes)
        missing = [o.held for o in outcomes if o.held != held]
        print(
            f"  {name:36} {statistics.median(times) * 1000:7.1f}ms {max(times) * 1000:7.1f}ms"
            f"  {left} / {timed_out}" + (f"  HELD {missing} != {held}" if missing else "")
        )
        failed = failed or bool(left or timed_out or missing)
    if failed:
        sys.exit("a run left something in flight, timed out, or lost messages")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    if reference.binary("nsqd") is None:
        sys.exit(f"no real nsqd: {reference.skip_reason()}")
    # The consumer's warnings (messages requeued on leaving, lost connections)
    # are the expected course of these cases.
    logging.disable(logging.WARNING)
    trio.run(main, args.runs)
