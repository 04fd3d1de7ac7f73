"""The stream reader's protocol driven by hand, the way Spark drives it (no JVM):
offsets, FIN after commit, requeue on stop, TOUCH while held."""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest
import trustme
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from pyspark.sql.types import StringType, StructField, StructType

from fakensq import NSQD, Cluster
from trionsq.spark import NSQInputPartition
from trionsq.spark._options import parse_sink_options, parse_source_options
from trionsq.spark.sink import NSQBatchWriter
from trionsq.spark.source import NSQStreamReader

from .conftest import consume, publish, wait_for


def reader_for(nsqd: NSQD, **extra: str) -> NSQStreamReader:
    options = {
        "topic": "events",
        "channel": "spark",
        "nsqd_tcp_addresses": nsqd.tcp_address,
        "max_batch_wait": "5",
        **extra,
    }
    return NSQStreamReader(parse_source_options(options))


def channel_stats(nsqd: NSQD, topic: str = "events", channel: str = "spark") -> dict[str, int]:
    stats = httpx.get(f"http://{nsqd.http_address}/stats?format=json").json()
    for t in stats["topics"]:
        if t["topic_name"] == topic:
            for c in t["channels"]:
                if c["channel_name"] == channel:
                    return dict(c)
    return {}


def delivered(reader: NSQStreamReader, nsqd: NSQD, count: int, start: int = 0) -> None:
    """Open the reader's consumer and wait until nsqd has handed it ``count`` messages,
    so that what a latestOffset call returns does not depend on timing."""
    assert reader.latestOffset({"seq": start}, ReadMaxRows(0)) == {"seq": start}
    wait_for(lambda: channel_stats(nsqd).get("in_flight_count") == count, what="delivery")


def rows(reader: NSQStreamReader, start: int, end: int) -> list[bytes]:
    bodies: list[bytes] = []
    for partition in reader.partitions({"seq": start}, {"seq": end}):
        assert isinstance(partition, NSQInputPartition)
        for batch in reader.read(partition):
            bodies.extend(batch.column(0).to_pylist())
    return bodies


def test_batches_are_numbered_and_finished_after_commit(nsqd: NSQD) -> None:
    bodies = [b"m%02d" % i for i in range(10)]
    publish(nsqd.tcp_address, "events", bodies)
    reader = reader_for(nsqd)
    try:
        assert reader.initialOffset() == {"seq": 0}
        assert reader.getDefaultReadLimit() == ReadMaxRows(2500)
        delivered(reader, nsqd, 10)
        end = reader.latestOffset({"seq": 0}, ReadMaxRows(4))
        assert end == {"seq": 4}
        assert rows(reader, 0, 4) == bodies[:4]
        # Nothing is FINed before Spark says the batch is committed.
        assert channel_stats(nsqd)["in_flight_count"] == 10
        end = reader.latestOffset({"seq": 4}, ReadAllAvailable())
        assert end == {"seq": 10}
        assert channel_stats(nsqd)["in_flight_count"] == 6
        assert rows(reader, 4, 10) == bodies[4:]
        reader.commit({"seq": 10})
        wait_for(lambda: channel_stats(nsqd)["in_flight_count"] == 0, what="FINs")
        assert channel_stats(nsqd)["depth"] == 0
    finally:
        reader.stop()


def test_stop_requeues_what_was_not_committed(nsqd: NSQD) -> None:
    publish(nsqd.tcp_address, "events", [b"a", b"b", b"c"])
    reader = reader_for(nsqd)
    try:
        delivered(reader, nsqd, 3, start=7)
        assert reader.latestOffset({"seq": 7}, ReadMaxRows(2)) == {"seq": 9}
        assert rows(reader, 7, 9) == [b"a", b"b"]
    finally:
        reader.stop()
    assert sorted(consume(nsqd.tcp_address, "events", "spark", 3)) == [b"a", b"b", b"c"]


def test_a_replayed_batch_from_an_earlier_run_is_empty(nsqd: NSQD) -> None:
    reader = reader_for(nsqd, max_batch_wait="0.1")
    try:
        # After a restart Spark replays the uncommitted batch; its messages come again
        # from nsqd instead, numbered after it.
        assert reader.partitions({"seq": 10}, {"seq": 20}) == []
        publish(nsqd.tcp_address, "events", [b"again"])
        end = wait_for(
            lambda: reader.latestOffset({"seq": 20}, ReadAllAvailable())["seq"] > 20,
            what="the redelivered message",
        )
        assert end
        assert rows(reader, 20, 21) == [b"again"]
    finally:
        reader.stop()


def test_an_offer_spark_did_not_take_is_offered_again(nsqd: NSQD) -> None:
    publish(nsqd.tcp_address, "events", [b"x", b"y"])
    reader = reader_for(nsqd)
    try:
        delivered(reader, nsqd, 2)
        assert reader.latestOffset({"seq": 0}, ReadMaxRows(2)) == {"seq": 2}
        assert reader.latestOffset({"seq": 0}, ReadMaxRows(2)) == {"seq": 2}
        assert rows(reader, 0, 2) == [b"x", b"y"]
    finally:
        reader.stop()


@pytest.mark.nsqd(msg_timeout=60.0)
def test_held_messages_are_touched_before_they_time_out(nsqd: NSQD) -> None:
    publish(nsqd.tcp_address, "events", [b"slow"])
    reader = reader_for(nsqd, msg_timeout="1")
    try:
        delivered(reader, nsqd, 1)
        assert reader.latestOffset({"seq": 0}, ReadMaxRows(1)) == {"seq": 1}
        # Held for 2.5 msg_timeouts: only TOUCHes keep nsqd from redelivering it.
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            stats = channel_stats(nsqd)
            assert (stats["timeout_count"], stats["in_flight_count"]) == (0, 1)
            time.sleep(0.1)
    finally:
        reader.stop()


def test_available_now_leaves_later_messages_for_the_next_run(nsqd: NSQD) -> None:
    publish(nsqd.tcp_address, "events", [b"before"])
    reader = reader_for(nsqd, max_batch_wait="0.5")
    try:
        reader.prepareForTriggerAvailableNow()
        publish(nsqd.tcp_address, "events", [b"after"])
        assert reader.latestOffset({"seq": 0}, ReadAllAvailable()) == {"seq": 1}
        assert rows(reader, 0, 1) == [b"before"]
        assert reader.latestOffset({"seq": 1}, ReadAllAvailable()) == {"seq": 1}
    finally:
        reader.stop()
    assert consume(nsqd.tcp_address, "events", "spark", 1) == [b"after"]


def test_the_reader_pickles_without_its_consumer(nsqd: NSQD) -> None:
    import pickle

    publish(nsqd.tcp_address, "events", [b"p"])
    reader = reader_for(nsqd)
    try:
        reader.latestOffset({"seq": 0}, ReadMaxRows(1))
        copy = pickle.loads(pickle.dumps(reader))
        assert copy.options == reader.options
        [partition] = reader.partitions({"seq": 0}, {"seq": 1})
        batch = next(copy.read(pickle.loads(pickle.dumps(partition))))
        assert batch.to_pydict()["body"] == [b"p"]
        assert "messages=1" in repr(partition)
    finally:
        reader.stop()


def test_tls_auth_and_compression_options_reach_nsqd(
    nsqd_factory: Callable[..., NSQD], tmp_path: Path
) -> None:
    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    secrets: list[str] = []

    def auth(query: dict[str, str]) -> dict[str, Any]:
        secrets.append(query["secret"])
        return {
            "ttl": 3600,
            "identity": "spark",
            "authorizations": [
                {"topic": ".*", "channels": [".*"], "permissions": ["subscribe", "publish"]}
            ],
        }

    node = nsqd_factory(ssl_context=server, auth_handler=auth)
    secure = {"tls": "true", "tls_ca_file": str(ca_file), "auth_secret": "open-sesame"}
    writer = NSQBatchWriter(
        parse_sink_options(
            {"topic": "events", "nsqd_tcp_addresses": node.tcp_address, "snappy": "true", **secure}
        ),
        StructType([StructField("value", StringType())]),
    )
    batch = pa.RecordBatch.from_pydict({"value": ["one", "two"]})
    assert writer.write(iter([batch])).messages == 2
    reader = reader_for(node, deflate="true", **secure)
    try:
        delivered(reader, node, 2)
        assert reader.latestOffset({"seq": 0}, ReadAllAvailable()) == {"seq": 2}
        assert sorted(rows(reader, 0, 2)) == [b"one", b"two"]
    finally:
        reader.stop()
    assert secrets and set(secrets) == {"open-sesame"}


def test_nsqds_are_found_through_lookupd(nsq_cluster: Cluster) -> None:
    [address] = nsq_cluster.nsqd_tcp_addresses
    [lookupd] = nsq_cluster.lookupd_http_addresses
    publish(address, "found", [b"via lookupd"])
    wait_for(
        lambda: httpx.get(f"http://{lookupd}/lookup?topic=found").status_code == 200,
        what="the topic's registration",
    )
    options = {
        "topic": "found",
        "channel": "spark",
        "lookupd_http_addresses": lookupd,
        "max_batch_wait": "5",
    }
    reader = NSQStreamReader(parse_source_options(options))
    try:
        assert reader.latestOffset({"seq": 0}, ReadMaxRows(1)) == {"seq": 1}
        [partition] = reader.partitions({"seq": 0}, {"seq": 1})
        assert next(reader.read(partition)).to_pydict()["nsqd_address"] == [address]
    finally:
        reader.stop()


@pytest.mark.nsqd(max_rdy_count=5)
def test_batches_are_capped_by_the_rdy_budget(nsqd: NSQD, caplog: pytest.LogCaptureFixture) -> None:
    publish(nsqd.tcp_address, "events", [b"r%d" % i for i in range(8)])
    # nsqd grants 5 in flight: a batch of 8 could never fill, so it must not wait for it.
    reader = reader_for(nsqd, max_in_flight="8", max_batch_wait="30")
    try:
        delivered(reader, nsqd, 5)
        began = time.monotonic()
        assert reader.latestOffset({"seq": 0}, ReadMaxRows(8)) == {"seq": 5}
        assert time.monotonic() - began < 10
        assert "exceeds the RDY budget" in caplog.text
        assert reader.latestOffset({"seq": 5}, ReadMaxRows(8)) == {"seq": 8}
    finally:
        reader.stop()
