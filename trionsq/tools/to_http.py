"""``trionsq to-http``: deliver a topic's messages to HTTP endpoints, as ``nsq_to_http``.

With ``--post URL`` (repeatable) each message body is POSTed (``--content-type``,
default ``application/octet-stream``); with ``--get URL`` the body, URL-escaped,
replaces ``%s`` in the URL.  ``--mode round-robin`` (default) sends each
message to one endpoint in turn; ``--mode multicast`` to all of them.  A
message is finished when the request(s) got a 2xx answer within
``--http-timeout``, requeued otherwise.  SIGINT/SIGTERM stop cleanly.
"""

from __future__ import annotations

import argparse
import itertools
from typing import Any
from urllib.parse import quote_plus

import httpx
import trio

from ..config import Config
from ..consumer import Consumer
from ..message import Message
from .common import (
    add_consumer_flags,
    check_sources,
    consumer_options,
    parse_duration,
    require_sources,
    stop_on_signals,
)
from .progress import Progress

__all__ = ["configure", "prepare", "run", "request_for"]

HELP = "send a topic's messages to HTTP endpoints (nsq_to_http)"


def configure(parser: argparse.ArgumentParser) -> None:
    add_consumer_flags(parser, channel_default="nsq_to_http")
    parser.add_argument(
        "--get",
        action="append",
        default=[],
        metavar="URL",
        help="HTTP address to make a GET request to; '%%s' is replaced with the data "
        "(may be given multiple times)",
    )
    parser.add_argument(
        "--post",
        action="append",
        default=[],
        metavar="URL",
        help="HTTP address to make a POST request to; the data is the body "
        "(may be given multiple times)",
    )
    parser.add_argument(
        "--mode",
        choices=["round-robin", "multicast"],
        default="round-robin",
        help="which endpoints get a message: one in turn (default) or all",
    )
    parser.add_argument(
        "--content-type",
        default="application/octet-stream",
        help="the Content-Type used for POST requests",
    )
    parser.add_argument(
        "--http-timeout",
        type=parse_duration,
        default=20.0,
        help="timeout for HTTP connect/read/write (each; default 20s)",
    )
    parser.add_argument(
        "--status-every", type=float, default=5.0, help="seconds between plain status lines"
    )


def prepare(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    if len(args.topic) != 1:
        parser.error("--topic is required (once)")
    require_sources(parser, args)
    if not args.get and not args.post:
        parser.error("--get or --post required")
    if args.get and args.post:
        parser.error("use --get or --post not both")
    for url in args.get + args.post:
        try:
            parsed = httpx.URL(url.replace("%s", "x"))
        except httpx.InvalidURL as exc:
            parser.error(f"invalid endpoint {url!r}: {exc}")
        if parsed.scheme not in ("http", "https") or not parsed.host:
            parser.error(f"invalid endpoint {url!r}: expected an http(s) URL")
    if args.http_timeout <= 0:
        parser.error("--http-timeout must be positive")
    try:
        options = consumer_options(args)
        Consumer(args.topic[0], args.channel, **options)
    except (ValueError, TypeError) as exc:
        parser.error(str(exc))
    return options


def request_for(args: argparse.Namespace, endpoint: str, body: bytes) -> httpx.Request:
    """The request delivering ``body`` to ``endpoint`` (nsq_to_http's GET or POST)."""
    if args.get:
        return httpx.Request("GET", endpoint.replace("%s", quote_plus(body)))
    return httpx.Request(
        "POST", endpoint, content=body, headers={"Content-Type": args.content_type}
    )


async def run(args: argparse.Namespace, options: dict[str, Any]) -> int:
    await check_sources(Config(**options))
    endpoints: list[str] = args.get or args.post
    turn = itertools.count()
    progress = Progress(
        f"to-http {args.topic[0]}",
        ["delivered", "requests", "failed"],
        rate_of="delivered",
        backlog=lambda: consumer.stats.in_flight if consumer is not None else 0,
        interval=args.status_every,
    )
    consumer: Consumer | None = None
    timeout = httpx.Timeout(args.http_timeout)
    async with httpx.AsyncClient(timeout=timeout) as client:

        async def send(endpoint: str, body: bytes) -> str | None:
            progress.add("requests")
            try:
                response = await client.send(request_for(args, endpoint, body))
                await response.aclose()
            except httpx.HTTPError as exc:
                return f"{endpoint}: {exc or type(exc).__name__}"
            if not 200 <= response.status_code < 300:
                return f"{endpoint}: got status code {response.status_code}"
            return None

        async def deliver(message: Message) -> None:
            if args.mode == "multicast":
                targets = endpoints
            else:
                targets = [endpoints[next(turn) % len(endpoints)]]
            errors: list[str | None] = [None] * len(targets)

            async def one(i: int) -> None:
                errors[i] = await send(targets[i], message.body)

            async with trio.open_nursery() as nursery:
                for i in range(len(targets)):
                    nursery.start_soon(one, i)
            failed = [e for e in errors if e is not None]
            if failed:
                progress.add("failed")
                progress.info["last error"] = failed[-1]
                await message.requeue()
            else:
                progress.add("delivered")

        async with stop_on_signals() as stop, trio.open_nursery() as nursery:
            nursery.start_soon(progress.run)
            async with Consumer(args.topic[0], args.channel, handler=deliver, **options) as c:
                consumer = c
                await stop.wait()
            nursery.cancel_scope.cancel()
    progress.summary()
    return 0
