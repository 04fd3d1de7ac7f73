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
from ..message import Message
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
    flags.bool("print-topic", False, "print topic name where message was received")


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


class _Stdout:
    """stdout, written in batches: messages are written to the buffer as they
    come, and the buffer is flushed (then what it held finished) whenever the
    consumers let the scheduler run, that is when no message is waiting or
    every few hundred messages.  A message is finished only once it reached
    stdout; one that could not be written (the reader left) is requeued."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.held: list[Message] = []
        self.wake = trio.Event()
        self.broken = False

    def write(self, data: bytes, message: Message) -> bool:
        """Buffer ``data``; False once stdout is gone."""
        if self.broken:
            return False
        try:
            self.out.write(data)
        except BrokenPipeError:
            self.broken = True
            return False
        self.held.append(message)
        if not self.wake.is_set():
            self.wake.set()
        return True

    async def flush_and_finish(self) -> None:
        held, self.held = self.held, []
        try:
            if not self.broken:
                self.out.flush()
        except BrokenPipeError:
            self.broken = True
        with trio.CancelScope(shield=True):
            for message in held:
                if self.broken:
                    await message.requeue(0, backoff=False)
                else:
                    await message.finish()

    async def run(self) -> None:
        while True:
            await self.wake.wait()
            self.wake = trio.Event()
            await self.flush_and_finish()


def _buffered_stdout() -> BinaryIO:
    """stdout with a buffer of its own, even under PYTHONUNBUFFERED: when to
    flush is decided by :class:`_Stdout`."""
    return open(sys.stdout.fileno(), "wb", buffering=1 << 16, closefd=False)


async def run(
    args: argparse.Namespace,
    options: dict[str, Any],
    stop: trio.Event,
    out: BinaryIO | None = None,
) -> int:
    stdout = _Stdout(out if out is not None else _buffered_stdout())
    await check_sources(Config(**options))
    done = trio.Event()
    scopes: list[trio.CancelScope] = []

    async def consume(topic: str) -> None:
        shown = 0
        prefix = topic.encode() + b" | " if args.print_topic else b""
        # Iterating (not a handler) keeps nsqd's delivery order on stdout.
        async with Consumer(topic, args.channel, **options) as consumer:
            try:
                with trio.CancelScope() as scope:
                    scopes.append(scope)
                    if done.is_set():
                        scope.cancel()
                    async for message in consumer:
                        if not stdout.write(prefix + message.body + b"\n", message):
                            # The reader went away: stop, leaving it unfinished.
                            await message.requeue(0, backoff=False)
                            done.set()
                            break
                        shown += 1
                        if args.n and shown >= args.n:
                            done.set()
                            break
            finally:
                # Before the consumer closes: what was written is flushed and finished.
                await stdout.flush_and_finish()
                if stdout.broken:
                    done.set()

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
        watcher.start_soon(stdout.run)
        async with trio.open_nursery() as consumers:
            for topic in dict.fromkeys(args.topics):
                consumers.start_soon(consume, topic)
        watcher.cancel_scope.cancel()
    return 0
