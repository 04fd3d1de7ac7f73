"""NSQ into Parquet with Spark (local[2]), against a same-run baseline with no NSQ.

The NSQ run: N messages of 100 bytes wait in a fakensq nsqd (a thread of this
process); a query reads them with ``format("nsq")`` (trigger availableNow, 2500
messages per trigger: nsqd's default RDY budget) and writes Parquet.  Its time
covers everything from ``start()`` to the end of the query: connecting, every
micro-batch, every FIN, and the idle wait that tells the source the channel is
drained.

The baseline: the same query over a Python streaming data source with no NSQ
behind it, producing the same N rows (same schema, same bodies, same partition
class and Arrow conversion, same rows per trigger) from memory.  The ratio is what
NSQ delivery and at-least-once bookkeeping cost over Spark's own per-batch work.

    python benchmarks/bench_spark.py [--messages N] [--rounds R] [--per-trigger M]
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import trio
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

import trionsq
from fakensq import NSQD
from fakensq.threaded import BackgroundNode
from trionsq.spark import SCHEMA, NSQDataSource, NSQInputPartition

BODY = b"x" * 100
PER_TRIGGER = 2500
PARTITIONS = 2


class MemoryReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The baseline: ``total`` rows like the nsq source's, made up on the spot."""

    def __init__(self, total: int, per_trigger: int) -> None:
        self.total = total
        self.per_trigger = per_trigger

    def initialOffset(self) -> dict[str, Any]:
        return {"seq": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        pass

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        rows = limit.max_rows if isinstance(limit, ReadMaxRows) else self.total
        return {"seq": min(self.total, start["seq"] + rows)}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        first, last = start["seq"], end["seq"]
        now = time.time_ns()
        bounds = [first + (last - first) * i // PARTITIONS for i in range(PARTITIONS + 1)]
        return [
            NSQInputPartition(
                "bench",
                [BODY] * (b - a),
                [f"{i:016x}" for i in range(a, b)],
                [now] * (b - a),
                [1] * (b - a),
                ["127.0.0.1:4150"] * (b - a),
            )
            for a, b in itertools.pairwise(bounds)
            if b > a
        ]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, NSQInputPartition)
        yield partition.to_arrow()


class MemorySource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "bench_memory"

    def schema(self) -> StructType:
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return MemoryReader(int(self.options["rows"]), int(self.options["per_trigger"]))


def session() -> SparkSession:
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("bench-spark")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(NSQDataSource)
    spark.dataSource.register(MemorySource)
    return spark


def publish(address: str, count: int) -> None:
    async def main() -> None:
        async with trionsq.Producer(nsqd_tcp_addresses=[address]) as producer:
            for start in range(0, count, 1000):
                await producer.multi_publish("bench", [BODY] * min(1000, count - start))

    trio.run(main)


def run_query(spark: SparkSession, reader: Any, rows: int) -> tuple[float, float]:
    """Run to completion into fresh Parquet; (wall-clock rows/s, rows/s within batches)."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    try:
        start = time.perf_counter()
        query = (
            reader.load()
            .writeStream.format("parquet")
            .option("checkpointLocation", str(tmp / "checkpoint"))
            .trigger(availableNow=True)
            .start(str(tmp / "out"))
        )
        query.awaitTermination()
        elapsed = time.perf_counter() - start
        progress = query.recentProgress
        got = sum(p["numInputRows"] for p in progress)
        assert got == rows, f"read {got} rows, expected {rows}"
        busy = sum(p["durationMs"]["triggerExecution"] for p in progress if p["numInputRows"])
        written = spark.read.parquet(str(tmp / "out")).count()
        assert written == rows, f"wrote {written} rows, expected {rows}"
        return rows / elapsed, rows / (busy / 1000)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=25_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--per-trigger",
        type=int,
        default=PER_TRIGGER,
        help="messages per micro-batch (nsqd's max-rdy-count is raised to match)",
    )
    args = parser.parse_args()
    spark = session()
    n = args.messages
    per_trigger = args.per_trigger

    def baseline(rows: int) -> tuple[float, float]:
        reader = (
            spark.readStream.format("bench_memory")
            .option("rows", rows)
            .option("per_trigger", per_trigger)
        )
        return run_query(spark, reader, rows)

    node = BackgroundNode(
        lambda: NSQD(
            tcp_address="127.0.0.1:0",
            http_address="127.0.0.1:0",
            max_rdy_count=max(2500, per_trigger),
        )
    )
    with node as nsqd:

        def nsq(rows: int) -> tuple[float, float]:
            publish(nsqd.tcp_address, rows)
            reader = (
                spark.readStream.format("nsq")
                .option("topic", "bench")
                .option("channel", "parquet")
                .option("nsqd_tcp_addresses", nsqd.tcp_address)
                .option("max_in_flight", max(2500, per_trigger))
                .option("max_messages_per_trigger", per_trigger)
                .option("num_partitions", PARTITIONS)
            )
            return run_query(spark, reader, rows)

        baseline(per_trigger * 2)  # warm the JVM and the Python workers up
        nsq(per_trigger * 2)
        results: dict[str, list[tuple[float, float]]] = {"nsq": [], "baseline": []}
        for _ in range(args.rounds):
            results["baseline"].append(baseline(n))
            results["nsq"].append(nsq(n))
    spark.stop()

    best = {name: max(r[0] for r in runs) for name, runs in results.items()}
    busy = {name: statistics.median(r[1] for r in runs) for name, runs in results.items()}
    print(f"{n} messages of {len(BODY)} bytes into Parquet, local[2], {per_trigger} per trigger")
    print(f"  baseline (Python source, no NSQ): {best['baseline']:9,.0f} rows/s")
    print(f"  nsq source (fakensq over TCP):    {best['nsq']:9,.0f} messages/s")
    print(f"  ratio nsq / baseline:             {best['nsq'] / best['baseline']:9.0%}")
    print(
        "  within batches (excluding start-up and the end of the stream): "
        f"baseline {busy['baseline']:,.0f}/s, nsq {busy['nsq']:,.0f}/s "
        f"({busy['nsq'] / busy['baseline']:.0%})"
    )


if __name__ == "__main__":
    main()
