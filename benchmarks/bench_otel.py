"""What OpenTelemetry costs a drain, against the real nsqd v1.3.0, same run.

The load is bench_client.py's consume drain (N pre-filled 100-byte messages,
``async for``, FIN each, ``max_in_flight`` 2500, checked against nsqd's
``/stats``), each case in a fresh process of its own, the cases interleaved in
rotating order for ``--rounds`` rounds; the figures are medians of the
per-round ratios to the drain with no SDK (wall-clock rates; CPU per message
beside).  Cases:

- ``no SDK``: opentelemetry-api installed, no provider set (the baseline);
- ``otel not installed``: every import of opentelemetry fails (the extra
  not installed): the same path, which imports nothing of it;
- ``SDK, sampler off``: a global SDK TracerProvider with the ``always_off``
  sampler (the target: >= 0.9 of the baseline);
- ``SDK, sampler off, metrics``: and a global SDK MeterProvider (an
  in-memory reader, collected once at the end): the process duration is a
  histogram point a message;
- ``SDK, all sampled, batch``: the ``always_on`` sampler and a
  BatchSpanProcessor whose exporter drops what it is given (the cost of
  making, ending and queueing a span a message, not of any network).

    python benchmarks/bench_otel.py [--messages N] [--rounds R]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import bench_client  # noqa: E402
from bench_client import CHANNEL, IN_FLIGHT, Case, Row, Took  # noqa: E402

from tests import reference  # noqa: E402

#: the children's setups, by case name
SETUPS = ("plain", "blocked", "sdk_off", "sdk_off_metrics", "sdk_on_batch")


def _block_opentelemetry() -> None:
    class Block:
        def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
            if name == "opentelemetry" or name.startswith("opentelemetry."):
                raise ImportError(f"blocked: {name}")

    sys.meta_path.insert(0, Block())  # type: ignore[arg-type]


def _setup(case: str) -> Any:
    """Configure the child's OpenTelemetry as ``case`` says; returns what to
    shut down (flush) once the drain is timed."""
    if case == "blocked":
        _block_opentelemetry()
        return None
    if case == "plain":
        return None
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON

    class Drop(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider(sampler=ALWAYS_ON if case == "sdk_on_batch" else ALWAYS_OFF)
    if case == "sdk_on_batch":
        provider.add_span_processor(BatchSpanProcessor(Drop()))
    trace.set_tracer_provider(provider)
    if case == "sdk_off_metrics":
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader

        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        return reader
    return provider


def child(case: str, address: str, topic: str, count: int) -> None:
    """Drain ``count`` messages with ``case``'s setup; print the timings (JSON)."""
    keep = _setup(case)
    import trio

    import trionsq

    if case != "blocked":
        # imported when the consumer starts, once: outside the timing, as
        # the other imports are (tens of milliseconds on a busy machine)
        import trionsq.telemetry.otel

    async def main() -> None:
        received = 0
        async with trionsq.Consumer(
            topic, CHANNEL, nsqd_tcp_addresses=[address], max_in_flight=IN_FLIGHT
        ) as consumer:
            async for message in consumer:
                await message.finish()
                received += 1
                if received == count:
                    break

    gc.collect()
    wall, cpu = time.perf_counter(), bench_client._cpu_seconds()
    trio.run(main)
    wall, cpu = time.perf_counter() - wall, bench_client._cpu_seconds() - cpu
    imported = any(name.startswith("opentelemetry") for name in sys.modules)
    if keep is not None:
        # the metrics collected (or the spans flushed) once, after the timing
        if hasattr(keep, "get_metrics_data"):
            keep.get_metrics_data()
        else:
            keep.shutdown()
    print(json.dumps({"wall": wall, "cpu": cpu, "system": 0.0, "imported": imported}))


def run_child(case: str) -> Case:
    def run(nsqd: bench_client.Nsqd, topic: str, count: int) -> Took:
        import subprocess

        argv = [sys.executable, __file__, "--child", case, nsqd.tcp, topic, str(count)]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            raise RuntimeError(f"{case} failed ({out.returncode}): {out.stderr[-3000:]}")
        result = json.loads(out.stdout.strip().splitlines()[-1])
        if case == "blocked" and result["imported"]:
            raise AssertionError("opentelemetry imported while blocked")
        return Took(result["wall"], result["cpu"], count)

    labels = {
        "plain": "no SDK (baseline)",
        "blocked": "otel not installed",
        "sdk_off": "SDK, sampler off",
        "sdk_off_metrics": "SDK, sampler off, metrics",
        "sdk_on_batch": "SDK, all sampled, batch processor",
    }
    return Case(labels[case], "consume", run)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child", nargs=4, metavar=("CASE", "ADDRESS", "TOPIC", "COUNT"))
    args = parser.parse_args(argv)
    if args.child:
        case, address, topic, count = args.child
        child(case, address, topic, int(count))
        return 0
    if reference.binary("nsqd") is None:
        print(f"no real nsqd: {reference.skip_reason()}")
        return 1
    with bench_client.nsqd_daemon() as nsqd:
        cases = {name: (nsqd, run_child(name)) for name in SETUPS}
        series = bench_client.rounds(cases, args.messages, args.rounds, "otel")
        missed = bench_client.table(
            f"OpenTelemetry: drain {args.messages:,} messages with async for, FIN each, "
            f"RDY {IN_FLIGHT}, median of {args.rounds} per-round ratios to the drain with no SDK",
            cases,
            series,
            [
                Row("plain"),
                Row("blocked", "plain"),
                Row("sdk_off", "plain", 0.9),
                Row("sdk_off_metrics", "plain"),
                Row("sdk_on_batch", "plain"),
            ],
        )
    for line in missed:
        print(f"MISSED: {line}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
