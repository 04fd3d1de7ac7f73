"""The nsq sink: DataFrames published to topics (batch and streaming)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import trio
from pyspark.sql import SparkSession

from fakensq import NSQD, Cluster

from ..support.stats import topic_depth
from ..support.waiting import wait_until_blocking
from .conftest import channel_stats, consume, example


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


def test_write_through_lookupd(spark: SparkSession, nsq_cluster: Cluster) -> None:
    [address] = nsq_cluster.nsqd_tcp_addresses
    [lookupd] = nsq_cluster.lookupd_http_addresses
    wait_until_blocking(lambda: httpx.get(f"http://{lookupd}/nodes").json()["producers"], what="registration")
    df = spark.createDataFrame([(f"v{i}",) for i in range(40)], ["value"])
    (
        df.write.format("nsq")
        .option("topic", "via_lookupd")
        .option("lookupd_http_addresses", lookupd)
        .mode("append")
        .save()
    )
    assert sorted(consume(address, "via_lookupd", "check", 40)) == sorted(
        f"v{i}".encode() for i in range(40)
    )


def test_an_nsqd_dying_mid_write_is_replaced_by_the_next(
    spark: SparkSession, real_nsqds: Callable[..., list[Any]]
) -> None:
    # The first nsqd writes every message to disk before answering (and takes its time
    # over it: a write lasts long enough to be cut in the middle by the SIGKILL).
    first = real_nsqds(1, "--mem-queue-size=0", "--sync-every=1")[0]
    [second] = real_nsqds(1)
    rows = 3000

    def kill_mid_write() -> None:
        deadline = time.monotonic() + 120
        while topic_depth(first.http_address, "failover") < 300 and time.monotonic() < deadline:
            time.sleep(0.005)
        first.kill()

    df = spark.range(rows).selectExpr("CAST(id AS STRING) AS value").repartition(1)
    killer = threading.Thread(target=kill_mid_write, daemon=True)
    killer.start()
    (
        df.write.format("nsq")
        .option("topic", "failover")
        .option("nsqd_tcp_addresses", f"{first.tcp_address},{second.tcp_address}")
        .option("batch_size", "20")
        .mode("append")
        .save()
    )
    killer.join()
    assert not first.running
    unsynced = unsynced_tail(first.data_path, "failover")
    first.start()
    counts: Counter[bytes] = Counter()
    depths = [topic_depth(first.http_address, "failover"), topic_depth(second.http_address, "failover")]
    assert all(depths)  # both had a share: the write moved over when the first died
    for daemon, depth in zip((first, second), depths, strict=True):
        counts.update(consume(daemon.tcp_address, "failover", "check", depth, timeout=60))
    # Nothing lost by the sink.  What nsqd itself may lose on SIGKILL: go-diskqueue
    # answers a write before it records the new write position (the sync comes at
    # the top of its next loop, even with --sync-every=1), so the last message it
    # acknowledged can be in its data file yet past the recorded end, and a restart
    # drops it.  Such a message was delivered to nsqd (it is in the file) and is
    # nsqd's loss: at most that one write.
    lost = {str(i).encode() for i in range(rows)} - set(counts)
    assert len(lost) <= 1 and lost <= set(unsynced), (lost, unsynced)
    # At most the chunk in flight when the connection died is there twice.
    assert sum(n - 1 for n in counts.values()) <= 20


def unsynced_tail(data_path: Path, topic: str) -> list[bytes]:
    """The bodies in ``topic``'s diskqueue past the write position nsqd recorded
    (what a restart of a SIGKILLed nsqd forgets)."""
    meta = data_path / f"{topic}.diskqueue.meta.dat"
    file_number, position = 0, 0  # never synced: all of it
    if meta.exists():
        file_number, position = (int(n) for n in meta.read_text().split()[2].split(","))
    data = (data_path / f"{topic}.diskqueue.{file_number:06d}.dat").read_bytes()
    bodies = []
    while position + 4 <= len(data):
        size = int.from_bytes(data[position : position + 4], "big")
        # Each record: a 4-byte size, then nsqd's message (8-byte timestamp, 2-byte
        # attempts, 16-byte id) and the body.
        bodies.append(data[position + 4 + 26 : position + 4 + size])
        position += 4 + size
    return bodies
