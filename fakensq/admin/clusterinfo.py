"""The cluster as nsqadmin v1.3.0 sees it (its ``internal/clusterinfo``).

nsqadmin's HTTP API answers with Go structs it builds from nsqlookupd's and
nsqd's HTTP answers: producers from ``/nodes`` or ``/lookup``, topic and channel
stats from each nsqd's ``/stats``, summed with ``TopicStats.Add`` and
``ChannelStats.Add``.  Those types and queries are reproduced here, quirks
included, because scripts read the JSON they produce:

- a topic's summed channels *are* the first node's channel objects (Go keeps
  pointers), so in ``/api/topics/T`` the first node's channels show the totals
  (``"node":"*"``) and list only the other nodes;
- partial failures are warnings (``"message":"WARNING: ..."``), and only a query
  that reaches no node at all is an error (``UPSTREAM_ERROR: failed to query any
  nsqd: ...``), with Go's error texts;
- lists keep Go's nil/empty distinction (``null`` vs ``[]``).

Where Go's order depends on which node answered first, nodes are taken in the
order they were asked (one of the orders nsqadmin can produce), then sorted by
hostname as nsqadmin sorts them.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote_plus

import httpx
import trio

from trionsq.protocol.names import go_quote

__all__ = [
    "ChannelStats",
    "ClientStats",
    "ClusterInfo",
    "E2eAggregate",
    "ErrList",
    "Failure",
    "Producer",
    "TopicStats",
    "UpstreamError",
    "join_host_port",
]

log = logging.getLogger("fakensq.admin")

T = TypeVar("T")

_V1_ACCEPT = "application/vnd.nsq; version=1.0"


class UpstreamError(Exception):
    """One request to nsqd or nsqlookupd that failed; ``str()`` is Go's error text."""


class ErrList(Exception):
    """Some of the nodes failed (Go's ``PartialErr``): the answer is a warning."""

    def __init__(self, errors: Sequence[BaseException]) -> None:
        super().__init__("\n".join(str(e) for e in errors))
        self.errors = list(errors)


class Failure(Exception):
    """No node answered (or an action could not start): nsqadmin's 502."""


Result = tuple[T, Exception | None]


def join_host_port(host: str, port: int | str) -> str:
    """Go's ``net.JoinHostPort``."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


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


def _semver_lt(a: str, b: str) -> bool:
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


def _int(doc: dict[str, Any], key: str) -> int:
    value = doc.get(key)
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


def _str(doc: dict[str, Any], key: str) -> str:
    value = doc.get(key)
    return value if isinstance(value, str) else ""


def _bool(doc: dict[str, Any], key: str) -> bool:
    return doc.get(key) is True


def _stable_sort_by_hostname(items: list[Any]) -> None:
    # sort.Sort on nsqadmin's short lists is an insertion sort: stable.
    items.sort(key=lambda item: item.hostname)


@dataclass
class Producer:
    """An nsqd as nsqlookupd (or the nsqd itself) describes it."""

    remote_addresses: list[str] | None = None
    remote_address: str = ""
    hostname: str = ""
    broadcast_address: str = ""
    tcp_port: int = 0
    http_port: int = 0
    version: str = ""
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
        return cls(
            remote_address=_str(doc, "remote_address"),
            hostname=_str(doc, "hostname"),
            broadcast_address=_str(doc, "broadcast_address"),
            tcp_port=_int(doc, "tcp_port"),
            http_port=_int(doc, "http_port"),
            version=_str(doc, "version"),
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
            "remote_address": self.remote_address,
            "hostname": self.hostname,
            "broadcast_address": self.broadcast_address,
            "tcp_port": self.tcp_port,
            "http_port": self.http_port,
            "version": self.version,
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
        count = _int(doc, "count")
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
        return cls(count, percentiles, _str(doc, "topic"), _str(doc, "channel"), _str(doc, "host"))

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


_CLIENT_FIELDS = (
    ("remote_address", str),
    ("version", str),
    ("client_id", str),
    ("hostname", str),
    ("user_agent", str),
    ("connect_ts", int),
)
_CLIENT_COUNTS = (
    "in_flight_count",
    "ready_count",
    "finish_count",
    "requeue_count",
    "message_count",
)


@dataclass
class ClientStats:
    """A client of a channel, as nsqadmin re-encodes nsqd's ``/stats`` entry."""

    doc: dict[str, Any]
    node: str = ""
    connected_ns: int = 0

    @classmethod
    def from_nsqd(cls, doc: dict[str, Any]) -> ClientStats:
        # UnmarshalJSON: "connected" is now (to the second) minus connect_ts.
        connected = (int(time.time()) - _int(doc, "connect_ts")) * 1_000_000_000
        return cls(doc, connected_ns=connected)

    @property
    def hostname(self) -> str:
        return _str(self.doc, "hostname")

    def to_go(self) -> dict[str, Any]:
        d = self.doc
        out: dict[str, Any] = {"node": self.node}
        out["remote_address"] = _str(d, "remote_address")
        out["version"] = _str(d, "version")
        out["client_id"] = _str(d, "client_id")
        out["hostname"] = _str(d, "hostname")
        out["user_agent"] = _str(d, "user_agent")
        out["connect_ts"] = _int(d, "connect_ts")
        out["connected"] = self.connected_ns
        for key in ("in_flight_count", "ready_count", "finish_count", "requeue_count"):
            out[key] = _int(d, key)
        out["message_count"] = _int(d, "message_count")
        out["sample_rate"] = _int(d, "sample_rate")
        for key in ("deflate", "snappy", "authed"):
            out[key] = _bool(d, key)
        out["auth_identity"] = _str(d, "auth_identity")
        out["auth_identity_url"] = _str(d, "auth_identity_url")
        out["tls"] = _bool(d, "tls")
        out["tls_cipher_suite"] = _str(d, "tls_cipher_suite")
        out["tls_version"] = _str(d, "tls_version")
        out["tls_negotiated_protocol"] = _str(d, "tls_negotiated_protocol")
        out["tls_negotiated_protocol_is_mutual"] = _bool(d, "tls_negotiated_protocol_is_mutual")
        return out


_CHANNEL_SUMS = (
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
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_CHANNEL_SUMS, 0))
    nodes: list[ChannelStats] | None = None
    clients: list[ClientStats] | None = None
    paused: bool = False
    e2e: E2eAggregate | None = None

    @classmethod
    def from_nsqd(cls, doc: dict[str, Any]) -> ChannelStats:
        counts = {key: _int(doc, key) for key in _CHANNEL_SUMS}
        raw = doc.get("clients")
        clients = (
            [ClientStats.from_nsqd(c) for c in raw if isinstance(c, dict)]
            if isinstance(raw, list)
            else None
        )
        return cls(
            channel_name=_str(doc, "channel_name"),
            counts=counts,
            clients=clients,
            paused=_bool(doc, "paused"),
            e2e=E2eAggregate.from_nsqd(doc.get("e2e_processing_latency")),
        )

    def add(self, a: ChannelStats) -> None:
        self.node = "*"
        for key in _CHANNEL_SUMS:
            self.counts[key] += a.counts[key]
        if a.paused:
            self.paused = True
        self.nodes = [*(self.nodes or []), a]
        _stable_sort_by_hostname(self.nodes)
        if self.e2e is None:
            self.e2e = E2eAggregate(
                topic=self.topic_name, channel=self.channel_name, addr=self.node
            )
        self.e2e.add(a.e2e)
        # append(nil, nothing...) stays nil in Go.
        if a.clients:
            self.clients = [*(self.clients or []), *a.clients]
            _stable_sort_by_hostname(self.clients)

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
            topic_name=_str(doc, "topic_name"),
            counts={key: _int(doc, key) for key in _TOPIC_SUMS},
            channels=channels,
            paused=_bool(doc, "paused"),
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
        _stable_sort_by_hostname(self.nodes)
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


# -- queries ----------------------------------------------------------------------


def _describe(method: str, url: str, exc: httpx.HTTPError) -> str:
    """Go's ``*url.Error`` text for a transport failure."""
    host = url.split("/")[2] if "//" in url else url
    if isinstance(exc, httpx.ConnectTimeout):
        why = f"dial tcp {host}: i/o timeout"
    elif isinstance(exc, httpx.TimeoutException):
        why = "net/http: timeout awaiting response headers"
    elif isinstance(exc, httpx.ConnectError):
        text = str(exc).lower()
        if "name or service" in text or "nodename" in text or "no address" in text:
            why = f"dial tcp: lookup {host.rpartition(':')[0]}: no such host"
        else:
            why = f"dial tcp {host}: connect: connection refused"
    elif isinstance(exc, httpx.RemoteProtocolError):
        why = "EOF"
    else:
        why = str(exc) or type(exc).__name__
    return f'{method.capitalize()} "{url}": {why}'


class ClusterInfo:
    """nsqadmin's queries of the cluster, over ``client`` (Go's ``http_api.Client``)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def get_v1(self, url: str) -> Any:
        """``GETV1``: the decoded JSON, or :class:`UpstreamError` with Go's text."""
        try:
            response = await self.client.get(url, headers={"Accept": _V1_ACCEPT})
        except httpx.HTTPError as exc:
            raise UpstreamError(_describe("GET", url, exc)) from None
        if response.status_code != 200:
            raise UpstreamError(_status_error(response))
        try:
            return response.json()
        except ValueError as exc:
            raise UpstreamError(f"invalid character in response - {exc}") from None

    async def post_v1(self, url: str) -> None:
        """``POSTV1`` with no body."""
        try:
            response = await self.client.post(url, headers={"Accept": _V1_ACCEPT})
        except httpx.HTTPError as exc:
            raise UpstreamError(_describe("POST", url, exc)) from None
        if response.status_code != 200:
            raise UpstreamError(_status_error(response))

    async def _gather(
        self, jobs: Sequence[Callable[[], Awaitable[T]]]
    ) -> tuple[list[T], list[UpstreamError]]:
        """Run ``jobs`` at once; their results in job order, and the failures."""
        results: dict[int, T] = {}
        errors: dict[int, UpstreamError] = {}

        async def run(i: int, job: Callable[[], Awaitable[T]]) -> None:
            try:
                results[i] = await job()
            except UpstreamError as exc:
                errors[i] = exc

        async with trio.open_nursery() as nursery:
            for i, job in enumerate(jobs):
                nursery.start_soon(run, i, job)
        return [results[i] for i in sorted(results)], [errors[i] for i in sorted(errors)]

    def _lookupd_query(self, url: str) -> Callable[[], Awaitable[Any]]:
        async def query() -> Any:
            log.info("CI: querying nsqlookupd %s", url)
            return await self.get_v1(url)

        return query

    def _nsqd_query(self, url: str) -> Callable[[], Awaitable[Any]]:
        async def query() -> Any:
            log.info("CI: querying nsqd %s", url)
            return await self.get_v1(url)

        return query

    @staticmethod
    def _outcome(kind: str, errors: list[UpstreamError], asked: int) -> Exception | None:
        if len(errors) == asked:
            return Failure(f"failed to query any {kind}: {ErrList(errors)}")
        return ErrList(errors) if errors else None

    async def lookupd_topics(self, lookupds: Sequence[str]) -> Result[list[str] | None]:
        docs, errors = await self._gather(
            [self._lookupd_query(f"http://{a}/topics") for a in lookupds]
        )
        outcome = self._outcome("nsqlookupd", errors, len(lookupds))
        if isinstance(outcome, Failure):
            return None, outcome
        topics = {str(t) for d in docs for t in (d.get("topics") or [])}
        return sorted(topics) if topics else None, outcome

    async def lookupd_topic_channels(
        self, topic: str, lookupds: Sequence[str]
    ) -> Result[list[str] | None]:
        query = quote_plus(topic)
        docs, errors = await self._gather(
            [self._lookupd_query(f"http://{a}/channels?topic={query}") for a in lookupds]
        )
        outcome = self._outcome("nsqlookupd", errors, len(lookupds))
        if isinstance(outcome, Failure):
            return None, outcome
        channels = {str(c) for d in docs for c in (d.get("channels") or [])}
        return sorted(channels) if channels else None, outcome

    async def lookupd_producers(self, lookupds: Sequence[str]) -> Result[list[Producer] | None]:
        async def nodes(address: str) -> tuple[str, Any]:
            return address, await self._lookupd_query(f"http://{address}/nodes")()

        answers, errors = await self._gather([functools.partial(nodes, a) for a in lookupds])
        outcome = self._outcome("nsqlookupd", errors, len(lookupds))
        if isinstance(outcome, Failure):
            return None, outcome
        producers: list[Producer] = []
        by_address: dict[str, Producer] = {}
        newest = "0.0.0"
        for address, doc in answers:
            for raw in doc.get("producers") or []:
                p = Producer.from_lookupd(raw)
                known = by_address.get(p.tcp_address)
                if known is None:
                    by_address[p.tcp_address] = known = p
                    producers.append(p)
                    if _semver_lt(newest, p.version):
                        newest = p.version
                    if p.topics:
                        p.topics.sort(key=lambda t: t[0])
                # Every lookupd that lists the node adds "lookupd/remote address".
                known.remote_addresses = [
                    *(known.remote_addresses or []),
                    f"{address}/{p.remote_address or 'N/A'}",
                ]
        for p in producers:
            if _semver_lt(p.version, newest):
                p.out_of_date = True
        _stable_sort_by_hostname(producers)
        return producers or None, outcome

    async def lookupd_topic_producers(
        self, topic: str, lookupds: Sequence[str]
    ) -> Result[list[Producer] | None]:
        query = quote_plus(topic)
        docs, errors = await self._gather(
            [self._lookupd_query(f"http://{a}/lookup?topic={query}") for a in lookupds]
        )
        outcome = self._outcome("nsqlookupd", errors, len(lookupds))
        if isinstance(outcome, Failure):
            return None, outcome
        producers: list[Producer] = []
        for doc in docs:
            for raw in doc.get("producers") or []:
                p = Producer.from_lookupd(raw)
                if all(p.http_address != q.http_address for q in producers):
                    producers.append(p)
        return producers or None, outcome

    async def nsqd_topics(self, nsqds: Sequence[str]) -> Result[list[str] | None]:
        docs, errors = await self._gather(
            [self._nsqd_query(f"http://{a}/stats?format=json") for a in nsqds]
        )
        outcome = self._outcome("nsqd", errors, len(nsqds))
        if isinstance(outcome, Failure):
            return None, outcome
        topics: list[str] = []
        for doc in docs:
            for t in doc.get("topics") or []:
                name = _str(t, "topic_name")
                if name not in topics:
                    topics.append(name)
        topics.sort()
        return topics or None, outcome

    async def nsqd_producers(self, nsqds: Sequence[str]) -> Result[list[Producer] | None]:
        async def one(address: str) -> Producer:
            info = await self._nsqd_query(f"http://{address}/info")()
            stats = await self._nsqd_query(
                f"http://{address}/stats?format=json&include_clients=false"
            )()
            names = [(_str(t, "topic_name"), False) for t in stats.get("topics") or []]
            return Producer(
                version=_str(info, "version"),
                broadcast_address=_str(info, "broadcast_address"),
                hostname=_str(info, "hostname"),
                http_port=_int(info, "http_port"),
                tcp_port=_int(info, "tcp_port"),
                topics=names or None,
            )

        producers, errors = await self._gather([functools.partial(one, a) for a in nsqds])
        outcome = self._outcome("nsqd", errors, len(nsqds))
        if isinstance(outcome, Failure):
            return None, outcome
        return producers or None, outcome

    async def nsqd_topic_producers(
        self, topic: str, nsqds: Sequence[str]
    ) -> Result[list[Producer] | None]:
        query = quote_plus(topic)

        async def one(address: str) -> Producer | None:
            stats = await self._nsqd_query(
                f"http://{address}/stats?format=json&topic={query}&include_clients=false"
            )()
            names = [(_str(t, "topic_name"), False) for t in stats.get("topics") or []]
            if all(name != topic for name, _ in names):
                return None
            info = await self._nsqd_query(f"http://{address}/info")()
            broadcast, http_port = _str(info, "broadcast_address"), _int(info, "http_port")
            if not broadcast:  # very old nsqd: use the address we asked
                broadcast, _, port = address.rpartition(":")
                http_port = int(port) if port.isdigit() else 0
            return Producer(
                version=_str(info, "version"),
                broadcast_address=broadcast,
                hostname=_str(info, "hostname") or address.rpartition(":")[0],
                http_port=http_port,
                tcp_port=_int(info, "tcp_port"),
                topics=names or None,
            )

        found, errors = await self._gather([functools.partial(one, a) for a in nsqds])
        outcome = self._outcome("nsqd", errors, len(nsqds))
        if isinstance(outcome, Failure):
            return None, outcome
        producers = [p for p in found if p is not None]
        return producers or None, outcome

    async def producers(
        self, lookupds: Sequence[str], nsqds: Sequence[str]
    ) -> Result[list[Producer] | None]:
        if lookupds:
            return await self.lookupd_producers(lookupds)
        return await self.nsqd_producers(nsqds)

    async def topic_producers(
        self, topic: str, lookupds: Sequence[str], nsqds: Sequence[str]
    ) -> Result[list[Producer] | None]:
        if lookupds:
            return await self.lookupd_topic_producers(topic, lookupds)
        return await self.nsqd_topic_producers(topic, nsqds)

    async def nsqd_stats(
        self,
        producers: Sequence[Producer],
        topic: str = "",
        channel: str = "",
        include_clients: bool = True,
    ) -> Result[tuple[list[TopicStats], dict[str, ChannelStats]]]:
        """``GetNSQDStats``: every producer's topics (sorted by hostname) and the
        channels summed over the producers, keyed by name (``topic:channel``
        when no topic is selected)."""

        def url(p: Producer) -> str:
            u = f"http://{p.http_address}/stats?format=json"
            if topic:
                u += "&topic=" + quote_plus(topic)
                if channel:
                    u += "&channel=" + quote_plus(channel)
            if not include_clients:
                u += "&include_clients=false"
            return u

        docs, errors = await self._gather(
            [functools.partial(self._tagged, p, url(p)) for p in producers]
        )
        topics: list[TopicStats] = []
        channels: dict[str, ChannelStats] = {}
        for p, doc in docs:
            address = p.http_address
            for raw in doc.get("topics") or []:
                if not isinstance(raw, dict):
                    continue
                t = TopicStats.from_nsqd(raw)
                t.node, t.hostname = address, p.hostname
                t.counts["memory_depth"] = t.counts["depth"] - t.counts["backend_depth"]
                if topic and t.topic_name != topic:
                    continue
                topics.append(t)
                for c in t.channels or []:
                    c.node, c.hostname, c.topic_name = address, p.hostname, t.topic_name
                    c.counts["memory_depth"] = c.counts["depth"] - c.counts["backend_depth"]
                    key = c.channel_name if topic else f"{t.topic_name}:{c.channel_name}"
                    total = channels.get(key)
                    if total is None:
                        total = channels[key] = ChannelStats(
                            node=address, topic_name=t.topic_name, channel_name=c.channel_name
                        )
                    for client in c.clients or []:
                        client.node = address
                    total.add(c)
        outcome = self._outcome("nsqd", errors, len(producers))
        if isinstance(outcome, Failure):
            return ([], {}), outcome
        _stable_sort_by_hostname(topics)
        return (topics, channels), outcome

    async def _tagged(self, p: Producer, url: str) -> tuple[Producer, Any]:
        return p, await self._nsqd_query(url)()

    # -- actions --------------------------------------------------------------------

    async def _post_each(self, urls: Sequence[str], kind: str) -> list[UpstreamError]:
        # nsqadmin posts to one node after the other.
        errors = []
        for url in urls:
            log.info("CI: querying %s %s", kind, url)
            try:
                await self.post_v1(url)
            except UpstreamError as exc:
                errors.append(exc)
        return errors

    async def lookupd_post(self, lookupds: Sequence[str], uri: str, qs: str) -> list[UpstreamError]:
        return await self._post_each([f"http://{a}/{uri}?{qs}" for a in lookupds], "nsqlookupd")

    async def producers_post(
        self, producers: Sequence[Producer], uri: str, qs: str
    ) -> list[UpstreamError]:
        return await self._post_each(
            [f"http://{p.http_address}/{uri}?{qs}" for p in producers], "nsqd"
        )


def _status_error(response: httpx.Response) -> str:
    reason = response.reason_phrase or httpx.codes.get_reason_phrase(response.status_code)
    return f"got response {response.status_code} {reason} {go_quote(response.content)}"


def partial_errors(err: Exception | None) -> list[BaseException]:
    """The failures inside a partial error (none for a success)."""
    return list(err.errors) if isinstance(err, ErrList) else []
