"""``trionsq stat``: poll ``/stats`` of a topic's nsqds and print a table, as ``nsq_stat``.

The nsqds are ``--nsqd-http-address`` (repeatable) or those found through
``--lookupd-http-address``.  Every ``--status-every`` (alias ``--interval``,
default 2s) the channel's numbers are summed over the nsqds and printed as a
row; the header is repeated every 25 rows::

    ------rate------+----------------depth----------------+--------------metadata---------------
    ingress  egress |   total     mem    disk inflt   def |     req     t-o         msgs clients
         10      10 |       0       0       0     0     0 |       0       0           50       1

``ingress`` is messages/s into the channel, ``egress`` messages/s out of it.
``--count N`` exits after N rows.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, TextIO

import trio

from .common import ToolError, add_http_client_flags, reason
from .flags import FlagSet, explained, go_int

if TYPE_CHECKING:
    import httpx

__all__ = ["configure", "prepare", "run", "ChannelTotals", "format_header", "format_row"]

HELP = "poll /stats of a topic's nsqds and print nsq_stat's table"

HEADER_EVERY = 25


def configure(flags: FlagSet) -> None:
    flags.string("topic", "", "NSQ topic")
    flags.string("channel", "", "NSQ channel")
    flags.strings("nsqd-http-address", "nsqd HTTP address (may be given multiple times)")
    flags.strings("lookupd-http-address", "lookupd HTTP address (may be given multiple times)")
    flags.duration(
        "interval", 2.0, "duration of time between polling/printing output", plain_seconds=True
    )
    # (None: not given; Go's flag.Value knows whether it was set)
    flags.var("count", _count, None, "number of reports")
    add_http_client_flags(flags, request_timeout=5.0)


def _count(text: str) -> int:
    """nsq_stat's ``-count`` (a flag.Value: its error is strconv's)."""
    try:
        return go_int(text)
    except ValueError:
        raise explained(f'strconv.ParseInt: parsing "{text}": invalid syntax') from None


def prepare(args: argparse.Namespace) -> None:
    if not args.topic or not args.channel:
        raise ToolError("--topic and --channel are required")
    if not args.nsqd_http_address and not args.lookupd_http_address:
        raise ToolError("--nsqd-http-address or --lookupd-http-address required")
    if args.nsqd_http_address and args.lookupd_http_address:
        raise ToolError("use --nsqd-http-address or --lookupd-http-address not both")
    for flag, addresses in (
        ("--nsqd-http-address", args.nsqd_http_address),
        ("--lookupd-http-address", args.lookupd_http_address),
    ):
        for address in addresses:
            if address.startswith(("http://", "https://")):
                raise ToolError(f"{flag} error - address should not contain scheme")
    if args.interval <= 0:
        raise ToolError("--interval should be positive")
    if args.count is not None and args.count <= 0:
        raise ToolError("--count should be positive")
    for timeout in (args.http_client_connect_timeout, args.http_client_request_timeout):
        if timeout <= 0:
            raise ToolError("--http-client-*-timeout should be positive")


@dataclass
class ChannelTotals:
    """One channel's numbers, summed over nsqds (clusterinfo's ChannelStats)."""

    depth: int = 0
    memory_depth: int = 0
    backend_depth: int = 0
    in_flight_count: int = 0
    deferred_count: int = 0
    requeue_count: int = 0
    timeout_count: int = 0
    message_count: int = 0
    client_count: int = 0

    def add(self, doc: dict[str, Any]) -> None:
        """Add one nsqd's ``/stats`` channel document (the admin's pages sum the
        same way, in a subclass: only these fields are counters)."""
        for f in fields(ChannelTotals):
            if f.name != "memory_depth":
                setattr(self, f.name, getattr(self, f.name) + int(doc.get(f.name) or 0))
        self.memory_depth += int(doc.get("depth") or 0) - int(doc.get("backend_depth") or 0)


def format_header() -> str:
    """nsq_stat's two header lines."""
    return (
        "------rate------+----------------depth----------------+"
        "--------------metadata---------------\n"
        f"{'ingress':>7} {'egress':>7} | {'total':>7} {'mem':>7} {'disk':>7} {'inflt':>5} "
        f"{'def':>5} | {'req':>7} {'t-o':>7} {'msgs':>12} {'clients':>7}"
    )


def format_row(now: ChannelTotals, before: ChannelTotals, seconds: float) -> str:
    """One row: rates from the change since ``before`` over ``seconds``."""
    ingress = int((now.message_count - before.message_count) / seconds)
    egress = int((now.message_count - before.message_count - (now.depth - before.depth)) / seconds)
    return (
        f"{ingress:>7} {egress:>7} | {now.depth:>7} {now.memory_depth:>7} "
        f"{now.backend_depth:>7} {now.in_flight_count:>5} {now.deferred_count:>5} | "
        f"{now.requeue_count:>7} {now.timeout_count:>7} {now.message_count:>12} "
        f"{now.client_count:>7}"
    )


def _http_error() -> type[Exception]:
    import httpx

    return httpx.HTTPError


def _base(address: str) -> str:
    return f"http://{address}".rstrip("/")


async def _producers(client: httpx.AsyncClient, args: argparse.Namespace) -> list[str]:
    """The nsqd HTTP addresses to poll."""
    if args.nsqd_http_address:
        return list(dict.fromkeys(args.nsqd_http_address))
    found: dict[str, None] = {}
    errors: list[str] = []
    for address in args.lookupd_http_address:
        try:
            response = await client.get(f"{_base(address)}/lookup", params={"topic": args.topic})
            if response.status_code == 404:
                continue
            response.raise_for_status()
            doc = response.json()
        except (_http_error(), ValueError) as exc:
            errors.append(f"{address}: {reason(exc, address)}")
            continue
        if "producers" not in doc and isinstance(doc.get("data"), dict):
            doc = doc["data"]
        for producer in doc.get("producers") or []:
            host, port = producer.get("broadcast_address"), producer.get("http_port")
            if host and port:
                found[f"[{host}]:{port}" if ":" in host else f"{host}:{port}"] = None
    if errors and len(errors) == len(args.lookupd_http_address):
        raise ToolError("failed to get topic producers - " + "; ".join(errors))
    return list(found)


async def _poll(client: httpx.AsyncClient, args: argparse.Namespace) -> ChannelTotals | None:
    totals = ChannelTotals()
    found = False
    for address in await _producers(client, args):
        try:
            response = await client.get(
                f"{_base(address)}/stats",
                params={"format": "json", "topic": args.topic, "channel": args.channel},
            )
            response.raise_for_status()
            doc = response.json()
        except (_http_error(), ValueError) as exc:
            raise ToolError(
                f"failed to get nsqd stats - {address}: {reason(exc, address)}"
            ) from None
        if "topics" not in doc and isinstance(doc.get("data"), dict):
            doc = doc["data"]
        for topic in doc.get("topics") or []:
            if topic.get("topic_name") != args.topic:
                continue
            for channel in topic.get("channels") or []:
                if channel.get("channel_name") == args.channel:
                    totals.add(channel)
                    found = True
    return totals if found else None


async def run(
    args: argparse.Namespace, prepared: None, stop: trio.Event, out: TextIO | None = None
) -> int:
    import httpx

    out = out if out is not None else sys.stdout
    timeout = httpx.Timeout(
        args.http_client_request_timeout, connect=args.http_client_connect_timeout
    )
    async with (
        httpx.AsyncClient(timeout=timeout) as client,
        trio.open_nursery() as nursery,
    ):

        async def on_stop() -> None:
            await stop.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(on_stop)
        previous: tuple[float, ChannelTotals] | None = None
        rows = 0
        i = 0
        while not args.count or rows < args.count:
            totals = await _poll(client, args)
            if totals is None:
                raise ToolError(
                    f"failed to find channel({args.channel}) in stats metadata "
                    f"for topic({args.topic})"
                )
            now = trio.current_time()
            if i % HEADER_EVERY == 0:
                print(format_header(), file=out, flush=True)
            if previous is not None:
                print(format_row(totals, previous[1], now - previous[0]), file=out, flush=True)
                rows += 1
            previous = (now, totals)
            i += 1
            if not args.count or rows < args.count:
                await trio.sleep(args.interval)
        nursery.cancel_scope.cancel()
    return 0
