"""``trionsq to-nsq``: copy topics to other nsqds, as ``nsq_to_nsq``.

Messages consumed from each ``--topic`` are published to
``--destination-topic`` (default: the topic's own name) on the
``--destination-nsqd-tcp-address``es, picked by ``--mode`` (``hostpool``, the
default: in turn among those that work; ``round-robin``; ``epsilon-greedy``).
A message is finished once a destination acknowledged it, and requeued (with
go-nsq's delay and backoff) when publishing failed.

Messages on their way are published in batches: what the consumer has
received goes out as one MPUB (up to 1,000 messages or 1 MiB), a few batches
under way at once, where nsq_to_nsq sends one pipelined PUB per message; the
destination sees the same messages, and a batch an nsqd refuses as a whole is
retried message by message.

JSON filters, for messages that are JSON objects: ``--require-json-field F``
passes only messages with the field (others are finished unsent; with
``--require-json-value V``, the field must equal V, as a string or a number,
and a message without the field is requeued); ``--whitelist-json-field F``
(repeatable) keeps only those fields.  A message that is not a JSON object is
then finished unsent.

``--output-trace-context`` wraps each published body in the trace context
envelope (docs/observability.md) and unwraps the consumed ones (unless
``--consumer-opt=trace_context=false``): a message that came with a context
keeps it on its copy, the others get the publish span's; the publish span
links to the contexts the batch came with.

SIGINT/SIGTERM: no new message is taken; what is being published gets a
second to be acknowledged, the rest is requeued.
"""

from __future__ import annotations

import argparse
import json
import math
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import trio

from ..config import Config
from ..consumer import Consumer
from ..message import Message
from ..producer import Producer
from ..protocol.errors import NSQError, NSQErrorResponse
from ..protocol.names import is_valid_topic_name
from ..telemetry import carrying, creation_context
from ..tracecontext import Unwrapped
from .common import (
    STOP_GRACE,
    ToolError,
    add_consumer_flags,
    add_status_every,
    check_sources,
    consumer_options,
    producer_options,
    require_sources,
)
from .flags import FlagSet
from .progress import Progress
from .routing import MODES, Router

__all__ = ["configure", "prepare", "run", "JsonFilter"]

HELP = "copy topics to other nsqds (nsq_to_nsq)"

#: The largest batch published as one MPUB: messages, and bytes of bodies.
BATCH_MESSAGES = 1000
BATCH_BYTES = 1 << 20
#: Batches being published at once, per topic.
BATCHES_IN_FLIGHT = 4


def configure(flags: FlagSet) -> None:
    add_consumer_flags(
        flags,
        channel_default="nsq_to_nsq",
        consumer_opt_help="see http://godoc.org/github.com/nsqio/go-nsq#Config",
    )
    flags.strings(
        "destination-nsqd-tcp-address",
        "destination nsqd TCP address (may be given multiple times)",
    )
    flags.string(
        "destination-topic",
        "",
        "use this destination topic for all consumed topics (default is consumed topic name)",
    )
    flags.var(
        "producer-opt",
        _producer_opt,
        [],
        "option to passthrough to nsq.Producer (may be given multiple times, "
        "see http://godoc.org/github.com/nsqio/go-nsq#Config)",
        join="append",
    )
    flags.string(
        "mode",
        "hostpool",
        "the upstream request mode options: round-robin, hostpool (default), epsilon-greedy",
    )
    flags.string(
        "require-json-field", "", "for JSON messages: only pass messages that contain this field"
    )
    flags.string(
        "require-json-value",
        "",
        "for JSON messages: only pass messages in which the required field has this value",
    )
    flags.strings(
        "whitelist-json-field", "for JSON messages: pass this field (may be given multiple times)"
    )
    flags.bool(
        "output-trace-context",
        False,
        "wrap each published body in trionsq's trace context envelope, keeping the context a "
        "consumed message came with (trionsq; unwraps the input unless "
        "--consumer-opt=trace_context=false; see docs/observability.md)",
    )
    add_status_every(flags, default=250, per="per destination")


def _producer_opt(text: str) -> tuple[str, str | None]:
    from .common import opt_pair

    return opt_pair(text)


@dataclass
class Prepared:
    consumer: dict[str, Any]
    producers: list[Config]
    json_filter: JsonFilter | None


def prepare(args: argparse.Namespace) -> Prepared:
    if not args.topics or not args.channel:
        raise ToolError("--topic and --channel are required")
    require_sources(args)
    if not args.destination_nsqd_tcp_address:
        raise ToolError("--destination-nsqd-tcp-address required")
    for topic in args.topics:
        if not is_valid_topic_name(topic):
            raise ToolError("--topic is invalid")
    if args.destination_topic and not is_valid_topic_name(args.destination_topic):
        raise ToolError("--destination-topic is invalid")
    if args.mode not in MODES:
        raise ToolError(f"invalid --mode {args.mode!r} (round-robin, hostpool, epsilon-greedy)")
    options = consumer_options(args)
    if args.output_trace_context:
        # the input's envelopes are taken off, not wrapped in a second one
        options.setdefault("trace_context", True)
    try:
        Consumer(args.topics[0], args.channel, **options)
    except (ValueError, TypeError) as exc:
        raise ToolError(str(exc)) from None
    producer = producer_options(args)
    if args.output_trace_context:
        producer["trace_context"] = True
    configs = [
        Config(nsqd_tcp_addresses=(address,), **producer)
        for address in dict.fromkeys(args.destination_nsqd_tcp_address)
    ]
    json_filter = None
    if args.require_json_field or args.whitelist_json_field:
        json_filter = JsonFilter(
            args.require_json_field, args.require_json_value, args.whitelist_json_field
        )
    return Prepared(options, configs, json_filter)


class JsonFilter:
    """nsq_to_nsq's JSON filters, for messages that are JSON objects."""

    def __init__(self, field: str, value: str, whitelist: list[str]) -> None:
        self.field = field
        self.value = value
        self.whitelist = whitelist
        try:
            self.number: float | None = float(value) if value else None
        except ValueError:
            self.number = None
        if self.number is not None and not math.isfinite(self.number):
            self.number = None

    def apply(self, body: bytes) -> tuple[str, bytes]:
        """``("pass", body)`` (maybe rewritten), ``("drop", b"")`` (finish it
        unsent) or ``("requeue", b"")`` (a required value with no field)."""
        try:
            doc = json.loads(body)
        except ValueError:
            return "drop", b""
        if not isinstance(doc, dict):
            return "drop", b""
        if self.field:
            if self.field not in doc:
                return ("requeue" if self.value else "drop"), b""
            if self.value:
                found = doc[self.field]
                if isinstance(found, str):
                    if found != self.value:
                        return "drop", b""
                elif (
                    self.number is None
                    or isinstance(found, bool)
                    or not isinstance(found, int | float)
                ):
                    return "drop", b""
                elif float(found) != self.number:
                    return "drop", b""
        if not self.whitelist:
            return "pass", body
        kept = {key: _go_number(doc[key]) for key in self.whitelist if key in doc}
        return "pass", _go_json(kept)


def _go_number(value: Any) -> Any:
    # Go decodes every JSON number as a float64 and writes whole ones as ints.
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    return value


def _go_json(doc: dict[str, Any]) -> bytes:
    """``json.Marshal`` of a map: sorted keys, compact, <, > and & escaped."""
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(char, escape)
    text = text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return text.encode()


async def run(args: argparse.Namespace, prepared: Prepared, stop: trio.Event) -> int:
    await check_sources(Config(**prepared.consumer))
    addresses = [config.nsqd_tcp_addresses[0] for config in prepared.producers]
    router = Router(len(addresses), args.mode)
    consumers: list[Consumer] = []
    destination = args.destination_topic
    progress = Progress(
        f"to-nsq {','.join(args.topics)} -> {destination or '(same)'}",
        ["published", "requeued", "filtered"],
        rate_of="published",
        backlog=lambda: sum(c.stats.in_flight for c in consumers),
        every=args.status_every,
    )
    async with AsyncExitStack() as stack:
        producers = [
            await stack.enter_async_context(Producer(config=c)) for c in prepared.producers
        ]
        display = await stack.enter_async_context(trio.open_nursery())
        display.start_soon(progress.run)
        async with trio.open_nursery() as copies:
            for topic in dict.fromkeys(args.topics):
                copies.start_soon(
                    _copy,
                    topic,
                    destination or topic,
                    args.channel,
                    prepared,
                    _Destinations(producers, addresses, router, progress),
                    consumers,
                    stop,
                )
        display.cancel_scope.cancel()
    progress.summary()
    return 0


#: a message taken, the body to publish, the trace context it came with
_Item = tuple[Message, bytes, Unwrapped | None]


@dataclass
class _Destinations:
    """Where the copies go: a producer for each destination nsqd (its
    address), the router choosing among them, and the progress counters."""

    producers: list[Producer]
    addresses: list[str]
    router: Router
    progress: Progress


async def _copy(
    topic: str,
    destination: str,
    channel: str,
    prepared: Prepared,
    destinations: _Destinations,
    consumers: list[Consumer],
    stop: trio.Event,
) -> None:
    """Copy one topic: take messages, filter them, publish them in batches."""
    progress = destinations.progress
    send, receive = trio.open_memory_channel[_Item](math.inf)
    json_filter = prepared.json_filter

    async def take(consumer: Consumer) -> None:
        async with send:
            async for message in consumer:
                body = message.body
                if json_filter is not None:
                    verdict, body = json_filter.apply(body)
                    if verdict == "drop":
                        progress.add("filtered")
                        await message.finish()
                        continue
                    if verdict == "requeue":
                        progress.add("requeued")
                        await message.requeue()
                        continue
                send.send_nowait((message, body, creation_context()))

    async def publish_batches() -> None:
        while True:
            try:
                first = await receive.receive()
            except trio.EndOfChannel:
                return
            batch = [first]
            size = len(first[1])
            while len(batch) < BATCH_MESSAGES and size < BATCH_BYTES:
                try:
                    item = receive.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
                batch.append(item)
                size += len(item[1])
            await _publish(batch, destination, destinations)

    async with Consumer(topic, channel, **prepared.consumer) as consumer:
        consumers.append(consumer)
        async with trio.open_nursery() as work:
            publishing = trio.CancelScope()
            taking = trio.CancelScope()

            async def on_stop() -> None:
                await stop.wait()
                taking.cancel()  # take no more; batches under way get STOP_GRACE
                await trio.sleep(STOP_GRACE)
                publishing.cancel()

            async def publishers() -> None:
                with publishing:
                    async with trio.open_nursery() as batches:
                        for _ in range(BATCHES_IN_FLIGHT):
                            batches.start_soon(publish_batches)

            async def taker() -> None:
                with taking:
                    await take(consumer)
                await send.aclose()

            work.start_soon(on_stop)
            work.start_soon(taker)
            await publishers()
            work.cancel_scope.cancel()
        # Taken but never published (stopped, or cancelled): back to nsqd.
        with trio.CancelScope(shield=True):
            for message, *_ in _drain(receive):
                await message.requeue(0, backoff=False)


def _drain(
    receive: trio.MemoryReceiveChannel[_Item],
) -> list[_Item]:
    left = []
    while True:
        try:
            left.append(receive.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
            return left


async def _publish(batch: list[_Item], topic: str, destinations: _Destinations) -> None:
    """Publish a batch: each message goes where the router sends it (as
    nsq_to_nsq routes every message), one MPUB per destination."""
    router = destinations.router
    if len(destinations.producers) == 1:
        groups = {0: batch}
    else:
        groups = {}
        for item in batch:
            groups.setdefault(router.pick()[0], []).append(item)
    if len(groups) == 1:
        ((index, items),) = groups.items()
        await _publish_to(index, items, topic, destinations)
        return
    async with trio.open_nursery() as nursery:
        for index, items in groups.items():
            nursery.start_soon(_publish_to, index, items, topic, destinations)


async def _publish_to(
    index: int, batch: list[_Item], topic: str, destinations: _Destinations
) -> None:
    """Publish to one destination; FIN on success, requeue on failure.  A
    batch refused as a whole goes again one by one."""
    router, progress = destinations.router, destinations.progress
    address = destinations.addresses[index]
    producer = destinations.producers[index]
    started = trio.current_time()
    try:
        try:
            # (each copy keeps the trace context its message came with)
            with carrying([context for *_, context in batch]):
                if len(batch) == 1:
                    await producer.publish(topic, batch[0][1])
                else:
                    await producer.multi_publish(topic, [body for _, body, _ in batch])
        except NSQErrorResponse as exc:
            if len(batch) == 1:
                raise
            # One message the destination refuses (too big, say) must not
            # hold back the others.
            progress.info["last error"] = f"{address}: {exc} (batch split)"
            for item in batch:
                await _publish_to(index, [item], topic, destinations)
            return
    except NSQError as exc:
        router.mark(index, False)
        progress.add("requeued", len(batch))
        progress.info["last error"] = f"{address}: {exc}"
        with trio.CancelScope(shield=True):
            for message, *_ in batch:
                await message.requeue()
        return
    except BaseException:
        with trio.CancelScope(shield=True):
            for message, *_ in batch:
                await message.requeue(0, backoff=False)
        raise
    elapsed = trio.current_time() - started
    router.mark(index, True, elapsed)
    with trio.CancelScope(shield=True):
        for message, *_ in batch:
            await message.finish()
    progress.time(elapsed)
    progress.add("published", len(batch))
