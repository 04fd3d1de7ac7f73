"""``trionsq tail``: consume a topic and write the messages to stdout, as ``nsq_tail``.

Each message body is written followed by a newline (with ``--print-topic``,
prefixed by ``TOPIC | ``), then finished.  Without ``--channel`` an ephemeral
channel ``tail<6 digits>#ephemeral`` is used, which nsqd deletes when the tool
leaves.  ``-n N`` exits after N messages; SIGINT/SIGTERM exit cleanly.
"""

from __future__ import annotations

import argparse
import random
import sys
from typing import Any, BinaryIO

import trio

from ..config import Config
from ..consumer import Consumer
from .common import (
    add_consumer_flags,
    check_sources,
    consumer_options,
    non_negative_int,
    require_sources,
    stop_on_signals,
)

__all__ = ["configure", "run"]

HELP = "consume a topic/channel and write its messages to stdout (nsq_tail)"


def configure(parser: argparse.ArgumentParser) -> None:
    add_consumer_flags(parser, channel_default=None)
    parser.add_argument(
        "-n",
        "--n",
        dest="n",
        type=non_negative_int,
        default=0,
        help="total messages to show, then exit (will wait if starved; 0: no limit)",
    )
    parser.add_argument(
        "--print-topic", action="store_true", help="print the topic name before each message"
    )


def ephemeral_channel(rng: random.Random | None = None) -> str:
    """nsq_tail's default channel name."""
    return f"tail{(rng or random.Random()).randrange(999999):06d}#ephemeral"


def prepare(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    if not args.topic:
        parser.error("--topic is required")
    require_sources(parser, args)
    if args.channel is None:
        args.channel = ephemeral_channel()
    if args.n and args.n < args.max_in_flight:
        # Don't ask for more messages than we want (as nsq_tail).
        args.max_in_flight = args.n
    try:
        options = consumer_options(args)
        for topic in args.topic:
            Consumer(topic, args.channel, **options)
    except (ValueError, TypeError) as exc:
        parser.error(str(exc))
    return options


async def run(
    args: argparse.Namespace, options: dict[str, Any], out: BinaryIO | None = None
) -> int:
    out = out if out is not None else sys.stdout.buffer
    await check_sources(Config(**options))
    shown = 0
    done = trio.Event()
    stop_scopes: list[trio.CancelScope] = []

    async def consume(topic: str) -> None:
        nonlocal shown
        # Iterating (not a handler) keeps nsqd's delivery order on stdout.
        async with Consumer(topic, args.channel, **options) as consumer:
            with trio.CancelScope() as scope:
                stop_scopes.append(scope)
                if done.is_set():
                    scope.cancel()
                async for message in consumer:
                    prefix = topic.encode() + b" | " if args.print_topic else b""
                    try:
                        out.write(prefix + message.body + b"\n")
                        out.flush()
                    except BrokenPipeError:
                        # The reader went away (``| head``): stop, leaving it unfinished.
                        await message.requeue(0, backoff=False)
                        done.set()
                        break
                    await message.finish()
                    shown += 1
                    if args.n and shown >= args.n:
                        done.set()
                        break

    async def stop_all(stop: trio.Event) -> None:
        await stop.wait()
        done.set()

    async def on_done() -> None:
        await done.wait()
        for scope in stop_scopes:
            scope.cancel()

    async with stop_on_signals() as stop, trio.open_nursery() as watcher:
        watcher.start_soon(stop_all, stop)
        watcher.start_soon(on_done)
        async with trio.open_nursery() as consumers:
            for topic in args.topic:
                consumers.start_soon(consume, topic)
        watcher.cancel_scope.cancel()
    return 0
