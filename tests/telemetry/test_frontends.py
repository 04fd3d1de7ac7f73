"""The blocking and asyncio front ends: their producers' spans (parented by
the caller's own span, in the caller's thread or task), their consumers'
process spans (current where the application's code runs, linked to the
publish through the envelope), on fakensq and the real nsqd v1.3.0."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind, StatusCode

import trionsq
from trionsq import aio, blocking

from ..frontends.conftest import stats
from ..support.nodes import BlockingDaemons, BlockingNode
from .conftest import Otel
from .test_clients import RaisingProcessor

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


@pytest.mark.parametrize("front", ["blocking", "aio"])
def test_the_front_ends_report_timed_out_and_the_requeue_delay(
    nodes: BlockingDaemons, otel: Otel, front: str
) -> None:
    """As the Trio Consumer: a handler that outlives nsqd's msg_timeout
    (1 s here) is ``timed_out`` (nsqd redelivered the message), one that
    TOUCHes the message meanwhile is not; a requeue's span carries its delay
    (the default one, from the attempts, when none is given)."""
    nsqd = nodes.nsqd("--msg-timeout=1s")
    nsqd.scanned_channel(TOPIC, "slow")  # timeouts scanned at once
    with blocking.Producer([nsqd.tcp_address]) as producer:
        producer.multi_publish(TOPIC, [b"late", b"touching", b"failing", b"later"])
    options = {
        "nsqd_tcp_addresses": [nsqd.tcp_address],
        "max_in_flight": 4,
        "backoff": False,
        "default_requeue_delay": 0.05,
        **otel.options,
    }
    done = threading.Event()
    seen: list[tuple[bytes, int]] = []
    metrics: dict[str, list[tuple[dict[str, object], object]]] = {}

    def plan(message: blocking.Message | aio.Message) -> tuple[str, float]:
        """What the handler does: ('sleep'|'touch'|'raise'|'requeue'|'ok', seconds)."""
        seen.append((message.body, message.attempts))
        if len(seen) >= 7:
            done.set()
        if message.attempts > 1:
            return "ok", 0
        return {
            b"late": ("sleep", 2.5),
            b"touching": ("touch", 2.0),
            b"failing": ("raise", 0),
            b"later": ("requeue", 0.07),
        }[message.body]

    if front == "blocking":

        def handle(message: blocking.Message) -> None:
            what, seconds = plan(message)
            if what == "sleep":
                time.sleep(seconds)
            elif what == "touch":
                for _ in range(5):
                    time.sleep(seconds / 5)
                    message.touch()
            elif what == "raise":
                raise RuntimeError("failing")
            elif what == "requeue":
                message.requeue(seconds)

        with blocking.Consumer(TOPIC, "slow", handler=handle, concurrency=4, **options):
            assert done.wait(30)
            metrics.update(otel.metrics())  # while the consumer lives
    else:

        async def ahandle(message: aio.Message) -> None:
            what, seconds = plan(message)
            if what == "sleep":
                await asyncio.sleep(seconds)
            elif what == "touch":
                for _ in range(5):
                    await asyncio.sleep(seconds / 5)
                    await message.touch()
            elif what == "raise":
                raise RuntimeError("failing")
            elif what == "requeue":
                await message.requeue(seconds)

        async def main() -> None:
            async with aio.Consumer(TOPIC, "slow", handler=ahandle, **options):
                await asyncio.to_thread(done.wait, 30)
                metrics.update(otel.metrics())

        asyncio.run(main())
    assert done.is_set()
    outcomes = sorted(
        (
            a["messaging.nsq.message.attempts"],
            a["messaging.nsq.message.outcome"],
            a.get("messaging.nsq.message.requeue_delay"),
        )
        for a in (dict(s.attributes or {}) for s in otel.spans(f"process {TOPIC}"))
        if a["messaging.nsq.message.attempts"] == 1
    )
    assert outcomes == [
        (1, "finished", None),  # touching
        (1, "requeued", 0.05),  # failing: the default delay, 0.05 x 1 attempt
        (1, "requeued", 0.07),  # later
        (1, "timed_out", None),  # late
    ]
    # the consumer's counts, as the Trio Consumer's
    port = int(nsqd.tcp_address.rsplit(":", 1)[1])
    (consumed,) = [v for _, v in metrics["messaging.client.consumed.messages"]]
    assert isinstance(consumed, int) and consumed >= 7
    assert [a["server.port"] for a, _ in metrics["messaging.nsq.client.rdy"]] == [port]
    assert [a["server.port"] for a, _ in metrics["messaging.nsq.client.in_flight"]] == [port]
    settled = {
        a["messaging.nsq.message.outcome"]: v
        for a, v in metrics["messaging.nsq.client.settled.messages"]
    }
    assert settled["requeued"] == 2  # failing, later
    # late, failing and later came again
    assert sorted(body for body, attempts in seen if attempts == 2) == [
        b"failing",
        b"late",
        b"later",
    ]


@pytest.mark.parametrize("guest", [True, False], ids=["guest", "thread"])
def test_an_asyncio_publish_span_ends_with_its_answer(
    daemon: BlockingNode, otel: Otel, guest: bool
) -> None:
    """The traced asyncio publish methods stay plain methods returning the
    future (a gather makes no Task); each span starts at the call and ends
    when the answer comes, with nsqd's or the client's error."""

    async def main() -> tuple[int, int, int]:
        async with aio.Producer([daemon.tcp_address], guest=guest, **otel.options) as producer:
            await producer.publish(TOPIC, b"warm")
            loop = asyncio.get_running_loop()
            made = 0

            def factory(loop: asyncio.AbstractEventLoop, coro: object, **kw: object) -> object:
                nonlocal made
                made += 1
                return asyncio.Task(coro, loop=loop, **kw)  # type: ignore[arg-type]

            loop.set_task_factory(factory)  # type: ignore[arg-type]
            future = producer.publish(TOPIC, b"timed")
            returned = time.time_ns()
            assert isinstance(future, asyncio.Future)
            assert len(otel.spans()) == 1  # the warm one only: not ended at the call
            await future
            answered = time.time_ns()
            results = await asyncio.gather(
                producer.publish("bad topic!", b"x"),
                producer.multi_publish(TOPIC, []),
                producer.deferred_publish(TOPIC, b"later", 0.01),
                return_exceptions=True,
            )
            assert isinstance(results[0], trionsq.BadTopicError)
            assert isinstance(results[1], trionsq.BadBodyError)
            assert results[2] is None
        return made, returned, answered

    made, returned, answered = asyncio.run(main())
    assert made == 0
    _, timed = sorted(otel.spans(f"publish {TOPIC}"), key=lambda s: s.start_time or 0)
    assert timed.start_time is not None and timed.end_time is not None
    assert timed.start_time <= returned < timed.end_time <= answered
    errors = {
        s.name: dict(s.attributes or {}).get("error.type")
        for s in otel.spans()
        if s.status.status_code is StatusCode.ERROR
    }
    assert errors == {"publish bad topic!": "E_BAD_TOPIC", f"multi_publish {TOPIC}": "E_BAD_BODY"}
    assert len(otel.spans()) == 5


@pytest.mark.parametrize("front", ["blocking", "aio"])
def test_a_raising_sdk_costs_the_front_ends_nothing(
    daemon: BlockingNode, front: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A span processor that raises at every start and end: the front ends'
    publishes go out, their messages are delivered (unwrapped) and finished,
    the failure logged (a traceback once per client)."""
    provider = TracerProvider()
    provider.add_span_processor(RaisingProcessor())
    options = {
        "nsqd_tcp_addresses": [daemon.tcp_address],
        "tracer_provider": provider,
        "trace_context": True,
    }
    got: list[bytes] = []
    if front == "blocking":
        with blocking.Producer(**options) as producer:
            producer.multi_publish(TOPIC, [b"a", b"b"])
            producer.publish(TOPIC, b"c")
        three = threading.Event()

        def handle(message: blocking.Message) -> None:
            got.append(message.body)
            if len(got) == 3:
                three.set()

        with blocking.Consumer(TOPIC, "broken", handler=handle, **options):
            assert three.wait(20)
    else:

        async def main() -> None:
            async with aio.Producer(**options) as producer:
                await producer.multi_publish(TOPIC, [b"a", b"b"])
                await producer.publish(TOPIC, b"c")
            async with aio.Consumer(TOPIC, "broken", max_in_flight=3, **options) as consumer:
                async for message in consumer:
                    got.append(message.body)
                    await message.finish()
                    if len(got) == 3:
                        break

        asyncio.run(main())
    assert sorted(got) == [b"a", b"b", b"c"]
    channel = stats(daemon, TOPIC, "broken")
    assert (channel["requeue_count"], channel["in_flight_count"]) == (0, 0)
    failed = [
        r
        for r in caplog.records
        if r.name == "trionsq.telemetry" and r.levelname == "ERROR" and r.exc_info
    ]
    assert len(failed) == 2  # the producer's, the consumer's
