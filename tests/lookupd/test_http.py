"""nsqlookupd's HTTP API (v1.3: plain JSON answers, {"message": ...} errors)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import trio

from fakensq.lookupd.daemon import LEGACY_ALIASES, NSQLookupd

from .conftest import registered_client


async def test_ping_info(http: httpx.AsyncClient) -> None:
    r = await http.get("/ping")
    assert (r.status_code, r.text) == (200, "OK")
    assert r.headers["content-type"].startswith("text/plain")
    r = await http.get("/info")
    assert r.json() == {"version": "1.3.0"}
    assert r.headers["x-nsq-content-type"] == "nsq; version=1.0"


async def test_lookup(lookupd: NSQLookupd, http: httpx.AsyncClient) -> None:
    r = await http.get("/lookup")
    assert (r.status_code, r.json()) == (400, {"message": "MISSING_ARG_TOPIC"})
    r = await http.get("/lookup", params={"topic": "t"})
    assert (r.status_code, r.json()) == (404, {"message": "TOPIC_NOT_FOUND"})
    client = await registered_client(lookupd, "t c", hostname="h1", tcp_port=14150)
    r = await http.get("/lookup", params={"topic": "t"})
    assert r.status_code == 200
    body = r.json()
    assert body["channels"] == ["c"]
    (producer,) = body["producers"]
    assert list(producer) == [
        "remote_address",
        "hostname",
        "broadcast_address",
        "tcp_port",
        "http_port",
        "version",
    ]
    assert producer["hostname"] == "h1"
    assert producer["tcp_port"] == 14150
    assert producer["http_port"] == 4151
    assert producer["broadcast_address"] == "127.0.0.1"
    assert producer["remote_address"].startswith("127.0.0.1:")
    await client.aclose()


async def test_topics_channels_nodes(lookupd: NSQLookupd, http: httpx.AsyncClient) -> None:
    assert (await http.get("/topics")).json() == {"topics": []}
    assert (await http.get("/nodes")).json() == {"producers": []}
    r = await http.get("/channels")
    assert (r.status_code, r.json()) == (400, {"message": "MISSING_ARG_TOPIC"})
    assert (await http.get("/channels", params={"topic": "x"})).json() == {"channels": []}
    client = await registered_client(lookupd, "a", "b c")
    assert (await http.get("/topics")).json() == {"topics": ["a", "b"]}
    assert (await http.get("/channels", params={"topic": "b"})).json() == {"channels": ["c"]}
    (node,) = (await http.get("/nodes")).json()["producers"]
    assert node["topics"] == ["a", "b"]
    assert node["tombstones"] == [False, False]
    assert node["tcp_port"] == 4150
    await client.aclose()


async def test_create_and_delete(http: httpx.AsyncClient, lookupd: NSQLookupd) -> None:
    r = await http.post("/topic/create", params={"topic": "t"})
    assert (r.status_code, r.content) == (200, b"")
    r = await http.post("/topic/create", params={"topic": "bad topic"})
    assert (r.status_code, r.json()) == (400, {"message": "INVALID_ARG_TOPIC"})
    r = await http.post("/topic/create")
    assert (r.status_code, r.json()) == (400, {"message": "MISSING_ARG_TOPIC"})
    r = await http.post("/channel/create", params={"topic": "u", "channel": "c"})
    assert r.status_code == 200
    assert (await http.get("/topics")).json() == {"topics": ["t", "u"]}
    # Created but unproduced: /lookup knows the topic, with no producers.
    assert (await http.get("/lookup", params={"topic": "u"})).json() == {
        "channels": ["c"],
        "producers": [],
    }
    for params, message in [
        ({}, "MISSING_ARG_TOPIC"),
        ({"topic": "!"}, "INVALID_ARG_TOPIC"),
        ({"topic": "u"}, "MISSING_ARG_CHANNEL"),
        ({"topic": "u", "channel": "!"}, "INVALID_ARG_CHANNEL"),
    ]:
        r = await http.post("/channel/create", params=params)
        assert (r.status_code, r.json()) == (400, {"message": message})
    r = await http.post("/channel/delete", params={"topic": "u", "channel": "nope"})
    assert (r.status_code, r.json()) == (404, {"message": "CHANNEL_NOT_FOUND"})
    r = await http.post("/channel/delete", params={"topic": "u", "channel": "c"})
    assert r.status_code == 200
    assert (await http.get("/channels", params={"topic": "u"})).json() == {"channels": []}
    await http.post("/channel/create", params={"topic": "u", "channel": "c"})
    r = await http.post("/topic/delete", params={"topic": "u"})
    assert r.status_code == 200
    assert (await http.get("/topics")).json() == {"topics": ["t"]}
    assert lookupd.channels("u") == []


async def test_routing_errors(http: httpx.AsyncClient) -> None:
    r = await http.get("/nope")
    assert (r.status_code, r.json()) == (404, {"message": "NOT_FOUND"})
    r = await http.get("/topic/create", params={"topic": "t"})
    assert (r.status_code, r.json()) == (405, {"message": "METHOD_NOT_ALLOWED"})
    assert r.headers["allow"] == "OPTIONS, POST"
    r = await http.options("/lookup")
    assert (r.status_code, r.headers["allow"]) == (200, "GET, OPTIONS")
    r = await http.head("/ping")
    assert r.status_code == 405
    r = await http.post("/lookup", params={"topic": "t"})
    assert r.status_code == 405
    r = await http.get("/ping/")
    assert (r.status_code, r.headers["location"]) == (301, "/ping")
    r = await http.get("/PING")
    assert (r.status_code, r.headers["location"]) == (301, "/ping")
    r = await http.post("/Topic/Create/", params={"topic": "t"})
    # 307 keeps the method (httprouter v1.3.0), and the query goes along.
    assert (r.status_code, r.headers["location"]) == (307, "/topic/create?topic=t")


async def test_debug(lookupd: NSQLookupd, http: httpx.AsyncClient) -> None:
    client = await registered_client(lookupd, "t")
    data = (await http.get("/debug")).json()
    assert sorted(data) == ["client::", "topic:t:"]
    (entry,) = data["topic:t:"]
    assert entry["tombstoned"] is False
    assert entry["tcp_port"] == 4150
    assert entry["id"].startswith("127.0.0.1:")
    await client.aclose()


@pytest.mark.parametrize("node_host", ["127.0.0.1"])
async def test_tombstone_hides_producer_for_its_lifetime(
    autojump_clock: trio.testing.MockClock, node_host: str
) -> None:
    async with NSQLookupd(tombstone_lifetime=45) as lookupd:
        async with httpx.AsyncClient(base_url=f"http://{lookupd.http_address}") as http:
            a = await registered_client(lookupd, "t", "u", http_port=1111)
            b = await registered_client(lookupd, "t", http_port=2222)
            r = await http.post("/topic/tombstone", params={"node": "x"})
            assert (r.status_code, r.json()) == (400, {"message": "MISSING_ARG_TOPIC"})
            r = await http.post("/topic/tombstone", params={"topic": "t"})
            assert (r.status_code, r.json()) == (400, {"message": "MISSING_ARG_NODE"})
            r = await http.post("/topic/tombstone", params={"topic": "t", "node": "x"})
            assert r.status_code == 200  # an unknown node is not an error
            r = await http.post(
                "/topic/tombstone", params={"topic": "t", "node": f"{node_host}:1111"}
            )
            assert r.status_code == 200
            ports = [
                p["http_port"] for p in (await http.get("/lookup?topic=t")).json()["producers"]
            ]
            assert ports == [2222]
            # Only that topic: "u" still lists the producer.
            assert len((await http.get("/lookup?topic=u")).json()["producers"]) == 1
            nodes = (await http.get("/nodes")).json()["producers"]
            assert [n["tombstones"] for n in nodes] == [[True, False], [False]]
            # Re-REGISTER on the same connection keeps the tombstone (as nsqlookupd does)...
            assert await a.command("REGISTER t") == b"OK"
            assert len(lookupd.producers("t")) == 1
            await trio.sleep(44)
            # (pings keep both producers active)
            assert await a.command("PING") == b"OK"
            assert len(lookupd.producers("t")) == 1
            await trio.sleep(1.5)
            assert len(lookupd.producers("t")) == 2
            # ...while UNREGISTER then REGISTER clears it at once.
            await http.post("/topic/tombstone", params={"topic": "t", "node": f"{node_host}:1111"})
            assert len(lookupd.producers("t")) == 1
            assert await a.command("UNREGISTER t") == b"OK"
            assert await a.command("REGISTER t") == b"OK"
            assert len(lookupd.producers("t")) == 2
            await a.aclose()
            await b.aclose()


async def test_inactive_producers_are_hidden(autojump_clock: trio.testing.MockClock) -> None:
    async with NSQLookupd(inactive_producer_timeout=300) as lookupd:
        a = await registered_client(lookupd, "t", tcp_port=1)
        b = await registered_client(lookupd, "t", tcp_port=2)
        await trio.sleep(200)
        assert await a.command("PING") == b"OK"
        await trio.sleep(101)
        # b has been silent for 301 s: gone from /lookup and /nodes, still registered.
        assert [p.tcp_port for p in lookupd.producers("t")] == [1]
        assert [n["tcp_port"] for n in lookupd.nodes()] == [1]
        assert len(lookupd.db.find_producers("topic", "t", "")) == 2
        # A PING revives it.
        assert await b.command("PING") == b"OK"
        assert [p.tcp_port for p in lookupd.producers("t")] == [1, 2]
        await a.aclose()
        await b.aclose()


async def test_removed_aliases_answer_404_by_default(http: httpx.AsyncClient) -> None:
    # nsqlookupd v1.3.0 dropped them (tests/conformance compares with the real one).
    for alias in LEGACY_ALIASES:
        r = await http.post(alias, params={"topic": "old", "channel": "c", "node": "x:1"})
        assert (r.status_code, r.json()) == (404, {"message": "NOT_FOUND"})


@pytest.fixture
async def legacy_http() -> AsyncIterator[httpx.AsyncClient]:
    async with (
        NSQLookupd(legacy_http_aliases=True) as node,
        httpx.AsyncClient(base_url=f"http://{node.http_address}") as client,
    ):
        yield client


async def test_legacy_http_aliases_option_serves_them(legacy_http: httpx.AsyncClient) -> None:
    http = legacy_http
    assert (await http.post("/create_topic", params={"topic": "old"})).status_code == 200
    r = await http.post("/create_channel", params={"topic": "old", "channel": "c"})
    assert r.status_code == 200
    assert (await http.get("/channels", params={"topic": "old"})).json() == {"channels": ["c"]}
    r = await http.post("/delete_channel", params={"topic": "old", "channel": "c"})
    assert r.status_code == 200
    assert (await http.get("/channels", params={"topic": "old"})).json() == {"channels": []}
    r = await http.post("/tombstone_topic_producer", params={"topic": "old", "node": "x:1"})
    assert r.status_code == 200  # an unknown node is a no-op, as for /topic/tombstone
    assert (await http.post("/delete_topic", params={"topic": "old"})).status_code == 200
    assert "old" not in (await http.get("/topics")).json()["topics"]
    # Same methods as the current names.
    assert (await http.get("/create_topic", params={"topic": "x"})).status_code == 405
