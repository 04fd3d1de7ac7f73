"""The source's protocol driven by hand, the way Spark drives it, without a JVM.

The test process plays the driver (it calls the reader's methods) and the tasks
(it calls ``read``); agents are real ``python -m trionsq.spark.agent`` processes,
anchored to the test process or to a stand-in "executor" process that a test
can kill.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from pyspark.sql.types import StringType, StructField, StructType

from fakensq import NSQD, Cluster
from trionsq.spark import NSQInputPartition, NSQSourceError
from trionsq.spark import source as source_module
from trionsq.spark._executor import ExecutorIdentity
from trionsq.spark._options import parse_sink_options, parse_source_options
from trionsq.spark.sink import NSQBatchWriter
from trionsq.spark.source import NSQStreamReader

from ..support.tls import Pki
from ..support.waiting import wait_until_blocking
from .conftest import as_task, channel_stats, consume, publish


def reader_for(address: str, **extra: str) -> NSQStreamReader:
    options = {
        "topic": "events",
        "channel": "spark",
        "nsqd_tcp_addresses": address,
        "max_batch_wait": "0.5",
        **extra,
    }
    return NSQStreamReader(parse_source_options(options))


def finished(nsqd: Any) -> int:
    """FINs nsqd counted from the channel's current clients."""
    return sum(c["finish_count"] for c in channel_stats(nsqd).get("clients", []))


@dataclass
class Executor:
    """A stand-in executor: its agent lives as long as ``process`` (or the test run)."""

    identity: ExecutorIdentity
    process: subprocess.Popen[bytes] | None = None

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait()


@pytest.fixture
def executors(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], Executor]]:
    """Make stand-in executors; ``read`` runs as if on the one last used."""
    made: list[Executor] = []

    def make() -> Executor:
        process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        identity = ExecutorIdentity(f"test-{len(made)}", "127.0.0.1", 2, process.pid)
        executor = Executor(identity, process)
        made.append(executor)
        return executor

    yield make
    for executor in made:
        if executor.process is not None and executor.process.poll() is None:
            executor.process.kill()
            executor.process.wait()


def linked_agents(reader: NSQStreamReader) -> list[str]:
    loop, coordinator = reader._started()
    return loop.run_sync(lambda: list(coordinator.agents))


def agent_pids(nsqd: Any) -> set[int]:
    """The pids nsqd's subscribers name in their user agent."""
    return {
        int(c["user_agent"].split("pid=")[1].split()[0]) for c in channel_stats(nsqd)["clients"]
    }


def on(monkeypatch: pytest.MonkeyPatch, executor: Executor) -> None:
    monkeypatch.setattr(source_module, "identify", lambda: executor.identity)


def read(reader: NSQStreamReader, partition: NSQInputPartition) -> list[bytes]:
    bodies: list[bytes] = []
    for batch in reader.read(partition):
        bodies.extend(batch.column(0).to_pylist())
    return bodies


def plan(
    reader: NSQStreamReader, start: int, limit: Any = None
) -> tuple[int, list[NSQInputPartition]]:
    end = reader.latestOffset({"batch": start}, limit or reader.getDefaultReadLimit())["batch"]
    if end == start:
        return end, []
    partitions = reader.partitions({"batch": start}, {"batch": end})
    assert all(isinstance(p, NSQInputPartition) for p in partitions)
    return end, list(partitions)  # type: ignore[arg-type]


def read_all(reader: NSQStreamReader, partitions: list[NSQInputPartition]) -> list[bytes]:
    return [body for partition in partitions for body in read(reader, partition)]


@pytest.fixture(scope="module")
def shared_executor() -> Iterator[Executor]:
    """One stand-in executor for the tests that do not kill it: one agent serves
    them all, as an executor's agent serves every query that runs there."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    yield Executor(ExecutorIdentity("test-0", "127.0.0.1", 2, process.pid), process)
    process.kill()
    process.wait()


@pytest.fixture
def executor(shared_executor: Executor, monkeypatch: pytest.MonkeyPatch) -> Executor:
    on(monkeypatch, shared_executor)
    return shared_executor


@pytest.fixture
def own_executor(executors: Callable[[], Executor], monkeypatch: pytest.MonkeyPatch) -> Executor:
    one = executors()
    on(monkeypatch, one)
    return one


def test_batches_come_from_the_executors_and_are_finished_after_commit(
    nsqd: NSQD, executor: Executor
) -> None:
    bodies = [b"m%02d" % i for i in range(10)]
    publish(nsqd.tcp_address, "events", bodies)
    reader = reader_for(nsqd.tcp_address)
    try:
        assert reader.initialOffset() == {"batch": 0}
        assert reader.getDefaultReadLimit() == ReadAllAvailable()
        # No agent yet: the first batch is planned blind, and starts them.
        end, partitions = plan(reader, 0)
        assert end == 1 and len(partitions) == 2
        assert "batch=1" in repr(partitions[0])
        assert sorted(read_all(reader, partitions)) == bodies
        # Nothing is FINed before Spark says the batch is committed.
        assert channel_stats(nsqd)["in_flight_count"] == 10
        # Asking for the next batch means batch 1 is committed: its messages go.
        assert plan(reader, 1) == (1, [])
        wait_until_blocking(lambda: channel_stats(nsqd)["in_flight_count"] == 0, what="FINs")
        assert channel_stats(nsqd)["depth"] == 0
        publish(nsqd.tcp_address, "events", [b"later"])
        end, partitions = wait_until_blocking(lambda: plan(reader, 1)[1] and plan(reader, 1), what="a batch")
        assert read_all(reader, partitions) == [b"later"]
        reader.commit({"batch": end})
        wait_until_blocking(lambda: channel_stats(nsqd)["in_flight_count"] == 0, what="FINs")
    finally:
        reader.stop()


def test_the_subscriber_is_the_agent_and_says_so(nsqd: NSQD, executor: Executor) -> None:
    publish(nsqd.tcp_address, "events", [b"x"])
    reader = reader_for(nsqd.tcp_address)
    try:
        _, partitions = plan(reader, 0)
        read_all(reader, partitions)
        clients = {c["user_agent"] for c in channel_stats(nsqd)["clients"]}
        assert len(clients) == 1
        [client] = clients
        assert client.startswith("trionsq/") and "spark-agent executor=test-0 pid=" in client
        [pid] = agent_pids(nsqd)
        assert pid != os.getpid()
    finally:
        reader.stop()


def test_stop_requeues_what_was_not_committed_and_unsubscribes(
    nsqd: NSQD, executor: Executor
) -> None:
    publish(nsqd.tcp_address, "events", [b"a", b"b", b"c"])
    reader = reader_for(nsqd.tcp_address)
    try:
        _, partitions = plan(reader, 7)
        assert sorted(read_all(reader, partitions)) == [b"a", b"b", b"c"]
    finally:
        reader.stop()
    stats = channel_stats(nsqd)
    assert (stats["in_flight_count"], stats["depth"], stats["clients"]) == (0, 3, [])
    assert sorted(consume(nsqd.tcp_address, "events", "spark", 3)) == [b"a", b"b", b"c"]


def test_a_retried_task_replays_the_same_messages(
    nsqd: NSQD, executor: Executor, monkeypatch: pytest.MonkeyPatch
) -> None:
    bodies = [b"r%d" % i for i in range(6)]
    publish(nsqd.tcp_address, "events", bodies)
    reader = reader_for(nsqd.tcp_address, num_partitions="1")
    try:
        _, [partition] = plan(reader, 0)
        as_task(monkeypatch, attempt=0, task=10)
        first = read(reader, partition)
        assert sorted(first) == bodies
        publish(nsqd.tcp_address, "events", [b"new"])
        as_task(monkeypatch, attempt=1, task=11)  # the task failed after reading: again
        assert read(reader, partition) == first
        as_task(monkeypatch, stage=2, attempt=0, task=12)  # another stage, same batch
        assert read(reader, partition) == first
        assert plan(reader, 1, ReadMaxRows(10))[0] == 2  # commits batch 1: FINs it once
        wait_until_blocking(lambda: finished(nsqd) == 6, what="FINs")
    finally:
        reader.stop()


def test_a_retry_on_another_executor_fetches_the_first_attempts_messages(
    nsqd: NSQD, executors: Callable[[], Executor], monkeypatch: pytest.MonkeyPatch
) -> None:
    bodies = [b"f%d" % i for i in range(20)]
    publish(nsqd.tcp_address, "events", bodies)
    first, second = executors(), executors()
    reader = reader_for(nsqd.tcp_address, num_partitions="1")
    try:
        _, [partition] = plan(reader, 0)
        on(monkeypatch, first)
        as_task(monkeypatch, attempt=0, task=1)
        rows = read(reader, partition)
        assert sorted(rows) == sorted(bodies)
        on(monkeypatch, second)
        as_task(monkeypatch, attempt=1, task=2)
        assert read(reader, partition) == rows  # replayed from the first agent
        assert len(agent_pids(nsqd)) == 1  # the second executor never subscribed for it
        reader.commit({"batch": 1})
        wait_until_blocking(lambda: finished(nsqd) == 20, what="FINs")
    finally:
        reader.stop()


def test_an_executor_that_dies_gives_its_messages_back_and_the_retry_reads_fresh(
    nsqd: NSQD, executors: Callable[[], Executor], monkeypatch: pytest.MonkeyPatch
) -> None:
    bodies = [b"d%d" % i for i in range(8)]
    publish(nsqd.tcp_address, "events", bodies)
    doomed, survivor = executors(), executors()
    reader = reader_for(nsqd.tcp_address, num_partitions="1")
    try:
        _, [partition] = plan(reader, 0)
        on(monkeypatch, doomed)
        as_task(monkeypatch, attempt=0, task=1)
        assert sorted(read(reader, partition)) == bodies
        doomed.kill()  # the executor goes; its agent leaves with it, requeueing
        wait_until_blocking(lambda: not channel_stats(nsqd)["clients"], what="the agent to leave")
        wait_until_blocking(lambda: channel_stats(nsqd)["depth"] == 8, what="the requeue")
        wait_until_blocking(lambda: len(linked_agents(reader)) == 0, what="the coordinator to notice")
        on(monkeypatch, survivor)
        as_task(monkeypatch, attempt=1, task=2)
        seen = read(reader, partition)  # fresh: what nsqd hands the new agent
        assert seen and set(seen) <= set(bodies)
        end = 1
        while len(seen) < len(bodies):  # the rest in the next batches
            end, partitions = plan(reader, end)
            seen += read_all(reader, partitions)
        assert sorted(seen) == bodies
        reader.commit({"batch": end})
        wait_until_blocking(lambda: finished(nsqd) == 8, what="FINs")
        assert channel_stats(nsqd)["in_flight_count"] == 0
    finally:
        reader.stop()


@pytest.mark.nsqd(msg_timeout=60.0)
def test_held_messages_are_touched_before_they_time_out(nsqd: NSQD, executor: Executor) -> None:
    publish(nsqd.tcp_address, "events", [b"slow"])
    reader = reader_for(nsqd.tcp_address, msg_timeout="1.5", num_partitions="1")
    try:
        _, partitions = plan(reader, 0)
        assert read_all(reader, partitions) == [b"slow"]
        # Held for 2.5 msg_timeouts: only TOUCHes keep nsqd from redelivering it.
        deadline = time.monotonic() + 3.75
        while time.monotonic() < deadline:
            stats = channel_stats(nsqd)
            assert (stats["timeout_count"], stats["in_flight_count"]) == (0, 1)
            time.sleep(0.1)
    finally:
        reader.stop()


def test_available_now_leaves_later_messages_for_the_next_run(
    nsqd: NSQD, executor: Executor
) -> None:
    publish(nsqd.tcp_address, "events", [b"before"])
    reader = reader_for(nsqd.tcp_address)
    try:
        reader.prepareForTriggerAvailableNow()
        time.sleep(0.01)  # nsqd's clock must move past the cutoff
        publish(nsqd.tcp_address, "events", [b"after"])
        _, partitions = plan(reader, 0)
        assert read_all(reader, partitions) == [b"before"]
        assert plan(reader, 1) == (1, [])  # nothing else was there before: done
    finally:
        reader.stop()
    assert consume(nsqd.tcp_address, "events", "spark", 1) == [b"after"]


def test_a_limit_per_trigger_is_shared_by_the_partitions(nsqd: NSQD, executor: Executor) -> None:
    publish(nsqd.tcp_address, "events", [b"l%d" % i for i in range(10)])
    reader = reader_for(nsqd.tcp_address, max_messages_per_trigger="4", num_partitions="2")
    try:
        assert reader.getDefaultReadLimit() == ReadMaxRows(4)
        end, partitions = plan(reader, 0)
        assert [p.limit for p in partitions] == [2, 2]
        assert len(read_all(reader, partitions)) == 4
        end, partitions = plan(reader, end, ReadMaxRows(6))
        assert len(read_all(reader, partitions)) == 6
    finally:
        reader.stop()


def test_the_reader_pickles_without_its_coordinator(nsqd: NSQD, executor: Executor) -> None:
    import pickle

    publish(nsqd.tcp_address, "events", [b"p"])
    reader = reader_for(nsqd.tcp_address, num_partitions="1")
    try:
        _, [partition] = plan(reader, 0)
        copy = pickle.loads(pickle.dumps(reader))
        assert copy.options == reader.options and copy._coordinator is None
        assert read(copy, pickle.loads(pickle.dumps(partition))) == [b"p"]
    finally:
        reader.stop()


def test_tls_auth_and_compression_options_reach_nsqd(
    nsqd_factory: Callable[..., NSQD], pki: Pki, executor: Executor
) -> None:
    server, ca_file = pki.server_context(), pki.ca_file
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
        parse_sink_options({"topic": "events", "nsqd_tcp_addresses": node.tcp_address, **secure}),
        StructType([StructField("value", StringType())]),
    )
    assert writer.write(iter([pa.RecordBatch.from_pydict({"value": ["one", "two"]})])).messages == 2
    reader = reader_for(node.tcp_address, deflate="true", **secure)
    try:
        _, partitions = plan(reader, 0)
        assert sorted(read_all(reader, partitions)) == [b"one", b"two"]
    finally:
        reader.stop()
    assert secrets and set(secrets) == {"open-sesame"}


def test_nsqds_are_found_through_lookupd(nsq_cluster: Cluster, executor: Executor) -> None:
    [address] = nsq_cluster.nsqd_tcp_addresses
    [lookupd] = nsq_cluster.lookupd_http_addresses
    publish(address, "found", [b"via lookupd"])
    wait_until_blocking(
        lambda: httpx.get(f"http://{lookupd}/lookup?topic=found").status_code == 200,
        what="the topic's registration",
    )
    options = {"topic": "found", "channel": "spark", "lookupd_http_addresses": lookupd}
    reader = NSQStreamReader(parse_source_options(options))
    try:
        _, partitions = plan(reader, 0)
        rows = [r for p in partitions for b in reader.read(p) for r in b.to_pylist()]
        assert [(r["body"], r["nsqd_address"], r["topic"]) for r in rows] == [
            (b"via lookupd", address, "found")
        ]
    finally:
        reader.stop()


def test_an_unreachable_nsqd_fails_the_read_with_one_line_after_the_connect_timeout(
    executor: Executor,
) -> None:
    from tests.support.ports import free_port

    address = f"127.0.0.1:{free_port()}"
    reader = reader_for(address, connect_timeout="0.5")
    try:
        _, partitions = plan(reader, 0)
        began = time.monotonic()
        with pytest.raises(NSQSourceError) as failure:
            read(reader, partitions[0])
        assert time.monotonic() - began < 15
        message = str(failure.value)
        assert "\n" not in message
        assert f"no nsqd connection for events/spark after 0.5s: nsqd {address}:" in message
        assert "refused" in message.lower()
    finally:
        reader.stop()


def test_an_unreachable_coordinator_fails_the_read_with_one_line(
    nsqd: NSQD, executor: Executor
) -> None:
    reader = reader_for(nsqd.tcp_address, connect_timeout="0.5")
    _, partitions = plan(reader, 0)
    reader.stop()  # the driver side is gone
    with pytest.raises(NSQSourceError, match="cannot reach the nsq source's coordinator"):
        read(reader, partitions[0])


def test_a_connection_lost_while_reading_fails_the_read(
    executor: Executor, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests import reference

    reference.require("nsqd")
    daemon = reference.RealDaemon("nsqd", ["--log-level=warn"])  # SIGKILLed below
    daemon.start()
    reader = reader_for(daemon.tcp_address, num_partitions="1", max_batch_wait="3")
    stop = threading.Event()
    try:
        publish(daemon.tcp_address, "events", [b"first"])
        end, [partition] = plan(reader, 0)
        assert read(reader, partition) == [b"first"]  # the agent is up and subscribed

        # Messages trickle in, so the next read waits its whole max_batch_wait...
        def trickle() -> None:
            n = 0
            while not stop.wait(0.05):
                try:
                    publish(daemon.tcp_address, "events", [b"t%d" % n])
                except Exception:
                    return
                n += 1

        threading.Thread(target=trickle, daemon=True).start()
        wait_until_blocking(
            lambda: channel_stats(daemon)["depth"] + channel_stats(daemon)["in_flight_count"] > 3,
            what="a trickle",
        )
        end, [partition] = plan(reader, end)
        # ... and nsqd dies in the middle of it.
        threading.Timer(1.0, daemon.kill).start()
        as_task(monkeypatch, attempt=0, task=1)
        with pytest.raises(NSQSourceError) as failure:
            read(reader, partition)
        assert "lost the connection to nsqd" in str(failure.value)
        assert "\n" not in str(failure.value)
    finally:
        stop.set()
        reader.stop()
        daemon.close()


def test_the_agent_leaves_with_its_executor(nsqd: NSQD, own_executor: Executor) -> None:
    publish(nsqd.tcp_address, "events", [b"x"])
    reader = reader_for(nsqd.tcp_address)
    try:
        _, partitions = plan(reader, 0)
        read_all(reader, partitions)
        [agent] = agent_pids(nsqd)
        own_executor.kill()
        wait_until_blocking(lambda: not _alive(agent), what="the agent to leave")
        # It requeued what it held on the way out.
        wait_until_blocking(lambda: channel_stats(nsqd)["in_flight_count"] == 0, what="requeue")
        assert channel_stats(nsqd)["depth"] == 1
    finally:
        reader.stop()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return (
        Path(f"/proc/{pid}").exists()
        and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]
    )


# Real nsqd's behaviour: a dead consumer's messages come back when their timeout expires.
@pytest.mark.nsqd(requeue_on_disconnect=False)
def test_a_killed_agent_loses_nothing(
    nsqd: NSQD, executors: Callable[[], Executor], monkeypatch: pytest.MonkeyPatch
) -> None:
    bodies = [b"k%d" % i for i in range(5)]
    publish(nsqd.tcp_address, "events", bodies)
    first = executors()
    on(monkeypatch, first)
    reader = reader_for(nsqd.tcp_address, num_partitions="1", msg_timeout="2")
    try:
        _, [partition] = plan(reader, 0)
        assert sorted(read(reader, partition)) == bodies
        [agent] = agent_pids(nsqd)
        os.kill(agent, signal.SIGKILL)
        wait_until_blocking(lambda: not _alive(agent), what="the agent's death")
        wait_until_blocking(lambda: not linked_agents(reader), what="the coordinator to notice")
        # No requeue this time: nsqd times the messages out, and they come again.
        end = 1
        seen: list[bytes] = []
        deadline = time.monotonic() + 30
        while sorted(seen) != bodies and time.monotonic() < deadline:
            end, partitions = plan(reader, end)
            seen.extend(read_all(reader, partitions))
        assert sorted(seen) == bodies
    finally:
        reader.stop()


def test_big_messages_lower_what_a_partition_holds(nsqd: NSQD, executor: Executor) -> None:
    bodies = [bytes([65 + i % 26]) * 8192 for i in range(60)]
    publish(nsqd.tcp_address, "events", bodies)
    reader = reader_for(
        nsqd.tcp_address, max_bytes_in_flight="64k", connections_per_nsqd="1", num_partitions="1"
    )
    try:
        end, [partition] = plan(reader, 0)
        seen = read(reader, partition)
        # 64 KiB of 8 KiB bodies: 8 held at a time (plus what came before the first
        # sizes were known), not all 60.
        wait_until_blocking(lambda: channel_stats(nsqd)["in_flight_count"] <= 16, what="a lower RDY")
        while len(seen) < len(bodies):
            end, partitions = plan(reader, end)
            seen += read_all(reader, partitions)
            assert channel_stats(nsqd)["in_flight_count"] <= 16
        assert sorted(seen) == sorted(bodies)
    finally:
        reader.stop()


def test_an_unreachable_lookupd_fails_the_read_with_one_line(executor: Executor) -> None:
    from tests.support.ports import free_port

    lookupd = f"127.0.0.1:{free_port()}"
    options = {
        "topic": "events",
        "channel": "spark",
        "lookupd_http_addresses": lookupd,
        "connect_timeout": "0.5",
    }
    reader = NSQStreamReader(parse_source_options(options))
    try:
        _, partitions = plan(reader, 0)
        began = time.monotonic()
        with pytest.raises(NSQSourceError) as failure:
            read(reader, partitions[0])
        assert time.monotonic() - began < 15
        message = str(failure.value)
        assert "\n" not in message
        assert f"no nsqd connection for events/spark after 0.5s: lookupd {lookupd}:" in message
    finally:
        reader.stop()
