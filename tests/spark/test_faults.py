"""At least once under every fault, against the real nsqd v1.3.0.

Each test archives a topic to Parquet on a cluster of two executor processes
(``local-cluster[2,1,1024]``), breaks something in the middle, and checks that
every message is in the output, that the only duplicates are messages that were
in flight at the fault, and that nothing of the query is left in flight at nsqd
afterwards.  They skip where the real binaries are not found (CI has them).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from ..support.waiting import wait_until_blocking
from .conftest import (
    channel_stats,
    descendants,
    driver_pid,
    executor_pids,
    http_publish,
    wait_for_executors,
)

ROOT = Path(__file__).resolve().parents[2]
TOPIC, CHANNEL = "orders", "archive"


def bodies_for(tag: str, count: int) -> list[bytes]:
    return [b"%s-%06d" % (tag.encode(), i) for i in range(count)]


def stream(spark: SparkSession, daemons: list[Any], **options: str) -> DataFrame:
    return (
        spark.readStream.format("nsq")
        .option("topic", TOPIC)
        .option("channel", CHANNEL)
        .option("nsqd_tcp_addresses", ",".join(d.tcp_address for d in daemons))
        .options(**options)
        .load()
    )


def parquet(stream: DataFrame, tmp: Path, available_now: bool = False) -> StreamingQuery:
    writer = stream.writeStream.format("parquet").option(
        "checkpointLocation", str(tmp / "checkpoint")
    )
    writer = (
        writer.trigger(availableNow=True)
        if available_now
        else writer.trigger(processingTime="0 seconds")
    )
    return writer.start(str(tmp / "out"))


def rows_read(query: StreamingQuery) -> int:
    return sum(p["numInputRows"] for p in query.recentProgress)


def archived(spark: SparkSession, tmp: Path) -> Counter[bytes]:
    return Counter(r.body for r in spark.read.parquet(str(tmp / "out")).select("body").collect())


def in_flight(daemons: list[Any]) -> int:
    return sum(channel_stats(d, TOPIC, CHANNEL).get("in_flight_count", 0) for d in daemons)


def drained(daemons: list[Any]) -> bool:
    stats = [channel_stats(d, TOPIC, CHANNEL) for d in daemons]
    return all((s.get("depth"), s.get("in_flight_count")) == (0, 0) for s in stats)


def finish(spark: SparkSession, daemons: list[Any], tmp: Path, **options: str) -> None:
    """Run the query again from its checkpoint until it has read what is left."""
    query = parquet(stream(spark, daemons, **options), tmp, available_now=True)
    query.awaitTermination(180)
    assert not query.isActive, "the restarted query did not finish"
    assert query.exception() is None


def check(
    spark: SparkSession, tmp: Path, expected: list[bytes], duplicates_at_most: int
) -> Counter[bytes]:
    counts = archived(spark, tmp)
    missing = set(expected) - set(counts)
    assert not missing, f"{len(missing)} message(s) lost, e.g. {sorted(missing)[:3]}"
    duplicated = sum(n - 1 for n in counts.values())
    assert duplicated <= duplicates_at_most, (duplicated, duplicates_at_most)
    return counts


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return tmp_path


def test_every_subscriber_is_an_executor_process(
    spark: SparkSession, real_nsqds: Callable[..., list[Any]], out: Path
) -> None:
    daemons = real_nsqds(3)
    expected = []
    for n, daemon in enumerate(daemons):
        bodies = bodies_for(f"n{n}", 1000)
        http_publish(daemon, TOPIC, bodies)
        expected += bodies
    query = parquet(stream(spark, daemons), out, available_now=True)
    subscribers: set[int] = set()
    while query.isActive:
        for daemon in daemons:
            for client in channel_stats(daemon, TOPIC, CHANNEL).get("clients", []):
                subscribers.add(int(client["user_agent"].split("pid=")[1].split()[0]))
        time.sleep(0.05)
    assert query.exception() is None
    counts = check(spark, out, expected, duplicates_at_most=0)
    assert sum(counts.values()) == 3000
    executors = executor_pids(spark)
    on_executors = set().union(*(descendants(pid) for pid in executors.values()))
    assert subscribers and subscribers <= on_executors
    assert driver_pid(spark) not in subscribers and os.getpid() not in subscribers
    assert drained(daemons)
    wait_until_blocking(
        lambda: not any(channel_stats(d, TOPIC, CHANNEL)["clients"] for d in daemons),
        what="the agents to unsubscribe at the end of the query",
    )


def test_a_failing_batch_is_retried_and_reads_the_same_messages(
    spark: SparkSession, real_nsqds: Callable[..., list[Any]], out: Path
) -> None:
    [daemon] = real_nsqds(1)
    expected = bodies_for("r", 3000)
    http_publish(daemon, TOPIC, expected)
    marker = out / "failed-once"

    @F.udf("binary")
    def flaky(body):  # type: ignore[no-untyped-def]  # (hints would make it an Arrow UDF)
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is not None and context.attemptNumber() == 0 and not marker.exists():
            marker.touch()
            raise RuntimeError("injected: this task fails once")
        return body

    failing = stream(spark, [daemon], max_messages_per_trigger="1000").withColumn(
        "body", flaky("body")
    )
    query = parquet(failing, out, available_now=True)
    query.awaitTermination(180)
    assert not query.isActive and query.exception() is None
    assert marker.exists()  # a task did fail, and Spark retried it
    # The retry replayed the failed attempt's messages: not one duplicate.
    check(spark, out, expected, duplicates_at_most=0)
    assert drained([daemon])


def test_a_query_stopped_and_started_again_loses_nothing(
    spark: SparkSession, real_nsqds: Callable[..., list[Any]], out: Path
) -> None:
    [daemon] = real_nsqds(1)
    expected = bodies_for("s", 3000)
    http_publish(daemon, TOPIC, expected)
    options = {"max_messages_per_trigger": "500"}
    query = parquet(stream(spark, [daemon], **options), out)
    wait_until_blocking(lambda: rows_read(query) >= 1500, limit=120, what="three batches")
    query.stop()
    # Whatever the query held went back to nsqd when it stopped.
    wait_until_blocking(lambda: in_flight([daemon]) == 0, what="the stop to requeue")
    assert channel_stats(daemon, TOPIC, CHANNEL)["clients"] == []
    finish(spark, [daemon], out, **options)
    # The batch running at the stop (its output discarded) comes again; one committed
    # batch may have been requeued before its FIN: at most one batch twice.
    check(spark, out, expected, duplicates_at_most=500)
    assert drained([daemon])


def test_an_executor_killed_mid_batch_loses_nothing(
    spark: SparkSession, real_nsqds: Callable[..., list[Any]], out: Path
) -> None:
    [daemon] = real_nsqds(1)
    expected = bodies_for("e", 5000)
    http_publish(daemon, TOPIC, expected)

    @F.udf("binary")
    def slow(body):  # type: ignore[no-untyped-def]  # (hints would make it an Arrow UDF)
        time.sleep(0.0005)  # tasks of ~0.25 s: a kill lands in the middle of one
        return body

    options = {"max_messages_per_trigger": "1000", "msg_timeout": "5"}
    query = parquet(stream(spark, [daemon], **options).withColumn("body", slow("body")), out)
    try:
        wait_until_blocking(lambda: rows_read(query) >= 2000, limit=180, what="two batches")
        held = in_flight([daemon])
        victim = sorted(executor_pids(spark).items())[0][1]
        os.kill(victim, signal.SIGKILL)
        # The query goes on, on the other executor (and the replacement Spark starts).
        wait_until_blocking(lambda: rows_read(query) >= len(expected), limit=240, what="the rest")
        assert query.isActive and query.exception() is None
    finally:
        query.stop()
    finish(spark, [daemon], out, **options)
    check(spark, out, expected, duplicates_at_most=held)
    wait_until_blocking(lambda: drained([daemon]), what="nothing left in flight")
    wait_for_executors(spark, 2)


def test_an_nsqd_killed_and_restarted_loses_nothing(
    spark: SparkSession, real_nsqds: Callable[..., list[Any]], out: Path
) -> None:
    steady, victim = real_nsqds(2)
    kept, flaky = bodies_for("kept", 2000), bodies_for("flaky", 2000)
    http_publish(steady, TOPIC, kept)
    http_publish(victim, TOPIC, flaky)
    # Make the victim's own losses impossible: SIGKILL loses what nsqd holds in memory
    # and its disk queue's unsynced read position; with everything on disk and no sync
    # after this clean restart, it redelivers everything it has not been stopped with.
    victim.stop()
    victim.flags += ["--mem-queue-size=0", "--sync-every=100000000", "--sync-timeout=1h"]
    victim.start()
    options = {"max_messages_per_trigger": "600"}
    query = parquet(stream(spark, [steady, victim], **options), out)
    try:
        wait_until_blocking(lambda: rows_read(query) >= 1200, limit=180, what="two batches")
        victim.kill()
        wait_until_blocking(lambda: rows_read(query) >= 1800, limit=120, what="a batch without it")
        victim.start()
        # The agents reconnect; the restarted nsqd redelivers what it had.
        wait_until_blocking(lambda: drained([steady, victim]), limit=240, what="both drained")
    finally:
        query.stop()
    counts = archived(spark, out)
    assert set(kept) <= set(counts) and set(flaky) <= set(counts)
    # The steady nsqd's messages were never in doubt: each is there exactly once.
    assert all(counts[body] == 1 for body in kept)
    assert drained([steady, victim])


def test_the_driver_killed_mid_batch_restarts_from_its_checkpoint(
    spark: SparkSession, real_nsqds: Callable[..., list[Any]], out: Path
) -> None:
    [daemon] = real_nsqds(1)
    expected = bodies_for("d", 5000)
    http_publish(daemon, TOPIC, expected)
    checkpoint, output = out / "checkpoint", out / "out"
    argv = [
        sys.executable,
        str(ROOT / "examples" / "spark_archive.py"),
        "--topic", TOPIC, "--channel", CHANNEL, "--nsqd", daemon.tcp_address,
        "--output", str(output), "--checkpoint", str(checkpoint),
        "--max-per-trigger", "500", "--every", "0 seconds", "--option", "msg_timeout=5",
    ]  # fmt: skip
    driver = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL)
    try:
        commits = checkpoint / "commits"
        wait_until_blocking(
            lambda: (
                commits.is_dir() and len([p for p in commits.iterdir() if p.name.isdigit()]) >= 3
            ),
            limit=240,
            what="three committed batches",
        )
        held = in_flight([daemon])
        os.killpg(driver.pid, signal.SIGKILL)  # the driver's Python and JVM, at once
        driver.wait(30)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    # Restarted from its checkpoint, it finishes the job.
    again = subprocess.run([*argv, "--once"], timeout=600, stdout=subprocess.DEVNULL)
    assert again.returncode == 0
    counts = Counter(r.body for r in spark.read.parquet(str(output)).select("body").collect())
    missing = set(expected) - set(counts)
    assert not missing, f"{len(missing)} lost"
    assert sum(n - 1 for n in counts.values()) <= max(held, 500)
    wait_until_blocking(lambda: drained([daemon]), what="nothing left in flight")
