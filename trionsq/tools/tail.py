"""``trionsq tail``: consume topics and write the messages to stdout, as ``nsq_tail``.

Each message body is written followed by a newline (with ``--print-topic``,
prefixed by ``TOPIC | ``), then finished.  Without ``--channel`` an ephemeral
channel ``tail<6 digits>#ephemeral`` is used, which nsqd deletes when the tool
leaves.  ``-n N`` exits after N messages of a topic (asking for no more than N
at once); unlike nsq_tail, the last one is finished before leaving.
SIGINT/SIGTERM exit cleanly; so does a closed stdout (``| head``).
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
    ToolError,
    add_consumer_flags,
    check_names,
    check_sources,
    consumer_options,
    require_sources,
)
from .flags import FlagSet

__all__ = ["configure", "prepare", "run", "ephemeral_channel"]

HELP = "consume topics and write their messages to stdout (nsq_tail)"


def configure(flags: FlagSet) -> None:
    add_consumer_flags(
        flags, channel_default="", channel_help="NSQ channel", topic_help="NSQ topic"
    )
    flags.int("n", 0, "total messages to show (will wait if starved)")
    flags.bool("print-topic", "print topic name where message was received")


def ephemeral_channel(rng: random.Random | None = None) -> str:
    """nsq_tail's default channel name."""
    return f"tail{(rng or random.Random()).randrange(999999):06d}#ephemeral"


def prepare(args: argparse.Namespace) -> dict[str, Any]:
    if not args.channel:
        args.channel = ephemeral_channel()
    require_sources(args)
    if not args.topics:
        raise ToolError("--topic required")
    if 0 < args.n < args.max_in_flight:
        # Don't ask for more messages than we want (as nsq_tail).
        args.max_in_flight = args.n
    check_names(args.topics, args.channel)
    return consumer_options(args)


async def run(
    args: argparse.Namespace,
    options: dict[str, Any],
    stop: trio.Event,
    out: BinaryIO | None = None,
) -> int:
    out = out if out is not None else sys.stdout.buffer
    await check_sources(Config(**options))
    done = trio.Event()

    async def consume(topic: str) -> None:
        shown = 0
        prefix = topic.encode() + b" | " if args.print_topic else b""
        # Iterating (not a handler) keeps nsqd's delivery order on stdout.
        async with Consumer(topic, args.channel, **options) as consumer:
            with trio.CancelScope() as scope:
                scopes.append(scope)
                if done.is_set():
                    scope.cancel()
                async for message in consumer:
                    try:
                        out.write(prefix + message.body + b"\n")
                        out.flush()
                    except BrokenPipeError:
                        # The reader went away: stop, leaving it unfinished.
                        await message.requeue(0, backoff=False)
                        done.set()
                        break
                    await message.finish()
                    shown += 1
                    if args.n and shown >= args.n:
                        done.set()
                        break

    scopes: list[trio.CancelScope] = []

    async def on_done() -> None:
        await done.wait()
        for scope in scopes:
            scope.cancel()

    async def on_stop() -> None:
        await stop.wait()
        done.set()

    async with trio.open_nursery() as watcher:
        watcher.start_soon(on_stop)
        watcher.start_soon(on_done)
        async with trio.open_nursery() as consumers:
            for topic in dict.fromkeys(args.topics):
                consumers.start_soon(consume, topic)
        watcher.cancel_scope.cancel()
    return 0
