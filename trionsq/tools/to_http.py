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
delay and backoff); the FINs of delivered messages go out together, within
5 ms.  ``--sample`` delivers only that fraction (the rest is
finished unsent); ``--header Name:Value`` adds a header.

SIGINT/SIGTERM: no new message is taken; requests under way get a second to
complete, then are cancelled, and whatever was not delivered is requeued.
"""

from __future__ import annotations

import argparse
import math
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
#: How long a delivered message's FIN may wait to go out with others (s).
FIN_DELAY = 0.005
#: FINs that go out at once, at most (and at most a quarter of --max-in-flight).
FIN_BATCH = 256


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
    """A worker's state: its scopes, and what it is delivering.

    ``scope`` is cancelled on stop while the worker waits for a message (not
    ``busy``); ``timer`` by the watchdog once ``deadline`` (of the request under
    way to endpoint ``index``) has passed, and replaced by a new one.
    """

    __slots__ = ("busy", "deadline", "index", "message", "scope", "timer")

    def __init__(self) -> None:
        self.scope = trio.CancelScope()
        self.timer = trio.CancelScope()
        self.busy = False
        self.deadline = math.inf
        self.index = 0
        self.message: Message | None = None


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

    timeout = args.http_client_request_timeout

    # Delivered messages are finished a few at a time (within FIN_DELAY, or
    # once FIN_BATCH wait), not one by one: a FIN of its own per answer costs
    # a write to nsqd, and wakes nsqd to send one message back, a read of its
    # own (on an idle machine, where answers come one per wake-up, that was a
    # third of the tool's CPU).  What waits counts as in flight, so a batch
    # is kept well under --max-in-flight; a stop finishes it at once.
    fins: list[Message] = []
    fin_batch = max(1, min(FIN_BATCH, args.max_in_flight // 4))
    fins_waiting = trio.Event()

    async def finish_delivered() -> None:
        nonlocal fins
        batch, fins = fins, []
        with trio.CancelScope(shield=True):  # delivered: FIN, whatever happens
            for message in batch:
                await message.finish()

    async def fin_timer() -> None:
        nonlocal fins_waiting
        while True:
            await fins_waiting.wait()
            fins_waiting = trio.Event()
            await trio.sleep(FIN_DELAY)
            if fins:
                await finish_delivered()

    async def delivered(message: Message) -> None:
        if not fins:
            fins_waiting.set()
        fins.append(message)
        if len(fins) >= fin_batch:
            await finish_delivered()

    async def deliver(
        me: _Worker, message: Message, conns: dict[int, HTTPConnection]
    ) -> str | None:
        """Deliver to the endpoint(s) the router picks; an error text, or None."""
        for index in router.pick():
            conn = conns.get(index)
            if conn is None:
                conn = conns[index] = HTTPConnection(
                    prepared.endpoints[index],
                    connect_timeout=args.http_client_connect_timeout,
                    request_timeout=None,  # the watchdog's
                )
            if method == "GET":
                _, target = request_target(args, urls[index], message.body)
                body = b""
            else:
                target, body = prepared.endpoints[index].target, message.body
            started = time.monotonic()
            progress.add("requests")
            me.index = index
            try:
                # The deadline counts from the request's start (connecting
                # included), not from the wait for a turn to connect.
                if conn.connected:
                    me.deadline = trio.current_time() + timeout
                    status = await conn.request(method, target, prepared.headers, body)
                else:
                    async with opening:
                        me.deadline = trio.current_time() + timeout
                        status = await conn.request(method, target, prepared.headers, body)
            except HTTPError as exc:
                router.mark(index, False)
                return f"{urls[index]}: {exc}"
            finally:
                me.deadline = math.inf
            elapsed = time.monotonic() - started
            ok = status == 200 if method == "GET" else 200 <= status < 300
            router.mark(index, ok, elapsed)
            if not ok:
                return f"{urls[index]}: got status code {status}"
            progress.time(elapsed)
        return None

    async def take(me: _Worker, consumer: Consumer, conns: dict[int, HTTPConnection]) -> None:
        """Take and deliver messages until stopped (or the consumer ends)."""
        # an iterator of this worker's own (each iteration a span, when traced)
        messages = aiter(consumer)
        while not stop.is_set():
            try:
                message = await anext(messages)
            except StopAsyncIteration:
                return
            me.busy = True
            me.message = message
            try:
                if args.sample < 1.0 and rng.random() > args.sample:
                    progress.add("skipped")
                    await message.finish()
                    continue
                error = await deliver(me, message, conns)
            except BaseException:
                # Cancelled mid-request: the stop grace ran out, or the stop
                # came as the message did (back to nsqd at once), or the
                # request timed out (the worker requeues it, see below).
                if not me.timer.cancel_called:
                    with trio.CancelScope(shield=True):
                        await message.requeue(0, backoff=False)
                raise
            finally:
                me.busy = False
            if error is None:
                progress.add("delivered")
                await delivered(message)
            else:
                progress.add("failed")
                progress.info["last error"] = error
                await message.requeue()
            me.message = None

    async def worker(consumer: Consumer) -> None:
        me = _Worker()
        states.append(me)
        conns: dict[int, HTTPConnection] = {}
        try:
            # Scopes for the worker's life, not one per message or request
            # (which cost ~12% of the tool's CPU): a stop cancels ``scope``
            # while the worker waits for a message, the watchdog ``timer``
            # when a request outlives --http-client-request-timeout.
            with me.scope:
                while True:
                    with me.timer:
                        await take(me, consumer, conns)
                        return
                    me.timer = trio.CancelScope()
                    message, me.message = me.message, None
                    if message is not None:
                        router.mark(me.index, False)
                        progress.add("failed")
                        progress.info["last error"] = f"{urls[me.index]}: request timed out"
                        with trio.CancelScope(shield=True):
                            await message.requeue()
        finally:
            for conn in conns.values():
                await conn.aclose()

    async def watchdog() -> None:
        """Cut off the requests that outlive the timeout (their connections
        are closed, their messages requeued).  A request starting later ends
        later than any under way, so sleeping until the earliest deadline
        under way (or a whole timeout) misses none."""
        while True:
            now = trio.current_time()
            earliest = now + timeout
            for w in states:
                if w.deadline <= now:
                    w.deadline = math.inf
                    w.timer.cancel()
                elif w.deadline < earliest:
                    earliest = w.deadline
            await trio.sleep_until(earliest)

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
                workers.start_soon(watchdog)
                workers.start_soon(fin_timer)
                try:
                    async with trio.open_nursery() as pool:
                        for _ in range(args.n):
                            pool.start_soon(worker, consumer)
                finally:
                    await finish_delivered()
                workers.cancel_scope.cancel()
        display.cancel_scope.cancel()
    progress.summary()
    return 0
