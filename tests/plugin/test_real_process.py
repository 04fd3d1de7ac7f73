"""The one runner of a real daemon (``fakensq.testing.real.RealProcess``: the
plugin's ``--nsq-real`` nodes and ``tests.reference.RealDaemon`` alike) when
a port it picked free is taken before the daemon binds it, as parallel test
workers make happen: a first start moves to fresh ports, a given port is
kept (and the start fails), a daemon of another test answering on our HTTP
port is not taken for ours, and a cluster's nsqds register with their
nsqlookupds where those ended up."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio

from fakensq.testing import real
from fakensq.testing.real import RealBinaries, RealCluster, RealProcess
from tests import reference
from tests.support.ports import free_port


@pytest.fixture
def binaries() -> RealBinaries:
    return RealBinaries(reference.require("nsqd"), reference.require("nsqlookupd"))


@pytest.fixture
def held_port() -> Iterator[int]:
    """A loopback port someone else listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def picks_first(monkeypatch: pytest.MonkeyPatch, *ports: int) -> None:
    """The runner's next picks of a free port are ``ports``, then free ones."""
    queue = list(ports)
    monkeypatch.setattr(real, "free_port", lambda: queue.pop(0) if queue else free_port())


def port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


@pytest.mark.parametrize("which", ["tcp", "http"])
def test_a_first_start_moves_off_a_taken_port(
    binaries: RealBinaries,
    tmp_path: Path,
    held_port: int,
    monkeypatch: pytest.MonkeyPatch,
    which: str,
) -> None:
    picks_first(monkeypatch, *((held_port,) if which == "tcp" else (free_port(), held_port)))
    nsqd = RealProcess(binaries.nsqd, [], tmp_path, "nsqd-0")
    assert held_port in (port_of(nsqd.tcp_address), port_of(nsqd.http_address))
    try:
        nsqd.start()
        assert held_port not in (port_of(nsqd.tcp_address), port_of(nsqd.http_address))
        info = httpx.get(f"http://{nsqd.http_address}/info").json()
        assert info["tcp_port"] == port_of(nsqd.tcp_address)
        assert "address already in use" in nsqd.log()
    finally:
        nsqd.stop()


def test_a_given_port_is_kept(binaries: RealBinaries, tmp_path: Path, held_port: int) -> None:
    nsqd = RealProcess(binaries.nsqd, [], tmp_path, "nsqd-0", tcp_port=held_port)
    try:
        with pytest.raises(RuntimeError, match="address already in use"):
            nsqd.start()
        assert port_of(nsqd.tcp_address) == held_port
    finally:
        nsqd.stop()


def test_another_daemon_on_our_http_port_is_not_ours(
    binaries: RealBinaries, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with reference.RealDaemon("nsqd") as other:
        # Our first TCP port is free, our HTTP port is the other nsqd's: its
        # /ping answers while ours exits, address already in use.
        picks_first(monkeypatch, free_port(), port_of(other.http_address))
        nsqd = RealProcess(binaries.nsqd, [], tmp_path, "nsqd-0")
        try:
            nsqd.start()
            assert nsqd.http_address != other.http_address
            info = httpx.get(f"http://{nsqd.http_address}/info").json()
            assert info["tcp_port"] == port_of(nsqd.tcp_address)
        finally:
            nsqd.stop()


def test_nsqds_register_where_the_lookupd_ended_up(
    binaries: RealBinaries, tmp_path: Path, held_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    picks_first(monkeypatch, held_port)  # the nsqlookupd's first TCP port
    cluster = RealCluster(binaries, tmp_path, nsqd=1, lookupd=1)
    try:
        cluster.start()  # returns once the nsqd is registered with the lookupd
        assert port_of(cluster.lookupd_tcp_addresses[0]) != held_port
        assert cluster.nsqd_tcp_addresses == [cluster.nsqd_processes[0].tcp_address]
    finally:
        cluster.close()


async def test_a_fault_proxy_follows_its_nsqd_to_fresh_ports(
    binaries: RealBinaries, tmp_path: Path, held_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The proxy is made (and its nsqd told to broadcast it) before the nsqd
    # starts; the nsqd's first TCP port is taken, so it moves: the proxy
    # relays to where it ended up, and a publish through it is stored.
    import trionsq
    from fakensq.testing.pytest_faults import FaultSettings, TestFaults
    from fakensq.testing.real import faulty_real_cluster

    picks_first(monkeypatch, held_port)
    cluster = RealCluster(binaries, tmp_path, nsqd=1, lookupd=0)
    settings = FaultSettings(seed=1, rate=0.0)
    faults = TestFaults(settings, "t", 0.0, "safe", None, None, 3, 2.0)
    async with faulty_real_cluster(faults, "nsqd-0", cluster, 2.0):
        assert port_of(cluster.nsqd_processes[0].tcp_address) != held_port
        async with trionsq.Producer(nsqd_tcp_addresses=cluster.nsqd_tcp_addresses) as producer:
            with trio.fail_after(10):
                await producer.publish("moved", b"through the proxy")
        http = cluster.nsqd_processes[0].http_address
        async with httpx.AsyncClient() as client:
            stats = (await client.get(f"http://{http}/stats?format=json&topic=moved")).json()
        assert [t["message_count"] for t in stats["topics"]] == [1]
