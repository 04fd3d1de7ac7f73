"""What the source's own traffic shows a network, and where it listens.

Its TCP connections (agents to the coordinator, agents to agents) are TLS with
the query's key: a relay in the middle records neither a message body nor the
query's token.  Tokens and set ids are long random numbers; the coordinator
listens on loopback in local mode, and on the address Spark uses otherwise.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio

from fakensq import NSQD
from trionsq.spark import NSQInputPartition
from trionsq.spark import coordinator as coordinator_module
from trionsq.spark import source as source_module
from trionsq.spark._executor import ExecutorIdentity, settings_of
from trionsq.spark._ledger import Ledger
from trionsq.spark._options import parse_source_options
from trionsq.spark.agent import Agent
from trionsq.spark.coordinator import Coordinator, default_host, listen_address
from trionsq.spark.source import NSQStreamReader

from ..support.waiting import wait_until_blocking
from .conftest import as_task, publish


class Relay:
    """A TCP relay to ``target`` that records every byte it passes, both ways."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.recorded = bytearray()
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.address: tuple[str, int] = self._server.getsockname()[:2]
        self._sockets: list[socket.socket] = [self._server]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self._sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                with self._lock:
                    self.recorded += chunk
                sink.sendall(chunk)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        for sock in self._sockets:
            sock.close()


@pytest.fixture
def executors() -> Iterator[Callable[[], ExecutorIdentity]]:
    made: list[subprocess.Popen[bytes]] = []

    def make() -> ExecutorIdentity:
        process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        made.append(process)
        return ExecutorIdentity(f"sec-{len(made)}", "127.0.0.1", 1, process.pid)

    yield make
    for process in made:
        process.kill()
        process.wait()


def test_neither_bodies_nor_the_token_cross_the_network_in_the_clear(
    nsqd: NSQD,
    executors: Callable[[], ExecutorIdentity],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bodies = [b"confidential-%04d" % i for i in range(30)]
    publish(nsqd.tcp_address, "events", bodies)
    first, second = executors(), executors()
    options = {
        "topic": "events",
        "channel": "spark",
        "nsqd_tcp_addresses": nsqd.tcp_address,
        "max_batch_wait": "0.5",
        "num_partitions": "1",
    }
    reader = NSQStreamReader(parse_source_options(options))
    relays: list[Relay] = []
    try:
        end = reader.latestOffset({"batch": 0}, reader.getDefaultReadLimit())["batch"]
        [partition] = reader.partitions({"batch": 0}, {"batch": end})
        assert isinstance(partition, NSQInputPartition)
        loop, coordinator = reader._started()
        # The agents reach the coordinator through a relay that records.
        to_coordinator = Relay(coordinator.address)
        relays.append(to_coordinator)
        partition.coordinator = to_coordinator.address

        def read_on(identity: ExecutorIdentity, attempt: int) -> list[bytes]:
            monkeypatch.setattr(source_module, "identify", lambda: identity)
            as_task(monkeypatch, attempt=attempt, task=attempt + 1)
            return [b for batch in reader.read(partition) for b in batch.column(0).to_pylist()]

        rows = read_on(first, 0)
        assert sorted(rows) == sorted(bodies)
        # The retry on the other executor fetches the set from the first agent,
        # through a relay that records too.
        [holder] = loop.run_sync(lambda: list(coordinator.agents.values()))
        to_holder = Relay(holder.peer)
        relays.append(to_holder)
        loop.run_sync(lambda: setattr(holder, "peer", to_holder.address))
        assert read_on(second, 1) == rows
        reader.commit({"batch": end})
        wait_until_blocking(lambda: nsqd_finished(nsqd) == len(bodies), what="the FINs")
    finally:
        reader.stop()
        for relay in relays:
            relay.close()
    for relay in relays:
        recorded = bytes(relay.recorded)
        assert recorded[:1] == b"\x16"  # a TLS handshake record first
        assert coordinator.token.encode() not in recorded
        assert not [body for body in bodies if body in recorded]
    assert len(to_holder.recorded) > sum(map(len, bodies))  # the replay went through it


def nsqd_finished(nsqd: NSQD) -> int:
    import httpx

    stats = httpx.get(f"http://{nsqd.http_address}/stats?format=json").json()
    return sum(
        client["finish_count"]
        for topic in stats["topics"]
        for channel in topic["channels"]
        for client in channel["clients"]
    )


def test_tokens_and_set_ids_are_not_guessable() -> None:
    options = parse_source_options({"topic": "t", "channel": "c", "nsqd_tcp_addresses": "h:1"})
    tokens = {Coordinator(options).token for _ in range(3)}
    assert len(tokens) == 3 and all(len(token) >= 43 for token in tokens)  # 256 random bits
    ledger = Ledger()
    ledger.agent_joined("a")
    ids = [ledger.start_read(1, p, 1, 0, p, "a").set_id for p in range(10)]
    assert len(set(ids)) == 10
    assert sorted(ids) != list(range(min(ids), min(ids) + 10))  # not a counter
    assert max(ids).bit_length() > 40  # 62 random bits


LOCAL_OPTIONS = parse_source_options({"topic": "t", "channel": "c", "nsqd_tcp_addresses": "h:1"})


@pytest.mark.parametrize(
    ("extra", "settings", "expected"),
    [
        ({}, {"spark.master": "local[2]"}, ("127.0.0.1", "127.0.0.1")),
        ({}, {"spark.master": "local-cluster[2,1,1024]"}, ("127.0.0.1", "127.0.0.1")),
        (
            {"coordinator_host": "driver.example"},
            {"spark.master": "local[2]"},
            ("driver.example", "driver.example"),
        ),
        (
            {},
            {"spark.master": "yarn", "spark.driver.host": "10.1.2.3"},
            ("10.1.2.3", "10.1.2.3"),
        ),
        (
            {},
            {
                "spark.master": "k8s://https://api:6443",
                "spark.driver.host": "driver-svc.ns.svc",
                "spark.driver.bindAddress": "10.4.5.6",
            },
            ("10.4.5.6", "driver-svc.ns.svc"),
        ),
    ],
)
def test_the_coordinator_listens_no_wider_than_needed(
    extra: dict[str, str], settings: dict[str, str], expected: tuple[str, str]
) -> None:
    options = parse_source_options(
        {"topic": "t", "channel": "c", "nsqd_tcp_addresses": "h:1", **extra}
    )
    assert listen_address(options, settings) == expected


def test_the_drivers_settings_come_from_its_command_line(tmp_path: Path) -> None:
    argv = [
        "java",
        "-cp",
        "jars/*",
        "org.apache.spark.deploy.SparkSubmit",
        "--conf",
        "spark.master=local-cluster[2,1,1024]",
        "--conf",
        "spark.driver.host=127.0.0.1",
        "pyspark-shell",
    ]
    assert settings_of(argv) == {
        "spark.master": "local-cluster[2,1,1024]",
        "spark.driver.host": "127.0.0.1",
    }
    assert settings_of(["spark-submit", "--master", "yarn", "app.py"]) == {"spark.master": "yarn"}
    # Kubernetes' driver pods: a properties file, and the bind address on the line.
    properties = tmp_path / "spark.properties"
    properties.write_text(
        "# written by the submission client\n"
        "spark.master k8s://https://api:6443\n"
        "spark.driver.host=driver-svc.ns.svc\n"
        "other.setting=1\n"
    )
    argv = [
        "org.apache.spark.deploy.SparkSubmit",
        "--conf",
        "spark.driver.bindAddress=10.4.5.6",
        "--properties-file",
        str(properties),
    ]
    assert settings_of(argv) == {
        "spark.master": "k8s://https://api:6443",
        "spark.driver.host": "driver-svc.ns.svc",
        "spark.driver.bindAddress": "10.4.5.6",
    }


def test_a_coordinator_in_local_mode_listens_on_loopback_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    monkeypatch.delenv("SPARK_LOCAL_HOSTNAME", raising=False)
    monkeypatch.setattr(coordinator_module, "driver_settings", lambda: {"spark.master": "local[*]"})
    outside = default_host()  # this machine's address on its default route
    refused: list[bool] = []

    async def main() -> None:
        coordinator = Coordinator(LOCAL_OPTIONS)
        async with trio.open_nursery() as nursery:
            host, port = await nursery.start(coordinator.serve)
            assert host == "127.0.0.1"
            await (await trio.open_tcp_stream("127.0.0.1", port)).aclose()
            if outside != "127.0.0.1":
                try:
                    await (await trio.open_tcp_stream(outside, port)).aclose()
                except OSError:
                    refused.append(True)
                else:
                    refused.append(False)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert refused in ([], [True])


def test_an_agent_in_local_mode_takes_fetches_on_loopback_only() -> None:
    local = Agent(ExecutorIdentity("driver", "10.9.8.7", 1, 1), "unused", None)
    assert local.peer_host == "127.0.0.1"
    cluster = Agent(ExecutorIdentity("3", "10.9.8.7", 1, 1), "unused", None)
    assert cluster.peer_host == "10.9.8.7"  # the address Spark gave the executor
