"""``trionsq pub``: publish stdin to a topic, one message per line, as ``to_nsq``.

stdin is split on ``--delimiter`` (default a newline; escapes like ``\\t`` or
``\\0`` are understood); empty records are skipped, and a last record without
a delimiter is published whole (to_nsq drops its last byte).  Like ``to_nsq``,
every record is published to *every* ``--nsqd-tcp-address`` given, and an nsqd
is connected to when there is something to publish.  Records are batched into
MPUBs (``--batch``) while stdin runs ahead; ``--rate N`` publishes N messages
a second, on a schedule kept from the first message (single PUBs while they
keep up, the messages due since in one MPUB when a round trip took longer).
The run ends at the end of stdin, or cleanly on SIGINT/SIGTERM (what was read
is published first).
"""

from __future__ import annotations

import argparse
import codecs
import os
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from functools import partial
from typing import Any

import trio

from ..config import Config
from ..producer import Producer
from ..protocol.errors import NSQError
from ..protocol.names import is_valid_topic_name
from .common import (
    ToolError,
    add_status_every,
    add_tls_flags,
    opt_pair,
    producer_options,
)
from .flags import FlagSet
from .progress import Progress

__all__ = ["Pace", "configure", "prepare", "publish_paced", "run", "split_records"]

HELP = "publish lines of stdin to a topic (to_nsq)"

_READ_SIZE = 64 * 1024


def configure(flags: FlagSet) -> None:
    flags.string("topic", "", "NSQ topic to publish to")
    flags.strings("nsqd-tcp-address", "destination nsqd TCP address (may be given multiple times)")
    flags.string("delimiter", "\n", "character to split input from stdin")
    flags.int("rate", 0, "Throttle messages to n/second. 0 to disable")
    flags.var(
        "producer-opt",
        opt_pair,
        [],
        "option to passthrough to nsq.Producer (may be given multiple times, "
        "http://godoc.org/github.com/nsqio/go-nsq#Config)",
        join="append",
    )
    flags.int("batch", 200, "most messages per MPUB (trionsq)")
    add_status_every(flags, default=0, per="trionsq: messages published")
    add_tls_flags(flags)


def prepare(args: argparse.Namespace) -> dict[str, Any]:
    if not args.topic:
        raise ToolError("--topic required")
    if not args.nsqd_tcp_address:
        raise ToolError("--nsqd-tcp-address required")
    try:
        # Escapes (\\t, \\0, \\x1f) are understood; a plain character is itself.
        delimiter = codecs.decode(args.delimiter, "unicode_escape").encode("latin-1")
    except (UnicodeError, ValueError):
        delimiter = args.delimiter.encode()
    if len(delimiter) != 1:
        raise ToolError("--delimiter must be a single byte")
    args.delimiter_byte = delimiter
    if not is_valid_topic_name(args.topic):
        raise ToolError(f"invalid topic name {args.topic!r}")
    if args.rate < 0:
        raise ToolError("--rate must be >= 0")
    if args.batch < 1:
        raise ToolError("--batch must be >= 1")
    options = producer_options(args)
    try:
        Config(nsqd_tcp_addresses=tuple(args.nsqd_tcp_address), **options)
    except (ValueError, TypeError) as exc:
        raise ToolError(str(exc)) from None
    return options


class Pace:
    """``--rate N``: when the messages are due, N a second from the first one.

    The schedule is kept, not restarted at each message: a publish that took
    longer than 1/N (its round trip, a busy machine, a timer's granularity)
    is made up by sending the messages due since in one MPUB, so the rate
    holds at N for as long as the connection carries N (Go's to_nsq v1.3.0
    falls well short of N: benchmarks/bench_pub_rate.py).  What is made up is bounded
    by ``burst`` messages: a source that paused (stdin idle) does not earn a
    burst beyond that.
    """

    def __init__(self, rate: int, burst: int) -> None:
        self.period = 1.0 / rate
        self.burst = max(1, burst)
        self._start: float | None = None
        self._count = 0

    def next_due(self, now: float) -> float:
        """When the next message is due (``now`` or earlier if it is)."""
        if self._start is None:
            self._start = now
        # The credit is bounded: behind by more than a burst, the schedule moves.
        behind = now - (self._start + self._count * self.period)
        if behind > self.burst * self.period:
            self._start += behind - self.burst * self.period
        return self._start + self._count * self.period

    def due(self, now: float, most: int) -> int:
        """How many messages are due at ``now`` (at least 1, at most ``most``)."""
        assert self._start is not None
        due = int((now - self._start) / self.period) + 1 - self._count
        return max(1, min(most, due))

    def sent(self, count: int) -> None:
        self._count += count


async def publish_paced(
    receive: trio.MemoryReceiveChannel[bytes],
    rate: int,
    batch: int,
    send: Callable[[list[bytes]], Awaitable[bool]],
) -> None:
    """Hand the records of ``receive`` to ``send`` at ``rate`` a second (lists of
    at most ``batch``), until the channel ends or ``send`` says False."""
    # Up to 50 ms of lateness is made up (in lists of ``batch`` at most).
    pace = Pace(rate, burst=max(batch, rate // 20))
    async with receive:
        async for record in receive:
            await trio.sleep_until(pace.next_due(trio.current_time()))
            records = [record]
            due = pace.due(trio.current_time(), most=batch)
            while len(records) < due:
                try:
                    records.append(receive.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            pace.sent(len(records))
            if not await send(records):
                return


def split_records(buffer: bytes, delimiter: bytes) -> tuple[list[bytes], bytes]:
    """Whole records (non-empty) in ``buffer``, and the unfinished rest."""
    *records, rest = buffer.split(delimiter)
    return [r for r in records if r], rest


async def _read_stdin(
    send: trio.MemorySendChannel[bytes], delimiter: bytes, fd: int, progress: Progress
) -> None:
    async with send:
        try:
            await _read_records(send, delimiter, fd, progress)
        except trio.BrokenResourceError:
            pass  # the publisher gave up: it reports why


async def _read_records(
    send: trio.MemorySendChannel[bytes], delimiter: bytes, fd: int, progress: Progress
) -> None:
    rest = b""
    while True:
        # A thread per read: stdin may be a terminal or a pipe, and must stay blocking.
        chunk = await trio.to_thread.run_sync(os.read, fd, _READ_SIZE, abandon_on_cancel=True)
        if not chunk:
            break
        records, rest = split_records(rest + chunk, delimiter)
        for record in records:
            progress.add("read")
            await send.send(record)
    if rest:
        progress.add("read")
        await send.send(rest)


async def run(
    args: argparse.Namespace, options: dict[str, Any], stop: trio.Event, fd: int | None = None
) -> int:
    addresses: list[str] = list(dict.fromkeys(args.nsqd_tcp_address))
    configs = [Config(nsqd_tcp_addresses=(a,), **options) for a in addresses]
    send, receive = trio.open_memory_channel[bytes](max(args.batch * 4, 1024))
    progress = Progress(
        f"pub {args.topic}",
        ["read", "published"],
        rate_of="published",
        backlog=lambda: receive.statistics().current_buffer_used,
        every=args.status_every,
    )
    failure: list[str] = []

    async def send_batch(producers: list[Producer], batch: list[bytes]) -> bool:
        try:
            for producer in producers:
                if len(batch) == 1:
                    await producer.publish(args.topic, batch[0])
                else:
                    await producer.multi_publish(args.topic, batch)
        except NSQError as exc:
            failure.append(str(exc))
            return False
        progress.add("published", len(batch))
        return True

    async def publish(producers: list[Producer]) -> None:
        async with receive:
            async for record in receive:
                batch = [record]
                while len(batch) < args.batch:
                    try:
                        batch.append(receive.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                if not await send_batch(producers, batch):
                    return

    async def publish_at_rate(producers: list[Producer]) -> None:
        await publish_paced(receive, args.rate, args.batch, partial(send_batch, producers))

    async with trio.open_nursery() as nursery:
        producers = [Producer(config=config) for config in configs]
        async with trio.open_nursery() as display:
            display.start_soon(progress.run)
            async with AsyncExitStack() as stack:
                for producer in producers:
                    await stack.enter_async_context(producer)
                async with trio.open_nursery() as work:
                    reader_scope = trio.CancelScope()

                    async def read() -> None:
                        with reader_scope:
                            await _read_stdin(send, args.delimiter_byte, fd or 0, progress)

                    async def on_stop() -> None:
                        await stop.wait()
                        reader_scope.cancel()  # what was read still gets published

                    work.start_soon(read)
                    nursery.start_soon(on_stop)
                    work.start_soon(publish_at_rate if args.rate else publish, producers)
            display.cancel_scope.cancel()
        nursery.cancel_scope.cancel()
    progress.summary()
    if failure:
        raise ToolError(f"publishing failed: {failure[0]}")
    return 0
