"""``trionsq pub``: publish stdin to a topic, one message per line, as ``to_nsq``.

stdin is split on ``--delimiter`` (default a newline; escapes like ``\\t`` or
``\\0`` are understood); empty records are skipped.  Like ``to_nsq``, every
record is published to *every* ``--nsqd-tcp-address`` given.  Records are
batched into MPUBs while stdin runs ahead; ``--rate N`` limits publishing to N
messages a second (single PUBs).  The run ends at the end of stdin, or cleanly
on SIGINT/SIGTERM (what was read is published first).
"""

from __future__ import annotations

import argparse
import codecs
import math
import os
from contextlib import AsyncExitStack
from typing import Any

import trio

from ..config import Config
from ..producer import Producer
from ..protocol.errors import NSQError
from ..protocol.names import is_valid_topic_name
from .common import (
    ToolError,
    add_tls_flags,
    check_nsqds,
    parse_opts,
    positive_int,
    stop_on_signals,
    tls_options,
)
from .progress import Progress

__all__ = ["configure", "prepare", "run", "split_records"]

HELP = "publish lines of stdin to a topic (to_nsq)"

_READ_SIZE = 64 * 1024


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--topic", required=True, help="NSQ topic to publish to")
    parser.add_argument(
        "--nsqd-tcp-address",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="destination nsqd TCP address (may be given multiple times)",
    )
    parser.add_argument(
        "--delimiter", default="\\n", help="character to split input on (default '\\n')"
    )
    parser.add_argument(
        "--rate", type=float, default=0.0, help="throttle messages to N/second (0: no limit)"
    )
    parser.add_argument(
        "--batch", type=positive_int, default=200, help="most messages per MPUB (default 200)"
    )
    parser.add_argument(
        "--producer-opt",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a trionsq.Config option for the producers (repeatable)",
    )
    parser.add_argument(
        "--status-every", type=float, default=5.0, help="seconds between plain status lines"
    )
    add_tls_flags(parser)


def prepare(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    if not args.nsqd_tcp_address:
        parser.error("--nsqd-tcp-address required")
    if not is_valid_topic_name(args.topic):
        parser.error(f"invalid topic name {args.topic!r}")
    try:
        delimiter = codecs.decode(args.delimiter, "unicode_escape").encode("latin-1")
    except (UnicodeError, ValueError):
        parser.error(f"invalid --delimiter {args.delimiter!r}")
    if len(delimiter) != 1:
        parser.error("--delimiter must be a single character")
    args.delimiter_byte = delimiter
    if args.rate < 0 or not math.isfinite(args.rate):
        parser.error("--rate must be >= 0")
    try:
        options = {**tls_options(args), **parse_opts(args.producer_opt, "--producer-opt")}
        Config(nsqd_tcp_addresses=tuple(args.nsqd_tcp_address), **options)
    except (ValueError, TypeError) as exc:
        parser.error(str(exc))
    return options


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


async def run(args: argparse.Namespace, options: dict[str, Any], fd: int | None = None) -> int:
    addresses: list[str] = list(dict.fromkeys(args.nsqd_tcp_address))
    configs = [Config(nsqd_tcp_addresses=(a,), **options) for a in addresses]
    for config in configs:
        await check_nsqds(config.nsqd_tcp_addresses, config)
    send, receive = trio.open_memory_channel[bytes](max(args.batch * 4, 1024))
    progress = Progress(
        f"pub {args.topic}",
        ["read", "published"],
        rate_of="published",
        backlog=lambda: receive.statistics().current_buffer_used,
        interval=args.status_every,
    )
    interval = 1.0 / args.rate if args.rate else 0.0
    failure: list[str] = []

    async def publish(producers: list[Producer]) -> None:
        next_at = trio.current_time()
        async with receive:
            async for record in receive:
                batch = [record]
                if not interval:
                    while len(batch) < args.batch:
                        try:
                            batch.append(receive.receive_nowait())
                        except (trio.WouldBlock, trio.EndOfChannel):
                            break
                else:
                    await trio.sleep_until(next_at)
                    next_at = max(next_at, trio.current_time()) + interval
                try:
                    for producer in producers:
                        if len(batch) == 1:
                            await producer.publish(args.topic, batch[0])
                        else:
                            await producer.multi_publish(args.topic, batch)
                except NSQError as exc:
                    failure.append(str(exc))
                    return
                progress.add("published", len(batch))

    async with stop_on_signals() as stop, trio.open_nursery() as nursery:
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
                    work.start_soon(publish, producers)
            display.cancel_scope.cancel()
        nursery.cancel_scope.cancel()
    progress.summary()
    if failure:
        raise ToolError(f"publishing failed: {failure[0]}")
    return 0
