"""The source's option ``trace_context``: through Spark, the rows hold the
bodies as published (the envelope taken off on the executors' agents), a
body it cannot unwrap whole; without the option, the bodies as they came."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from trionsq.tracecontext import MAGIC, wrap

from ..tools.helpers import create_channel
from .conftest import channel_stats, publish

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
CUT = MAGIC + b"\x01\x37short"


def archive(spark: SparkSession, nsqd: Any, channel: str, tmp: Path, **options: str) -> list[bytes]:
    stream = (
        spark.readStream.format("nsq")
        .option("topic", "traced")
        .option("channel", channel)
        .option("nsqd_tcp_addresses", nsqd.tcp_address)
        .options(**options)
        .load()
    )
    query = (
        stream.writeStream.format("parquet")
        .option("checkpointLocation", str(tmp / channel / "checkpoint"))
        .trigger(availableNow=True)
        .start(str(tmp / channel / "out"))
    )
    query.awaitTermination(120)
    assert not query.isActive and query.exception() is None
    return [r.body for r in spark.read.parquet(str(tmp / channel / "out")).collect()]


def test_the_source_unwraps_when_told(spark: SparkSession, nsqd: Any, tmp_path: Path) -> None:
    bodies = [wrap(b"one", PARENT, "k=v"), wrap(b"two"), b"plain", CUT]
    # the channels exist before the messages come: each gets all of them
    for channel in ("unwrapped", "whole"):
        create_channel(nsqd.http_address, "traced", channel)
    publish(nsqd.tcp_address, "traced", bodies)
    told = archive(spark, nsqd, "unwrapped", tmp_path, trace_context="true")
    assert sorted(told) == sorted([b"one", b"two", b"plain", CUT])
    whole = archive(spark, nsqd, "whole", tmp_path)
    assert sorted(whole) == sorted(bodies)
    for channel in ("unwrapped", "whole"):
        stats = channel_stats(nsqd, "traced", channel)
        assert (stats["depth"], stats["in_flight_count"]) == (0, 0)
