"""fakensq's pytest plugin, registered through the ``pytest11`` entry point.

Add ``fakensq`` to a project's test dependencies and these fixtures are there, with
no conftest code:

- ``nsqd``: a fakensq nsqd on free loopback ports, serving real TCP and HTTP from a
  background thread, so any client works with it: Trio, asyncio, synchronous, or
  another language's.  ``nsqd.tcp_address`` and ``nsqd.http_address`` are
  ``"host:port"`` strings.
- ``nsqd_factory``: starts more nsqds, each stopped at the end of the test.
- ``nsqlookupd``: a fakensq nsqlookupd likewise (``.tcp_address``, ``.http_address``).
- ``nsq_cluster``: a :class:`fakensq.Cluster` (nsqds wired to every nsqlookupd,
  registered before the test starts); ``nsq_cluster.nsqd_tcp_addresses`` and
  ``nsq_cluster.lookupd_http_addresses`` are what clients need.

Options go through markers, with nsqd's and nsqlookupd's option names::

    @pytest.mark.nsqd(msg_timeout=5.0, max_rdy_count=100)
    def test_something(nsqd): ...

    @pytest.mark.nsqlookupd(tombstone_lifetime=1.0)
    @pytest.mark.nsq_cluster(nsqd=3, lookupd=2, nsqd_options={"mem_queue_size": 10})
    def test_cluster(nsq_cluster): ...

``@pytest.mark.nsqd`` also takes ``tls=True`` (a CA and a server certificate made
by ``trustme``; the node then has ``tls_ca_file``, a path, and
``client_ssl_context``, for clients) and ``auth_handler=callable`` (stands in for
the auth server: takes the query dict, returns the auth JSON as a dict).

For Trio tests, ``sim_cluster`` is a :class:`fakensq.simulation.SimCluster` (no
socket, no thread) on pytest-trio's ``autojump_clock``: a minute of timeouts takes
milliseconds.  Shape through ``@pytest.mark.sim_cluster(nsqd=2, lookupd=1,
seed=0, nsqd_options={...})``; give clients ``sim_cluster.connector`` and
``sim_cluster.http_transport``; inject faults with ``sim_cluster.faults``.  Ask for
``autojump_clock`` next to it: ``async def test_x(sim_cluster, autojump_clock)``.

``pytest --nsq-faults=SEED`` makes every test using these fixtures (but
``nsqlookupd``) meet faults drawn from the seed: see :mod:`fakensq.testing.pytest_faults`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import pytest

from .testing import pytest_faults, pytest_replay
from .testing.real import RealBinaries, RealCluster, RealNSQD, faulty_real_cluster, find_binaries
from .testing.threaded import BackgroundNode

if TYPE_CHECKING:
    from .lookupd.daemon import NSQLookupd
    from .nsqd.node import NSQD
    from .testing.cluster import Cluster
    from .testing.simulation import SimCluster

__all__ = ["nsq_cluster", "nsqd", "nsqd_factory", "nsqlookupd", "sim_cluster"]

_MARKERS = {
    "nsqd": "nsqd(**options): options for the fakensq `nsqd` fixture (NSQDOptions fields)",
    "nsqlookupd": "nsqlookupd(**options): options for the fakensq `nsqlookupd` fixture",
    "nsq_cluster": "nsq_cluster(nsqd=1, lookupd=1, nsqd_options=..., lookupd_options=...): "
    "the fakensq `nsq_cluster` fixture's shape",
    "sim_cluster": "sim_cluster(nsqd=1, lookupd=1, seed=0, nsqd_options=..., trace=...): "
    "the fakensq `sim_cluster` fixture's shape (in-memory, virtual time)",
}  # (the nsq_faults marker is fakensq.testing.pytest_faults')


def pytest_addoption(parser: pytest.Parser) -> None:
    pytest_faults.add_options(parser)
    parser.getgroup("fakensq").addoption(
        "--nsq-real",
        metavar="PATH",
        nargs="?",
        const="",
        default=None,
        help="run the nsqd, nsqd_factory, nsqlookupd and nsq_cluster fixtures on the real "
        "daemons: PATH is the folder of nsqd and nsqlookupd, or the nsqd binary (none: "
        "$NSQ_BIN, then PATH); with --nsq-faults, a fault proxy stands in front of each nsqd",
    )


_REAL: Final = pytest.StashKey["RealBinaries | None"]()


def real_binaries(config: pytest.Config) -> RealBinaries | None:
    """The real daemons the fixtures run (``--nsq-real``), or None."""
    return config.stash.get(_REAL, None)


def pytest_configure(config: pytest.Config) -> None:
    for text in _MARKERS.values():
        config.addinivalue_line("markers", text)
    pytest_faults.configure(config)
    real = config.getoption("--nsq-real")
    try:
        config.stash[_REAL] = None if real is None else find_binaries(real)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    if pytest_faults.settings_of(config) is not None:
        # The session's end: replays, shrinking, the --nsq-faults-only check.
        config.pluginmanager.register(pytest_replay.ReplayLog.of(config), "fakensq-replays")


def pytest_report_header(config: pytest.Config) -> str | None:
    return pytest_faults.report_header(config)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        pytest_faults.note_call(item, report, call)
        section = pytest_faults.report_section(item)
        if section is not None:
            report.sections.append(("fakensq faults", section))
    if report.when == "teardown":
        # The fixtures have stopped: what the test met is final.
        pytest_faults.record_outcome(item, report)
    return report


def _marker_options(request: pytest.FixtureRequest, name: str) -> dict[str, Any]:
    options: dict[str, Any] = {}
    # Closest last, so a function's marker overrides its class's or module's.
    for marker in reversed(list(request.node.iter_markers(name))):
        options.update(marker.kwargs)
    return options


@pytest.fixture
def nsqd_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., NSQD]]:
    """Start fakensq nsqds on free loopback ports; all are stopped after the test."""
    from .nsqd.node import NSQD

    started: list[BackgroundNode[Any] | RealCluster] = []
    faults = pytest_faults.faults_of(request)
    real = real_binaries(request.config)

    def start(**options: Any) -> NSQD:
        tls = options.pop("tls", False)
        ca_file = ""
        client_context = None
        if tls:
            ca_file, client_context = _tls_files(tmp_path / f"tls-{len(started)}", options)
        if faults is not None:
            faults.tune_nsqd_options(options, real=real is not None)
        label = f"nsqd-{len(started)}"
        nsqd: Any
        if real is not None:
            nsqd = _start_real_nsqd(real, tmp_path / label, label, options, faults, started)
        else:
            options.setdefault("tcp_address", "127.0.0.1:0")
            options.setdefault("http_address", "127.0.0.1:0")
            if "data_path" not in options:
                data_path = tmp_path / label
                data_path.mkdir()
                options["data_path"] = str(data_path)
            node: BackgroundNode[NSQD]
            if faults is None:
                node = BackgroundNode(lambda: NSQD(**options), name="fakensq-nsqd")
            else:
                node = BackgroundNode(
                    lambda: pytest_faults.faulty_nsqd(faults, label, lambda: NSQD(**options)),
                    name="fakensq-nsqd",
                )
            started.append(node)
            nsqd = node.start()
        if tls:
            # What a client needs to trust the node's certificate.
            setattr(nsqd, "tls_ca_file", ca_file)  # noqa: B010
            setattr(nsqd, "client_ssl_context", client_context)  # noqa: B010
        return nsqd  # type: ignore[no-any-return]

    try:
        yield start
    finally:
        errors = []
        for node in reversed(started):
            try:
                (node.close if isinstance(node, RealCluster) else node.stop)()
            except Exception as exc:  # keep stopping the others
                errors.append(exc)
        if errors:
            raise errors[0]


def _start_real_nsqd(
    real: RealBinaries,
    data_root: Path,
    label: str,
    options: dict[str, Any],
    faults: pytest_faults.TestFaults | None,
    started: list[BackgroundNode[Any] | RealCluster],
) -> RealNSQD:
    """A real nsqd (``--nsq-real``), behind a fault proxy with faults on."""
    if "auth_handler" in options:
        pytest.fail("auth_handler needs fakensq's own nsqd (not --nsq-real)", pytrace=False)
    for name in ("tcp_address", "http_address", "data_path"):
        options.pop(name, None)  # (the real node's own: free ports, a path of its own)
    cluster = RealCluster(real, data_root, nsqd=1, lookupd=0, nsqd_options=options)
    if faults is None:
        cluster.start()
        started.append(cluster)
        return cluster.nsqds[0]
    msg_timeout = float(options.get("msg_timeout", 60.0))
    node = BackgroundNode(
        lambda: faulty_real_cluster(faults, label, cluster, msg_timeout), name="fakensq-proxy"
    )
    started.append(node)
    node.start()
    return cluster.nsqds[0]


@pytest.fixture
def nsqd(request: pytest.FixtureRequest, nsqd_factory: Callable[..., NSQD]) -> NSQD:
    """A fakensq nsqd on free loopback ports (options from ``@pytest.mark.nsqd``)."""
    return nsqd_factory(**_marker_options(request, "nsqd"))


@pytest.fixture
def nsqlookupd(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[NSQLookupd]:
    """A fakensq nsqlookupd on free loopback ports (options from ``@pytest.mark.nsqlookupd``)."""
    from .lookupd.daemon import NSQLookupd

    options: dict[str, Any] = {"tcp_address": "127.0.0.1:0", "http_address": "127.0.0.1:0"}
    options.update(_marker_options(request, "nsqlookupd"))
    real = real_binaries(request.config)
    if real is not None:
        for name in ("tcp_address", "http_address"):
            options.pop(name, None)
        cluster = RealCluster(real, tmp_path, nsqd=0, lookupd=1, lookupd_options=options)
        cluster.start()
        try:
            yield cluster.lookupd_processes[0]  # type: ignore[misc]
        finally:
            cluster.close()
        return
    with BackgroundNode(lambda: NSQLookupd(**options), name="fakensq-nsqlookupd") as node:
        yield node


@pytest.fixture
def nsq_cluster_node(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[BackgroundNode[Cluster]]:
    """The thread serving ``nsq_cluster``: ``nsq_cluster_node.call(cluster.stop_nsqd, 0)``
    runs a cluster operation (stop, restart a node) from a test that is not Trio."""
    from .testing.cluster import Cluster

    if real_binaries(request.config) is not None:
        pytest.fail(
            "nsq_cluster_node drives fakensq's in-process cluster: not under --nsq-real",
            pytrace=False,
        )
    options: dict[str, Any] = {"data_root": str(tmp_path)}
    options.update(_marker_options(request, "nsq_cluster"))
    faults = pytest_faults.faults_of(request)
    node: BackgroundNode[Cluster]
    if faults is None:
        node = BackgroundNode(lambda: Cluster(**options), "fakensq-cluster")
    else:
        nsqd_options = dict(options.get("nsqd_options") or {})
        faults.tune_nsqd_options(nsqd_options)
        options["nsqd_options"] = nsqd_options
        shape = (options.get("nsqd", 1), options.get("lookupd", 1))
        node = BackgroundNode(
            lambda: pytest_faults.faulty_cluster(faults, "nsq_cluster", Cluster(**options), *shape),
            "fakensq-cluster",
        )
    node.start()
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture
def nsq_cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    """A fakensq cluster on free loopback ports, every nsqd registered with every lookupd.

    Shape and options from ``@pytest.mark.nsq_cluster(nsqd=..., lookupd=..., ...)``
    (default: one nsqd, one nsqlookupd).  Under ``--nsq-real``, real nsqds and
    nsqlookupds with the same addresses (``nsqd_tcp_addresses``...).
    """
    real = real_binaries(request.config)
    if real is None:
        node: BackgroundNode[Cluster] = request.getfixturevalue("nsq_cluster_node")
        yield node.node
        return
    options = _marker_options(request, "nsq_cluster")
    faults = pytest_faults.faults_of(request)
    nsqd_options = dict(options.get("nsqd_options") or {})
    if faults is not None:
        faults.tune_nsqd_options(nsqd_options, real=True)
    cluster = RealCluster(
        real,
        tmp_path,
        nsqd=options.get("nsqd", 1),
        lookupd=options.get("lookupd", 1),
        nsqd_options=nsqd_options,
        lookupd_options=options.get("lookupd_options"),
    )
    if faults is None:
        cluster.start()
        try:
            yield cluster  # type: ignore[misc]
        finally:
            cluster.close()
        return
    msg_timeout = float(nsqd_options.get("msg_timeout", 60.0))
    with BackgroundNode(
        lambda: faulty_real_cluster(faults, "nsq_cluster", cluster, msg_timeout), "fakensq-proxy"
    ):
        yield cluster  # type: ignore[misc]


def _tls_files(directory: Path, options: dict[str, Any]) -> tuple[str, Any]:
    """A trustme CA and a ``localhost``/``127.0.0.1`` server certificate, as files
    the nsqd options point at; returns the CA file and a client SSL context."""
    import ssl

    import trustme

    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert_file, key_file, ca_file = (
        directory / "server.pem",
        directory / "server.key",
        directory / "ca.pem",
    )
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    for blob in cert.cert_chain_pems[1:]:
        blob.write_to_path(str(cert_file), append=True)
    cert.private_key_pem.write_to_path(str(key_file))
    ca.cert_pem.write_to_path(str(ca_file))
    options.setdefault("tls_cert", str(cert_file))
    options.setdefault("tls_key", str(key_file))
    context = ssl.create_default_context(cafile=str(ca_file))
    return str(ca_file), context


@pytest.fixture
async def sim_cluster(request: pytest.FixtureRequest) -> AsyncIterator[SimCluster]:
    """A simulated cluster (:class:`fakensq.simulation.SimCluster`) for Trio tests.

    No socket, thread or file outlives the test.  Ask for pytest-trio's
    ``autojump_clock`` in the test too (pytest-trio takes the clock from the test
    function's own arguments) to run it in virtual time.  Shape and options from
    ``@pytest.mark.sim_cluster(...)`` (SimCluster's keywords).
    """
    from .testing.simulation import SimCluster

    options = _marker_options(request, "sim_cluster")
    faults = pytest_faults.faults_of(request)
    if faults is None:
        async with SimCluster(**options) as cluster:
            yield cluster
        return
    cluster = SimCluster(**options)
    shape = (len(cluster.nsqd_tcp_addresses), len(cluster.lookupd_tcp_addresses))
    async with pytest_faults.faulty_cluster(faults, "sim_cluster", cluster, *shape):
        yield cluster
