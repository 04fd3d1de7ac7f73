"""``trionsq to-nsq``: copy a topic to other nsqds, as ``nsq_to_nsq``.

Messages consumed from ``--topic`` are published to ``--destination-topic``
(default: the same name) on ``--destination-nsqd-tcp-address`` (repeatable;
round-robin, failing over to the next one when one is down).  A message is
finished once the destination acknowledged it, requeued when publishing failed.
SIGINT/SIGTERM stop cleanly: what is being published completes first.
"""

from __future__ import annotations

import argparse
import itertools
from contextlib import AsyncExitStack
from typing import Any

import trio

from ..config import Config
from ..consumer import Consumer
from ..message import Message
from ..producer import Producer
from ..protocol.errors import NSQError
from ..protocol.names import is_valid_topic_name
from .common import (
    add_consumer_flags,
    check_nsqds,
    check_sources,
    consumer_options,
    parse_opts,
    require_sources,
    stop_on_signals,
)
from .progress import Progress

__all__ = ["configure", "prepare", "run"]

HELP = "copy a topic to other nsqds (nsq_to_nsq)"


def configure(parser: argparse.ArgumentParser) -> None:
    add_consumer_flags(parser, channel_default="nsq_to_nsq")
    parser.add_argument(
        "--destination-nsqd-tcp-address",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="destination nsqd TCP address (may be given multiple times)",
    )
    parser.add_argument(
        "--destination-topic", default="", help="destination topic (default: --topic)"
    )
    parser.add_argument(
        "--producer-opt",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a trionsq.Config option for the destination producers (repeatable)",
    )
    parser.add_argument(
        "--status-every", type=float, default=5.0, help="seconds between plain status lines"
    )


def prepare(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    if len(args.topic) != 1:
        parser.error("--topic is required (once)")
    require_sources(parser, args)
    if not args.destination_nsqd_tcp_address:
        parser.error("--destination-nsqd-tcp-address required")
    args.destination_topic = args.destination_topic or args.topic[0]
    if not is_valid_topic_name(args.destination_topic):
        parser.error(f"invalid --destination-topic {args.destination_topic!r}")
    try:
        options = consumer_options(args)
        Consumer(args.topic[0], args.channel, **options)
        producer_options = parse_opts(args.producer_opt, "--producer-opt")
        producer_configs = [
            Config(nsqd_tcp_addresses=(address,), **producer_options)
            for address in dict.fromkeys(args.destination_nsqd_tcp_address)
        ]
    except (ValueError, TypeError) as exc:
        parser.error(str(exc))
    return {"consumer": options, "producers": producer_configs}


async def run(args: argparse.Namespace, prepared: dict[str, Any]) -> int:
    options: dict[str, Any] = prepared["consumer"]
    configs: list[Config] = prepared["producers"]
    for config in configs:
        await check_nsqds(config.nsqd_tcp_addresses, config)
    await check_sources(Config(**options))
    topic = args.destination_topic
    progress = Progress(
        f"to-nsq {args.topic[0]} -> {topic}",
        ["published", "requeued"],
        rate_of="published",
        backlog=lambda: consumer.stats.in_flight if consumer is not None else 0,
        interval=args.status_every,
    )
    consumer: Consumer | None = None
    async with AsyncExitStack() as stack:
        producers = [await stack.enter_async_context(Producer(config=c)) for c in configs]
        turn = itertools.count()

        async def forward(message: Message) -> None:
            start = next(turn)
            errors = []
            for step in range(len(producers)):
                producer = producers[(start + step) % len(producers)]
                try:
                    await producer.publish(topic, message.body)
                except NSQError as exc:
                    errors.append(f"{producer.config.nsqd_tcp_addresses[0]}: {exc}")
                    continue
                progress.add("published")
                return  # the consumer finishes it
            progress.add("requeued")
            progress.info["last error"] = errors[-1]
            await message.requeue()

        stop = await stack.enter_async_context(stop_on_signals())
        nursery = await stack.enter_async_context(trio.open_nursery())
        nursery.start_soon(progress.run)
        async with Consumer(args.topic[0], args.channel, handler=forward, **options) as consumer:
            await stop.wait()
        nursery.cancel_scope.cancel()
    progress.summary()
    return 0
