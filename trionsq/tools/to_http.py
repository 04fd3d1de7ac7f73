"""``trionsq to-http``: deliver a topic's messages to HTTP endpoints, as ``nsq_to_http``.

With ``--post URL`` (repeatable) each message body is POSTed
(``--content-type``, default ``application/octet-stream``); with ``--get URL``
the body, URL-escaped, replaces the ``%s`` in the URL.  ``-n`` requests (100)
are under way at once, each of ``-n`` workers keeping its own keep-alive
connection per endpoint.  ``--mode`` picks the endpoint: ``hostpool`` (the
default: in turn among the endpoints that work, a failing one left out for a
while), ``round-robin``, ``epsilon-greedy`` (mostly the fastest), or
``multicast`` (every endpoint; from older nsq_to_http).  A message is finished
when its request got a 2xx answer (200 for GET) within
``--http-client-request-timeout``, and requeued otherwise (with go-nsq's
delay and backoff).  ``--sample`` delivers only that fraction (the rest is
finished unsent); ``--header Name:Value`` adds a header.

SIGINT/SIGTERM: no new message is taken; requests under way get a second to
complete, then are cancelled, and whatever was not delivered is requeued.
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote_plus

import trio

from .. import __version__
from ..config import Config
from ..consumer import Consumer
from ..message import Message
from .common import (
    STOP_GRACE,
    ToolError,
    add_consumer_flags,
    add_http_client_flags,
    add_status_every,
    check_names,
    check_sources,
    consumer_options,
    require_sources,
)
from .flags import FlagSet
from .httpclient import Endpoint, HTTPConnection, HTTPError
from .progress import Progress
from .routing import MODES, Router

__all__ = ["configure", "prepare", "run", "request_target"]

HELP = "send a topic's messages to HTTP endpoints (nsq_to_http)"

DEFAULT_CONTENT_TYPE = "application/octet-stream"
#: Connections being opened at once (each with its first request).
NEW_CONNECTIONS = 4


def configure(flags: FlagSet) -> None:
    add_consumer_flags(flags, channel_default="nsq_to_http", many_topics=False)
    flags.strings(
        "get",
        "HTTP address to make a GET request to. '%s' will be printf replaced with data "
        "(may be given multiple times)",
    )
    flags.strings(
        "post",
        "HTTP address to make a POST request to.  data will be in the body "
        "(may be given multiple times)",
    )
    flags.strings("header", "Custom header for HTTP requests (may be given multiple times)")
    flags.string("content-type", DEFAULT_CONTENT_TYPE, "the Content-Type used for POST requests")
    flags.string(
        "mode",
        "hostpool",
        "the upstream request mode options: round-robin, hostpool (default), epsilon-greedy; "
        "also multicast (every endpoint, trionsq)",
    )
    flags.int("n", 100, "number of concurrent publishers")
    flags.float("sample", 1.0, "% of messages to publish (float b/w 0 -> 1)")
    add_http_client_flags(flags, request_timeout=20.0)
    add_status_every(flags, default=250, per="per handler")


@dataclass
class Prepared:
    options: dict[str, Any]
    endpoints: list[Endpoint]
    headers: list[tuple[str, str]]


def prepare(args: argparse.Namespace) -> Prepared:
    if not args.topic or not args.channel:
        raise ToolError("--topic and --channel are required")
    if args.content_type != DEFAULT_CONTENT_TYPE:
        if not args.post:
            raise ToolError("--content-type only used with --post")
        if not args.content_type:
            raise ToolError("--content-type requires a value when used")
    require_sources(args)
    if not args.get and not args.post:
        raise ToolError("--get or --post required")
    if args.get and args.post:
        raise ToolError("use --get or --post not both")
    for url in args.get:
        if url.count("%s") != 1:
            raise ToolError("invalid GET address - must be a printf string")
    if args.mode not in (*MODES, "multicast"):
        raise ToolError(f"invalid --mode {args.mode!r} (round-robin, hostpool, epsilon-greedy)")
    if not 0.0 <= args.sample <= 1.0:
        raise ToolError("--sample must be between 0.0 and 1.0")
    headers = [("User-Agent", f"trionsq-to-http/{__version__}")]
    for header in args.header:
        name, sep, value = header.partition(":")
        if not sep or not name.strip():
            raise ToolError("--header value format should be 'key=value'")
        headers.append((name.strip(), value.strip()))
    if args.post:
        headers.append(("Content-Type", args.content_type))
    if args.n < 1:
        raise ToolError("no handlers")
    for timeout in (args.http_client_connect_timeout, args.http_client_request_timeout):
        if timeout <= 0:
            raise ToolError("--http-client-*-timeout must be positive")
    endpoints = []
    for url in args.get or args.post:
        try:
            endpoints.append(Endpoint.parse(url.replace("%s", "", 1)))
        except ValueError as exc:
            raise ToolError(f"invalid endpoint {url!r}: {exc}") from None
    check_names([args.topic], args.channel)
    options = consumer_options(args)
    return Prepared(options, endpoints, headers)


class _Worker:
    """A worker's state, for stopping: its scope, and whether it is delivering."""

    __slots__ = ("busy", "scope")

    def __init__(self) -> None:
        self.scope = trio.CancelScope()
        self.busy = False


def request_target(args: argparse.Namespace, url: str, body: bytes) -> tuple[Endpoint, str]:
    """Where a GET of ``body`` goes: the URL with its ``%s`` replaced by the
    URL-escaped body (Go's ``url.QueryEscape``), parsed."""
    endpoint = Endpoint.parse(url.replace("%s", quote_plus(body), 1))
    return endpoint, endpoint.target


async def run(args: argparse.Namespace, prepared: Prepared, stop: trio.Event) -> int:
    await check_sources(Config(**prepared.options))
    urls: list[str] = args.get or args.post
    method = "GET" if args.get else "POST"
    router = Router(len(urls), args.mode)
    rng = random.Random()
    consumer: Consumer | None = None
    progress = Progress(
        f"to-http {args.topic}",
        ["delivered", "requests", "failed", "skipped"],
        rate_of="delivered",
        backlog=lambda: consumer.stats.in_flight if consumer is not None else 0,
        every=args.status_every,
    )
    states: list[_Worker] = []
    # New connections are opened a few at a time, each with its first request:
    # -n workers connecting at once would overflow a small server's accept
    # queue (a plain threaded server listens with a backlog of 5), and a
    # connection the server has not accepted yet looks open but never answers.
    opening = trio.Semaphore(NEW_CONNECTIONS)

    async def deliver(message: Message, conns: dict[int, HTTPConnection]) -> str | None:
        """Deliver to the endpoint(s) the router picks; an error text, or None."""
        for index in router.pick():
            conn = conns.get(index)
            if conn is None:
                conn = conns[index] = HTTPConnection(
                    prepared.endpoints[index],
                    connect_timeout=args.http_client_connect_timeout,
                    request_timeout=args.http_client_request_timeout,
                )
            if method == "GET":
                _, target = request_target(args, urls[index], message.body)
                body = b""
            else:
                target, body = prepared.endpoints[index].target, message.body
            started = time.monotonic()
            progress.add("requests")
            try:
                if conn.connected:
                    status = await conn.request(method, target, prepared.headers, body)
                else:
                    async with opening:
                        status = await conn.request(method, target, prepared.headers, body)
            except HTTPError as exc:
                router.mark(index, False)
                return f"{urls[index]}: {exc}"
            elapsed = time.monotonic() - started
            ok = status == 200 if method == "GET" else 200 <= status < 300
            router.mark(index, ok, elapsed)
            if not ok:
                return f"{urls[index]}: got status code {status}"
            progress.time(elapsed)
        return None

    async def worker(consumer: Consumer) -> None:
        me = _Worker()
        states.append(me)
        conns: dict[int, HTTPConnection] = {}
        try:
            # One scope for the worker's life (not one per message): a stop
            # cancels it while the worker waits for a message (not busy).
            with me.scope:
                while not stop.is_set():
                    try:
                        message = await consumer.__anext__()
                    except StopAsyncIteration:
                        return
                    me.busy = True
                    try:
                        if args.sample < 1.0 and rng.random() > args.sample:
                            progress.add("skipped")
                            await message.finish()
                            continue
                        error = await deliver(message, conns)
                    except BaseException:
                        # Cancelled mid-request (the stop grace ran out, or the
                        # stop came as the message did): back to nsqd.
                        with trio.CancelScope(shield=True):
                            await message.requeue(0, backoff=False)
                        raise
                    finally:
                        me.busy = False
                    if error is None:
                        progress.add("delivered")
                        await message.finish()
                    else:
                        progress.add("failed")
                        progress.info["last error"] = error
                        await message.requeue()
        finally:
            for conn in conns.values():
                await conn.aclose()

    async def on_stop(pool: trio.CancelScope) -> None:
        await stop.wait()
        for w in states:
            if not w.busy:
                w.scope.cancel()  # take no more; a busy one stops after its message
        await trio.sleep(STOP_GRACE)
        pool.cancel()  # what is still under way is requeued

    async with trio.open_nursery() as display:
        display.start_soon(progress.run)
        async with Consumer(args.topic, args.channel, **prepared.options) as consumer:
            async with trio.open_nursery() as workers:
                workers.start_soon(on_stop, workers.cancel_scope)
                async with trio.open_nursery() as pool:
                    for _ in range(args.n):
                        pool.start_soon(worker, consumer)
                workers.cancel_scope.cancel()
        display.cancel_scope.cancel()
    progress.summary()
    return 0
