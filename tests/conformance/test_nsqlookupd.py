"""nsqlookupd conformance: /ping, an nsqd's registration, /lookup and /nodes
shapes (real nsqlookupd v1.3's http.go)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

import fakensq

from .conftest import Target, _real

PRODUCER_FIELDS = {
    "remote_address",
    "hostname",
    "broadcast_address",
    "tcp_port",
    "http_port",
    "version",
}


async def _until(client: httpx.AsyncClient, url: str, ok: Any) -> Any:
    # Registration travels over another connection: poll the answer.
    with trio.fail_after(10):
        while True:
            r = await client.get(url)
            if ok(r):
                return r.json()
            await trio.sleep(0.02)


async def test_ping_and_lookup_of_an_unknown_topic(nsqlookupd_under_test: Target) -> None:
    base = f"http://{nsqlookupd_under_test.http_address}"
    async with httpx.AsyncClient(timeout=10) as client:
        r = await client.get(f"{base}/ping")
        assert (r.status_code, r.text) == (200, "OK")
        r = await client.get(f"{base}/lookup?topic=nope")
        assert (r.status_code, r.json()) == (404, {"message": "TOPIC_NOT_FOUND"})
        r = await client.get(f"{base}/lookup")
        assert (r.status_code, r.json()) == (400, {"message": "MISSING_ARG_TOPIC"})


async def test_nsqd_registration_lookup_and_nodes(nsqlookupd_under_test: Target) -> None:
    base = f"http://{nsqlookupd_under_test.http_address}"
    async with (
        fakensq.NSQD(
            tcp_address="127.0.0.1:0",
            http_address="127.0.0.1:0",
            broadcast_address="127.0.0.1",
            lookupd_tcp_addresses=[nsqlookupd_under_test.tcp_address],
        ) as nsqd,
        httpx.AsyncClient(timeout=10) as client,
    ):
        nsqd.get_topic("conf_lookup").get_channel("c")
        doc = await _until(
            client,
            f"{base}/lookup?topic=conf_lookup",
            lambda r: r.status_code == 200 and r.json().get("channels") == ["c"],
        )
        assert set(doc) == {"channels", "producers"}
        (producer,) = doc["producers"]
        assert PRODUCER_FIELDS <= set(producer)
        assert producer["broadcast_address"] == "127.0.0.1"
        assert producer["tcp_port"] == int(nsqd.tcp_address.rpartition(":")[2])
        assert producer["http_port"] == int(nsqd.http_address.rpartition(":")[2])
        nodes = (await client.get(f"{base}/nodes")).json()
        assert set(nodes) == {"producers"}
        (node,) = nodes["producers"]
        assert PRODUCER_FIELDS | {"tombstones", "topics"} <= set(node)
        assert node["topics"] == ["conf_lookup"] and node["tombstones"] == [False]


@pytest.mark.skipif(
    not os.environ.get("NSQD_BINARY"), reason="NSQD_BINARY is not set: no real nsqd to register"
)
async def test_a_real_nsqd_registers_with_fakensq_lookupd(tmp_path: Path) -> None:
    async with (
        fakensq.NSQLookupd(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0") as lookupd,
        httpx.AsyncClient(timeout=10) as client,
    ):
        extra = (f"--data-path={tmp_path}", f"--lookupd-tcp-address={lookupd.tcp_address}")
        async for nsqd in _real("NSQD_BINARY", tmp_path, *extra):
            r = await client.post(f"http://{nsqd.http_address}/topic/create?topic=conf_real")
            assert r.status_code == 200
            doc = await _until(
                client,
                f"http://{lookupd.http_address}/lookup?topic=conf_real",
                lambda r: r.status_code == 200 and r.json()["producers"],
            )
            (producer,) = doc["producers"]
            assert PRODUCER_FIELDS <= set(producer)
            assert producer["tcp_port"] == int(nsqd.tcp_address.rpartition(":")[2])
