"""The blocking and asyncio front ends: their producers' spans (parented by
the caller's own span, in the caller's thread or task) and their consumers'
trace context envelope, on fakensq and the real nsqd v1.3.0.  (The front
ends' consumers have no process spans yet: see docs/observability.md.)"""

from __future__ import annotations

import asyncio

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


def test_the_blocking_producer_and_consumer(daemon: BlockingNode, otel: Otel) -> None:
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
    got = []
    with blocking.Consumer(
        TOPIC, "billing", nsqd_tcp_addresses=[daemon.tcp_address], max_in_flight=10, **options
    ) as consumer:
        for message in consumer:
            got.append(message.body)  # unwrapped
            message.finish()
            if len(got) == 5:
                break
    assert sorted(got) == [b"five", b"four", b"one", b"three", b"two"]


def test_a_failed_blocking_publish_is_an_error_span(daemon: BlockingNode, otel: Otel) -> None:
    with blocking.Producer([daemon.tcp_address], **otel.options) as producer:
        future = producer.publish_async("bad topic!", b"x")
        assert future.exception(timeout=20) is not None
    (span,) = otel.spans()
    assert span.status.status_code is StatusCode.ERROR
    assert dict(span.attributes or {})["error.type"] == "E_BAD_TOPIC"


def test_the_asyncio_producer_and_consumer(daemon: BlockingNode, otel: Otel) -> None:
    app = otel.tracer_provider.get_tracer("app")
    options = {"trace_context": True, **otel.options}

    async def main() -> list[bytes]:
        with app.start_as_current_span("handler"):
            async with aio.Producer([daemon.tcp_address], **options) as producer:
                await producer.publish(TOPIC, b"first")
                await asyncio.gather(*(producer.publish(TOPIC, b"n%d" % i) for i in range(5)))
        got = []
        async with aio.Consumer(
            TOPIC, "feed", nsqd_tcp_addresses=[daemon.tcp_address], max_in_flight=10, **options
        ) as consumer:
            async for message in consumer:
                got.append(message.body)
                await message.finish()
                if len(got) == 6:
                    break
        return got

    got = asyncio.run(main())
    assert sorted(got) == sorted([b"first", *(b"n%d" % i for i in range(5))])
    spans = producer_spans(otel)
    assert len(spans) == 6 and len({parent for _, parent, _ in spans}) == 1
