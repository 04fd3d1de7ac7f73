"""nsqlookupd's HTTP API, request by request, on fakensq and on nsqlookupd
v1.3.0: each case runs on a node with a registered producer (topic ``t`` with
channels ``c`` and ``c2``, ephemeral topic ``e#ephemeral``) and an HTTP-created
topic ``h``; the answer and everything the API shows afterwards are compared."""

from __future__ import annotations

from typing import Any

import pytest

from fakensq.lookupd.daemon import LEGACY_ALIASES

from .conftest import Conformance, Target
from .httpcheck import mask_pprof_index, raw, request
from .lookupd import debug_times, lookupd_state, v1_connect

CASES: list[tuple[str, str]] = [
    ("GET", "/ping"),
    ("HEAD", "/ping"),
    ("POST", "/ping"),
    ("OPTIONS", "/ping"),
    ("OPTIONS", "/topic/create"),
    ("GET", "/ping/"),
    ("GET", "/PING"),
    ("GET", "/nope"),
    ("GET", "/"),
    ("GET", "/info"),
    ("GET", "/info/"),
    ("POST", "/info"),
    ("GET", "/debug"),
    ("GET", "/debug/"),
    ("GET", "/topics"),
    ("GET", "/Topics"),
    ("POST", "/topics"),
    ("GET", "/topics?%zz"),
    ("GET", "/channels"),
    ("GET", "/channels?topic=t"),
    ("GET", "/channels?topic=zz"),
    ("GET", "/channels?topic="),
    ("GET", "/channels?topic=a!"),
    ("GET", "/channels?topic=%zz"),
    ("GET", "/channels?topic=t;x"),
    ("GET", "/lookup"),
    ("GET", "/lookup?topic=t"),
    ("GET", "/lookup?topic=h"),
    ("GET", "/lookup?topic=zz"),
    ("GET", "/lookup?topic=a!"),
    ("GET", "/lookup?topic=%zz"),
    ("GET", "/lookup?topic=e%23ephemeral"),
    ("GET", "/lookup/?topic=t"),
    ("POST", "/lookup?topic=t"),
    ("GET", "/nodes"),
    ("GET", "/nodes?x=%zz"),
    ("POST", "/topic/create"),
    ("POST", "/topic/create?topic="),
    ("POST", "/topic/create?topic=a!"),
    ("POST", "/topic/create?topic=new"),
    ("POST", "/topic/create?topic=t"),
    ("POST", "/topic/create?topic=new%23ephemeral"),
    ("POST", "/topic/create?topic=%zz"),
    ("POST", "/Topic/Create?topic=new"),
    ("GET", "/topic/create?topic=new"),
    ("POST", "/topic/delete"),
    ("POST", "/topic/delete?topic=zz"),
    ("POST", "/topic/delete?topic=a!"),
    ("POST", "/topic/delete?topic=t"),
    ("POST", "/topic/delete?topic=h"),
    ("POST", "/topic/delete?topic=e%23ephemeral"),
    ("POST", "/topic/delete?topic=%zz"),
    ("POST", "/channel/create"),
    ("POST", "/channel/create?topic=t"),
    ("POST", "/channel/create?topic=a!&channel=c"),
    ("POST", "/channel/create?topic=t&channel="),
    ("POST", "/channel/create?topic=t&channel=a!"),
    ("POST", "/channel/create?topic=t&channel=c3"),
    ("POST", "/channel/create?topic=zz&channel=c"),
    ("POST", "/channel/create?topic=t&channel=c"),
    ("POST", "/channel/create?topic=%zz&channel=c"),
    ("POST", "/channel/delete?topic=t"),
    ("POST", "/channel/delete?topic=t&channel=zz"),
    ("POST", "/channel/delete?topic=zz&channel=c"),
    ("POST", "/channel/delete?topic=t&channel=c"),
    ("POST", "/channel/delete?topic=t&channel=a!"),
    ("POST", "/channel/delete?topic=%zz&channel=c"),
    ("POST", "/topic/tombstone"),
    ("POST", "/topic/tombstone?topic=t"),
    ("POST", "/topic/tombstone?topic=t&node=zz:1"),
    ("POST", "/topic/tombstone?topic=t&node=127.0.0.1:4151"),
    ("POST", "/topic/tombstone?topic=t&node=127.0.0.1:4150"),
    ("POST", "/topic/tombstone?topic=zz&node=127.0.0.1:4151"),
    ("POST", "/topic/tombstone?topic=a!&node=x"),
    ("POST", "/topic/tombstone?topic=h&node=127.0.0.1:4151"),
    ("POST", "/topic/tombstone?topic=%zz&node=x"),
    ("GET", "/topic/tombstone?topic=t&node=127.0.0.1:4151"),
    ("GET", "/debug/pprof"),
    ("GET", "/debug/pprof/"),
    ("POST", "/debug/pprof"),
    ("GET", "/debug/pprof/symbol"),
    ("POST", "/debug/pprof/symbol"),
    ("GET", "/debug/pprof/heap?seconds=0"),
    ("GET", "/debug/pprof/goroutine?seconds=1&debug=1"),
    ("GET", "/debug/pprof/mutex"),
    ("POST", "/debug/freememory"),
    ("PUT", "/debug/setblockrate?rate=1"),
    ("GET", "/stats"),
    ("GET", "/config/x"),
    *(("POST", f"{alias}?topic=t&channel=c&node=127.0.0.1:4151") for alias in LEGACY_ALIASES),
    ("GET", "/create_topic?topic=t"),
]


async def _setup(t: Target) -> None:
    producer = await v1_connect(t, "p")
    await producer.identify()
    for line in (b"REGISTER t c", b"REGISTER t c2", b"REGISTER e#ephemeral"):
        await producer.command(line)
    async with t.http() as http:
        assert (await http.post("/topic/create?topic=h")).status_code == 200


@pytest.mark.parametrize(("method", "path"), CASES, ids=[f"{m} {p}" for m, p in CASES])
async def test_request(conformance: Conformance, method: str, path: str) -> None:
    async def scenario(t: Target) -> Any:
        await _setup(t)
        async with t.http() as http:
            answer = await request(http, method, path)
        status, headers, body = answer
        if status == 200 and isinstance(body, tuple) and body[0] == "json":
            body = ("json", _sorted_lists(body[1]))  # Go's map order, sorted away
        if isinstance(body, bytes) and body.startswith(b"<html>"):
            body = mask_pprof_index(body)
            headers.pop("content-length", None)
        return (status, headers, body), await lookupd_state(t, "t", "h", "zz")

    await conformance.nsqlookupd(scenario, normalize=debug_times)


def _sorted_lists(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {k: _sorted_lists(v) for k, v in doc.items()}
    if isinstance(doc, list):
        items = [_sorted_lists(v) for v in doc]
        return sorted(items, key=repr)
    return doc


RAW = [
    b"GET /%zz HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET lookup HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /ping HTTP/1.1\r\n\r\n",
    b"GET * HTTP/1.1\r\nHost: x\r\n\r\n",
    b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET //topics HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /lookup?topic=t HTTP/1.0\r\n\r\n",
]


@pytest.mark.parametrize("data", RAW, ids=[c.split(b"\r\n")[0].decode() for c in RAW])
async def test_raw_request(conformance: Conformance, data: bytes) -> None:
    async def scenario(t: Target) -> Any:
        await _setup(t)
        status, headers, _body, closed = await raw(t.http_address, data)
        return status, headers, closed

    await conformance.nsqlookupd(scenario)


async def test_tombstone_lifetime(conformance: Conformance) -> None:
    """A tombstoned producer leaves ``/lookup`` of that topic (not of others),
    shows as tombstoned in ``/nodes``, and comes back once the lifetime ends."""

    async def scenario(t: Target) -> Any:
        await _setup(t)
        async with t.http() as http:
            await http.post("/topic/tombstone?topic=t&node=127.0.0.1:4151")
        tombstoned = await lookupd_state(t, "t")
        await t.until("/lookup?topic=t", lambda r: bool(r.json()["producers"]))
        return tombstoned, await lookupd_state(t, "t")

    await conformance.nsqlookupd(scenario, "--tombstone-lifetime=2s")


async def test_tombstone_then_reregister(conformance: Conformance) -> None:
    """A tombstone stays through a producer's REGISTER of the same topic
    (nsqd re-registering does not lift it) but goes with UNREGISTER."""

    async def scenario(t: Target) -> Any:
        await _setup(t)
        async with t.http() as http:
            await http.post("/topic/tombstone?topic=t&node=127.0.0.1:4151")
        p2 = await v1_connect(t, "p2")
        await p2.identify(tcp_port=5150, http_port=5151)
        await p2.command(b"REGISTER t")
        state = await lookupd_state(t, "t")
        return state

    await conformance.nsqlookupd(scenario)


async def test_inactive_producer_timeout(conformance: Conformance) -> None:
    """A producer silent past --inactive-producer-timeout leaves ``/lookup`` and
    ``/nodes``; a PING brings it back."""

    async def scenario(t: Target) -> Any:
        p = await v1_connect(t, "p")
        await p.identify()
        await p.command(b"REGISTER t c")
        await t.until("/nodes", lambda r: not r.json()["producers"])
        gone = await lookupd_state(t, "t")
        await p.sync()
        back = await lookupd_state(t, "t")
        return gone, back

    await conformance.nsqlookupd(scenario, "--inactive-producer-timeout=1500ms")
