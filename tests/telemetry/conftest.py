"""The telemetry tests' fixtures: ``daemons`` (fakensq's or the real ones) and
an OpenTelemetry SDK of the test's own (in-memory exporter and reader), given
to the clients through their Config: no global provider is set."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ..client.daemons import daemons
from ..frontends.conftest import daemon, nodes

__all__ = ["Otel", "daemon", "daemons", "nodes", "otel"]


@dataclass
class Otel:
    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader

    @property
    def options(self) -> dict[str, Any]:
        """The client options that record with this SDK."""
        return {"tracer_provider": self.tracer_provider, "meter_provider": self.meter_provider}

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        found = self.exporter.get_finished_spans()
        return [s for s in found if name is None or s.name == name]

    def metrics(self) -> dict[str, list[tuple[dict[str, Any], Any]]]:
        """Each metric's points: (attributes, value or the histogram's count)."""
        found: dict[str, list[tuple[dict[str, Any], Any]]] = {}
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data is not None else []:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    found[metric.name] = [
                        (dict(point.attributes or {}), getattr(point, "value", None)
                         if not hasattr(point, "count") else point.count)
                        for point in metric.data.data_points
                    ]  # fmt: skip
        return found


@pytest.fixture
def otel() -> Iterator[Otel]:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    yield Otel(tracer_provider, meter_provider, exporter, reader)
    tracer_provider.shutdown()
    meter_provider.shutdown()
