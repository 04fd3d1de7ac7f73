"""AUTH against an auth server (a Python callable, or real HTTP)."""

from __future__ import annotations

import json
from typing import Any

import trio

import fakensq
from fakensq.http.server import HTTPServer, Request, Response
from trionsq.protocol import commands as cmds

from .helpers import memory_client

GRANT = {
    "ttl": 10,
    "identity": "alice",
    "identity_url": "http://x/alice",
    "authorizations": [
        {"topic": "^orders$", "channels": [".*"], "permissions": ["subscribe", "publish"]},
        {"topic": "logs", "channels": [".*"], "permissions": ["publish"]},
    ],
}


def handler(queries: list[dict[str, str]]) -> Any:
    def answer(query: dict[str, str]) -> dict[str, Any]:
        queries.append(query)
        if query["secret"] == "good":
            return GRANT
        if query["secret"] == "none":
            return {"ttl": 10, "authorizations": []}
        raise RuntimeError("auth server down")

    return answer


async def test_auth_flow(autojump_clock: trio.abc.Clock, nursery: trio.Nursery) -> None:
    queries: list[dict[str, str]] = []
    async with fakensq.NSQD(tcp_address="", http_address="", auth_handler=handler(queries)) as nsqd:
        c = await memory_client(nsqd, nursery)
        doc = await c.identify()
        assert doc["auth_required"] is True
        await c.send(cmds.pub("orders", b"x"))
        assert await c.read_error() == b"E_AUTH_FIRST AUTH required before PUB"
        await c.expect_closed()

        c = await memory_client(nsqd, nursery)
        await c.send(cmds.auth("good"))
        reply = json.loads(await c.read_response())
        assert reply == {
            "identity": "alice",
            "identity_url": "http://x/alice",
            "permission_count": 2,
        }
        assert queries[-1] == {
            "remote_ip": "127.0.0.1",
            "tls": "false",
            "secret": "good",
            "common_name": "",
        }
        await c.pub("orders", b"x")
        await c.pub("biglogs", b"unanchored match, as Go's MatchString")
        await c.send(cmds.sub("logs", "c"))
        assert await c.read_error() == b'E_UNAUTHORIZED AUTH failed for SUB on "logs" "c"'
        await c.expect_closed()

        # the TTL expires: the next check asks again
        c = await memory_client(nsqd, nursery)
        await c.send(cmds.auth("good"))
        await c.read_response()
        await c.send(cmds.auth("good"))
        assert await c.read_error() == b"E_INVALID AUTH already set"
        await c.expect_closed()

        c = await memory_client(nsqd, nursery)
        await c.send(cmds.auth("good"))
        await c.read_response()
        n = len(queries)
        await trio.sleep(11)
        await c.sub("orders", "c")
        assert len(queries) == n + 1
        stats = nsqd.stats()["topics"][1]["channels"][0]["clients"][0]
        assert (stats["authed"], stats["auth_identity"]) == (True, "alice")
        await c.send(cmds.auth("good"))
        assert await c.read_error() == b"E_INVALID cannot AUTH in current state"


async def test_auth_failures(nursery: trio.Nursery) -> None:
    async with fakensq.NSQD(tcp_address="", http_address="", auth_handler=handler([])) as nsqd:
        c = await memory_client(nsqd, nursery)
        await c.send(cmds.auth("bad"))
        assert await c.read_error() == b"E_AUTH_FAILED AUTH failed"
        c = await memory_client(nsqd, nursery)
        await c.send(cmds.auth("none"))
        assert await c.read_error() == b"E_UNAUTHORIZED AUTH no authorizations found"


async def test_auth_over_http(nursery: trio.Nursery) -> None:
    seen: list[dict[str, list[str]]] = []

    async def auth_server(request: Request) -> Response:
        seen.append(request.query)
        return Response.json(GRANT)

    server = HTTPServer(auth_server)
    host, port = await nursery.start(server.serve, "127.0.0.1", 0)
    async with fakensq.NSQD(
        tcp_address="", http_address="", auth_http_addresses=[f"{host}:{port}"]
    ) as nsqd:
        c = await memory_client(nsqd, nursery)
        await c.send(cmds.auth("s3cret"))
        with trio.fail_after(5):
            reply = json.loads(await c.read_response())
        assert reply["identity"] == "alice"
        assert seen[0]["secret"] == ["s3cret"]
        assert seen[0]["tls"] == ["false"]
