"""nsqadmin's HTTP API: ``fakensq admin`` beside the real nsqadmin v1.3.0.

Both admins are pointed at the same cluster (real nsqlookupd and nsqd, or
fakensq's) and asked the same things; their answers are compared byte for byte
(status, ``X-NSQ-Content-Type``, ``Content-Type``, body), only a client's
``connected`` (seconds since it connected, which moves) is set aside.  Where
nsqadmin's answer depends on which nsqd answered first (the order of a topic's
nodes, and so which node's channels carry the totals), the question is asked
again until both admins happened to see the same order.

Actions are done through one admin, checked on the daemons, and answered the
same way by the other.  And the real nsqadmin, pointed at a fakensq cluster,
must answer as it does for a real cluster built the same way.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from fakensq import Cluster
from fakensq.admin import Admin
from tests import reference
from tests.support.ports import free_port, refused_address
from tests.support.stats import channel_entry

from ..support.waiting import poll_until
from .conftest import AsyncRawConsumer

_CONNECTED = re.compile(rb'"connected":\d+')


def answer(response: httpx.Response) -> tuple[Any, ...]:
    """What a script sees of an answer (``connected`` set aside)."""
    body = _CONNECTED.sub(b'"connected":0', response.content)
    return (
        response.status_code,
        response.headers.get("x-nsq-content-type", ""),
        response.headers.get("content-type", ""),
        response.headers.get("content-encoding", ""),
        response.headers.get("location", ""),
        response.headers.get("server", ""),
        response.headers.get("vary", ""),
        ", ".join(sorted(response.headers.get("allow", "").split(", "))),
        body,
    )


@dataclass
class Layout:
    """A cluster's addresses: one nsqlookupd, two nsqd."""

    lookupd_http: str
    nsqd_http: list[str]
    nsqd_tcp: list[str]


async def _equals(value: Awaitable[Any], expected: Any) -> bool:
    return await value == expected


async def build(layout: Layout, http: httpx.AsyncClient) -> AsyncRawConsumer:
    """The same cluster state every time: ``orders`` on both nsqd (``billing`` on
    both, ``audit`` on nsqd 0), 5 + 3 messages, a topic ``empty`` on nsqd 1, and a
    consumer holding 2 of nsqd 0's ``billing`` messages in flight."""
    n0, n1 = layout.nsqd_http
    lookupd = layout.lookupd_http

    async def channels(address: str) -> list[str]:
        stats = (await http.get(f"http://{address}/stats?format=json&topic=orders")).json()
        return sorted(c["channel_name"] for t in stats["topics"] for c in t["channels"])

    async def lookupd_channels() -> list[str]:
        doc = (await http.get(f"http://{lookupd}/channels?topic=orders")).json()
        return sorted(doc.get("channels") or [])

    (await http.post(f"http://{n0}/topic/create?topic=orders")).raise_for_status()
    await http.post(f"http://{n0}/channel/create?topic=orders&channel=billing")
    await poll_until(lambda: _equals(lookupd_channels(), ["billing"]))
    # A new topic takes the channels nsqlookupd knows (both daemons look them
    # up before answering; tests/conformance/test_registration.py checks that).
    await http.post(f"http://{n1}/topic/create?topic=orders")
    await poll_until(lambda: _equals(channels(n1), ["billing"]))
    await http.post(f"http://{n0}/channel/create?topic=orders&channel=audit")
    await http.post(f"http://{n1}/topic/create?topic=empty")
    await http.post(f"http://{n0}/mpub?topic=orders", content=b"a\nb\nc\nd\ne")
    await http.post(f"http://{n1}/mpub?topic=orders", content=b"f\ng\nh")

    async def registered() -> bool:
        lookup = (await http.get(f"http://{lookupd}/lookup?topic=orders")).json()
        empty = await http.get(f"http://{lookupd}/lookup?topic=empty")
        channels = lookup.get("channels") or []
        return (
            len(lookup.get("producers") or []) == 2
            and sorted(channels) == ["audit", "billing"]
            and empty.status_code == 200
        )

    await poll_until(registered)
    consumer = await AsyncRawConsumer.connect(layout.nsqd_tcp[0], "orders", "billing", rdy=2)

    async def in_flight() -> bool:
        stats = (await http.get(f"http://{n0}/stats?format=json&topic=orders")).json()
        channels = {c["channel_name"]: c for c in stats["topics"][0]["channels"]}
        return channels["billing"]["in_flight_count"] == 2

    await poll_until(in_flight)
    return consumer


@dataclass
class Pair:
    real: str  # http://host:port of the real nsqadmin
    fake: str  # ... and of fakensq's admin
    layout: Layout
    http: httpx.AsyncClient

    async def ask(self, method: str, path: str, body: bytes | None = None) -> tuple[Any, Any]:
        real = await self.http.request(method, self.real + path, content=body)
        fake = await self.http.request(method, self.fake + path, content=body)
        return answer(real), answer(fake)

    async def same(self, method: str, path: str, body: bytes | None = None) -> None:
        """Both admins answer alike (asked again while only the node order differs)."""
        for _ in range(60):
            real, fake = await self.ask(method, path, body)
            if real == fake:
                return
            if method != "GET" or real[:4] != fake[:4]:
                break
        assert fake == real, f"{method} {path}"


async def _real_cluster(stack: AsyncExitStack, *nsqd_flags: str) -> Layout:
    lookupd = await stack.enter_async_context(reference.open_nsqlookupd())
    nsqds = [
        await stack.enter_async_context(
            reference.open_nsqd(f"--lookupd-tcp-address={lookupd.tcp_address}", *nsqd_flags)
        )
        for _ in range(2)
    ]

    async def know_lookupd() -> bool:
        # A topic created before nsqd has nsqlookupd's answer to its IDENTIFY
        # (the log's "peer info") is not given the channels nsqlookupd knows.
        return all("peer info" in n.log() for n in nsqds)

    await poll_until(know_lookupd)
    return Layout(
        lookupd.http_address, [n.http_address for n in nsqds], [n.tcp_address for n in nsqds]
    )


async def _fake_cluster(stack: AsyncExitStack) -> Layout:
    cluster = await stack.enter_async_context(Cluster(nsqd=2, lookupd=1))
    return Layout(
        cluster.lookupd_http_addresses[0],
        list(cluster.nsqd_http_addresses),
        list(cluster.nsqd_tcp_addresses),
    )


async def _pair(
    stack: AsyncExitStack, layout: Layout, http: httpx.AsyncClient, *flags: str
) -> Pair:
    real = await stack.enter_async_context(
        reference.open_nsqadmin(f"--lookupd-http-address={layout.lookupd_http}", *flags)
    )
    fake = await stack.enter_async_context(
        Admin(
            lookupd_http_addresses=[layout.lookupd_http],
            http_address="127.0.0.1:0",
            watch_interval=60,
        )
    )
    return Pair(f"http://{real.http_address}", fake.url, layout, http)


async def _built_real_cluster(stack: AsyncExitStack) -> tuple[httpx.AsyncClient, Layout]:
    """An HTTP client and a real cluster built by :func:`build` (its consumer
    closed when ``stack`` unwinds)."""
    http = await stack.enter_async_context(httpx.AsyncClient(timeout=10))
    layout = await _real_cluster(stack)
    consumer = await build(layout, http)
    stack.push_async_callback(consumer.aclose)
    return http, layout


@pytest.fixture
async def real_pair() -> AsyncIterator[Pair]:
    """Both admins over a real cluster built by :func:`build`."""
    reference.require("nsqadmin")
    async with AsyncExitStack() as stack:
        http, layout = await _built_real_cluster(stack)
        yield await _pair(stack, layout, http)


_READS = [
    "/api/topics",
    "/api/topics?inactive=true",
    "/api/topics/orders",
    "/api/topics/orders/billing",
    "/api/topics/orders/audit",
    "/api/topics/orders/nosuch",
    "/api/topics/empty",
    "/api/topics/nosuch",
    "/api/topics/nosuch/c",
    "/api/nodes",
    "/api/nodes/nosuch:4151",
    "/api/counter",
    "/api/graphite",
    "/api/graphite?metric=rate",
    "/api/graphite?metric=rate&target=x",
    "/api/topics?inactive=true;x=1",
    "/config/nope",
    "/config/log_level",
    "/config/admin_users",
    "/config/statsd_interval",
    "/config/base_path",
    "/config/graphite_url",
    "/ping",
    "/nope",
    "/static/nope.js",
    "/static/",
    "/API/TOPICS",
    "/api//nodes",
    "/api/topics/orders/",
    "/api/topics/orders/billing/extra",
]


async def test_reads_answer_as_nsqadmin(real_pair: Pair) -> None:
    pair = real_pair
    for path in _READS:
        await pair.same("GET", path)
    for address in pair.layout.nsqd_http:
        await pair.same("GET", f"/api/nodes/{address}")
    # Wrong methods, OPTIONS and HEAD, as nsqadmin's router answers them.
    await pair.same("PUT", "/api/topics/orders")
    await pair.same("OPTIONS", "/api/topics/orders")
    await pair.same("HEAD", "/api/topics")
    await pair.same("POST", "/config/log_level")
    await pair.same("POST", "/api/topics/orders/billing/", b'{"action":"pause"}')


_BAD_BODIES = [
    b"",
    b"   ",
    b"xx",
    b"[1]",
    b'"pause"',
    b"12x",
    b"null",
    b"{",
    b'{"action"',
    b'{"action":',
    b'{"action" 1}',
    b'{"action":1}',
    b'{"action":{}}',
    b'{"action":[]}',
    b'{"action":[1 2]}',
    b'{"action":[1,]}',
    b'{"action":[1,2}',
    b'{"action":{"a":1,}}',
    b"{ }",
    b'{"action":true}',
    b'{"action":"frob"}',
    b'{"action":null}',
    b'{"ACTION":"pause"} trailing',
    b'{"action":"pause","action":2}',
    b'{"a":1 "b"}',
    b'"\\x"',
    b'"\\u12g4"',
    b"tru",
    b"nul",
    b"-",
    b"1.",
    b"1e+",
    b"\xef\xbb\xbf{}",
]


async def test_errors_answer_as_nsqadmin(real_pair: Pair) -> None:
    pair = real_pair
    for body in _BAD_BODIES:
        # A topic no lookupd knows: every well-formed action ends in nsqadmin's 502.
        await pair.same("POST", "/api/topics/nosuch/c", body)
        await pair.same("POST", "/api/topics/nosuch", body)
    for body in [
        b"xx",
        b"{}",
        b'{"topic":"bad name"}',
        b'{"topic":"ok","channel":"bad name"}',
        b'{"topic":1}',
    ]:
        await pair.same("POST", "/api/topics", body)
    for body in [b"", b"xx", b"{}", b'{"topic":"bad name"}', b'{"topic":[]}']:
        await pair.same("DELETE", f"/api/nodes/{pair.layout.nsqd_http[0]}", body)
    await pair.same("DELETE", "/api/topics/nosuch")
    await pair.same("DELETE", "/api/topics/nosuch/c")
    await pair.same("PUT", "/config/log_level", b"")
    await pair.same("PUT", "/config/log_level", b"bogus")
    await pair.same("PUT", "/config/nsqlookupd_http_addresses", b"not json")
    await pair.same("PUT", "/config/base_path", b"/x")


async def _stats(http: httpx.AsyncClient, address: str) -> dict[str, Any]:
    doc: dict[str, Any] = (await http.get(f"http://{address}/stats?format=json")).json()
    return doc


async def _channel(http: httpx.AsyncClient, address: str, topic: str, channel: str) -> Any:
    return channel_entry(await _stats(http, address), topic, channel)


async def test_actions_reach_the_daemons_as_nsqadmins(real_pair: Pair) -> None:
    pair, http, (n0, n1) = real_pair, real_pair.http, real_pair.layout.nsqd_http

    async def act(side: str, method: str, path: str, body: Any = None) -> Any:
        content = json.dumps(body).encode() if body is not None else None
        return answer(await http.request(method, side + path, content=content))

    # Pause through fakensq's admin: every nsqd holding the channel is paused...
    fake = await act(pair.fake, "POST", "/api/topics/orders/billing", {"action": "pause"})
    for address in (n0, n1):
        assert (await _channel(http, address, "orders", "billing"))["paused"] is True
    await pair.same("GET", "/api/topics/orders/billing")
    # ... the real one undoes it, and the answers agree.
    real = await act(pair.real, "POST", "/api/topics/orders/billing", {"action": "unpause"})
    for address in (n0, n1):
        assert (await _channel(http, address, "orders", "billing"))["paused"] is False
    assert fake == real
    real = await act(pair.real, "POST", "/api/topics/orders", {"action": "pause"})
    assert (await _stats(http, n1))["topics"][1]["paused"] is True
    fake = await act(pair.fake, "POST", "/api/topics/orders", {"action": "unpause"})
    assert fake == real
    assert all(not t["paused"] for t in (await _stats(http, n1))["topics"])

    # Empty a channel through each admin.
    fake = await act(pair.fake, "POST", "/api/topics/orders/audit", {"action": "empty"})
    assert (await _channel(http, n0, "orders", "audit"))["depth"] == 0
    await http.post(f"http://{n0}/pub?topic=orders", content=b"again")
    real = await act(pair.real, "POST", "/api/topics/orders/audit", {"action": "empty"})
    assert (await _channel(http, n0, "orders", "audit"))["depth"] == 0
    assert fake == real

    # Create a topic and channel: nsqlookupd learns both; each admin, its own.
    lookupd = pair.layout.lookupd_http
    for side, name in ((pair.fake, "made_fake"), (pair.real, "made_real")):
        result = await act(side, "POST", "/api/topics", {"topic": name, "channel": "first"})
        assert result[0] == 200 and json.loads(result[-1]) == {"message": ""}
        channels = (await http.get(f"http://{lookupd}/channels?topic={name}")).json()
        assert channels["channels"] == ["first"]
    await pair.same("GET", "/api/topics")
    await pair.same("GET", "/api/topics?inactive=true")

    # Delete a channel, then tombstone and delete topics, one through each admin.
    for address in (n0, n1):
        await http.post(f"http://{address}/channel/create?topic=orders&channel=gone_fake")
        await http.post(f"http://{address}/channel/create?topic=orders&channel=gone_real")
    fake = await act(pair.fake, "DELETE", "/api/topics/orders/gone_fake")
    real = await act(pair.real, "DELETE", "/api/topics/orders/gone_real")
    assert fake == real
    for address in (n0, n1):
        assert await _channel(http, address, "orders", "gone_fake") is None
        assert await _channel(http, address, "orders", "gone_real") is None

    for name in ("tomb_fake", "tomb_real"):
        await http.post(f"http://{n1}/topic/create?topic={name}")
    await poll_until(lambda: _lookup_has(http, lookupd, "tomb_fake"))
    await poll_until(lambda: _lookup_has(http, lookupd, "tomb_real"))
    fake = await act(pair.fake, "DELETE", f"/api/nodes/{n1}", {"topic": "tomb_fake"})
    real = await act(pair.real, "DELETE", f"/api/nodes/{n1}", {"topic": "tomb_real"})
    assert fake == real
    names = {t["topic_name"] for t in (await _stats(http, n1))["topics"]}
    assert not names & {"tomb_fake", "tomb_real"}
    await pair.same("GET", "/api/nodes")

    fake = await act(pair.fake, "DELETE", "/api/topics/made_fake")
    real = await act(pair.real, "DELETE", "/api/topics/made_real")
    assert fake == real
    await pair.same("GET", "/api/topics")


async def _has_channel(http: httpx.AsyncClient, address: str, channel: str) -> bool:
    return await _channel(http, address, "orders", channel) is not None


async def _lookup_has(http: httpx.AsyncClient, lookupd: str, topic: str) -> bool:
    r = await http.get(f"http://{lookupd}/lookup?topic={topic}")
    return r.status_code == 200 and bool(r.json().get("producers"))


async def test_a_dead_lookupd_is_a_warning_as_in_nsqadmin() -> None:
    """One of two nsqlookupd down: answers carry nsqadmin's WARNING; all down: 502."""
    reference.require("nsqadmin")
    async with AsyncExitStack() as stack:
        dead = stack.enter_context(refused_address())
        http, layout = await _built_real_cluster(stack)
        flags = (f"--lookupd-http-address={dead}",)
        real = await stack.enter_async_context(
            reference.open_nsqadmin(f"--lookupd-http-address={layout.lookupd_http}", *flags)
        )
        fake = await stack.enter_async_context(
            Admin(
                lookupd_http_addresses=[layout.lookupd_http, dead],
                http_address="127.0.0.1:0",
                watch_interval=60,
            )
        )
        pair = Pair(f"http://{real.http_address}", fake.url, layout, http)
        for path in ("/api/topics", "/api/nodes", "/api/topics/orders", "/api/counter"):
            await pair.same("GET", path)
        await pair.same("POST", "/api/topics", b'{"topic":"warned"}')
        only_dead = await stack.enter_async_context(
            reference.open_nsqadmin(f"--lookupd-http-address={dead}")
        )
        fake_dead = await stack.enter_async_context(
            Admin(lookupd_http_addresses=[dead], http_address="127.0.0.1:0", watch_interval=60)
        )
        pair = Pair(f"http://{only_dead.http_address}", fake_dead.url, layout, http)
        for path in ("/api/topics", "/api/nodes", "/api/topics/orders", "/api/counter"):
            await pair.same("GET", path)
        await pair.same("POST", "/api/topics/orders", b'{"action":"pause"}')


async def test_nsqd_addresses_instead_of_lookupd() -> None:
    """--nsqd-http-address (one of them down): the same answers as nsqadmin's."""
    reference.require("nsqadmin")
    async with AsyncExitStack() as stack:
        dead = stack.enter_context(refused_address())
        http, layout = await _built_real_cluster(stack)
        flags = [f"--nsqd-http-address={a}" for a in [*layout.nsqd_http, dead]]
        real = await stack.enter_async_context(reference.open_nsqadmin(*flags))
        fake = await stack.enter_async_context(
            Admin(
                nsqd_http_addresses=[*layout.nsqd_http, dead],
                http_address="127.0.0.1:0",
                watch_interval=60,
            )
        )
        pair = Pair(f"http://{real.http_address}", fake.url, layout, http)
        for path in [*_READS, f"/api/nodes/{layout.nsqd_http[0]}"]:
            await pair.same("GET", path)


async def test_end_to_end_latency_percentiles_summed_as_nsqadmin_sums_them() -> None:
    """nsqd's e2e percentiles, merged over nodes and channels by nsqadmin's
    averaging (floats written as Go writes them)."""
    reference.require("nsqadmin")
    async with AsyncExitStack() as stack:
        http = await stack.enter_async_context(httpx.AsyncClient(timeout=10))
        layout = await _real_cluster(stack, "--e2e-processing-latency-percentile=1.0,0.99,0.5")
        consumer = await build(layout, http)
        stack.push_async_callback(consumer.aclose)
        for i, tcp in enumerate(layout.nsqd_tcp):
            finisher = await AsyncRawConsumer.connect(
                tcp, "orders", "audit" if i == 0 else "billing", 10
            )
            with trio.fail_after(20):
                await finisher.finish(5 if i == 0 else 3)
            await finisher.aclose()

        async def percentiles_everywhere() -> bool:
            for address in layout.nsqd_http:
                doc = (await http.get(f"http://{address}/stats?format=json&topic=orders")).json()
                if not doc["topics"][0]["e2e_processing_latency"]["percentiles"]:
                    return False
            return True

        await poll_until(percentiles_everywhere)
        pair = await _pair(stack, layout, http)
        for path in (
            "/api/topics/orders",
            "/api/topics/orders/audit",
            "/api/topics/orders/billing",
        ):
            await pair.same("GET", path)
        doc = (await http.get(pair.fake + "/api/topics/orders")).json()
        assert [p["quantile"] for p in doc["e2e_processing_latency"]["percentiles"]] == [
            1,
            0.99,
            0.5,
        ]


# -- the real nsqadmin over a fakensq cluster --------------------------------------


def _symbolic(body: bytes, layout: Layout) -> Any:
    """An answer with a cluster's addresses, ports and connection times replaced by
    names, so answers about two clusters built alike can be compared."""
    text = body.decode()
    names = {layout.lookupd_http: "lookupd"}
    for i, (http_addr, tcp_addr) in enumerate(zip(layout.nsqd_http, layout.nsqd_tcp, strict=True)):
        names[http_addr] = f"nsqd{i}-http"
        names[tcp_addr] = f"nsqd{i}-tcp"
    for address, name in names.items():
        text = text.replace(address, name)
        port = address.rpartition(":")[2]
        text = re.sub(rf'"(tcp|http)_port":{port}\b', rf'"\1_port":"{name}"', text)
    text = re.sub(r"127\.0\.0\.1:\d+", "remote", text)
    text = re.sub(r'"(connect_ts|connected)":\d+', r'"\1":0', text)
    return json.loads(text) if text.startswith(("{", "[")) else text


async def test_real_nsqadmin_shows_a_fakensq_cluster_as_a_real_one() -> None:
    reference.require("nsqadmin")
    async with AsyncExitStack() as stack:
        http = await stack.enter_async_context(httpx.AsyncClient(timeout=10))
        real_layout = await _real_cluster(stack)
        fake_layout = await _fake_cluster(stack)
        pairs = []
        for layout in (real_layout, fake_layout):
            consumer = await build(layout, http)
            stack.push_async_callback(consumer.aclose)
            pairs.append(await _pair(stack, layout, http))
        on_real, on_fake = pairs
        paths = [p for p in _READS if p.startswith("/api/")]

        async def compare() -> None:
            for path in paths:
                # The real nsqadmin: a fakensq cluster looks like a real one.
                for _ in range(60):
                    a = await http.get(on_real.real + path)
                    b = await http.get(on_fake.real + path)
                    seen = (a.status_code, _symbolic(a.content, real_layout))
                    shown = (b.status_code, _symbolic(b.content, fake_layout))
                    if seen == shown:
                        break
                assert shown == seen, path
                # And fakensq's admin over the fakensq cluster answers as nsqadmin does.
                await on_fake.same("GET", path)
            for i in range(2):
                await on_fake.same("GET", f"/api/nodes/{fake_layout.nsqd_http[i]}")

        await compare()
        # More states, made the same way on both clusters: a paused topic, a paused
        # channel, a deferred message, an ephemeral channel with its consumer, a
        # producer tombstoned for a topic.
        for layout in (real_layout, fake_layout):
            n0, n1 = layout.nsqd_http
            await http.post(f"http://{n1}/topic/pause?topic=empty")
            await http.post(f"http://{n0}/channel/pause?topic=orders&channel=audit")
            await http.post(f"http://{n0}/pub?topic=orders&defer=60000", content=b"later")
            live = await AsyncRawConsumer.connect(layout.nsqd_tcp[1], "orders", "live#ephemeral", 1)
            stack.push_async_callback(live.aclose)
            await poll_until(lambda n1=n1: _has_channel(http, n1, "live#ephemeral"))
            await http.post(f"http://{n1}/pub?topic=orders", content=b"now")
            await http.post(f"http://{layout.lookupd_http}/topic/tombstone?topic=empty&node={n1}")

            async def settled(n0: str = n0, n1: str = n1) -> bool:
                audit = await _channel(http, n0, "orders", "audit")
                ephemeral = await _channel(http, n1, "orders", "live#ephemeral")
                return (
                    audit is not None
                    and audit["deferred_count"] == 1
                    and ephemeral is not None
                    and ephemeral["in_flight_count"] == 1
                )

            await poll_until(settled)
        await compare()


async def test_a_pause_sent_to_fakensq_admin_reaches_nsqd() -> None:
    """No real binary needed: fakensq's admin over fakensq's daemons."""
    async with (
        Cluster(nsqd=2, lookupd=1) as cluster,
        Admin(cluster=cluster, http_address="127.0.0.1:0", watch_interval=60) as admin,
        httpx.AsyncClient() as http,
    ):
        for address in cluster.nsqd_http_addresses:
            await http.post(f"http://{address}/topic/create?topic=T")
            await http.post(f"http://{address}/channel/create?topic=T&channel=C")
        await poll_until(lambda: _lookup_has(http, cluster.lookupd_http_addresses[0], "T"))

        async def two_producers() -> bool:
            doc = (await http.get(f"{admin.url}/api/topics/T")).json()
            return len(doc.get("nodes") or []) == 2

        await poll_until(two_producers)
        r = await http.post(f"{admin.url}/api/topics/T/C", json={"action": "pause"})
        assert (r.status_code, r.json()) == (200, {"message": ""})
        for nsqd in cluster.nsqds:
            assert nsqd.topics["T"].channels["C"].paused
        doc = (await http.get(f"{admin.url}/api/topics/T/C")).json()
        assert doc["paused"] is True and [n["paused"] for n in doc["nodes"]] == [True, True]
        r = await http.post(f"{admin.url}/api/topics/T/C", json={"action": "unpause"})
        assert r.status_code == 200
        assert not any(nsqd.topics["T"].channels["C"].paused for nsqd in cluster.nsqds)
        # The action is on the timeline too.
        assert any("pause channel T/C" in text for text in admin.timeline.texts())


# -- bodies from hypothesis, against both ------------------------------------------


@dataclass
class Processes:
    real: str
    fake: str


@pytest.fixture(scope="module")
def admin_processes() -> Iterator[Processes]:
    """A real nsqlookupd, the real nsqadmin and ``fakensq admin`` (a process)."""
    reference.require("nsqadmin")
    with reference.running("nsqlookupd") as lookupd:
        with reference.running(
            "nsqadmin", [f"--lookupd-http-address={lookupd.http_address}"]
        ) as real:
            port = free_port()
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "fakensq",
                    "admin",
                    f"--lookupd-http-address={lookupd.http_address}",
                    f"--http-address=127.0.0.1:{port}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                with httpx.Client(timeout=2) as http:
                    for _ in range(1000):
                        try:
                            if http.get(f"http://127.0.0.1:{port}/ping").status_code == 200:
                                break
                        except httpx.TransportError:
                            pass
                        assert proc.poll() is None
                        trio.run(trio.sleep, 0.02)  # waiting for another process
                yield Processes(f"http://{real.http_address}", f"http://127.0.0.1:{port}")
            finally:
                proc.terminate()
                proc.wait(timeout=10)


_JSONISH = st.lists(
    st.sampled_from(
        [
            b"{",
            b"}",
            b"[",
            b"]",
            b":",
            b",",
            b'"',
            b"\\",
            b"action",
            b"pause",
            b" ",
            b"1",
            b"-",
            b".",
            b"e",
            b"true",
            b"null",
            b"u",
            b"x",
            b"\n",
            b"\x00",
            b"\xc3",
            b"ACTION",
        ]
    ),
    max_size=12,
).map(b"".join)


@settings(max_examples=120)
@given(body=st.one_of(_JSONISH, st.binary(max_size=8)))
def test_any_body_is_answered_as_nsqadmin_answers_it(
    admin_processes: Processes, body: bytes
) -> None:
    with httpx.Client(timeout=10) as http:
        for path in ("/api/topics/nosuch/c", "/api/topics"):
            real = answer(http.post(admin_processes.real + path, content=body))
            fake = answer(http.post(admin_processes.fake + path, content=body))
            if path == "/api/topics" and real[0] == 200:
                continue  # a well-formed create: nsqlookupd got a topic, fine for both
            assert fake == real, body
