"""Discovery through nsqlookupd (httpx MockTransport), in virtual time."""

from __future__ import annotations

import itertools
import json
from typing import Any

import httpx
import pytest
import trio
import trio.testing

import trionsq
from trionsq.lookupd import lookup_url, merge, parse_lookup_response

from ..support.waiting import wait_until
from .minisrv import Cluster


def producer(address: str) -> dict[str, Any]:
    host, port = address.rsplit(":", 1)
    return {"broadcast_address": host, "tcp_port": int(port), "http_port": 4151}


class Lookupds:
    """Scripted lookupds: per host, a list of nsqd addresses, or a failure mode."""

    def __init__(self) -> None:
        self.answers: dict[str, list[str] | str] = {}
        self.requests: list[str] = []
        self.envelope: set[str] = set()

    async def handler(self, request: httpx.Request) -> httpx.Response:
        host = f"{request.url.host}:{request.url.port}"
        self.requests.append(host)
        assert request.url.path == "/lookup"
        assert request.url.params["topic"] == "topic"
        answer = self.answers.get(host, "error")
        if answer == "hang":
            await trio.sleep_forever()
        if answer == "error":
            return httpx.Response(500, text="boom")
        if answer == "missing":
            return httpx.Response(404, json={"message": "TOPIC_NOT_FOUND"})
        assert isinstance(answer, list)
        body: dict[str, Any] = {"channels": [], "producers": [producer(a) for a in answer]}
        if host in self.envelope:
            body = {"status_code": 200, "status_txt": "OK", "data": body}
        return httpx.Response(200, content=json.dumps(body).encode())

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handler)


def consumer(cluster: Cluster, lookupds: Lookupds, **options: Any) -> trionsq.Consumer:
    options.setdefault("lookupd_poll_interval", 10.0)
    options.setdefault("lookupd_poll_jitter", 0.0)
    return trionsq.Consumer(
        "topic",
        "chan",
        lookupd_http_addresses=sorted(lookupds.answers),
        connector=cluster.connector,
        http_transport=lookupds.transport(),
        handler=lambda m: None,
        **options,
    )


async def test_merges_producers_of_every_lookupd(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    cluster = Cluster(nursery)
    for name in ("a:4150", "b:4150", "c:4150"):
        cluster.add(name)
    lookupds = Lookupds()
    lookupds.answers = {"l1:4161": ["a:4150", "b:4150"], "l2:4161": ["b:4150", "c:4150"]}
    lookupds.envelope = {"l2:4161"}  # the pre-1.0 response shape
    async with consumer(cluster, lookupds) as c:
        await wait_until(lambda: c.connections == ["a:4150", "b:4150", "c:4150"])
        await trio.sleep(35)  # more polls: no duplicate connections
        assert c.connections == ["a:4150", "b:4150", "c:4150"]
    assert [len(node.conns) for node in cluster.nodes.values()] == [1, 1, 1]
    assert lookupds.requests.count("l1:4161") == 4  # at 0, 10, 20, 30


async def test_hanging_or_failing_lookupd_does_not_stall_the_others(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    cluster = Cluster(nursery)
    cluster.add("a:4150")
    lookupds = Lookupds()
    lookupds.answers = {"l1:4161": "hang", "l2:4161": "error", "l3:4161": ["a:4150"]}
    start = trio.current_time()
    async with consumer(cluster, lookupds, lookupd_poll_interval=5.0) as c:
        await wait_until(lambda: c.connections == ["a:4150"])
        # Connected at once, without waiting for the hung lookupd's timeout.
        assert trio.current_time() - start < 0.1


async def test_new_producers_are_found_and_vanished_ones_dropped(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    cluster = Cluster(nursery)
    cluster.add("a:4150")
    cluster.add("b:4150")
    lookupds = Lookupds()
    lookupds.answers = {"l1:4161": ["a:4150"], "l2:4161": "missing"}
    async with consumer(cluster, lookupds) as c:
        await wait_until(lambda: c.connections == ["a:4150"])
        lookupds.answers["l2:4161"] = ["b:4150"]
        await wait_until(lambda: c.connections == ["a:4150", "b:4150"], limit=15, step=0.05)
        # a vanishes from l1, but l2 fails this round: absence is not trusted yet.
        lookupds.answers["l1:4161"] = []
        lookupds.answers["l2:4161"] = "error"
        await trio.sleep(10)
        assert c.connections == ["a:4150", "b:4150"]
        lookupds.answers["l2:4161"] = ["b:4150"]
        await wait_until(lambda: c.connections == ["b:4150"], limit=15, step=0.05)


async def test_lost_connection_comes_back_with_the_next_poll(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    cluster = Cluster(nursery)
    node = cluster.add("a:4150")
    lookupds = Lookupds()
    lookupds.answers = {"l1:4161": ["a:4150"]}
    async with consumer(cluster, lookupds) as c:
        await wait_until(lambda: c.connections == ["a:4150"])
        start = trio.current_time()
        await node.conns[0].close()
        await wait_until(lambda: c.connections == [])
        await wait_until(lambda: c.connections == ["a:4150"], limit=15)
        assert trio.current_time() - start == pytest.approx(10.0, abs=0.1)


async def test_poll_interval_jitter_is_bounded(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    cluster = Cluster(nursery)
    lookupds = Lookupds()
    lookupds.answers = {"l1:4161": []}
    times: list[float] = []
    original = lookupds.handler

    async def handler(request: httpx.Request) -> httpx.Response:
        times.append(trio.current_time())
        return await original(request)

    lookupds.handler = handler  # type: ignore[method-assign]
    async with consumer(cluster, lookupds, lookupd_poll_jitter=0.5):
        await wait_until(lambda: len(times) == 8, limit=200, step=0.5)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(7.5 - 0.01 <= g <= 12.5 + 0.01 for g in gaps)
    assert len({round(g, 3) for g in gaps}) > 1


def test_parse_lookup_response_shapes() -> None:
    current = {"producers": [producer("h:1"), {"broadcast_address": "h", "tcp_port": "x"}, 3]}
    assert parse_lookup_response(current) == {"h:1"}
    old = {"status_code": 200, "data": {"producers": [producer("g:2")]}}
    assert parse_lookup_response(old) == {"g:2"}
    ipv6 = {"producers": [{"broadcast_address": "::1", "tcp_port": 4150}]}
    assert parse_lookup_response(ipv6) == {"[::1]:4150"}
    for bad in ([], {"data": 1}, {"producers": "x"}):
        with pytest.raises(ValueError):
            parse_lookup_response(bad)
    assert merge([{"a:1"}, None, {"b:1", "a:1"}]) == {"a:1", "b:1"}
    assert lookup_url("h:4161") == "http://h:4161/lookup"
    assert lookup_url("https://h:4161/") == "https://h:4161/lookup"
