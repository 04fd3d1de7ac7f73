"""nsqlookupd conformance: ``/ping``, an nsqd's registration, ``/lookup`` and
``/nodes`` shapes, compared between fakensq and the real nsqlookupd (and nsqd)."""

from __future__ import annotations

from typing import Any

import httpx

from .conftest import Conformance, Target

PRODUCER_FIELDS = {
    "remote_address",
    "hostname",
    "broadcast_address",
    "tcp_port",
    "http_port",
    "version",
}


def _registered(r: httpx.Response) -> bool:
    return r.status_code == 200 and r.json().get("channels") == ["c"]


async def test_ping_and_lookup_of_an_unknown_topic(conformance: Conformance) -> None:
    async def scenario(t: Target) -> Any:
        async with t.http() as http:
            r = await http.get("/ping")
            out: list[Any] = [(r.status_code, r.text)]
            for path in ("/lookup?topic=nope", "/lookup"):
                r = await http.get(path)
                out.append((r.status_code, r.json()))
        return out

    _, out = await conformance.nsqlookupd(scenario)
    assert out == [
        (200, "OK"),
        (404, {"message": "TOPIC_NOT_FOUND"}),
        (400, {"message": "MISSING_ARG_TOPIC"}),
    ]


async def _register_and_look_up(t: Target) -> Any:
    assert t.lookupd is not None
    async with t.http() as http:
        r = await http.post("/topic/create?topic=conf_lookup")
        r = await http.post("/channel/create?topic=conf_lookup&channel=c")
        assert r.status_code == 200
    doc = (await t.lookupd.until("/lookup?topic=conf_lookup", _registered)).json()
    async with t.lookupd.http() as http:
        nodes = (await http.get("/nodes")).json()
    return doc, nodes


def _remote(n: Any) -> None:
    # The nsqd's own end of its connection to nsqlookupd: a port of its choosing.
    n.key_rules["remote_address"] = lambda v: "<nsqd's address>"


async def test_nsqd_registration_lookup_and_nodes(conformance: Conformance) -> None:
    _, (doc, nodes) = await conformance.nsqd(_register_and_look_up, lookupd=[], normalize=_remote)
    assert set(doc) == {"channels", "producers"}
    (producer,) = doc["producers"]
    assert PRODUCER_FIELDS <= set(producer)
    assert producer["broadcast_address"] == "127.0.0.1"
    assert (producer["tcp_port"], producer["http_port"]) == ("<nsqd:tcp_port>", "<nsqd:http_port>")
    assert set(nodes) == {"producers"}
    (node,) = nodes["producers"]
    assert PRODUCER_FIELDS | {"tombstones", "topics"} <= set(node)
    assert node["topics"] == ["conf_lookup"] and node["tombstones"] == [False]


async def test_a_real_nsqd_registers_with_fakensq_lookupd(conformance: Conformance) -> None:
    # Both nsqds (fakensq's, then the real one) register with a fakensq nsqlookupd.
    _, (doc, _) = await conformance.nsqd(
        _register_and_look_up, lookupd=[], lookupd_kind="fakensq", normalize=_remote
    )
    (producer,) = doc["producers"]
    assert PRODUCER_FIELDS <= set(producer)
    assert producer["tcp_port"] == "<nsqd:tcp_port>"
