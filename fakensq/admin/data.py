"""What the admin pages show, read through the HTTP APIs nsqadmin reads.

Nodes come from nsqlookupd's ``/nodes`` (and any nsqd addresses given directly),
topics from ``/topics``, a topic's producers from ``/lookup``, and every number
from each nsqd's ``/stats?format=json``.  Nothing here touches fakensq's objects,
so the same code reads a cluster of real nsqd and nsqlookupd.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx
import trio

from trionsq.tools.stat import ChannelTotals as ChannelSums

__all__ = [
    "ChannelTotals",
    "Endpoint",
    "LookupdInfo",
    "NodeInfo",
    "Reader",
    "Snapshot",
    "TopicTotals",
]

#: Per-request timeout: a stalled node must not hold a page (or the timeline) up.
REQUEST_TIMEOUT = 2.0
#: Message rates are averaged over this window (seconds).
RATE_WINDOW = 10.0


@dataclass
class Endpoint:
    """An HTTP API the admin reads (an nsqd's, an nsqlookupd's, a fault
    proxy's), at its ``host:port``, as last read: up, or down and why."""

    address: str
    up: bool = False
    #: why it is down ("connection refused", "HTTP 500"...), as its page says
    error: str = ""

    async def read(self, client: httpx.AsyncClient, *paths: str) -> list[dict[str, Any]] | None:
        """``GET`` each of ``paths`` on it, each a JSON object: up then, or down
        with the reason (then None; a stalled one is down after
        :data:`REQUEST_TIMEOUT`)."""
        docs = []
        try:
            for path in paths:
                response = await client.get(f"http://{self.address}{path}", timeout=REQUEST_TIMEOUT)
                response.raise_for_status()
                doc = response.json()
                if not isinstance(doc, dict):
                    raise ValueError(f"{path} answered {type(doc).__name__}, not an object")
                docs.append(doc)
        except (httpx.HTTPError, ValueError) as exc:
            self.error = _describe(exc)
            return None
        self.up = True
        return docs


@dataclass
class NodeInfo(Endpoint):
    """One nsqd, addressed by its HTTP ``host:port``."""

    version: str = ""
    health: str = ""
    hostname: str = ""
    tcp_port: int = 0
    #: Where we heard of it: "lookupd", "nsqd-http-address", "cluster", "seen before".
    source: str = ""
    #: The node's slot in an in-process Cluster (fault controls use it), else None.
    index: int | None = None
    stats: dict[str, Any] | None = None

    @property
    def topics(self) -> list[dict[str, Any]]:
        return list((self.stats or {}).get("topics") or [])


@dataclass
class LookupdInfo(Endpoint):
    """One nsqlookupd, addressed by its HTTP ``host:port``."""

    nodes: list[dict[str, Any]] = field(default_factory=list)
    topics: list[str] = field(default_factory=list)
    index: int | None = None


@dataclass(kw_only=True)
class ChannelTotals(ChannelSums):
    """A channel summed over the nodes that have it: nsq_stat's sums (one
    summing of a channel's ``/stats`` over nsqds), with its name, whether any
    node has it paused, its rate and each node's document."""

    name: str
    paused: bool = False
    rate: float = 0.0
    #: (node address, that node's /stats channel document)
    per_node: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


@dataclass
class TopicTotals:
    """A topic summed over its nodes, with its channels."""

    name: str
    depth: int = 0
    message_count: int = 0
    paused: bool = False
    rate: float = 0.0
    #: (node address, that node's /stats topic document)
    per_node: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    channels: dict[str, ChannelTotals] = field(default_factory=dict)
    #: Only nsqlookupd knows it (created there, no nsqd holds it yet).
    lookupd_only: bool = False


@dataclass
class Snapshot:
    """The cluster as read at ``taken`` (wall clock)."""

    taken: float
    nodes: list[NodeInfo]
    lookupds: list[LookupdInfo]
    topics: dict[str, TopicTotals]

    def node(self, address: str) -> NodeInfo | None:
        for n in self.nodes:
            if n.address == address:
                return n
        return None

    def producers(self, topic: str) -> list[str]:
        """HTTP addresses of the nodes that hold ``topic``, or that a lookupd lists
        for it: the nodes nsqadmin sends a topic's actions to."""
        found: list[str] = []
        for lk in self.lookupds:
            for n in lk.nodes:
                if topic in (n.get("topics") or []):
                    addr = _join(n.get("broadcast_address", ""), int(n.get("http_port", 0)))
                    if addr not in found:
                        found.append(addr)
        for node in self.nodes:
            if node.up and any(t["topic_name"] == topic for t in node.topics):
                if node.address not in found:
                    found.append(node.address)
        return found


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Reader:
    """Reads snapshots; remembers every node it has seen (so one that disappears
    from lookupd shows as down rather than vanishing) and message counts (rates)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client
        self._seen: dict[str, NodeInfo] = {}
        self._history: dict[tuple[str, ...], deque[tuple[float, int]]] = {}

    async def snapshot(
        self,
        lookupd_addresses: Iterable[str],
        nsqd_addresses: Iterable[str],
        *,
        cluster_nsqds: Iterable[str] = (),
    ) -> Snapshot:
        """Read every lookupd, then every nsqd they list (plus those given), concurrently."""
        lookupds = [LookupdInfo(a, index=i) for i, a in enumerate(lookupd_addresses)]
        async with trio.open_nursery() as nursery:
            for lk in lookupds:
                nursery.start_soon(self._read_lookupd, lk)

        nodes: dict[str, NodeInfo] = {}
        for i, address in enumerate(cluster_nsqds):
            nodes[address] = NodeInfo(address, source="cluster", index=i)
        for address in nsqd_addresses:
            nodes.setdefault(address, NodeInfo(address, source="nsqd-http-address"))
        for lk in lookupds:
            for n in lk.nodes:
                address = _join(n.get("broadcast_address", ""), int(n.get("http_port", 0)))
                nodes.setdefault(address, NodeInfo(address, source="lookupd"))
        for address in self._seen:
            nodes.setdefault(address, NodeInfo(address, source="seen before"))
        async with trio.open_nursery() as nursery:
            for node in nodes.values():
                nursery.start_soon(self._read_nsqd, node)
        for node in nodes.values():
            if node.up:
                self._seen[node.address] = node

        snap = Snapshot(time.time(), sorted(nodes.values(), key=_node_key), lookupds, {})
        snap.topics = self._totals(snap)
        return snap

    async def _read_lookupd(self, lk: LookupdInfo) -> None:
        docs = await lk.read(self.client, "/nodes", "/topics")
        if docs is None:
            return
        nodes, topics = docs
        lk.nodes = list(nodes.get("producers") or [])
        lk.topics = list(topics.get("topics") or [])

    async def _read_nsqd(self, node: NodeInfo) -> None:
        docs = await node.read(self.client, "/stats?format=json")
        if docs is None:
            return
        (stats,) = docs
        node.stats = stats
        node.version = str(stats.get("version", ""))
        node.health = str(stats.get("health", ""))

    def _totals(self, snap: Snapshot) -> dict[str, TopicTotals]:
        topics: dict[str, TopicTotals] = {}
        for node in snap.nodes:
            for t in node.topics:
                tt = topics.setdefault(t["topic_name"], TopicTotals(t["topic_name"]))
                tt.depth += int(t.get("depth", 0))
                tt.message_count += int(t.get("message_count", 0))
                tt.paused = tt.paused or bool(t.get("paused"))
                tt.per_node.append((node.address, t))
                for c in t.get("channels") or []:
                    name = c["channel_name"]
                    ct = tt.channels.setdefault(name, ChannelTotals(name=name))
                    ct.add(c)
                    ct.paused = ct.paused or bool(c.get("paused"))
                    ct.per_node.append((node.address, c))
        for lk in snap.lookupds:
            for name in lk.topics:
                if name not in topics:
                    topics[name] = TopicTotals(name, lookupd_only=True)
        for tt in topics.values():
            tt.rate = self._rate(("topic", tt.name), snap.taken, tt.message_count)
            for ct in tt.channels.values():
                ct.rate = self._rate(("channel", tt.name, ct.name), snap.taken, ct.message_count)
        return dict(sorted(topics.items()))

    def _rate(self, key: tuple[str, ...], now: float, count: int) -> float:
        """Messages per second over the last RATE_WINDOW seconds of snapshots."""
        history = self._history.setdefault(key, deque())
        history.append((now, count))
        while len(history) > 1 and history[0][0] < now - RATE_WINDOW:
            history.popleft()
        first_t, first_count = history[0]
        if now - first_t < 0.2 or count < first_count:  # too short, or the counter reset
            return 0.0
        return (count - first_count) / (now - first_t)


def _node_key(node: NodeInfo) -> tuple[int, str]:
    return (node.index if node.index is not None else 1 << 30, node.address)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code}"
    if isinstance(exc, httpx.ConnectError):
        return "connection refused"
    if isinstance(exc, httpx.TimeoutException):
        return "timed out"
    return type(exc).__name__
