"""nsqd's HTTP API, request by request, on fakensq and on nsqd v1.3.0.

Each case runs on a node holding topic ``t`` (two messages) with channel ``c``;
the outcome is the answer (status, the headers a client acts on, the body) and
what the request changed (:func:`.httpcheck.state`).  So routing (redirects,
405s and their ``Allow``, 404s, the aliases v1.3.0 removed), every endpoint's
errors in nsqd's order of checks, and each endpoint's effect are compared.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fakensq.nsqd.http_api import LEGACY_ALIASES

from .conftest import Conformance, Target
from .httpcheck import mask_pprof_index, raw, request, state

# (method, path, body); the case's id is its text.
CASES: list[tuple[str, str, bytes | None]] = [
    # /ping, /info and the router's answers around them
    ("GET", "/ping", None),
    ("HEAD", "/ping", None),
    ("POST", "/ping", None),
    ("OPTIONS", "/ping", None),
    ("OPTIONS", "/pub", None),
    ("OPTIONS", "/config/msg_timeout", None),
    ("OPTIONS", "/nope", None),
    ("CONNECT", "/ping", None),
    ("BREW", "/ping", None),
    ("GET", "/ping?x=1", None),
    ("GET", "/ping/", None),
    ("GET", "/Ping", None),
    ("GET", "/PING/", None),
    ("HEAD", "/Ping", None),
    ("PUT", "/ping/", None),
    ("GET", "/", None),
    ("GET", "/nope", None),
    ("POST", "/nope", None),
    ("GET", "/%70ing", None),
    ("GET", "/ping%2F", None),
    ("GET", "/stats/?format=json&topic=zz", None),
    ("GET", "/STATS?format=json&topic=a&b=%26", None),
    ("POST", "/pub/?topic=t", b"via redirect"),
    ("POST", "/PUB?topic=t", b"via redirect"),
    ("POST", "/topic/Create?topic=t2", None),
    ("GET", "/topic/create", None),
    ("GET", "/topic/create/", None),
    ("DELETE", "/stats", None),
    ("GET", "/debug", None),
    ("GET", "/debug/", None),
    ("GET", "/info", None),
    ("POST", "/info", None),
    ("GET", "/info?%zz", None),
    # /pub
    ("GET", "/pub?topic=t", None),
    ("PUT", "/pub?topic=t", b"x"),
    ("POST", "/pub", b"x"),
    ("POST", "/pub?topic=", b"x"),
    ("POST", "/pub?topic=t", None),
    ("POST", "/pub?topic=a.b!", b"x"),
    ("POST", "/pub?topic=a+b", b"x"),
    ("POST", "/pub?topic=a%20b", b"x"),
    ("POST", "/pub?topic=t&topic=a!", b"first wins"),
    ("POST", "/pub?topic=a!&topic=t", b"first wins"),
    ("POST", "/pub?topic=t;b=1", b"x"),
    ("POST", "/pub?topic=%zz", b"x"),
    ("POST", "/pub?topic=t&x=%zz", b"x"),
    ("POST", "/pub?topic=new_one", b"created"),
    ("POST", "/pub?topic=new_one#ephemeral", b"x"),
    ("POST", "/pub?topic=new%23ephemeral", b"ephemeral"),
    ("POST", "/pub?topic=" + "x" * 64, b"x"),
    ("POST", "/pub?topic=" + "x" * 65, b"x"),
    ("POST", "/pub?topic=t&defer=0", b"x"),
    ("POST", "/pub?topic=t&defer=1000", b"x"),
    ("POST", "/pub?topic=t&defer=-1", b"x"),
    ("POST", "/pub?topic=t&defer=x", b"x"),
    ("POST", "/pub?topic=t&defer=", b"x"),
    ("POST", "/pub?topic=t&defer=+5", b"x"),
    ("POST", "/pub?topic=t&defer=1e3", b"x"),
    ("POST", "/pub?topic=t&defer=3600000", b"x"),
    ("POST", "/pub?topic=t&defer=3600001", b"x"),
    ("POST", "/pub?topic=t&defer=9223372036854", b"x"),
    ("POST", "/pub?topic=t&defer=9223372036854775807", b"x"),
    ("POST", "/pub?topic=t&defer=9223372036854775808", b"x"),
    # /mpub
    ("GET", "/mpub?topic=t", None),
    ("POST", "/mpub", b"a\nb"),
    ("POST", "/mpub?topic=a!", b"a\nb"),
    ("POST", "/mpub?topic=%zz", b"a"),
    ("POST", "/mpub?topic=t", None),
    ("POST", "/mpub?topic=t", b"\n\n\n"),
    ("POST", "/mpub?topic=t", b"a\nb\n\nc\n"),
    ("POST", "/mpub?topic=t", b"a\r\nb"),
    ("POST", "/mpub?topic=fresh", b""),
    ("POST", "/mpub?topic=t&binary=true", b""),
    ("POST", "/mpub?topic=t&binary=false", b"\x00\x00\x00\x01\x00\x00\x00\x01a"),
    ("POST", "/mpub?topic=t&binary=x", b"\x00\x00\x00\x01\x00\x00\x00\x01a"),
    ("POST", "/mpub?topic=t&binary=1", b"\x00\x00\x00\x02\x00\x00\x00\x01a\x00\x00\x00\x02bc"),
    ("POST", "/mpub?topic=t&binary=1", b"\x00\x00\x00\x02\x00\x00\x00\x01a"),
    ("POST", "/mpub?topic=t&binary=1", b"\x00\x00\x00\x00"),
    ("POST", "/mpub?topic=t&binary=1", b"\xff\xff\xff\xff"),
    ("POST", "/mpub?topic=t&binary=1", b"\x00\x00"),
    ("POST", "/mpub?topic=t&binary=1", b"\x00\x00\x00\x01\x00\x00\x00\x00"),
    ("POST", "/mpub?topic=t&binary=1", b"\x00\x00\x00\x01\xff\xff\xff\xff"),
    ("POST", "/mpub?topic=t&binary=1", b"\x00\x00\x00\x01\x00\x00\x00\x01abc"),
    ("POST", "/mpub?topic=t&binary=1", b"\x00\x10\x00\x00\x00\x00\x00\x01a"),
    # topics
    ("POST", "/topic/create", None),
    ("POST", "/topic/create?topic=", None),
    ("POST", "/topic/create?topic=a!", None),
    ("POST", "/topic/create?topic=t2", None),
    ("POST", "/topic/create?topic=t2", b"a body is ignored"),
    ("POST", "/topic/create?topic=t2;", None),
    ("POST", "/topic/create?topic=%zz", None),
    ("POST", "/topic/create?topic=e%23ephemeral", None),
    ("POST", "/topic/delete", None),
    ("POST", "/topic/delete?topic=zz", None),
    ("POST", "/topic/delete?topic=a!", None),
    ("POST", "/topic/delete?topic=%zz", None),
    ("POST", "/topic/delete?topic=t", None),
    ("POST", "/topic/empty", None),
    ("POST", "/topic/empty?topic=a!", None),
    ("POST", "/topic/empty?topic=zz", None),
    ("POST", "/topic/empty?topic=%zz", None),
    ("POST", "/topic/empty?topic=t", None),
    ("POST", "/topic/pause", None),
    ("POST", "/topic/pause?topic=a!", None),
    ("POST", "/topic/pause?topic=zz", None),
    ("POST", "/topic/pause?topic=%zz", None),
    ("POST", "/topic/pause?topic=t", None),
    ("POST", "/topic/unpause?topic=t", None),
    ("POST", "/topic/unpause?topic=zz", None),
    ("GET", "/topic/pause?topic=t", None),
    # channels
    ("POST", "/channel/create", None),
    ("POST", "/channel/create?topic=t", None),
    ("POST", "/channel/create?topic=a!&channel=c", None),
    ("POST", "/channel/create?topic=t&channel=", None),
    ("POST", "/channel/create?topic=t&channel=a!", None),
    ("POST", "/channel/create?topic=zz&channel=c", None),
    ("POST", "/channel/create?topic=%zz&channel=c", None),
    ("POST", "/channel/create?topic=t&channel=c2", None),
    ("POST", "/channel/create?topic=t&channel=c2%23ephemeral", None),
    ("POST", "/channel/delete?topic=t", None),
    ("POST", "/channel/delete?topic=t&channel=zz", None),
    ("POST", "/channel/delete?topic=zz&channel=c", None),
    ("POST", "/channel/delete?topic=t&channel=c", None),
    ("POST", "/channel/empty?topic=t&channel=zz", None),
    ("POST", "/channel/empty?topic=t&channel=c", None),
    ("POST", "/channel/empty?topic=t&channel=a!", None),
    ("POST", "/channel/pause?topic=t&channel=c", None),
    ("POST", "/channel/pause?topic=t&channel=zz", None),
    ("POST", "/channel/pause?topic=zz&channel=c", None),
    ("POST", "/channel/unpause?topic=t&channel=c", None),
    ("POST", "/channel/pause?topic=t", None),
    # /debug
    ("POST", "/debug/freememory", None),
    ("GET", "/debug/freememory", None),
    ("PUT", "/debug/setblockrate?rate=1", None),
    ("PUT", "/debug/setblockrate", None),
    ("PUT", "/debug/setblockrate?rate=x", None),
    ("GET", "/debug/setblockrate?rate=1", None),
    ("GET", "/debug/pprof", None),
    ("GET", "/debug/pprof/", None),
    ("GET", "/debug/pprof/allocs?debug=1", None),
    ("GET", "/debug/pprof/mutex", None),
    ("GET", "/debug/pprof/trace", None),
    ("GET", "/debug/pprof/nonexist", None),
    ("POST", "/debug/pprof/heap", None),
    ("GET", "/debug/pprof/symbol", None),
    ("POST", "/debug/pprof/symbol", b"0x1234"),
    ("GET", "/debug/pprof/goroutine?seconds=0", None),
    ("GET", "/debug/pprof/goroutine?seconds=x", None),
    ("GET", "/debug/pprof/threadcreate?seconds=1", None),
    ("GET", "/debug/pprof/heap?seconds=1&debug=1", None),
    # the aliases nsqd v1.3.0 removed
    *(("POST", f"{alias}?topic=t&channel=c", b"x") for alias in LEGACY_ALIASES),
    ("GET", "/put?topic=t", None),
    ("POST", "/empty?topic=t&channel=c", None),
    ("POST", "/tombstone_topic_producer?topic=t&node=x:1", None),
]


async def _setup(http: httpx.AsyncClient) -> None:
    """Topic ``t`` with channel ``c`` and two messages, moved to ``c``.

    The real nsqd moves a topic's messages to its channels in a goroutine of
    its own: a request sent at once (``/topic/empty`` above all) would meet
    them in the topic or in the channel, whichever the scheduler chose (a CI
    dry run saw the channel empty).  Waiting until they have moved makes the
    request meet the same state on both daemons."""
    assert (await http.post("/topic/create?topic=t")).status_code == 200
    assert (await http.post("/channel/create?topic=t&channel=c")).status_code == 200
    assert (await http.post("/mpub?topic=t", content=b"one\ntwo")).status_code == 200
    await state(http)


def _case_id(case: tuple[str, str, bytes | None]) -> str:
    method, path, body = case
    return f"{method} {path}" + ("" if body is None else f" [{len(body)}B]")


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
async def test_request(conformance: Conformance, case: tuple[str, str, bytes | None]) -> None:
    method, path, body = case

    async def scenario(t: Target) -> Any:
        async with t.http() as http:
            await _setup(http)
            status, headers, payload = await request(http, method, path, body)
            if isinstance(payload, bytes) and payload.startswith(b"<html>"):
                payload = mask_pprof_index(payload)
                headers.pop("content-length", None)
            return (status, headers, payload), await state(http)

    await conformance.nsqd(scenario)


# Requests an HTTP client library would not send: Go's server answers them itself.
RAW_CASES = [
    b"GET /%zz HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /ping%zz?x HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET http://x/ping HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET ping HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET * HTTP/1.1\r\nHost: x\r\n\r\n",
    b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /ping\r\n\r\n",
    b"GET /ping HTTP/1.1\r\n\r\n",
    b"GET //ping HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /./stats/../ping HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /ping/. HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"3\r\nabc\r\n0\r\n\r\n",
]


@pytest.mark.parametrize("data", RAW_CASES, ids=[c.split(b"\r\n")[0].decode() for c in RAW_CASES])
async def test_raw_request(conformance: Conformance, data: bytes) -> None:
    async def scenario(t: Target) -> Any:
        async with t.http() as http:
            await _setup(http)
            answer = await raw(t.http_address, data)
            return answer, await state(http)

    await conformance.nsqd(scenario)


@pytest.mark.parametrize(
    "flags",
    [
        (),
        ("--broadcast-tcp-port=1234", "--broadcast-http-port=2345"),
        ("--broadcast-address=elsewhere.example",),
        ("--max-heartbeat-interval=90s", "--max-output-buffer-size=1000"),
        ("--max-output-buffer-timeout=1s", "--max-deflate-level=9"),
    ],
    ids=lambda flags: " ".join(flags) or "defaults",
)
async def test_info(conformance: Conformance, flags: tuple[str, ...]) -> None:
    async def scenario(t: Target) -> Any:
        async with t.http() as http:
            return await request(http, "GET", "/info")

    await conformance.nsqd(scenario, *flags)


LIMITS = ("--max-msg-size=10", "--max-body-size=40")

# Bodies around the limits: (path, body).
SIZED = [
    ("/pub?topic=t", b"x" * 10),
    ("/pub?topic=t", b"x" * 11),
    ("/pub?topic=a!", b"x" * 11),
    ("/pub", b"x" * 11),
    ("/mpub?topic=t", b"x" * 40),
    ("/mpub?topic=t", b"x" * 41),
    ("/mpub?topic=a!", b"x" * 41),
    ("/mpub?topic=t", b"0123456789\n" * 3),
    ("/mpub?topic=t", b"0123456789\n" * 4),
    ("/mpub?topic=t", b"0123456789a\nb"),
    ("/mpub?topic=t", b"a\n0123456789a\n" + b"b" * 30),
    ("/mpub?topic=t&binary=true", b"\x00\x00\x00\x02\x00\x00\x00\x0a0123456789\x00\x00\x00\x01a"),
    ("/mpub?topic=t&binary=true", b"\x00\x00\x00\x01\x00\x00\x00\x0b0123456789a"),
    ("/mpub?topic=t&binary=true", b"\x00\x00\x00\x08" + b"\x00\x00\x00\x01a" * 8),
    ("/mpub?topic=t&binary=true", b"\x00\x00\x00\x07" + b"\x00\x00\x00\x01a" * 7),
]


@pytest.mark.parametrize(("chunked"), [False, True], ids=["length", "chunked"])
@pytest.mark.parametrize(("path", "body"), SIZED, ids=[f"{p} [{len(b)}B]" for p, b in SIZED])
async def test_size_limits(conformance: Conformance, path: str, body: bytes, chunked: bool) -> None:
    """Bodies at and over --max-msg-size/--max-body-size, sent with a length or
    chunked (nsqd then finds out while reading), and what reached the topic."""

    async def chunks() -> AsyncIterator[bytes]:
        yield body

    async def scenario(t: Target) -> Any:
        async with t.http() as http:
            assert (await http.post("/topic/create?topic=t")).status_code == 200
            content: Any = chunks() if chunked else body
            r = await http.post(path, content=content)
            answer = (r.status_code, r.text)
            stats = await t.stats(topic="t")
            topic = stats["topics"][0] if stats["topics"] else {}
            return answer, topic.get("message_count"), topic.get("message_bytes")

    await conformance.nsqd(scenario, *LIMITS)


async def test_published_bodies_reach_consumers_in_order(conformance: Conformance) -> None:
    """/pub and /mpub (text and binary) messages, as a consumer receives them."""

    async def scenario(t: Target) -> Any:
        c = await t.connect()
        await c.identify()
        await c.sub("t", "c", rdy=20)
        async with t.http() as http:
            await http.post("/pub?topic=t", content=b"one")
            await http.post("/mpub?topic=t", content=b"two\nthree\n\nfour")
            await http.post(
                "/mpub?topic=t&binary=true",
                content=b"\x00\x00\x00\x02\x00\x00\x00\x04five\x00\x00\x00\x03six",
            )
            await http.post("/pub?topic=t", content=b"bin\x00ary\n\xff")
        await c.read_messages(7)

    await conformance.nsqd(scenario)


async def test_deferred_publish(conformance: Conformance) -> None:
    """``/pub?defer=`` holds the message back (deferred_count) until its time."""

    async def scenario(t: Target) -> Any:
        async with t.http() as http:
            await http.post("/channel/create?topic=t&channel=c", params={})
            await http.post("/topic/create?topic=t")
            await http.post("/channel/create?topic=t&channel=c")
            await http.post("/pub?topic=t&defer=60000", content=b"later")
            await http.post("/pub?topic=t", content=b"now")
        c = await t.connect()
        await c.identify()
        await c.sub("t", "c", rdy=5)
        await c.read_messages(1)
        stats = await t.stats(topic="t", channel="c")
        channel = stats["topics"][0]["channels"][0]
        return channel["deferred_count"], channel["in_flight_count"], channel["depth"]

    await conformance.nsqd(scenario)


async def test_pause_and_unpause_over_http_hold_and_release_messages(
    conformance: Conformance,
) -> None:
    async def scenario(t: Target) -> Any:
        c = await t.connect()
        await c.identify()
        await c.sub("t", "c", rdy=5)
        async with t.http() as http:
            await http.post("/channel/pause?topic=t&channel=c")
            await http.post("/pub?topic=t", content=b"held")
            paused = await state(http)
            await http.post("/channel/unpause?topic=t&channel=c")
            await c.read_messages(1)
            await http.post("/topic/pause?topic=t")
            await http.post("/pub?topic=t", content=b"held by the topic")
            topic_paused = await state(http)
            await http.post("/topic/unpause?topic=t")
            await c.read_messages(1)
            return paused, topic_paused, await state(http)

    await conformance.nsqd(scenario)


async def test_json_bytes_as_go_writes_them(conformance: Conformance) -> None:
    """Go's encoding/json escapes <, > and & and writes other text raw: the
    exact bytes of /stats for a client id that holds them."""

    async def scenario(t: Target) -> Any:
        c = await t.connect()
        await c.identify(client_id="<a&b> é ✓", user_agent="ua\u2028x")
        await c.sub("t", "c")
        async with t.http() as http:
            r = await http.get("/stats?format=json&include_mem=false&include_clients=true")
        body = r.content
        start = body.index(b'"clients":')
        return body[start : body.index(b'"remote_address"', start)]

    await conformance.nsqd(scenario)


@pytest.mark.parametrize("alias", sorted(LEGACY_ALIASES))
async def test_legacy_http_aliases_option(
    conformance: Conformance, alias: str, tmp_path: Path
) -> None:
    """The opt-in: with ``legacy_http_aliases = true`` in its config file,
    fakensq answers a removed alias (404 by default: ``test_request``) as nsqd
    answers the endpoint it stood for, with the same effect."""
    config = tmp_path / "legacy.toml"
    config.write_text("legacy_http_aliases = true\n")

    def scenario(path: str) -> Any:
        async def run(t: Target) -> Any:
            async with t.http() as http:
                await _setup(http)
                answer = await request(http, "POST", f"{path}?topic=t&channel=c", b"x")
                return answer, await state(http)

        return run

    expected = await conformance.nsqd(scenario(LEGACY_ALIASES[alias]))
    got = await conformance.fakensq_only("nsqd", scenario(alias), f"--config={config}")
    assert got == expected
