"""The Go types nsqadmin v1.3.0 answers with (its ``internal/clusterinfo`` types).

nsqadmin decodes nsqlookupd's and nsqd's answers into these structs, sums them
(``TopicStats.Add``, ``ChannelStats.Add``) and encodes them again; scripts read
that JSON, so the types keep Go's field order, Go's nil/empty distinction
(``null`` vs ``[]``), Go's ``connected`` duration, and Go's aliasing: a topic's
summed channels *are* the first node's channel objects, so in
``/api/topics/:topic`` the first node's channels show the totals
(``"node":"*"``) and list only the other nodes.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Final

from trionsq.protocol.peers import Peer

from ..golang.net import join_host_port

__all__ = [
    "CHANNEL_SUMS",
    "ChannelStats",
    "ClientStats",
    "E2eAggregate",
    "Producer",
    "TopicStats",
    "bool_field",
    "int_field",
    "join_host_port",
    "semver_lt",
    "str_field",
    "stable_sort_by_hostname",
]


# -- semver (blang/semver, as far as nsqadmin's out_of_date needs it) ------------

_SEMVER = re.compile(r"(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?")


def _semver(text: str) -> tuple[int, int, int, tuple[tuple[int, int | str], ...] | None]:
    m = _SEMVER.fullmatch(text)
    if m is None:
        return (0, 0, 0, None)
    pre = None
    if m.group(4):
        pre = tuple((0, int(p)) if p.isdigit() else (1, p) for p in m.group(4).split("."))
    return (int(m.group(1)), int(m.group(2)), int(m.group(3)), pre)


def semver_lt(a: str, b: str) -> bool:
    va, vb = _semver(a), _semver(b)
    if va[:3] != vb[:3]:
        return va[:3] < vb[:3]
    pa, pb = va[3], vb[3]
    if pa is None:
        return False  # a release is never below its own pre-releases
    if pb is None:
        return True
    return pa < pb


# -- the Go types ---------------------------------------------------------------


def int_field(doc: dict[str, Any], key: str) -> int:
    value = doc.get(key)
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


def str_field(doc: dict[str, Any], key: str) -> str:
    value = doc.get(key)
    return value if isinstance(value, str) else ""


def bool_field(doc: dict[str, Any], key: str) -> bool:
    return doc.get(key) is True


def stable_sort_by_hostname(items: list[Any]) -> None:
    # sort.Sort on nsqadmin's short lists is an insertion sort: stable.
    items.sort(key=lambda item: item.hostname)


@dataclass(kw_only=True)
class Producer(Peer):
    """An nsqd as nsqlookupd (or the nsqd itself) describes it."""

    remote_addresses: list[str] | None = None
    topics: list[tuple[str, bool]] | None = None
    out_of_date: bool = False

    @classmethod
    def from_lookupd(cls, doc: dict[str, Any]) -> Producer:
        raw_names, raw_tombs = doc.get("topics"), doc.get("tombstones")
        names: list[Any] = raw_names if isinstance(raw_names, list) else []
        tombstones: list[Any] = raw_tombs if isinstance(raw_tombs, list) else []
        topics = None
        if names:
            topics = [
                (str(name), bool(tombstones[i]) if i < len(tombstones) else False)
                for i, name in enumerate(names)
            ]
        return cls.from_node(doc, topics)

    @classmethod
    def from_node(cls, doc: dict[str, Any], topics: list[tuple[str, bool]] | None) -> Producer:
        """From the fields a node is described by, in nsqlookupd's ``/nodes``
        (or ``/lookup``) or in an nsqd's own ``/info`` (no remote address)."""
        return cls(
            remote_address=str_field(doc, "remote_address"),
            hostname=str_field(doc, "hostname"),
            broadcast_address=str_field(doc, "broadcast_address"),
            tcp_port=int_field(doc, "tcp_port"),
            http_port=int_field(doc, "http_port"),
            version=str_field(doc, "version"),
            topics=topics,
        )

    @property
    def http_address(self) -> str:
        return join_host_port(self.broadcast_address, self.http_port)

    @property
    def tcp_address(self) -> str:
        return join_host_port(self.broadcast_address, self.tcp_port)

    def to_go(self) -> dict[str, Any]:
        return {
            "remote_addresses": self.remote_addresses,
            **self.peer_json(),
            "topics": (
                None
                if self.topics is None
                else [{"topic": t, "tombstoned": tomb} for t, tomb in self.topics]
            ),
            "out_of_date": self.out_of_date,
        }


@dataclass
class E2eAggregate:
    """``quantile.E2eProcessingLatencyAggregate``."""

    count: int = 0
    percentiles: list[dict[str, float]] | None = None
    topic: str = ""
    channel: str = ""
    addr: str = ""

    @classmethod
    def from_nsqd(cls, doc: Any) -> E2eAggregate | None:
        if not isinstance(doc, dict):
            return None
        count = int_field(doc, "count")
        percentiles = None
        raw = doc.get("percentiles")
        if isinstance(raw, list):
            percentiles = []
            for p in raw:
                item = {
                    str(k): float(v) for k, v in (p or {}).items() if isinstance(v, int | float)
                }
                value = item.get("value", 0.0)
                item.update(min=value, max=value, average=value, count=float(count))
                percentiles.append(item)
        return cls(
            count,
            percentiles,
            str_field(doc, "topic"),
            str_field(doc, "channel"),
            str_field(doc, "host"),
        )

    def add(self, other: E2eAggregate | None) -> None:
        """Merge ``other`` in, averaging percentiles as nsqadmin does (its
        ``min`` is computed from the maxima, as in Go)."""
        self.addr = "*"
        if other is None:
            return
        self.count += other.count
        for value in other.percentiles or []:
            mine = self.percentiles or []
            match = next(
                (p for p in mine if p.get("quantile", 0.0) == value.get("quantile", 0.0)), None
            )
            if match is None:
                match = {"quantile": value.get("quantile", 0.0)}
                self.percentiles = [*mine, match]
            match["max"] = max(value.get("max", 0.0), match.get("max", 0.0))
            match["min"] = min(value.get("max", 0.0), match.get("max", 0.0))
            match["count"] = match.get("count", 0.0) + value.get("count", 0.0)
            if match["count"] == 0:
                match["average"] = 0.0
                continue
            delta = value.get("average", 0.0) - match.get("average", 0.0)
            match["average"] = (
                match.get("average", 0.0) + delta * value.get("count", 0.0) / match["count"]
            )

    def to_go(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "percentiles": (
                None
                if self.percentiles is None
                else [dict(sorted(p.items())) for p in self.percentiles]
            ),
            "topic": self.topic,
            "channel": self.channel,
            "host": self.addr,
        }


@dataclass
class ClientStats:
    """A client of a channel, as nsqadmin re-encodes nsqd's ``/stats`` entry."""

    doc: dict[str, Any]
    node: str = ""
    connected_ns: int = 0

    @classmethod
    def from_nsqd(cls, doc: dict[str, Any]) -> ClientStats:
        # UnmarshalJSON: "connected" is now (to the second) minus connect_ts.
        connected = (int(time.time()) - int_field(doc, "connect_ts")) * 1_000_000_000
        return cls(doc, connected_ns=connected)

    @property
    def hostname(self) -> str:
        return str_field(self.doc, "hostname")

    def to_go(self) -> dict[str, Any]:
        d = self.doc
        out: dict[str, Any] = {"node": self.node}
        out["remote_address"] = str_field(d, "remote_address")
        out["version"] = str_field(d, "version")
        out["client_id"] = str_field(d, "client_id")
        out["hostname"] = str_field(d, "hostname")
        out["user_agent"] = str_field(d, "user_agent")
        out["connect_ts"] = int_field(d, "connect_ts")
        out["connected"] = self.connected_ns
        for key in ("in_flight_count", "ready_count", "finish_count", "requeue_count"):
            out[key] = int_field(d, key)
        out["message_count"] = int_field(d, "message_count")
        out["sample_rate"] = int_field(d, "sample_rate")
        for key in ("deflate", "snappy", "authed"):
            out[key] = bool_field(d, key)
        out["auth_identity"] = str_field(d, "auth_identity")
        out["auth_identity_url"] = str_field(d, "auth_identity_url")
        out["tls"] = bool_field(d, "tls")
        out["tls_cipher_suite"] = str_field(d, "tls_cipher_suite")
        out["tls_version"] = str_field(d, "tls_version")
        out["tls_negotiated_protocol"] = str_field(d, "tls_negotiated_protocol")
        out["tls_negotiated_protocol_is_mutual"] = bool_field(
            d, "tls_negotiated_protocol_is_mutual"
        )
        return out


#: The counters of a channel's ``/stats`` that add up over nodes.
CHANNEL_SUMS: Final = (
    "depth",
    "memory_depth",
    "backend_depth",
    "in_flight_count",
    "deferred_count",
    "requeue_count",
    "timeout_count",
    "message_count",
    "client_count",
)


@dataclass(eq=False)
class ChannelStats:
    """``clusterinfo.ChannelStats``: one node's channel, or a sum over nodes."""

    node: str = ""
    hostname: str = ""
    topic_name: str = ""
    channel_name: str = ""
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CHANNEL_SUMS, 0))
    nodes: list[ChannelStats] | None = None
    clients: list[ClientStats] | None = None
    paused: bool = False
    e2e: E2eAggregate | None = None

    @classmethod
    def from_nsqd(cls, doc: dict[str, Any]) -> ChannelStats:
        counts = {key: int_field(doc, key) for key in CHANNEL_SUMS}
        raw = doc.get("clients")
        clients = (
            [ClientStats.from_nsqd(c) for c in raw if isinstance(c, dict)]
            if isinstance(raw, list)
            else None
        )
        return cls(
            channel_name=str_field(doc, "channel_name"),
            counts=counts,
            clients=clients,
            paused=bool_field(doc, "paused"),
            e2e=E2eAggregate.from_nsqd(doc.get("e2e_processing_latency")),
        )

    def add(self, a: ChannelStats) -> None:
        self.node = "*"
        for key in CHANNEL_SUMS:
            self.counts[key] += a.counts[key]
        if a.paused:
            self.paused = True
        self.nodes = [*(self.nodes or []), a]
        stable_sort_by_hostname(self.nodes)
        if self.e2e is None:
            self.e2e = E2eAggregate(
                topic=self.topic_name, channel=self.channel_name, addr=self.node
            )
        self.e2e.add(a.e2e)
        # append(nil, nothing...) stays nil in Go.
        if a.clients:
            self.clients = [*(self.clients or []), *a.clients]
            stable_sort_by_hostname(self.clients)

    def to_go(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "node": self.node,
            "hostname": self.hostname,
            "topic_name": self.topic_name,
            "channel_name": self.channel_name,
        }
        out.update(self.counts)
        out["nodes"] = None if self.nodes is None else [n.to_go() for n in self.nodes]
        out["clients"] = None if self.clients is None else [c.to_go() for c in self.clients]
        out["paused"] = self.paused
        out["e2e_processing_latency"] = None if self.e2e is None else self.e2e.to_go()
        return out


_TOPIC_SUMS = ("depth", "memory_depth", "backend_depth", "message_count")


@dataclass(eq=False)
class TopicStats:
    """``clusterinfo.TopicStats``: one node's topic, or a sum over nodes."""

    node: str = ""
    hostname: str = ""
    topic_name: str = ""
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_TOPIC_SUMS, 0))
    nodes: list[TopicStats] | None = None
    channels: list[ChannelStats] | None = None
    paused: bool = False
    e2e: E2eAggregate | None = None

    @classmethod
    def from_nsqd(cls, doc: dict[str, Any]) -> TopicStats:
        raw = doc.get("channels")
        channels = (
            [ChannelStats.from_nsqd(c) for c in raw if isinstance(c, dict)]
            if isinstance(raw, list)
            else None
        )
        return cls(
            topic_name=str_field(doc, "topic_name"),
            counts={key: int_field(doc, key) for key in _TOPIC_SUMS},
            channels=channels,
            paused=bool_field(doc, "paused"),
            e2e=E2eAggregate.from_nsqd(doc.get("e2e_processing_latency")),
        )

    def add(self, a: TopicStats) -> None:
        self.node = "*"
        for key in _TOPIC_SUMS:
            self.counts[key] += a.counts[key]
        if a.paused:
            self.paused = True
        for a_channel in a.channels or []:
            found = False
            for channel in self.channels or []:
                if channel.channel_name == a_channel.channel_name:
                    found = True
                    channel.add(a_channel)  # mutates the first node's channel: Go's aliasing
            if not found:
                self.channels = [*(self.channels or []), a_channel]
        self.nodes = [*(self.nodes or []), a]
        stable_sort_by_hostname(self.nodes)
        if self.e2e is None:
            self.e2e = E2eAggregate(topic=self.topic_name, addr=self.node)
        self.e2e.add(a.e2e)

    def to_go(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "node": self.node,
            "hostname": self.hostname,
            "topic_name": self.topic_name,
        }
        out.update(self.counts)
        out["nodes"] = None if self.nodes is None else [n.to_go() for n in self.nodes]
        out["channels"] = None if self.channels is None else [c.to_go() for c in self.channels]
        out["paused"] = self.paused
        out["e2e_processing_latency"] = None if self.e2e is None else self.e2e.to_go()
        return out
