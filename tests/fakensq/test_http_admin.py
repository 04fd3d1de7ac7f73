"""nsqd's HTTP API, topic/channel lifecycle and the registry hooks."""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator

import httpx
import pytest
import trio

import fakensq
from fakensq import RegistryEvent
from trionsq.protocol import commands as cmds

from ..support.waiting import wait_until
from .helpers import memory_client


@pytest.fixture
async def nsqd() -> AsyncIterator[fakensq.NSQD]:
    async with fakensq.NSQD(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0") as node:
        yield node


@pytest.fixture
async def http(nsqd: fakensq.NSQD) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=f"http://{nsqd.http_address}") as client:
        yield client


async def test_info_and_ping(nsqd: fakensq.NSQD, http: httpx.AsyncClient) -> None:
    r = await http.get("/info")
    doc = r.json()
    assert r.headers["x-nsq-content-type"] == "nsq; version=1.0"
    assert doc["version"] == "1.3.0"
    assert doc["tcp_port"] == int(nsqd.tcp_address.rpartition(":")[2])
    assert doc["http_port"] == int(nsqd.http_address.rpartition(":")[2])
    assert doc["max_heartbeat_interval"] == 60_000_000_000
    nsqd.set_health("disk full")
    r = await http.get("/ping")
    assert (r.status_code, r.text) == (500, "NOK - disk full")
    r = await http.get("/stats?format=json")
    assert r.json()["health"] == "NOK - disk full"
    nsqd.set_health(None)
    assert (await http.get("/ping")).text == "OK"
    assert (await http.post("/ping")).status_code == 405


@pytest.mark.parametrize(
    ("method", "url", "body", "status", "message"),
    [
        ("POST", "/pub?topic=t", b"", 400, "MSG_EMPTY"),
        ("POST", "/pub?topic=a%20b", b"x", 400, "INVALID_TOPIC"),
        ("POST", "/pub?topic=t&defer=x", b"x", 400, "INVALID_DEFER"),
        ("POST", "/pub?topic=t&defer=-1", b"x", 400, "INVALID_DEFER"),
        ("POST", "/pub?topic=t&defer=3600001", b"x", 400, "INVALID_DEFER"),
        ("POST", "/pub?topic=t", b"x" * (1024 * 1024 + 1), 413, "MSG_TOO_BIG"),
        ("POST", "/mpub", b"x", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/mpub?topic=t&binary=true", b"\x00\x00\x00\x00", 413, "BAD_BODY"),
        (
            "POST",
            "/mpub?topic=t&binary=1",
            b"\x00\x00\x00\x01\x00\x00\x00\x05ab",
            413,
            "BAD_MESSAGE",
        ),
        ("POST", "/topic/delete?topic=nope", b"", 404, "TOPIC_NOT_FOUND"),
        ("POST", "/topic/empty?topic=nope", b"", 404, "TOPIC_NOT_FOUND"),
        ("POST", "/topic/empty?topic=a*", b"", 400, "INVALID_TOPIC"),
        ("POST", "/topic/pause", b"", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/channel/create?topic=t", b"", 400, "MISSING_ARG_CHANNEL"),
        ("POST", "/channel/create?topic=t*&channel=c", b"", 400, "INVALID_ARG_TOPIC"),
        ("POST", "/channel/create?topic=t&channel=c*", b"", 400, "INVALID_ARG_CHANNEL"),
        ("POST", "/channel/create?topic=nope&channel=c", b"", 404, "TOPIC_NOT_FOUND"),
        ("POST", "/channel/delete?topic=t&channel=nope", b"", 404, "CHANNEL_NOT_FOUND"),
        ("GET", "/config/nope", b"", 400, "INVALID_OPTION"),
        ("PUT", "/config/msg_timeout", b"1", 400, "INVALID_OPTION"),
        ("PUT", "/config/log_level", b"loud", 400, "INVALID_VALUE"),
        ("GET", "/topic/create?topic=t", b"", 405, "METHOD_NOT_ALLOWED"),
        ("GET", "/nothing/here", b"", 404, "NOT_FOUND"),
    ],
)
async def test_http_errors(
    nsqd: fakensq.NSQD,
    http: httpx.AsyncClient,
    method: str,
    url: str,
    body: bytes,
    status: int,
    message: str,
) -> None:
    nsqd.get_topic("t")
    r = await http.request(method, url, content=body)
    assert (r.status_code, r.json()) == (status, {"message": message})


async def test_mpub_binary_and_text(nsqd: fakensq.NSQD, http: httpx.AsyncClient) -> None:
    bodies = [b"one", b"two\nlines", b"three"]
    payload = struct.pack(">l", len(bodies)) + b"".join(
        struct.pack(">l", len(b)) + b for b in bodies
    )
    r = await http.post("/mpub?topic=t&binary=true", content=payload)
    assert (r.status_code, r.text) == (200, "OK")
    r = await http.post("/mpub?topic=t", content=b"a\n\nb\n")
    assert r.text == "OK"
    topic = nsqd.topics["t"]
    got = []
    while (m := topic.queue.get()) is not None:
        got.append(m.body)
    assert got == [*bodies, b"a", b"b"]


async def test_topic_and_channel_admin(nsqd: fakensq.NSQD, http: httpx.AsyncClient) -> None:
    events: list[RegistryEvent] = []
    nsqd.add_registry_listener(events.append)
    assert (await http.post("/topic/create?topic=t")).text == ""
    assert (await http.post("/channel/create?topic=t&channel=c")).status_code == 200
    assert nsqd.registrations() == [("t", None), ("t", "c")]
    await http.post("/pub?topic=t", content=b"1")
    assert nsqd.topics["t"].channels["c"].depth() == 1
    await http.post("/channel/empty?topic=t&channel=c")
    assert nsqd.topics["t"].channels["c"].depth() == 0
    await http.post("/topic/pause?topic=t")
    await http.post("/pub?topic=t", content=b"2")
    doc = (await http.get("/stats?format=json&include_mem=false")).json()
    assert "memory" not in doc
    assert doc["topics"][0]["paused"] is True
    assert doc["topics"][0]["depth"] == 1
    assert doc["topics"][0]["channels"][0]["depth"] == 0
    await http.post("/topic/unpause?topic=t")
    assert nsqd.topics["t"].channels["c"].depth() == 1
    await http.post("/channel/pause?topic=t&channel=c")
    assert nsqd.stats()["topics"][0]["channels"][0]["paused"] is True
    await http.post("/channel/unpause?topic=t&channel=c")
    await http.post("/topic/empty?topic=t")
    await http.post("/channel/delete?topic=t&channel=c")
    await http.post("/topic/delete?topic=t")
    assert nsqd.registrations() == []
    assert events == [
        RegistryEvent("register", "t", None),
        RegistryEvent("register", "t", "c"),
        RegistryEvent("unregister", "t", "c"),
        RegistryEvent("unregister", "t", None),
    ]


async def test_stats_filters_and_text(nsqd: fakensq.NSQD, http: httpx.AsyncClient) -> None:
    await http.post("/pub?topic=t", content=b"1")
    nsqd.get_topic("t").get_channel("c")
    doc = (await http.get("/stats?format=json&topic=nope")).json()
    assert doc["topics"] is None
    assert doc["producers"] is None
    doc = (await http.get("/stats?format=json&topic=t&channel=c&include_clients=false")).json()
    channel = doc["topics"][0]["channels"][0]
    assert channel["clients"] is None
    assert channel["e2e_processing_latency"] == {"count": 0, "percentiles": None}
    assert set(doc["topics"][0]) == {
        "topic_name",
        "channels",
        "depth",
        "backend_depth",
        "message_count",
        "message_bytes",
        "paused",
        "e2e_processing_latency",
    }
    text = (await http.get("/stats")).text
    assert text.startswith("nsqd v1.3.0")
    assert "[t              ] depth: 0" in text
    assert "[c                        ] depth: 1" in text
    assert "Producers: None" in text


async def test_config(nsqd: fakensq.NSQD, http: httpx.AsyncClient) -> None:
    assert (await http.get("/config/msg_timeout")).json() == 60_000_000_000
    assert (await http.get("/config/max_rdy_count")).json() == 2500
    assert (await http.get("/config/log_level")).json() == 2
    seen: list[list[str]] = []
    nsqd.add_options_listener(lambda o: seen.append(list(o.lookupd_tcp_addresses)))
    r = await http.put("/config/nsqlookupd_tcp_addresses", content=b'["127.0.0.1:4160"]')
    assert r.json() == ["127.0.0.1:4160"]
    assert seen == [["127.0.0.1:4160"]]


async def test_ephemeral_channel_and_topic_go_with_last_client(
    nsqd: fakensq.NSQD, nursery: trio.Nursery
) -> None:
    events: list[RegistryEvent] = []
    nsqd.add_registry_listener(events.append)
    c = await memory_client(nsqd, nursery)
    await c.sub("t#ephemeral", "c#ephemeral")
    assert nsqd.registrations() == [("t#ephemeral", None), ("t#ephemeral", "c#ephemeral")]
    await c.aclose()
    await wait_until(lambda: not nsqd.topics, limit=5, step=0.01)
    assert [e.action for e in events] == ["register", "register", "unregister", "unregister"]


async def test_deleting_a_channel_closes_its_clients(
    nsqd: fakensq.NSQD, http: httpx.AsyncClient, nursery: trio.Nursery
) -> None:
    c = await memory_client(nsqd, nursery)
    await c.sub("t", "c")
    await http.post("/topic/delete?topic=t")
    with trio.fail_after(5):
        await c.expect_closed()


async def test_tls_required_http(nursery: trio.Nursery) -> None:
    async with fakensq.NSQD(tcp_address="", http_address="127.0.0.1:0", tls_required=2) as nsqd:
        async with httpx.AsyncClient() as http:
            r = await http.get(f"http://{nsqd.http_address}/ping")
        assert r.status_code == 403
        assert r.json()["message"] == "TLS_REQUIRED"


async def test_pub_counts_in_stats(nsqd: fakensq.NSQD, nursery: trio.Nursery) -> None:
    c = await memory_client(nsqd, nursery)
    await c.pub("t", b"1")
    await c.send(cmds.mpub("t", [b"2", b"3"]))
    assert await c.read_response() == b"OK"
    producers = nsqd.stats()["producers"]
    assert producers[0]["pub_counts"] == [{"topic": "t", "count": 3}]


async def test_removed_aliases_answer_404_by_default() -> None:
    # nsqd v1.3.0 dropped them (tests/conformance compares with the real one).
    import httpx

    import fakensq
    from fakensq.nsqd.http_api import LEGACY_ALIASES

    async with (
        fakensq.NSQD(tcp_address="", http_address="127.0.0.1:0") as nsqd,
        httpx.AsyncClient(base_url=f"http://{nsqd.http_address}") as http,
    ):
        for alias in LEGACY_ALIASES:
            r = await http.post(alias, params={"topic": "t", "channel": "c"}, content=b"x")
            assert (r.status_code, r.json()) == (404, {"message": "NOT_FOUND"})
        assert nsqd.get_existing_topic("t") is None


async def test_legacy_http_aliases_option_serves_them() -> None:
    import httpx

    import fakensq

    async with (
        fakensq.NSQD(tcp_address="", http_address="127.0.0.1:0", legacy_http_aliases=True) as nsqd,
        httpx.AsyncClient(base_url=f"http://{nsqd.http_address}") as http,
    ):
        # The docs' own example: curl -d 'hello world 1' 'http://127.0.0.1:4151/put?topic=test'
        assert (await http.post("/put", params={"topic": "test"}, content=b"hello")).text == "OK"
        r = await http.post("/mput", params={"topic": "test"}, content=b"a\nb")
        assert r.text == "OK"
        assert nsqd.get_topic("test").message_count == 3
        for verb in ("create", "pause", "unpause", "empty", "delete"):
            r = await http.post(f"/{verb}_channel", params={"topic": "test", "channel": "c"})
            assert r.status_code == 200, (verb, r.text)
        for verb in ("pause", "unpause", "empty", "delete"):
            assert (await http.post(f"/{verb}_topic", params={"topic": "test"})).status_code == 200
        assert (await http.post("/create_topic", params={"topic": "again"})).status_code == 200
        assert nsqd.get_existing_topic("test") is None
        assert (await http.get("/put", params={"topic": "x"})).status_code == 405
