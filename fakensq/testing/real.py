"""The real nsqd and nsqlookupd behind the pytest plugin's fixtures
(``pytest --nsq-real=PATH``), so a project checks its tests against nsqd itself.

:func:`find_binaries` reads the option (a folder holding ``nsqd`` and
``nsqlookupd``, or the ``nsqd`` binary; empty: ``$NSQ_BIN``, then ``PATH``).
:class:`RealCluster` runs ``nsqd`` nsqds wired to ``lookupd`` nsqlookupds on
free loopback ports, each with a data path of its own, restartable in place
(it is the :class:`~fakensq.testing.faults.NodeControl` of node faults).  The
fixtures' options are nsqd's and nsqlookupd's option names, as for fakensq's
own nodes, passed as the daemons' flags (:func:`daemon_flags`).

With ``--nsq-faults``, :func:`faulty_real_cluster` puts a ``fakensq proxy``
(:class:`~fakensq.testing.proxy.FaultProxy`) in front of each nsqd and plays
the faults there, placed by the message flow as on fakensq; each nsqd
broadcasts its proxy's port to the nsqlookupds, so consumers that discover
nodes connect through it too.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import httpx
import trio

from trionsq.tools.flags import FlagSet, format_duration

if TYPE_CHECKING:
    from .pytest_faults import TestFaults

__all__ = [
    "RealBinaries",
    "RealCluster",
    "RealNSQD",
    "daemon_flags",
    "faulty_real_cluster",
    "find_binaries",
]

#: A Go daemon starts in milliseconds; a loaded machine can take far longer.
START_TIMEOUT: Final = 20.0
#: How long a daemon gets to leave after SIGTERM before it is killed.
STOP_TIMEOUT: Final = 10.0


@dataclass(frozen=True)
class RealBinaries:
    """The real daemons' executables."""

    nsqd: Path
    nsqlookupd: Path


def find_binaries(text: str) -> RealBinaries:
    """The binaries ``--nsq-real`` names: a folder with ``nsqd`` and
    ``nsqlookupd``, or the ``nsqd`` binary (``nsqlookupd`` beside it); ``""``:
    ``$NSQ_BIN``'s folder, else ``nsqd`` on ``PATH``.  ``ValueError`` (one
    line) when they are not there."""
    given = text or os.environ.get("NSQ_BIN", "")
    if not given:
        found = shutil.which("nsqd")
        if found is None:
            raise ValueError(
                "--nsq-real: no nsqd on PATH and no NSQ_BIN: give the folder of nsqd "
                "and nsqlookupd (--nsq-real=PATH)"
            )
        given = found
    path = Path(given).expanduser()
    if not path.exists():
        raise ValueError(
            f"--nsq-real: {path} does not exist (give the folder of nsqd and nsqlookupd, "
            "or the nsqd binary)"
        )
    folder = path if path.is_dir() else path.parent
    nsqd = path if path.is_file() else folder / "nsqd"
    lookupd = folder / "nsqlookupd"
    for binary in (nsqd, lookupd):
        if not (binary.is_file() and os.access(binary, os.X_OK)):
            raise ValueError(
                f"--nsq-real: no executable {binary.name} at {binary} (give the folder of "
                "nsqd and nsqlookupd, or the nsqd binary)"
            )
    return RealBinaries(nsqd, lookupd)


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One TLS context for the readiness checks: httpx would load the CA
    bundle for every client otherwise (10-150 ms a start on a loaded machine)."""
    return ssl.create_default_context()


def free_port() -> int:
    """A loopback port free right now (bound, then released: a tiny race)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def daemon_flags(flagset: FlagSet, options: Mapping[str, Any]) -> list[str]:
    """``options`` (the fields of fakensq's NSQDOptions or LookupdOptions) as
    the flags of the real daemon whose flags ``flagset`` declares.
    ``ValueError`` for an option the daemon has no flag for."""
    by_field = {f.dest: f for f in flagset.flags.values() if f.dest}
    flags = []
    for name, value in options.items():
        flag = by_field.get(name)
        if flag is None:
            raise ValueError(f"the real {flagset.name} has no flag for the option {name!r}")
        if flag.join is not None:
            flags += [f"--{flag.name}={item}" for item in value]
        elif flag.kind == "duration":
            flags.append(f"--{flag.name}={format_duration(float(value))}")
        elif flag.is_bool:
            flags.append(f"--{flag.name}={'true' if value else 'false'}")
        else:
            flags.append(f"--{flag.name}={value}")
    return flags


class RealProcess:
    """One real daemon (nsqd, nsqlookupd or nsqadmin, by ``binary``'s name) on
    fixed loopback ports, restartable on them; the one way the plugin and the
    project's own tests (``tests/reference.py``) run a real daemon.

    ``tcp_port``/``http_port`` fix a port; the others are picked free.  A port
    picked free may be taken by another process before the daemon binds it
    (parallel test workers): a first start then tries fresh ones.  nsqadmin
    gets only ``--http-address``; nsqd gets ``--data-path``.  The daemon's
    output goes to :attr:`log_path`, under ``data_path``.
    """

    def __init__(
        self,
        binary: Path,
        flags: Sequence[str],
        data_path: Path,
        name: str,
        *,
        tcp_port: int | None = None,
        http_port: int | None = None,
    ) -> None:
        self.binary = binary
        #: which daemon it is ("nsqd"...): the binary's name when made
        self.kind = binary.name
        self.flags = list(flags)
        self.data_path = data_path
        self.name = name
        self.tcp_address = f"127.0.0.1:{tcp_port or free_port()}"
        self.http_address = f"127.0.0.1:{http_port or free_port()}"
        self._fresh_ports = (tcp_port is None, http_port is None)
        self.log_path = data_path / f"{binary.name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._started = False

    @property
    def argv(self) -> list[str]:
        if self.kind == "nsqadmin":  # HTTP only
            return [str(self.binary), f"--http-address={self.http_address}", *self.flags]
        argv = [
            str(self.binary),
            f"--tcp-address={self.tcp_address}",
            f"--http-address={self.http_address}",
            "--broadcast-address=127.0.0.1",
        ]
        if self.kind == "nsqd":
            argv.append(f"--data-path={self.data_path}")
        return argv + self.flags

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        """Start (again: the same ports and data) and wait until it answers."""
        for attempt in range(3):
            try:
                self._start()
                self._started = True
                return
            except RuntimeError as exc:
                taken = "address already in use" in str(exc)
                if self._started or not taken or not any(self._fresh_ports) or attempt == 2:
                    raise
                if self._fresh_ports[0]:
                    self.tcp_address = f"127.0.0.1:{free_port()}"
                if self._fresh_ports[1]:
                    self.http_address = f"127.0.0.1:{free_port()}"

    def _start(self) -> None:
        if self.running:
            raise RuntimeError(f"{self.name} is already running")
        self.data_path.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + START_TIMEOUT
        with httpx.Client(timeout=2.0, verify=_tls_context()) as client:
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"{self.name} exited with {self.process.returncode}: {self.log()[-2000:]}"
                    )
                try:
                    # Any answer will do: with --tls-required=true nsqd answers
                    # plain HTTP with 403 TLS_REQUIRED.
                    if client.get(f"http://{self.http_address}/ping").status_code < 500:
                        if self._answering_is_ours(client):
                            return
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    self.kill()
                    raise TimeoutError(
                        f"{self.name} did not answer /ping in {START_TIMEOUT:g}s: "
                        f"{self.log()[-2000:]}"
                    )
                time.sleep(0.01)  # polling another process's readiness

    def _answering_is_ours(self, client: httpx.Client) -> bool:
        """Whether the daemon answering on our HTTP port is this one.

        Free ports are picked by binding and releasing them, so a daemon that
        another test started meanwhile can hold one of ours: this one then
        dies at once ("address already in use"), but the other answers /ping.
        An nsqd's /info names its TCP port; for the others, this process must
        still be running (checked again by the caller's loop).
        """
        if self.kind != "nsqd":
            return self.running
        response = client.get(f"http://{self.http_address}/info")
        if response.status_code != 200:
            return True  # --tls-required: /info is refused over plain HTTP
        port = response.json().get("tcp_port")
        return bool(port == int(self.tcp_address.rsplit(":", 1)[1]))

    def stop(self) -> int | None:
        """SIGTERM, as an operator stops it (nsqd saves its state), then wait;
        its exit status (None if it never started)."""
        return self._signal(signal.SIGTERM)

    def kill(self) -> int | None:
        """SIGKILL: nothing saved, connections cut."""
        return self._signal(signal.SIGKILL)

    def _signal(self, sig: signal.Signals) -> int | None:
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(sig)
            try:
                process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return process.returncode

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


@dataclass
class RealNSQD:
    """What the ``nsqd`` fixture is under ``--nsq-real``: a real nsqd's
    addresses (``tcp_address``: its proxy's, when faults are on)."""

    process: RealProcess
    #: where clients connect: the nsqd, or the fault proxy in front of it
    tcp_address: str
    http_address: str

    @property
    def real_tcp_address(self) -> str:
        """The nsqd's own TCP address (past the proxy)."""
        return self.process.tcp_address

    @property
    def data_path(self) -> str:
        return str(self.process.data_path)


class RealCluster:
    """``nsqd`` real nsqds wired to ``lookupd`` real nsqlookupds, on loopback,
    with the addresses of :class:`fakensq.Cluster` (nodes ``nsqd-N`` and
    ``lookupd-N``); ``nsqd_options``/``lookupd_options`` are option names of
    fakensq's nodes, passed as the daemons' flags."""

    def __init__(
        self,
        binaries: RealBinaries,
        data_root: Path,
        *,
        nsqd: int = 1,
        lookupd: int = 1,
        nsqd_options: Mapping[str, Any] | None = None,
        lookupd_options: Mapping[str, Any] | None = None,
    ) -> None:
        from ..lookupd.flags import nsqlookupd_flagset
        from ..nsqd.flags import nsqd_flagset

        self.lookupd_processes = [
            RealProcess(
                binaries.nsqlookupd,
                daemon_flags(nsqlookupd_flagset(), lookupd_options or {}),
                data_root / f"lookupd-{i}",
                f"lookupd-{i}",
            )
            for i in range(lookupd)
        ]
        nsqd_flags = daemon_flags(nsqd_flagset(), nsqd_options or {})
        # (the nsqlookupds' addresses are added once they run: a first start
        # may have moved one to fresh ports)
        self.nsqd_processes = [
            RealProcess(binaries.nsqd, nsqd_flags, data_root / f"nsqd-{i}", f"nsqd-{i}")
            for i in range(nsqd)
        ]
        # nsqd i's proxy's address, where one fronts it (see front)
        self._fronts: dict[int, str] = {}

    # -- the addresses of fakensq.Cluster --------------------------------------

    @property
    def client_addresses(self) -> list[str]:
        """Where clients connect to each nsqd: its proxy, else itself."""
        return [self._fronts.get(i, p.tcp_address) for i, p in enumerate(self.nsqd_processes)]

    @property
    def nsqds(self) -> list[RealNSQD]:
        return [
            RealNSQD(p, tcp, p.http_address)
            for p, tcp in zip(self.nsqd_processes, self.client_addresses, strict=True)
        ]

    @property
    def nsqd_tcp_addresses(self) -> list[str]:
        return self.client_addresses

    @property
    def nsqd_http_addresses(self) -> list[str]:
        return [p.http_address for p in self.nsqd_processes]

    @property
    def lookupd_tcp_addresses(self) -> list[str]:
        return [p.tcp_address for p in self.lookupd_processes]

    @property
    def lookupd_http_addresses(self) -> list[str]:
        return [p.http_address for p in self.lookupd_processes]

    def front(self, i: int, address: str) -> None:
        """Clients reach nsqd ``i`` at ``address`` (its proxy), which it
        broadcasts to the nsqlookupds; call before :meth:`start`."""
        self._fronts[i] = address
        port = address.rpartition(":")[2]
        self.nsqd_processes[i].flags.append(f"--broadcast-tcp-port={port}")

    # -- running -------------------------------------------------------------------

    def start(self) -> None:
        """Start every node; return once each nsqd is registered everywhere."""
        try:
            for process in self.lookupd_processes:
                process.start()
            lookups = [f"--lookupd-tcp-address={p.tcp_address}" for p in self.lookupd_processes]
            for process in self.nsqd_processes:
                process.flags += lookups
                process.start()
            self.wait_registered()
        except BaseException:
            self.close()
            raise

    def wait_registered(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        wanted = {p.process.http_address for p in self.nsqds}
        with httpx.Client(timeout=2.0) as client:
            for lookupd in self.lookupd_processes:
                while True:
                    try:
                        doc = client.get(f"http://{lookupd.http_address}/nodes").json()
                        ports = {
                            f"127.0.0.1:{n.get('http_port')}" for n in doc.get("producers") or []
                        }
                        if wanted <= ports:
                            break
                    except (httpx.HTTPError, ValueError):
                        pass
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"the nsqds did not register with {lookupd.name} in {START_TIMEOUT:g}s"
                        )
                    time.sleep(0.02)  # polling another process's state

    def close(self) -> None:
        """Stop every node (nsqds first)."""
        for process in [*self.nsqd_processes, *self.lookupd_processes]:
            process.stop()

    # -- fakensq.testing.faults.NodeControl ----------------------------------

    def _process(self, name: str) -> RealProcess:
        for process in [*self.nsqd_processes, *self.lookupd_processes]:
            if process.name == name:
                return process
        raise ValueError(f"no node {name!r}")

    async def stop_node(self, name: str, *, kill: bool = False) -> None:
        process = self._process(name)
        await trio.to_thread.run_sync(process.kill if kill else process.stop)

    async def start_node(self, name: str) -> None:
        await trio.to_thread.run_sync(self._process(name).start)

    def node_name_at(self, address: str) -> str:
        for process in [*self.nsqd_processes, *self.lookupd_processes]:
            if address in (process.tcp_address, process.http_address):
                return process.name
        return address


@asynccontextmanager
async def faulty_real_cluster(
    faults: TestFaults, label: str, cluster: RealCluster, msg_timeout: float
) -> AsyncIterator[RealCluster]:
    """A fault proxy in front of each of ``cluster``'s nsqds (bound first, so
    each nsqd broadcasts its proxy's port), playing ``label``'s faults placed
    by the message flow, while inside.  The cluster is started inside (in a
    worker thread) and closed on the way out."""
    from .faults import Faults
    from .proxy import FaultProxy
    from .pytest_faults import flowing

    injector = Faults(cluster)
    names = [p.name for p in cluster.nsqd_processes]
    proxies = [
        FaultProxy(p.tcp_address, http_address=None, name=p.name, faults=injector)
        for p in cluster.nsqd_processes
    ]
    player = faults.flow_player(
        label,
        injector,
        nsqd_names=names,
        lookupd_names=[p.name for p in cluster.lookupd_processes],
        real=True,
        msg_timeout=msg_timeout,
    )
    async with trio.open_nursery() as nursery:
        for i, proxy in enumerate(proxies):
            await nursery.start(proxy.serve)
            cluster.front(i, proxy.tcp_address)
        await trio.to_thread.run_sync(cluster.start)
        # A first start that found a port taken moved the nsqd to a fresh one.
        for proxy, process in zip(proxies, cluster.nsqd_processes, strict=True):
            proxy.retarget(process.tcp_address)
        try:
            async with flowing(player):
                yield cluster
        finally:
            nursery.cancel_scope.cancel()
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(cluster.close)
