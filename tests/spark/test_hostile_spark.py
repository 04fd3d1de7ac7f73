"""End to end: a Spark query archives every message while strangers attack the
coordinator and every agent's peer port the whole time."""

from __future__ import annotations

import os
import socket
import sys
import threading
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from fakensq import NSQD
from trionsq.spark._executor import driver_settings

from ..support.waiting import wait_until_blocking
from .conftest import cmdline, descendants, executor_pids, publish
from .hostile import HUGE_LENGTHS, alive, forge, memory, send_until_refused
from .test_source import source_runner_pids


def listening_ports(pid: int) -> list[int]:
    """The TCP ports process ``pid`` listens on (Linux /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                ports.append(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def arrow_loaded(pid: int) -> bool:
    return "libarrow" in Path(f"/proc/{pid}/maps").read_text()


def agent_pids(spark: SparkSession) -> set[int]:
    return {
        pid
        for executor in executor_pids(spark).values()
        for pid in descendants(executor)
        if "trionsq.spark.agent" in cmdline(pid)
    }


class Attacker(threading.Thread):
    """Sends every lie it knows to ``targets`` (ports on loopback) until stopped."""

    def __init__(self, targets: list[int]) -> None:
        super().__init__(daemon=True)
        self.targets = targets
        self.stopped = threading.Event()
        self.rounds = 0
        self.half_open: list[socket.socket] = []

    def lies(self) -> list[bytes]:
        wrong = {"op": "hello", "id": 0, "token": "guess", "set": 1}
        return [forge(wrong, length) for length in HUGE_LENGTHS] + [
            forge(wrong, header_length=2**32 - 1),
            b"\x16\x03\x01\x02\x00" + os.urandom(300),  # a mangled TLS handshake
            os.urandom(64),
        ]

    def run(self) -> None:
        while not self.stopped.is_set():
            for port in self.targets:
                for lie in self.lies():
                    try:
                        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                            sock.sendall(lie)
                            socket.socket.shutdown(sock, socket.SHUT_WR)
                            while sock.recv(65536):
                                pass
                    except OSError:
                        pass
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                        sock.sendall(forge({"op": "fetch", "token": "guess"}, 3 << 29))
                        send_until_refused(sock, 64 << 20)
                    if len(self.half_open) < 200:  # left open, never a byte
                        self.half_open.append(socket.create_connection(("127.0.0.1", port)))
                except OSError:
                    pass
            self.rounds += 1

    def stop(self) -> None:
        self.stopped.set()
        self.join(60)
        for sock in self.half_open:
            sock.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds Spark's processes in /proc")
def test_a_query_under_attack_archives_every_message(
    spark: SparkSession, nsqd: NSQD, tmp_path: Path
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        coordinator_port = probe.getsockname()[1]
    first = [b"under-attack-%05d" % i for i in range(300)]
    publish(nsqd.tcp_address, "attacked", first)
    query = (
        spark.readStream.format("nsq")
        .option("topic", "attacked")
        .option("channel", "archive")
        .option("nsqd_tcp_addresses", nsqd.tcp_address)
        .option("coordinator_port", str(coordinator_port))
        .load()
        .writeStream.format("parquet")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="0 seconds")
        .start(str(tmp_path / "out"))
    )
    attacker: Attacker | None = None
    try:

        def archived() -> set[bytes]:
            try:
                rows = spark.read.parquet(str(tmp_path / "out")).select("body").collect()
            except Exception:  # no Parquet file yet
                return set()
            return {row.body for row in rows}

        wait_until_blocking(lambda: archived() >= set(first), limit=120, what="the first messages")
        # Each agent imports pyarrow in a thread as it starts: measured once it has.
        wait_until_blocking(
            lambda: agent_pids(spark) and all(arrow_loaded(pid) for pid in agent_pids(spark)),
            limit=120,
            what="the agents' pyarrow",
        )
        agents = {pid: memory(pid)[1] for pid in agent_pids(spark)}
        peer_ports = [port for pid in agents for port in listening_ports(pid)]
        assert peer_ports, "no agent listens"
        [runner] = source_runner_pids(spark)
        assert listening_ports(runner) == [coordinator_port]
        # The coordinator found the driver's settings on its JVM's command line.
        settings = driver_settings(runner)
        assert settings is not None and settings["spark.master"].startswith("local-cluster")
        attacker = Attacker([coordinator_port, *peer_ports])
        attacker.start()
        second = [b"during-attack-%05d" % i for i in range(300)]
        publish(nsqd.tcp_address, "attacked", second)
        wait_until_blocking(lambda: attacker is not None and attacker.rounds >= 3, limit=120, what="attacks")
        wait_until_blocking(lambda: archived() >= set(first + second), limit=120, what="every message")
        attacker.stop()
        assert query.exception() is None and query.isActive
        for pid, peak_before in agents.items():
            assert alive(pid), "an agent died under attack"
            rss, peak = memory(pid)
            print(
                f"agent {pid} under attack: VmRSS {rss / 2**20:.1f} MiB, VmHWM "
                f"{peak / 2**20:.1f} MiB (before the attack {peak_before / 2**20:.1f} MiB)"
            )
            # The agent's own work (its first reads, Arrow's pool) moves its peak by
            # tens of MiB; what the attacks would cost (GiBs) cannot hide under this.
            assert peak < 256 << 20
        assert agent_pids(spark) == set(agents)  # the same agents, none restarted
    finally:
        if attacker is not None:
            attacker.stop()
        query.stop()
