"""Spans, metrics and links of the Trio clients, on fakensq and on the real
nsqd v1.3.0 (the ``daemons`` fixture), read with the SDK's in-memory exporter
and reader."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import SpanKind, StatusCode

import trionsq
from trionsq import telemetry
from trionsq.tracecontext import MAGIC, unwrap, wrap

from ..client.daemons import nothing_in_flight
from ..support.nodes import Daemons, Nsqd
from ..support.waiting import wait_until
from .conftest import Otel

TOPIC = "topic"


def consumer(nsqd: Nsqd, otel: Otel, **options: Any) -> trionsq.Consumer:
    return trionsq.Consumer(
        TOPIC, "chan", nsqd_tcp_addresses=[nsqd.tcp_address], **otel.options, **options
    )


def server(nsqd: Nsqd) -> dict[str, Any]:
    host, port = nsqd.tcp_address.rsplit(":", 1)
    return {"server.address": host, "server.port": int(port)}


def points(otel: Otel, name: str, **attributes: Any) -> list[Any]:
    """The values of metric ``name``'s points whose attributes include these."""
    found = otel.metrics().get(name, [])
    return [value for attrs, value in found if attributes.items() <= attrs.items()]


@pytest.mark.parametrize("mode", ["handler", "iterate"])
async def test_a_publish_and_its_processing_are_one_trace(
    daemons: Daemons, otel: Otel, mode: str
) -> None:
    nsqd = await daemons.nsqd()
    app = otel.tracer_provider.get_tracer("app")
    with app.start_as_current_span("request") as request:
        async with trionsq.Producer(
            [nsqd.tcp_address], trace_context=True, **otel.options
        ) as producer:
            await producer.publish(TOPIC, b"one")
            await producer.multi_publish(TOPIC, [b"m1", b"m2", b"m3"])
            await producer.deferred_publish(TOPIC, b"later", 0.05)
    got: list[bytes] = []
    current: list[trace.Span] = []

    def handle(message: trionsq.Message) -> None:
        got.append(message.body)
        current.append(trace.get_current_span())

    options: dict[str, Any] = {"trace_context": True, "max_in_flight": 10}
    if mode == "handler":
        async with consumer(nsqd, otel, handler=handle, **options) as c:
            await wait_until(lambda: len(got) == 5)
            metrics = otel.metrics()  # read while the consumer lives
    else:
        async with consumer(nsqd, otel, **options) as c:
            async for message in c:
                handle(message)
                await message.finish()
                if len(got) == 5:
                    break
            metrics = otel.metrics()
    assert sorted(got) == [b"later", b"m1", b"m2", b"m3", b"one"]
    await nothing_in_flight(nsqd, TOPIC, "chan")

    produced = {s.name: s for s in otel.spans() if s.kind is SpanKind.PRODUCER}
    assert set(produced) == {
        f"{op} {TOPIC}" for op in ("publish", "multi_publish", "deferred_publish")
    }
    for span in produced.values():
        assert span.parent is not None and span.parent.span_id == request.get_span_context().span_id
        assert span.attributes is not None
        expected = {
            "messaging.system": "nsq",
            "messaging.destination.name": TOPIC,
            "messaging.operation.type": "send",
            "messaging.operation.name": span.name.split()[0],
            **server(nsqd),
        }
        assert expected.items() <= dict(span.attributes).items()
        assert span.status.status_code is StatusCode.UNSET
    assert produced[f"multi_publish {TOPIC}"].attributes["messaging.batch.message_count"] == 3  # type: ignore[index]
    assert (
        produced[f"deferred_publish {TOPIC}"].attributes["messaging.nsq.message.defer_delay"]
        == 0.05
    )  # type: ignore[index]

    processed = otel.spans(f"process {TOPIC}")
    assert len(processed) == 5
    # bodies' sizes tell them apart: one, m1..m3, later
    operation = {3: "publish", 2: "multi_publish", 5: "deferred_publish"}
    by_span_id = {s.context.span_id: s.name.split()[0] for s in produced.values() if s.context}
    for span in processed:
        attributes = dict(span.attributes or {})
        assert span.kind is SpanKind.CONSUMER
        assert {
            "messaging.system": "nsq",
            "messaging.operation.type": "process",
            "messaging.destination.name": TOPIC,
            "messaging.consumer.group.name": "chan",
            "messaging.nsq.message.attempts": 1,
            "messaging.nsq.message.outcome": "finished",
            **server(nsqd),
        }.items() <= attributes.items()
        assert len(str(attributes["messaging.message.id"])) == 16
        # the creation context: a link to the producer's span, one trace
        (link,) = span.links
        assert (
            by_span_id[link.context.span_id] == operation[attributes["messaging.message.body.size"]]
        )  # type: ignore[index]
        assert link.context.trace_id == request.get_span_context().trace_id
    # the handler ran (the loop's body ran) inside its message's span
    assert {s.get_span_context().span_id for s in current} == {s.context.span_id for s in processed}

    assert points(
        otel, "messaging.client.sent.messages", **{"messaging.operation.name": "publish"}
    ) == [1]
    assert points(
        otel, "messaging.client.sent.messages", **{"messaging.operation.name": "multi_publish"}
    ) == [3]
    assert points(
        otel, "messaging.client.sent.messages", **{"messaging.operation.name": "deferred_publish"}
    ) == [1]
    assert sum(points(otel, "messaging.client.operation.duration", **server(nsqd))) == 3
    assert points(
        otel, "messaging.process.duration", **{"messaging.consumer.group.name": "chan"}
    ) == [5]
    group = {"messaging.destination.name": TOPIC, "messaging.consumer.group.name": "chan"}
    assert [
        v for a, v in metrics["messaging.client.consumed.messages"] if group.items() <= a.items()
    ] == [5]
    (rdy,) = [(a, v) for a, v in metrics["messaging.nsq.client.rdy"] if group.items() <= a.items()]
    assert rdy == (
        {**group, "messaging.system": "nsq", "messaging.operation.name": "process", **server(nsqd)},
        10,
    )
    assert [a["server.port"] for a, _ in metrics["messaging.nsq.client.in_flight"]] == [
        server(nsqd)["server.port"]
    ]
    assert [v for _, v in metrics["messaging.nsq.client.backoff.level"]] == [0]


async def test_outcomes_requeued_failed_given_up(daemons: Daemons, otel: Otel) -> None:
    nsqd = await daemons.nsqd()
    async with trionsq.Producer([nsqd.tcp_address]) as producer:
        await producer.multi_publish(TOPIC, [b"fail", b"later"])
    seen: list[tuple[bytes, int]] = []

    async def handle(message: trionsq.Message) -> None:
        seen.append((message.body, message.attempts))
        if message.body == b"fail":
            raise ValueError("no")
        if message.attempts == 1:
            await message.requeue(0.05, backoff=False)

    async with consumer(
        nsqd, otel, handler=handle, max_attempts=2, default_requeue_delay=0.02, backoff=False
    ):
        await wait_until(lambda: len(otel.spans()) == 5)
        metrics = otel.metrics()
    spans = sorted(otel.spans(), key=lambda s: s.start_time or 0)
    fail = [
        dict(s.attributes or {})
        for s in spans
        if s.attributes and s.attributes["messaging.message.body.size"] == 4
    ]
    later = [
        dict(s.attributes or {})
        for s in spans
        if s.attributes and s.attributes["messaging.message.body.size"] == 5
    ]
    outcome = "messaging.nsq.message.outcome"
    assert [(a["messaging.nsq.message.attempts"], a[outcome]) for a in fail] == [
        (1, "requeued"),
        (2, "requeued"),
        (3, "given_up"),
    ]
    assert [a.get("messaging.nsq.message.requeue_delay") for a in fail] == [0.02, 0.04, None]
    assert [a.get("error.type") for a in fail] == ["ValueError", "ValueError", None]
    failed = [s for s in spans if s.status.status_code is StatusCode.ERROR]
    assert len(failed) == 2 and all(e.name == "exception" for s in failed for e in s.events)
    assert [(a[outcome], a.get("messaging.nsq.message.requeue_delay")) for a in later] == [
        ("requeued", 0.05),
        ("finished", None),
    ]
    settled = {
        a["messaging.nsq.message.outcome"]: v
        for a, v in metrics["messaging.nsq.client.settled.messages"]
    }
    assert settled == {"finished": 1, "requeued": 3, "given_up": 1}
    errors = points(otel, "messaging.process.duration", **{"error.type": "ValueError"})
    assert errors == [2]


async def test_bad_envelopes_are_delivered_whole(
    daemons: Daemons, otel: Otel, caplog: pytest.LogCaptureFixture
) -> None:
    nsqd = await daemons.nsqd()
    parent = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    bad = {
        b"plain": "not_enveloped",
        MAGIC + b"\x01\x37" + parent[:20]: "truncated",
        MAGIC + b"\x02" + b"\x00\x00\x00body": "unknown_version",
        MAGIC + b"\x01\x05" + b"00-zz" + b"\x00\x00body": "malformed_context",
    }
    async with trionsq.Producer([nsqd.tcp_address]) as producer:
        await producer.multi_publish(TOPIC, list(bad))
    got: list[bytes] = []
    async with consumer(nsqd, otel, handler=lambda m: got.append(m.body), trace_context=True):
        await wait_until(lambda: len(got) == 4)
    assert sorted(got) == sorted(bad)  # whole, as published
    logged = [r.getMessage() for r in caplog.records if r.name == "trionsq.telemetry"]
    for problem in ("truncated", "unknown_version", "malformed_context"):
        assert any(f"unusable ({problem})" in line for line in logged), problem
    assert sum("without a trace context envelope" in line for line in logged) == 1
    problems = sorted((s.attributes or {})["messaging.nsq.envelope.problem"] for s in otel.spans())
    assert problems == sorted(bad.values())
    assert all(not s.links for s in otel.spans())
    # an envelope read by a consumer without the option: its bytes, as documented
    async with trionsq.Producer([nsqd.tcp_address], trace_context=True, **otel.options) as producer:
        await producer.publish(TOPIC, b"inside")
    async with consumer(nsqd, otel, handler=lambda m: got.append(m.body)):
        await wait_until(lambda: len(got) == 5)
    assert got[-1].startswith(MAGIC + b"\x01\x37") and got[-1].endswith(b"inside")
    await nothing_in_flight(nsqd, TOPIC, "chan")


async def test_a_refused_publish_is_an_error_span(daemons: Daemons, otel: Otel) -> None:
    nsqd = await daemons.nsqd("--max-msg-size=100")
    async with trionsq.Producer([nsqd.tcp_address], **otel.options) as producer:
        with pytest.raises(trionsq.BadMessageError):
            await producer.publish(TOPIC, b"x" * 200)
    (span,) = otel.spans()
    assert span.status.status_code is StatusCode.ERROR
    assert dict(span.attributes or {})["error.type"] == "E_BAD_MESSAGE"
    assert points(otel, "messaging.client.sent.messages", **{"error.type": "E_BAD_MESSAGE"}) == [1]


async def test_a_publish_with_no_nsqd_is_an_error_span(otel: Otel) -> None:
    async with trionsq.Producer(["127.0.0.1:1"], connect_timeout=2, **otel.options) as producer:
        with pytest.raises(trionsq.NSQConnectionError):
            await producer.publish(TOPIC, b"x")
    (span,) = otel.spans()
    assert span.status.status_code is StatusCode.ERROR
    assert dict(span.attributes or {})["error.type"] == "NSQConnectionError"


async def test_timed_out_messages_and_fin_failed(daemons: Daemons, otel: Otel) -> None:
    nsqd = await daemons.nsqd("--msg-timeout=1s")
    await nsqd.scanned_channel(TOPIC, "chan")  # timeouts scanned at once
    async with trionsq.Producer([nsqd.tcp_address]) as producer:
        await producer.publish(TOPIC, b"slow")
    done = trio.Event()

    async def handle(message: trionsq.Message) -> None:
        if message.attempts == 1:
            await trio.sleep(2.5)  # past nsqd's timeout: it redelivers
        else:
            done.set()

    async with consumer(nsqd, otel, handler=handle, max_in_flight=2, backoff=False):
        with trio.fail_after(20):
            await done.wait()
        await wait_until(lambda: len(otel.spans()) == 2)
        address = nsqd.tcp_address
        await wait_until(lambda: telemetry.counters.errors[address, "E_FIN_FAILED"] == 1)
        metrics = otel.metrics()
    outcomes = sorted(
        (a["messaging.nsq.message.attempts"], a["messaging.nsq.message.outcome"])
        for a in (dict(s.attributes or {}) for s in otel.spans())
    )
    assert outcomes == [(1, "timed_out"), (2, "finished")]
    assert [
        v
        for a, v in metrics["messaging.nsq.client.errors"]
        if a.get("server.port") == server(nsqd)["server.port"]
    ] == [1]


async def test_a_touched_message_is_not_timed_out(daemons: Daemons, otel: Otel) -> None:
    """nsqd's timeout starts again at each TOUCH: a handler that takes twice
    msg_timeout and touches the message meanwhile finishes it, and its span
    says so (timed_out counted from the last TOUCH, not the span's start)."""
    nsqd = await daemons.nsqd("--msg-timeout=1s")
    await nsqd.scanned_channel(TOPIC, "chan")
    async with trionsq.Producer([nsqd.tcp_address]) as producer:
        await producer.publish(TOPIC, b"long")
    done = trio.Event()

    async def handle(message: trionsq.Message) -> None:
        for _ in range(5):
            await trio.sleep(0.4)
            await message.touch()
        done.set()

    async with consumer(nsqd, otel, handler=handle):
        with trio.fail_after(20):
            await done.wait()
        await wait_until(lambda: len(otel.spans()) == 1)
    (span,) = otel.spans()
    attributes = dict(span.attributes or {})
    assert (
        attributes["messaging.nsq.message.attempts"],
        attributes["messaging.nsq.message.outcome"],
    ) == (1, "finished")
    assert telemetry.counters.errors[nsqd.tcp_address, "E_FIN_FAILED"] == 0


async def test_a_relay_keeps_each_messages_trace_context(daemons: Daemons, otel: Otel) -> None:
    """creation_context() in a handler is the context its message came with;
    publishes under carrying(contexts) envelope each body with its own (the
    publish span's for a body with none) and link their span to them."""
    nsqd = await daemons.nsqd()
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    async with trionsq.Producer([nsqd.tcp_address]) as plain:
        await plain.multi_publish(TOPIC, [wrap(b"a", parent, "k=v"), wrap(b"b")])
    seen: list[tuple[bytes, Any]] = []

    async def handle(message: trionsq.Message) -> None:
        seen.append((message.body, telemetry.creation_context()))

    async with consumer(nsqd, otel, handler=handle, trace_context=True, max_in_flight=2):
        await wait_until(lambda: len(seen) == 2)
    assert telemetry.creation_context() is None  # not outside a handler
    seen.sort()
    assert [(body, c and (c.traceparent, c.tracestate)) for body, c in seen] == [
        (b"a", (parent, "k=v")),
        (b"b", None),
    ]
    otel.exporter.clear()
    async with trionsq.Producer([nsqd.tcp_address], trace_context=True, **otel.options) as producer:
        with telemetry.carrying([c for _, c in seen]):
            await producer.multi_publish("relayed", [body for body, _ in seen])
    (span,) = otel.spans()
    links = [(f"{k.context.trace_id:032x}", f"{k.context.span_id:016x}") for k in span.links]
    assert links == [tuple(parent.split("-")[1:3])]
    got: list[Any] = []
    async with trionsq.Consumer(
        "relayed", "chan", nsqd_tcp_addresses=[nsqd.tcp_address], max_in_flight=2
    ) as raw:
        async for message in raw:
            got.append(unwrap(message.body))
            await message.finish()
            if len(got) == 2:
                break
    got.sort(key=lambda found: found.body)
    assert (got[0].body, got[0].traceparent, got[0].tracestate) == (b"a", parent, "k=v")
    ids = got[1].traceparent.split("-")[1:3]
    assert (got[1].body, ids) == (
        b"b",
        [f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}"],
    )


async def test_req_failed_is_counted(daemons: Daemons, otel: Otel) -> None:
    """A requeue after msg_timeout (nsqd gave the message out again): nsqd
    answers E_REQ_FAILED, counted by nsqd address and code, the span timed_out."""
    nsqd = await daemons.nsqd("--msg-timeout=1s")
    await nsqd.scanned_channel(TOPIC, "chan")
    async with trionsq.Producer([nsqd.tcp_address]) as producer:
        await producer.publish(TOPIC, b"slow")
    done = trio.Event()

    async def handle(message: trionsq.Message) -> None:
        if message.attempts == 1:
            await trio.sleep(2.5)
            raise ValueError("too late")  # REQ, after nsqd's timeout
        done.set()

    address = nsqd.tcp_address
    before = telemetry.counters.errors[address, "E_REQ_FAILED"]
    async with consumer(nsqd, otel, handler=handle, max_in_flight=2, backoff=False):
        with trio.fail_after(20):
            await done.wait()
        await wait_until(lambda: telemetry.counters.errors[address, "E_REQ_FAILED"] == before + 1)
        await wait_until(lambda: len(otel.spans()) == 2)
        metrics = otel.metrics()
    found = [
        (a["error.type"], v)
        for a, v in metrics["messaging.nsq.client.errors"]
        if a.get("server.port") == server(nsqd)["server.port"]
    ]
    assert found == [("E_REQ_FAILED", before + 1)]
    outcomes = sorted(
        (a["messaging.nsq.message.attempts"], a["messaging.nsq.message.outcome"])
        for a in (dict(s.attributes or {}) for s in otel.spans())
    )
    assert outcomes == [(1, "timed_out"), (2, "finished")]


async def test_the_backoff_level_is_reported(daemons: Daemons, otel: Otel) -> None:
    nsqd = await daemons.nsqd()
    async with trionsq.Producer([nsqd.tcp_address]) as producer:
        await producer.publish(TOPIC, b"fails")
    slow = trionsq.BackoffPolicy(base=30, max=30, jitter=0)  # stays backing off

    def handle(message: trionsq.Message) -> None:
        raise ValueError("a failure: backoff")

    async with consumer(nsqd, otel, handler=handle, backoff=slow) as c:
        await wait_until(lambda: c.stats.backoff_level == 1)
        metrics = otel.metrics()
    assert [v for _, v in metrics["messaging.nsq.client.backoff.level"]] == [1]


async def test_reconnects_are_counted(daemons: Daemons, otel: Otel) -> None:
    nsqd = await daemons.nsqd()
    quick = trionsq.BackoffPolicy(base=0.05, max=0.1)
    async with consumer(nsqd, otel, handler=lambda m: None, reconnect_backoff=quick) as c:
        await c.wait_connected()
        await nsqd.kill()
        await nsqd.start()
        await wait_until(lambda: telemetry.counters.reconnects[nsqd.tcp_address] >= 1)
        await wait_until(lambda: c.connections == [nsqd.tcp_address])
        metrics = otel.metrics()
    ports = [a["server.port"] for a, v in metrics["messaging.nsq.client.reconnects"] if v >= 1]
    assert server(nsqd)["server.port"] in ports


async def test_telemetry_off_and_sampler_off_record_nothing(daemons: Daemons, otel: Otel) -> None:
    nsqd = await daemons.nsqd()
    off = TracerProvider(sampler=ALWAYS_OFF)
    got: list[trionsq.Message] = []
    for options in ({**otel.options, "telemetry": False}, {"tracer_provider": off}):
        async with trionsq.Producer([nsqd.tcp_address], **options) as producer:
            assert producer.publish.__func__ is trionsq.Producer.publish  # type: ignore[attr-defined]
            await producer.publish(TOPIC, b"x")
        got.clear()
        async with trionsq.Consumer(
            TOPIC, "chan", nsqd_tcp_addresses=[nsqd.tcp_address], handler=got.append, **options
        ) as c:
            await wait_until(lambda: len(got) == 1)
            assert c._telemetry is None  # the plain path, untouched
    assert otel.spans() == []
    assert otel.metrics() == {}


class Raising(SpanExporter):
    def export(self, spans: Any) -> SpanExportResult:
        raise RuntimeError("the exporter broke")


class RaisingProcessor(SpanProcessor):
    """A span processor that raises at every span's start and end (the SDK
    passes those on to the caller: span.end() raises)."""

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        raise RuntimeError("the processor broke at the start")

    def on_end(self, span: Any) -> None:
        raise RuntimeError("the processor broke at the end")


@pytest.mark.parametrize(
    ("broken", "mode"),
    [("exporter", "handler"), ("processor", "handler"), ("processor", "iterate")],
)
async def test_an_sdk_that_raises_loses_nothing(
    daemons: Daemons, broken: str, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    nsqd = await daemons.nsqd()
    provider = TracerProvider()
    provider.add_span_processor(
        SimpleSpanProcessor(Raising()) if broken == "exporter" else RaisingProcessor()
    )
    options = {"tracer_provider": provider, "trace_context": True}
    async with trionsq.Producer([nsqd.tcp_address], **options) as producer:
        await producer.multi_publish(TOPIC, [b"a", b"b"])
        await producer.publish(TOPIC, b"c")
    got: list[bytes] = []
    address = [nsqd.tcp_address]
    if mode == "handler":
        async with trionsq.Consumer(
            TOPIC,
            "chan",
            nsqd_tcp_addresses=address,
            handler=lambda m: got.append(m.body),
            **options,
        ):
            await wait_until(lambda: len(got) == 3)
    else:
        async with trionsq.Consumer(TOPIC, "chan", nsqd_tcp_addresses=address, **options) as c:
            async for message in c:
                got.append(message.body)
                await message.finish()
                if len(got) == 3:
                    break
    assert sorted(got) == [b"a", b"b", b"c"]  # unwrapped, every one
    channel = await nothing_in_flight(nsqd, TOPIC, "chan")
    assert channel["requeue_count"] == 0
    if broken == "exporter":  # the SDK's processor logs its exporter's failures
        assert any("Exception while exporting" in r.getMessage() for r in caplog.records)
    else:  # trionsq logs the traceback once per client, then at debug level
        failed = [
            r
            for r in caplog.records
            if r.name == "trionsq.telemetry" and r.levelname == "ERROR" and r.exc_info
        ]
        assert len(failed) == 2  # the producer's, the consumer's
        assert "not affected" in failed[0].getMessage()
