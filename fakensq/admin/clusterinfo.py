"""The cluster as nsqadmin v1.3.0 sees it (its ``internal/clusterinfo``).

nsqadmin's HTTP API answers with Go structs (:mod:`fakensq.admin.gotypes`) it
builds from nsqlookupd's and nsqd's HTTP answers: producers from ``/nodes`` or
``/lookup``, topic and channel stats from each nsqd's ``/stats``.  Its queries
are reproduced here, with what scripts see of them:

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
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import quote_plus

import httpx
import trio

from trionsq.protocol.names import go_quote

from .gotypes import (
    ChannelStats,
    ClientStats,
    E2eAggregate,
    Producer,
    TopicStats,
    int_field,
    join_host_port,
    semver_lt,
    stable_sort_by_hostname,
    str_field,
)

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


# -- queries ----------------------------------------------------------------------


def _describe(method: str, url: str, exc: httpx.HTTPError) -> str:
    """Go's ``*url.Error`` text for a transport failure."""
    host = url.split("/")[2] if "//" in url else url
    if isinstance(exc, httpx.ConnectTimeout):
        why = f"dial tcp {host}: i/o timeout"
    elif isinstance(exc, httpx.TimeoutException):
        why = "net/http: timeout awaiting response headers"
    elif isinstance(exc, httpx.ConnectError):
        text = _causes(exc).lower()
        if "certificate verify failed" in text:
            why = "tls: failed to verify certificate: x509: " + _x509_reason(text)
        elif "ssl" in text or "tls" in text:
            why = f"remote error: tls: {text}"
        elif "name or service" in text or "nodename" in text or "no address" in text:
            why = f"dial tcp: lookup {host.rpartition(':')[0]}: no such host"
        else:
            why = f"dial tcp {host}: connect: connection refused"
    elif isinstance(exc, httpx.RemoteProtocolError):
        why = "EOF"
    else:
        why = str(exc) or type(exc).__name__
    return f'{method.capitalize()} "{url}": {why}'


def _causes(exc: BaseException) -> str:
    """The texts of an exception and of what caused it (httpx wraps the ssl error)."""
    texts: list[str] = []
    seen: BaseException | None = exc
    while seen is not None and len(texts) < 8:
        texts.append(f"{type(seen).__name__}: {seen}")
        seen = seen.__cause__ or seen.__context__
    return " / ".join(texts)


def _x509_reason(text: str) -> str:
    # OpenSSL's reasons in the words of Go's crypto/x509 (the common ones).
    if "unable to get local issuer" in text or "self-signed" in text or "self signed" in text:
        return "certificate signed by unknown authority"
    if "expired" in text:
        return "certificate has expired or is not yet valid"
    return text.rpartition("certificate verify failed: ")[2].split(")")[0].strip()


class ClusterInfo:
    """nsqadmin's queries of the cluster, over ``client`` (Go's ``http_api.Client``)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def _request_v1(self, method: str, url: str) -> httpx.Response:
        """One V1 request; a 403 from a plain-HTTP endpoint that names an HTTPS
        port (nsqd with ``--tls-required``) is asked again over HTTPS, as Go's
        ``http_api.Client`` does."""
        while True:
            try:
                response = await self.client.request(method, url, headers={"Accept": _V1_ACCEPT})
            except httpx.HTTPError as exc:
                raise UpstreamError(_describe(method, url, exc)) from None
            if response.status_code == 403 and url.startswith("http://"):
                url = _https_endpoint(url, response.content)
                continue
            if response.status_code != 200:
                raise UpstreamError(_status_error(response))
            return response

    async def get_v1(self, url: str) -> Any:
        """``GETV1``: the decoded JSON, or :class:`UpstreamError` with Go's text."""
        response = await self._request_v1("GET", url)
        try:
            return response.json()
        except ValueError as exc:
            raise UpstreamError(f"invalid character in response - {exc}") from None

    async def post_v1(self, url: str) -> None:
        """``POSTV1`` with no body."""
        await self._request_v1("POST", url)

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
                    if semver_lt(newest, p.version):
                        newest = p.version
                    if p.topics:
                        p.topics.sort(key=lambda t: t[0])
                # Every lookupd that lists the node adds "lookupd/remote address".
                known.remote_addresses = [
                    *(known.remote_addresses or []),
                    f"{address}/{p.remote_address or 'N/A'}",
                ]
        for p in producers:
            if semver_lt(p.version, newest):
                p.out_of_date = True
        stable_sort_by_hostname(producers)
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
                name = str_field(t, "topic_name")
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
            names = [(str_field(t, "topic_name"), False) for t in stats.get("topics") or []]
            return Producer.from_node(info, names or None)

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
            names = [(str_field(t, "topic_name"), False) for t in stats.get("topics") or []]
            if all(name != topic for name, _ in names):
                return None
            info = await self._nsqd_query(f"http://{address}/info")()
            broadcast, http_port = (
                str_field(info, "broadcast_address"),
                int_field(info, "http_port"),
            )
            if not broadcast:  # very old nsqd: use the address we asked
                broadcast, _, port = address.rpartition(":")
                http_port = int(port) if port.isdigit() else 0
            return Producer(
                version=str_field(info, "version"),
                broadcast_address=broadcast,
                hostname=str_field(info, "hostname") or address.rpartition(":")[0],
                http_port=http_port,
                tcp_port=int_field(info, "tcp_port"),
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
        stable_sort_by_hostname(topics)
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


def _https_endpoint(url: str, body: bytes) -> str:
    """``httpsEndpoint``: the same URL on the HTTPS port a 403 answer names."""
    try:
        port = int(json.loads(body).get("https_port") or 0)
    except (ValueError, AttributeError, TypeError) as exc:
        raise UpstreamError(str(exc)) from None
    scheme_host, _, rest = url.partition("://")[2].partition("/")
    host = scheme_host.rpartition(":")[0] or scheme_host
    return f"https://{join_host_port(host.strip('[]'), port)}/{rest}"


def _status_error(response: httpx.Response) -> str:
    reason = response.reason_phrase or httpx.codes.get_reason_phrase(response.status_code)
    return f"got response {response.status_code} {reason} {go_quote(response.content)}"
