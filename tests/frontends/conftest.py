"""An nsqd for the front ends' end-to-end tests: fakensq's, and the real v1.3.0.

``daemon`` is parametrized over both (the real one skips with a reason where
its binaries are absent).  Either can be killed (SIGKILL for the real one,
:meth:`fakensq.Cluster.kill_nsqd` for fakensq) and started again on the same
ports; ``stats`` reads its ``/stats`` JSON.  Options use fakensq's names
(seconds for times) and are translated into the real daemon's flags.
"""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx
import pytest
import trustme

from fakensq.testing.cluster import Cluster
from fakensq.testing.threaded import BackgroundNode
from tests import reference
from tests.authserver import AuthServer
from trionsq import BackoffPolicy

#: Reconnect quickly after a restart (the default waits seconds).
FAST_RECONNECT = BackoffPolicy(base=0.05, max=0.2, multiplier=2.0, jitter=0.0)


class Daemon(Protocol):
    kind: str
    tcp_address: str
    http_address: str

    def kill(self) -> None: ...

    def start(self) -> None: ...


class FakeDaemon:
    kind = "fakensq"

    def __init__(self, root: Path, options: dict[str, Any]) -> None:
        self._node: BackgroundNode[Cluster] = BackgroundNode(
            lambda: Cluster(nsqd=1, lookupd=0, nsqd_options=options, data_root=str(root)),
            name="fakensq-cluster",
        )
        cluster = self._node.start()
        self.cluster = cluster
        self.tcp_address = cluster.nsqd_tcp_addresses[0]
        self.http_address = cluster.nsqd_http_addresses[0]

    def kill(self) -> None:
        self._node.call(self.cluster.kill_nsqd, 0)

    def start(self) -> None:
        self._node.call(self.cluster.start_nsqd, 0)

    def close(self) -> None:
        self._node.stop()


def _flags(options: dict[str, Any]) -> list[str]:
    flags = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if name == "auth_http_addresses":
            flags += [f"--auth-http-address={address}" for address in value]
        elif name in ("msg_timeout", "max_req_timeout"):
            flags.append(f"{flag}={int(value * 1000)}ms")
        else:
            flags.append(f"{flag}={value}")
    return flags


class RealDaemon:
    kind = "nsqd"

    def __init__(self, options: dict[str, Any]) -> None:
        flags = _flags(options)
        if "tls_cert" in options:
            # nsqd then also listens for HTTPS, by default on 0.0.0.0:4152,
            # which another test (or daemon) on the machine may hold.
            flags.append(f"--https-address=127.0.0.1:{reference.free_port()}")
        self._daemon = reference.RealDaemon("nsqd", flags)
        self._daemon.start()
        self.tcp_address = self._daemon.tcp_address
        self.http_address = self._daemon.http_address

    def kill(self) -> None:
        self._daemon.kill()

    def start(self) -> None:
        self._daemon.start()

    def close(self) -> None:
        self._daemon.close()


@dataclass
class Nsqds:
    """Starts daemons of one kind; all are closed after the test."""

    kind: str
    root: Path
    started: list[FakeDaemon | RealDaemon] = field(default_factory=list)

    def __call__(self, **options: Any) -> Daemon:
        daemon: FakeDaemon | RealDaemon
        if self.kind == "fakensq":
            root = self.root / f"fake-{len(self.started)}"
            root.mkdir()
            daemon = FakeDaemon(root, options)
        else:
            daemon = RealDaemon(options)
        self.started.append(daemon)
        return daemon


@pytest.fixture(params=["fakensq", "nsqd"])
def nsqds(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Nsqds]:
    """``nsqds(**options)`` starts an nsqd of the parametrized kind."""
    if request.param == "nsqd":
        reference.require("nsqd")
    factory = Nsqds(request.param, tmp_path)
    try:
        yield factory
    finally:
        for daemon in reversed(factory.started):
            daemon.close()


class FakeCluster:
    """fakensq: ``nsqd`` nsqds registered with one nsqlookupd."""

    kind = "fakensq"

    def __init__(self, root: Path, nsqd: int, options: dict[str, Any]) -> None:
        self._node: BackgroundNode[Cluster] = BackgroundNode(
            lambda: Cluster(nsqd=nsqd, lookupd=1, nsqd_options=options, data_root=str(root)),
            name="fakensq-cluster",
        )
        self.cluster = self._node.start()
        self.nsqd_tcp_addresses = list(self.cluster.nsqd_tcp_addresses)
        self.nsqd_http_addresses = list(self.cluster.nsqd_http_addresses)
        self.lookupd_http_addresses = list(self.cluster.lookupd_http_addresses)

    def kill_nsqd(self, i: int) -> None:
        self._node.call(self.cluster.kill_nsqd, i)

    def start_nsqd(self, i: int) -> None:
        self._node.call(self.cluster.start_nsqd, i)

    def close(self) -> None:
        self._node.stop()


class RealCluster:
    """The real v1.3.0: ``nsqd`` nsqds registered with one nsqlookupd."""

    kind = "nsqd"

    def __init__(self, nsqd: int, options: dict[str, Any]) -> None:
        self._lookupd = reference.RealDaemon("nsqlookupd")
        self._lookupd.start()
        flags = [f"--lookupd-tcp-address={self._lookupd.tcp_address}", *_flags(options)]
        self._nsqds = [reference.RealDaemon("nsqd", flags) for _ in range(nsqd)]
        for daemon in self._nsqds:
            daemon.start()
        self.nsqd_tcp_addresses = [d.tcp_address for d in self._nsqds]
        self.nsqd_http_addresses = [d.http_address for d in self._nsqds]
        self.lookupd_http_addresses = [self._lookupd.http_address]

    def kill_nsqd(self, i: int) -> None:
        self._nsqds[i].kill()

    def start_nsqd(self, i: int) -> None:
        self._nsqds[i].start()

    def close(self) -> None:
        for daemon in self._nsqds:
            daemon.close()
        self._lookupd.close()


@pytest.fixture(params=["fakensq", "nsqd"])
def clusters(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[..., FakeCluster | RealCluster]]:
    """``clusters(nsqd=2, **nsqd_options)``: nsqds and an nsqlookupd, fakensq's or real."""
    if request.param == "nsqd":
        reference.require("nsqd")
        reference.require("nsqlookupd")
    started: list[FakeCluster | RealCluster] = []

    def make(nsqd: int = 2, **options: Any) -> FakeCluster | RealCluster:
        cluster: FakeCluster | RealCluster
        if request.param == "fakensq":
            root = tmp_path / f"cluster-{len(started)}"
            root.mkdir()
            cluster = FakeCluster(root, nsqd, options)
        else:
            cluster = RealCluster(nsqd, options)
        started.append(cluster)
        return cluster

    try:
        yield make
    finally:
        for cluster in reversed(started):
            cluster.close()


@pytest.fixture
def daemon(nsqds: Nsqds) -> Daemon:
    """One nsqd with default options, fakensq's or the real one."""
    return nsqds()


def stats(daemon: Daemon, topic: str, channel: str | None = None) -> dict[str, Any]:
    """The topic's (or channel's) entry of nsqd's /stats JSON ({} if absent)."""
    response = httpx.get(f"http://{daemon.http_address}/stats?format=json&topic={topic}")
    response.raise_for_status()
    for entry in response.json().get("topics") or []:
        if entry["topic_name"] != topic:
            continue
        if channel is None:
            return dict(entry)
        for chan in entry.get("channels") or []:
            if chan["channel_name"] == channel:
                return dict(chan)
    return {}


def wait_until(predicate: Callable[[], bool], limit: float = 20.0) -> None:
    """Poll a condition spread over client and server (real sockets, no virtual time)."""
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {limit} s")
        time.sleep(0.005)


@dataclass
class Tls:
    """A CA, nsqd's certificate files, and a client context trusting the CA."""

    cert: str
    key: str
    client: ssl.SSLContext


@pytest.fixture(scope="session")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    directory = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    cert, key = directory / "server.pem", directory / "server.key"
    server.private_key_pem.write_to_path(str(key))
    cert.write_bytes(b"".join(blob.bytes() for blob in server.cert_chain_pems))
    client = ssl.create_default_context()
    ca.configure_trust(client)
    return Tls(str(cert), str(key), client)


@pytest.fixture
def auth_server() -> Iterator[AuthServer]:
    server = AuthServer({"open-sesame": ["subscribe", "publish"]})
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def no_threads_left() -> Iterator[None]:
    """Fails the test if a thread of the front ends outlives it (they are all
    named ``trionsq-...``: loop threads, handler threads, give-up helpers).
    Threads already running before the test are not its own: the Spark sink's
    per-process producer thread, started by a Spark test that ran earlier on
    the same xdist worker, lives until the process exits, by design."""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 5
    while True:
        left = [
            t
            for t in threading.enumerate()
            if t.name.startswith("trionsq") and t.is_alive() and t not in before
        ]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert not left, f"threads left behind: {left}"
