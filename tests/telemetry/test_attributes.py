"""telemetry_attributes: a client's own attributes on every span and metric
point; the Spark sink's producer carries its executor's id with them."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import trionsq

from ..support.nodes import Daemons
from ..support.waiting import wait_until
from .conftest import Otel

EXTRA = {"deployment.environment.name": "test", "messaging.nsq.spark.executor_id": "7"}


async def test_every_span_and_point_carries_them(daemons: Daemons, otel: Otel) -> None:
    nsqd = await daemons.nsqd()
    options = {**otel.options, "telemetry_attributes": EXTRA}
    async with trionsq.Producer([nsqd.tcp_address], **options) as producer:
        await producer.publish("t", b"x")
    got: list[bytes] = []
    async with trionsq.Consumer(
        "t",
        "c",
        nsqd_tcp_addresses=[nsqd.tcp_address],
        handler=lambda m: got.append(m.body),
        **options,
    ):
        await wait_until(lambda: got)
        metrics = otel.metrics()
    spans = otel.spans()
    assert len(spans) == 2
    for span in spans:
        assert EXTRA.items() <= dict(span.attributes or {}).items()
    for name, points in metrics.items():
        if name.startswith("messaging.") and not name.endswith(("reconnects", "errors")):
            assert points and all(
                EXTRA.items() <= attributes.items() for attributes, _ in points
            ), name


@pytest.mark.parametrize(
    "given", [{"a": [1]}, {1: "a"}, (("a",),)], ids=["list value", "int key", "not pairs"]
)
def test_they_are_checked(given: object) -> None:
    with pytest.raises(TypeError):
        trionsq.Config(telemetry_attributes=given)  # type: ignore[arg-type]


def test_they_are_kept_as_sorted_pairs() -> None:
    config = trionsq.Config(telemetry_attributes={"b": 1, "a": "x"})
    assert config.telemetry_attributes == (("a", "x"), ("b", 1))
    hash(config.telemetry_attributes)


def test_the_spark_sinks_spans_carry_the_executor_id(nsqd: object) -> None:
    # In a process of its own: the sink takes the global provider, as in a
    # Spark worker (no executor: identify() says "driver").
    code = textwrap.dedent(
        f"""
        import pyarrow as pa
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from pyspark.sql.types import BinaryType, StructField, StructType
        from trionsq.spark._options import parse_sink_options
        from trionsq.spark.sink import NSQBatchWriter

        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        writer = NSQBatchWriter(
            parse_sink_options({{"topic": "rows", "nsqd_tcp_addresses": {nsqd.tcp_address!r}}}),
            StructType([StructField("body", BinaryType())]),
        )
        writer.write(iter([pa.RecordBatch.from_pydict({{"body": [b"a", b"b"]}})]))
        (span,) = exporter.get_finished_spans()
        print(span.name, span.attributes["messaging.nsq.spark.executor_id"])
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["multi_publish", "rows", "driver"]
