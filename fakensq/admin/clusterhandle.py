"""What the admin needs of an in-process cluster, as protocols.

``Admin(cluster=...)`` takes a :class:`fakensq.Cluster`, which belongs to the
test machinery (``fakensq.testing``) that the daemons never import, not even
for annotations.  These protocols say what the admin's fault controls and its
reads use of it (the addresses, the fault injector, a node's channel counters),
so any object with that shape will do, and the admin depends on no more.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

__all__ = ["ActiveFault", "ClusterFaults", "InProcessCluster", "NodeCounters"]


class ActiveFault(Protocol):
    """A fault in force (:class:`fakensq.testing.faults.Fault`)."""

    @property
    def id(self) -> int: ...

    def heal(self) -> None: ...

    def describe(self) -> dict[str, Any]: ...


class ClusterFaults(Protocol):
    """The faults the admin's controls inject (:class:`fakensq.testing.faults.Faults`)."""

    @property
    def active(self) -> Sequence[ActiveFault]: ...

    def time_out_in_flight(
        self, *, node: str | None = ..., topic: str | None = ..., channel: str | None = ...
    ) -> int: ...

    async def drop(self, *, node: str | None = ..., client: str | None = ...) -> int: ...

    def partition(self, a: str, b: str) -> ActiveFault: ...

    def swallow_heartbeats(self, *, node: str | None = ...) -> ActiveFault: ...

    def stall(self, *, node: str | None = ...) -> ActiveFault: ...

    async def stop(self, node: str) -> None: ...

    async def kill(self, node: str) -> None: ...

    async def start(self, node: str) -> None: ...


class _Channel(Protocol):
    @property
    def timeout_count(self) -> int: ...


class _Topic(Protocol):
    @property
    def channels(self) -> Mapping[str, _Channel]: ...


class NodeCounters(Protocol):
    """What the controls read of a running nsqd: its channels' timeout counts."""

    @property
    def topics(self) -> Mapping[str, _Topic]: ...


class InProcessCluster(Protocol):
    """A running cluster in the admin's process (:class:`fakensq.Cluster`):
    nodes named ``nsqd-N`` and ``lookupd-N``."""

    @property
    def nsqd_http_addresses(self) -> Sequence[str]: ...

    @property
    def lookupd_http_addresses(self) -> Sequence[str]: ...

    @property
    def faults(self) -> ClusterFaults: ...

    def nsqd(self, i: int) -> NodeCounters:
        """nsqd ``i`` (``RuntimeError`` while it is stopped)."""
        ...

    def node_name_at(self, address: str) -> str: ...
