"""The blocking and asyncio front ends: their producers' spans (parented by
the caller's own span, in the caller's thread or task), their consumers'
process spans (current where the application's code runs, linked to the
publish through the envelope), on fakensq and the real nsqd v1.3.0."""

from __future__ import annotations

import asyncio
import threading

import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode

from trionsq import aio, blocking

from ..support.nodes import BlockingNode
from .conftest import Otel

TOPIC = "orders"


def producer_spans(otel: Otel) -> list[tuple[str, int | None, object]]:
    return sorted(
        (s.name, s.parent.span_id if s.parent else None, (s.attributes or {}).get("server.port"))
        for s in otel.spans()
        if s.kind is SpanKind.PRODUCER
    )


def check_processed(otel: Otel, group: str, count: int, current: list[trace.Span]) -> None:
    """``count`` process spans, each linked to a producer span, each the
    current span where the application's code ran."""
    produced = {
        s.context.span_id for s in otel.spans() if s.kind is SpanKind.PRODUCER and s.context
    }
    processed = otel.spans(f"process {TOPIC}")
    assert len(processed) == count
    for span in processed:
        attributes = dict(span.attributes or {})
        assert span.kind is SpanKind.CONSUMER
        assert attributes["messaging.consumer.group.name"] == group
        assert attributes["messaging.nsq.message.outcome"] == "finished"
        (link,) = span.links
        assert link.context.span_id in produced
    assert {s.get_span_context().span_id for s in current} == {
        s.context.span_id for s in processed if s.context
    }


@pytest.mark.parametrize("mode", ["iterate", "handler"])
def test_the_blocking_producer_and_consumer(daemon: BlockingNode, otel: Otel, mode: str) -> None:
    app = otel.tracer_provider.get_tracer("app")
    port = int(daemon.tcp_address.rsplit(":", 1)[1])
    options = {"trace_context": True, **otel.options}
    with (
        app.start_as_current_span("view") as view,
        blocking.Producer([daemon.tcp_address], **options) as producer,
    ):
        producer.publish(TOPIC, b"one")
        producer.multi_publish(TOPIC, [b"two", b"three"])
        producer.deferred_publish(TOPIC, b"four", 0.01)
        producer.publish_async(TOPIC, b"five").result(timeout=20)
    parent = view.get_span_context().span_id
    assert producer_spans(otel) == sorted(
        [
            (f"publish {TOPIC}", parent, port),
            (f"multi_publish {TOPIC}", parent, port),
            (f"deferred_publish {TOPIC}", parent, port),
            (f"publish {TOPIC}", parent, port),
        ]
    )
    got: list[bytes] = []
    current: list[trace.Span] = []
    five = threading.Event()

    def handle(message: blocking.Message) -> None:
        got.append(message.body)  # unwrapped
        current.append(trace.get_current_span())
        if len(got) == 5:
            five.set()

    address = [daemon.tcp_address]
    if mode == "iterate":
        with blocking.Consumer(
            TOPIC, "billing", nsqd_tcp_addresses=address, max_in_flight=10, **options
        ) as consumer:
            for message in consumer:
                handle(message)
                message.finish()
                if len(got) == 5:
                    break
    else:
        with blocking.Consumer(
            TOPIC, "billing", nsqd_tcp_addresses=address, handler=handle, concurrency=2, **options
        ):
            assert five.wait(20)
    assert sorted(got) == [b"five", b"four", b"one", b"three", b"two"]
    check_processed(otel, "billing", 5, current)


def test_a_failed_blocking_publish_is_an_error_span(daemon: BlockingNode, otel: Otel) -> None:
    with blocking.Producer([daemon.tcp_address], **otel.options) as producer:
        future = producer.publish_async("bad topic!", b"x")
        assert future.exception(timeout=20) is not None
    (span,) = otel.spans()
    assert span.status.status_code is StatusCode.ERROR
    assert dict(span.attributes or {})["error.type"] == "E_BAD_TOPIC"


@pytest.mark.parametrize("mode", ["iterate", "handler"])
def test_the_asyncio_producer_and_consumer(daemon: BlockingNode, otel: Otel, mode: str) -> None:
    app = otel.tracer_provider.get_tracer("app")
    options = {"trace_context": True, **otel.options}

    async def main() -> list[bytes]:
        with app.start_as_current_span("handler"):
            async with aio.Producer([daemon.tcp_address], **options) as producer:
                await producer.publish(TOPIC, b"first")
                await asyncio.gather(*(producer.publish(TOPIC, b"n%d" % i) for i in range(5)))
        got: list[bytes] = []
        six = asyncio.Event()

        async def handle(message: aio.Message) -> None:
            got.append(message.body)
            current.append(trace.get_current_span())
            if len(got) == 6:
                six.set()

        address = [daemon.tcp_address]
        if mode == "iterate":
            async with aio.Consumer(
                TOPIC, "feed", nsqd_tcp_addresses=address, max_in_flight=10, **options
            ) as consumer:
                async for message in consumer:
                    await handle(message)
                    await message.finish()
                    if len(got) == 6:
                        break
        else:
            async with aio.Consumer(
                TOPIC, "feed", nsqd_tcp_addresses=address, handler=handle, **options
            ):
                await asyncio.wait_for(six.wait(), 20)
        return got

    current: list[trace.Span] = []
    got = asyncio.run(main())
    assert sorted(got) == sorted([b"first", *(b"n%d" % i for i in range(5))])
    spans = producer_spans(otel)
    assert len(spans) == 6 and len({parent for _, parent, _ in spans}) == 1
    check_processed(otel, "feed", 6, current)
