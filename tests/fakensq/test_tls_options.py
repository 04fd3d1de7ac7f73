"""TLS from nsqd's options: cert/key files, client certificates, HTTPS."""

from __future__ import annotations

import json
import ssl
from typing import Any

import httpx
import pytest
import trio

import fakensq
from trionsq.protocol import commands as cmds

from ..support.tls import Pki
from .helpers import RawClient


def _client_context(pki: Pki, with_cert: bool) -> ssl.SSLContext:
    return pki.client_context(pki.client_pem("client.example", "worker-7") if with_cert else "")


async def _tls_client(address: str, ctx: ssl.SSLContext) -> RawClient:
    c = await RawClient.connect(address)
    await c.send(cmds.identify({"feature_negotiation": True, "tls_v1": True}))
    assert json.loads(await c.read_response())["tls_v1"] is True
    c.stream = trio.SSLStream(c.stream, ctx, server_hostname="127.0.0.1")
    assert await c.read_response() == b"OK"
    return c


async def test_client_certificate_required_and_common_name(pki: Pki) -> None:
    queries: list[dict[str, str]] = []
    grant = {
        "ttl": 60,
        "authorizations": [{"topic": ".*", "channels": [".*"], "permissions": ["publish"]}],
    }

    def auth(query: dict[str, str]) -> dict[str, Any]:
        queries.append(query)
        return grant

    async with fakensq.NSQD(
        tcp_address="127.0.0.1:0",
        http_address="",
        https_address="127.0.0.1:0",
        tls_cert=pki.cert,
        tls_key=pki.key,
        tls_root_ca_file=pki.ca_file,
        tls_client_auth_policy="require-verify",
        auth_handler=auth,
    ) as nsqd:
        with trio.fail_after(10):
            c = await _tls_client(nsqd.tcp_address, _client_context(pki, with_cert=True))
            await c.send(cmds.auth("pw"))
            await c.read_response()
            assert queries[0]["tls"] == "true"
            assert queries[0]["common_name"] == "worker-7"
            await c.pub("t", b"x")

            # without a client certificate the handshake fails: connection closed
            bad = await RawClient.connect(nsqd.tcp_address)
            await bad.send(cmds.identify({"feature_negotiation": True, "tls_v1": True}))
            await bad.read_response()
            bad.stream = trio.SSLStream(
                bad.stream, _client_context(pki, with_cert=False), server_hostname="127.0.0.1"
            )
            with pytest.raises((trio.BrokenResourceError, EOFError, ssl.SSLError)):
                await bad.send(cmds.nop())
                await bad.read_frame()

            ctx = _client_context(pki, with_cert=True)
            async with httpx.AsyncClient(verify=ctx) as http:
                r = await http.get(f"https://{nsqd.https_address}/ping")
            assert r.text == "OK"
