"""The nsq sink: DataFrames published to topics (batch and streaming)."""

from __future__ import annotations

from pathlib import Path

import trio
from pyspark.sql import SparkSession

from fakensq import NSQD

from .conftest import consume, example
from .test_reader import channel_stats


def test_write_dataframe_to_topic(spark: SparkSession, nsqd: NSQD) -> None:
    values = [f"event-{i}" for i in range(300)] + ["é, ü, 日本"]
    df = spark.createDataFrame([(i, v) for i, v in enumerate(values)], "n int, value string")
    (
        df.repartition(2)
        .write.format("nsq")
        .option("topic", "events")
        .option("nsqd_tcp_addresses", nsqd.tcp_address)
        .option("batch_size", "64")
        .mode("append")
        .save()
    )
    received = consume(nsqd.tcp_address, "events", "check", len(values))
    assert sorted(received) == sorted(v.encode("utf-8") for v in values)


def test_write_a_named_binary_column(spark: SparkSession, nsqd: NSQD) -> None:
    payloads = [bytes([i % 256]) * (i + 1) for i in range(50)]
    df = spark.createDataFrame([(i, p) for i, p in enumerate(payloads)], "n int, payload binary")
    (
        df.write.format("nsq")
        .option("topic", "blobs")
        .option("nsqd_tcp_addresses", nsqd.tcp_address)
        .option("value_column", "payload")
        .mode("append")
        .save()
    )
    assert sorted(consume(nsqd.tcp_address, "blobs", "check", 50)) == sorted(payloads)


def test_aggregate_example_streams_counts_back_to_a_topic(
    spark: SparkSession, nsqd: NSQD, tmp_path: Path
) -> None:
    aggregate = example("spark_aggregate")
    trio.run(aggregate.publish_clicks, nsqd.tcp_address, 200)
    query = aggregate.aggregate(
        spark, nsqd=nsqd.tcp_address, checkpoint=str(tmp_path / "checkpoint"), once=True
    )
    query.awaitTermination(60)
    assert not query.isActive
    counts = trio.run(aggregate.latest_counts, nsqd.tcp_address)
    assert counts == {page: 50 for page in aggregate.PAGES}
    # The clicks were FINed once the batch counting them was committed.
    stats = channel_stats(nsqd, "clicks", "page-views")
    assert (stats["depth"], stats["in_flight_count"]) == (0, 0)
