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
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from .threaded import BackgroundNode

if TYPE_CHECKING:
    from .cluster import Cluster
    from .lookupd import NSQLookupd
    from .nsqd import NSQD

__all__ = ["nsq_cluster", "nsqd", "nsqd_factory", "nsqlookupd"]

_MARKERS = {
    "nsqd": "nsqd(**options): options for the fakensq `nsqd` fixture (NSQDOptions fields)",
    "nsqlookupd": "nsqlookupd(**options): options for the fakensq `nsqlookupd` fixture",
    "nsq_cluster": "nsq_cluster(nsqd=1, lookupd=1, nsqd_options=..., lookupd_options=...): "
    "the fakensq `nsq_cluster` fixture's shape",
}


def pytest_configure(config: pytest.Config) -> None:
    for text in _MARKERS.values():
        config.addinivalue_line("markers", text)


def _marker_options(request: pytest.FixtureRequest, name: str) -> dict[str, Any]:
    options: dict[str, Any] = {}
    # Closest last, so a function's marker overrides its class's or module's.
    for marker in reversed(list(request.node.iter_markers(name))):
        options.update(marker.kwargs)
    return options


@pytest.fixture
def nsqd_factory(tmp_path: Path) -> Iterator[Callable[..., NSQD]]:
    """Start fakensq nsqds on free loopback ports; all are stopped after the test."""
    from .nsqd import NSQD

    started: list[BackgroundNode[NSQD]] = []

    def start(**options: Any) -> NSQD:
        options.setdefault("tcp_address", "127.0.0.1:0")
        options.setdefault("http_address", "127.0.0.1:0")
        if "data_path" not in options:
            data_path = tmp_path / f"nsqd-{len(started)}"
            data_path.mkdir()
            options["data_path"] = str(data_path)
        node: BackgroundNode[NSQD] = BackgroundNode(lambda: NSQD(**options), name="fakensq-nsqd")
        started.append(node)
        return node.start()

    try:
        yield start
    finally:
        errors = []
        for node in reversed(started):
            try:
                node.stop()
            except Exception as exc:  # keep stopping the others
                errors.append(exc)
        if errors:
            raise errors[0]


@pytest.fixture
def nsqd(request: pytest.FixtureRequest, nsqd_factory: Callable[..., NSQD]) -> NSQD:
    """A fakensq nsqd on free loopback ports (options from ``@pytest.mark.nsqd``)."""
    return nsqd_factory(**_marker_options(request, "nsqd"))


@pytest.fixture
def nsqlookupd(request: pytest.FixtureRequest) -> Iterator[NSQLookupd]:
    """A fakensq nsqlookupd on free loopback ports (options from ``@pytest.mark.nsqlookupd``)."""
    from .lookupd import NSQLookupd

    options: dict[str, Any] = {"tcp_address": "127.0.0.1:0", "http_address": "127.0.0.1:0"}
    options.update(_marker_options(request, "nsqlookupd"))
    with BackgroundNode(lambda: NSQLookupd(**options), name="fakensq-nsqlookupd") as node:
        yield node


@pytest.fixture
def nsq_cluster_node(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[BackgroundNode[Cluster]]:
    """The thread serving ``nsq_cluster``: ``nsq_cluster_node.call(cluster.stop_nsqd, 0)``
    runs a cluster operation (stop, restart a node) from a test that is not Trio."""
    from .cluster import Cluster

    options: dict[str, Any] = {"data_root": str(tmp_path)}
    options.update(_marker_options(request, "nsq_cluster"))
    node: BackgroundNode[Cluster] = BackgroundNode(lambda: Cluster(**options), "fakensq-cluster")
    node.start()
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture
def nsq_cluster(nsq_cluster_node: BackgroundNode[Cluster]) -> Cluster:
    """A fakensq cluster on free loopback ports, every nsqd registered with every lookupd.

    Shape and options from ``@pytest.mark.nsq_cluster(nsqd=..., lookupd=..., ...)``
    (default: one nsqd, one nsqlookupd).
    """
    return nsq_cluster_node.node
