"""The Spark source's agent: a process span per message set (the semantic
conventions' batch processing: kind CONSUMER, the batch's count, a link to
each message's creation context, the executor id), ended when the set is
resolved (finished at a commit, requeued otherwise), the process duration,
and the trace context envelope taken off each body (option trace_context).
The agent's QueryRun driven through its coordinator link, as a task's reads
and the coordinator's resolves reach it, on fakensq and the real nsqd."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from opentelemetry.trace import SpanKind

import trionsq

pytest.importorskip("trionsq.spark", reason="needs pyspark and pyarrow (the spark extra)")

from trionsq.spark._executor import ExecutorIdentity
from trionsq.spark._framing import FrameReceiver
from trionsq.spark._framing import send as send_frame
from trionsq.spark._held import from_ipc
from trionsq.spark._link import Link
from trionsq.spark._options import parse_source_options
from trionsq.spark._secure import QueryKeys
from trionsq.spark._telemetry import SourceTelemetry
from trionsq.spark.agent import COORDINATOR_LIMITS, Agent, QueryRun
from trionsq.spark.coordinator import LINK_LIMITS
from trionsq.tracecontext import MAGIC, wrap

from ..support.nodes import Daemons
from ..support.waiting import wait_until
from .conftest import Otel

TOPIC = "clicks"
ONE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TWO = "00-1bf7651916cd43dd8448eb211c80319c-c7ad6b7169203331-01"
#: an envelope cut short: delivered whole, said on the span
CUT = MAGIC + b"\x01\x37short"


class Coordinator:
    """The coordinator's end of the agent's link: every read is fresh, with
    set ids 1, 2, ...; resolves are sent on demand."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.frames = FrameReceiver(stream, LINK_LIMITS)
        self.next_set = 1
        self.answers: dict[int, dict[str, Any]] = {}

    async def serve(self) -> None:
        while True:
            header, _ = await self.frames()
            if header.get("op") == "read":
                answer = {"re": header["id"], "set": self.next_set, "fresh": True}
                self.next_set += 1
                await send_frame(self.stream, answer, b"")
            elif "re" in header:
                self.answers[header["re"]] = header

    async def resolve(self, ident: int, fin: list[int], req: list[int]) -> dict[str, Any]:
        await send_frame(self.stream, {"op": "resolve", "id": ident, "fin": fin, "req": req}, b"")
        await wait_until(lambda: ident in self.answers)
        return self.answers[ident]


@pytest.mark.parametrize("trace_context", [True, False])
async def test_a_set_is_a_process_span(daemons: Daemons, otel: Otel, trace_context: bool) -> None:
    nsqd = await daemons.nsqd()
    bodies = [wrap(b"one", ONE, "k=v"), wrap(b"two", TWO), b"plain", CUT, wrap(b"none")]
    async with trionsq.Producer([nsqd.tcp_address]) as producer:
        await producer.multi_publish(TOPIC, bodies)
    options = parse_source_options(
        {
            "topic": TOPIC,
            "channel": "spark",
            "nsqd_tcp_addresses": nsqd.tcp_address,
            "max_batch_wait": "0.3",
            "trace_context": str(trace_context).lower(),
        }
    )
    agent = Agent(ExecutorIdentity("7", "127.0.0.1", 1, 1), "unused", None)
    agent.pyarrow_ready.set()
    run = QueryRun(agent, QueryKeys("token", "cert", "key"), ("127.0.0.1", 1), options)
    run.telemetry = SourceTelemetry.start(options, "7", otel.tracer_provider, otel.meter_provider)
    ours, theirs = trio.testing.memory_stream_pair()
    run.link = Link(ours, COORDINATOR_LIMITS)
    coordinator = Coordinator(theirs)
    rows: list[bytes] = []
    sets: list[int] = []
    async with trio.open_nursery() as nursery:
        run._nursery = nursery
        run._ready.set()
        nursery.start_soon(run._receive_loop, run.link)
        nursery.start_soon(coordinator.serve)
        with trio.fail_after(30):
            while len(rows) < len(bodies):
                request = {"batch": 3, "partition": 1, "stage": 0, "attempt": 0, "task": 9}
                header, data = await run.read({**request, "limit": None})
                sets.append(header["set"])
                for batch in from_ipc(data):
                    rows.extend(batch.column("body").to_pylist())
            assert run.telemetry.tracer is not None
            assert otel.spans() == []  # under way until resolved
            answer = await coordinator.resolve(100, fin=sets, req=[])
            assert answer["finished"] == len(bodies)
            # a set read later and left to the query's end: requeued
            async with trionsq.Producer([nsqd.tcp_address]) as producer:
                await producer.publish(TOPIC, b"later")
            header, _ = await run.read({**request, "limit": None, "batch": 4})
            await run._release_everything()
        nursery.cancel_scope.cancel()
    unwrapped = [b"one", b"two", b"plain", CUT, b"none"]
    assert sorted(rows) == sorted(unwrapped if trace_context else bodies)
    spans = otel.spans(f"process {TOPIC}")
    assert len(spans) == len(sets) + 1
    done, left = spans[:-1], spans[-1]
    attributes = [dict(s.attributes or {}) for s in spans]
    for span, found in zip(spans, attributes, strict=True):
        assert span.kind is SpanKind.CONSUMER
        assert (
            found.items()
            >= {
                "messaging.system": "nsq",
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.destination.name": TOPIC,
                "messaging.consumer.group.name": "spark",
                "messaging.nsq.spark.executor_id": "7",
                "messaging.nsq.spark.partition_id": 1,
            }.items()
        )
        assert "messaging.message.id" not in found  # a batch's span
    assert sum(a["messaging.batch.message_count"] for a in attributes[:-1]) == len(bodies)
    assert [a["messaging.nsq.message.outcome"] for a in attributes] == ["finished"] * len(done) + [
        "requeued"
    ]
    assert attributes[-1]["messaging.nsq.spark.batch_id"] == 4
    linked = sorted(f"{k.context.trace_id:032x}" for s in done for k in s.links)
    problems = sum(a.get("messaging.nsq.envelope.problems", 0) for a in attributes)
    if trace_context:
        assert linked == [ONE.split("-")[1], TWO.split("-")[1]]
        assert problems == 1  # CUT
    else:
        assert (linked, problems) == ([], 0)
    assert left.links == ()
    durations = otel.metrics()["messaging.process.duration"]
    assert sum(count for _, count in durations) == len(spans)
    assert all(a["messaging.nsq.spark.executor_id"] == "7" for a, _ in durations)


def test_a_raising_sdk_costs_a_set_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """A span processor that raises at a set's span start and end: the set's
    bookkeeping goes on (logged once), its duration still recorded."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider

    from trionsq.message import Message
    from trionsq.spark._held import Held

    from .test_clients import RaisingProcessor

    options = parse_source_options(
        {"topic": TOPIC, "channel": "spark", "nsqd_tcp_addresses": "127.0.0.1:4150"}
    )
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(RaisingProcessor())
    reader = InMemoryMetricReader()
    traced = SourceTelemetry.start(options, "7", tracer_provider, MeterProvider([reader]))
    held = [Held(Message(b"%016d" % i, b"x", 1, 0, "n:1", None), 0.0) for i in range(3)]  # type: ignore[arg-type]
    for set_id in (1, 2):
        traced.began(set_id, held, 3, 0)
        traced.ended(set_id, "finished")
    failed = [r for r in caplog.records if r.name == "trionsq.telemetry" and r.exc_info]
    assert len(failed) == 1 and "not affected" in failed[0].getMessage()
    data = reader.get_metrics_data()
    assert data is not None
    (metric,) = [
        m
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "messaging.process.duration"
    ]
    assert [p.count for p in metric.data.data_points] == [2]
