"""The nsq streaming source end to end: NSQ -> Spark -> Parquet, through fakensq over TCP."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from fakensq import NSQD

from ..support.waiting import wait_until_blocking
from .conftest import channel_stats, example, publish


def test_archive_example_puts_every_message_in_parquet(
    spark: SparkSession, nsqd: NSQD, tmp_path: Path
) -> None:
    bodies = [b'{"click": %d}' % i for i in range(250)]
    publish(nsqd.tcp_address, "clicks", bodies)
    query = example("spark_archive").archive(
        spark,
        topic="clicks",
        channel="archive",
        output=str(tmp_path / "out"),
        checkpoint=str(tmp_path / "checkpoint"),
        connect={"nsqd_tcp_addresses": nsqd.tcp_address},
        once=True,
        max_messages_per_trigger=100,
    )
    query.awaitTermination(60)
    assert not query.isActive
    batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    # At most max_messages_per_trigger each, shared by the partitions (one per
    # executor core); a partition whose executor holds fewer messages reads fewer.
    assert sum(batches) == 250 and max(batches) <= 100 and len(batches) >= 3
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    assert sorted(r.body for r in rows) == sorted(bodies)
    assert {(r.topic, r.nsqd_address, r.attempts) for r in rows} == {
        ("clicks", nsqd.tcp_address, 1)
    }
    assert len({r.id for r in rows}) == len(bodies)
    assert all(r.timestamp is not None and len(r.id) == 16 for r in rows)
    # Everything archived was FINed: nothing left for a second run.
    stats = channel_stats(nsqd, "clicks", "archive")
    assert (stats["depth"], stats["in_flight_count"]) == (0, 0)


def source_runner_pids(spark: SparkSession) -> list[int]:
    """The Python processes this Spark driver runs streaming sources in."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    driver = jvm.java.lang.ProcessHandle.current().pid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == driver and b"python_streaming_source_runner" in cmdline:
            found.append(int(entry))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds Spark's processes in /proc")
# Real nsqd's behaviour: a dead consumer's messages come back when their timeout expires.
@pytest.mark.nsqd(requeue_on_disconnect=False)
def test_a_killed_query_restarts_from_its_checkpoint_losing_nothing(
    spark: SparkSession, nsqd: NSQD, tmp_path: Path
) -> None:
    bodies = [b"k%03d" % i for i in range(300)]
    publish(nsqd.tcp_address, "orders", bodies)
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")

    def stream() -> DataFrame:
        return (
            spark.readStream.format("nsq")
            .option("topic", "orders")
            .option("channel", "archive")
            .option("nsqd_tcp_addresses", nsqd.tcp_address)
            .option("max_messages_per_trigger", "60")
            .option("msg_timeout", "2")
            .load()
        )

    earlier = set(source_runner_pids(spark))  # other queries' runners, if still exiting
    query: StreamingQuery = (
        stream().writeStream.format("parquet").option("checkpointLocation", checkpoint).start(out)
    )
    try:
        wait_until_blocking(
            lambda: sum(p["numInputRows"] for p in query.recentProgress) >= 120,
            limit=60,
            what="two batches",
        )
        [pid] = set(source_runner_pids(spark)) - earlier
        os.kill(pid, signal.SIGKILL)  # the driver-side consumer dies mid-stream
        try:
            query.awaitTermination(60)
        except StreamingQueryException:
            pass  # the query fails: its source is gone
        assert not query.isActive
    finally:
        query.stop()
    # What the dead consumer held comes back to the channel after msg_timeout.
    wait_until_blocking(
        lambda: channel_stats(nsqd, "orders", "archive")["in_flight_count"] == 0,
        what="nsqd to time the dead consumer's messages out",
    )
    restarted = (
        stream()
        .writeStream.format("parquet")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start(out)
    )
    restarted.awaitTermination(60)
    assert not restarted.isActive
    rows = spark.read.parquet(out).collect()
    archived = [r.body for r in rows]
    assert set(archived) == set(bodies)  # duplicates allowed, losses not
    assert any(r.attempts > 1 for r in rows)  # some came back from nsqd
    stats = channel_stats(nsqd, "orders", "archive")
    assert (stats["depth"], stats["in_flight_count"]) == (0, 0)


def test_an_unreachable_nsqd_fails_the_query_with_the_reason(
    spark: SparkSession, tmp_path: Path
) -> None:
    from tests.support.ports import free_port

    address = f"127.0.0.1:{free_port()}"
    query = (
        spark.readStream.format("nsq")
        .option("topic", "orders")
        .option("channel", "archive")
        .option("nsqd_tcp_addresses", address)
        .option("connect_timeout", "1")
        .load()
        .writeStream.format("parquet")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start(str(tmp_path / "out"))
    )
    began = time.monotonic()
    with pytest.raises(StreamingQueryException) as failure:
        query.awaitTermination(180)
    # Each of Spark's task attempts waits the connect timeout, then the query fails.
    assert time.monotonic() - began < 120
    assert not query.isActive
    reason = f"nsq source: no nsqd connection for orders/archive after 1s: nsqd {address}: "
    message = str(failure.value)
    assert reason in message and "Connection refused" in message.split(reason, 1)[1].split("\n")[0]
