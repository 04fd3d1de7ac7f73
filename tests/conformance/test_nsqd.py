"""nsqd conformance: the first checks (protocol errors, IDENTIFY, a round trip,
HTTP ``/ping``, ``/pub``, ``/stats`` and ``/info``), each compared between
fakensq and the real nsqd; the expected values are real nsqd v1.3.0's."""

from __future__ import annotations

from typing import Any

import pytest

from trionsq.protocol import commands as cmds

from .conftest import Conformance, Target


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"HELLO world\n", "E_INVALID invalid command HELLO"),
        (cmds.fin(b"0" * 16), "E_INVALID cannot FIN in current state"),
        (cmds.rdy(1), "E_INVALID cannot RDY in current state"),
        (b"SUB a|b c\n", 'E_BAD_TOPIC SUB topic name "a|b" is not valid'),
        (cmds.pub("t", b""), "E_BAD_MESSAGE PUB invalid message body size 0"),
        (cmds.identify({"sample_rate": 100}), "E_BAD_BODY IDENTIFY sample rate (100) is invalid"),
    ],
)
async def test_protocol_errors(conformance: Conformance, data: bytes, error: str) -> None:
    async def scenario(t: Target) -> None:
        c = await t.connect()
        await c.send(data)
        await c.read_until_closed()

    await conformance.nsqd(scenario, expect=[("c", error), ("c", "closed")])


async def test_identify_reply_fields(conformance: Conformance) -> None:
    async def scenario(t: Target) -> Any:
        c = await t.connect()
        (_, _, doc, _) = await c.identify(client_id="conformance", feature_negotiation=True)
        return doc

    _, doc = await conformance.nsqd(scenario)
    assert doc == {
        "max_rdy_count": 2500,
        "version": "1.3.0",
        "max_msg_timeout": 900000,
        "msg_timeout": 60000,
        "tls_v1": False,
        "deflate": False,
        "deflate_level": 6,
        "max_deflate_level": 6,
        "snappy": False,
        "sample_rate": 0,
        "auth_required": False,
        "output_buffer_size": 16384,
        "output_buffer_timeout": 250,
    }


async def test_pub_sub_fin_round_trip(conformance: Conformance) -> None:
    async def scenario(t: Target) -> None:
        consumer = await t.connect()
        await consumer.identify(feature_negotiation=True)
        await consumer.sub("conformance", "ch", rdy=1)
        producer = await t.connect("p")
        await producer.call(cmds.pub("conformance", b"hello"))
        (msg,) = await consumer.read_messages(1)
        assert (msg.body, msg.attempts, len(msg.id)) == (b"hello", 1, 16)
        await consumer.send(cmds.fin(msg.id))
        await consumer.sync()  # FIN has no answer: the sync proves no error came
        await producer.call(cmds.pub("conformance", b"again"))  # and the channel goes on
        await consumer.read_messages(1)

    transcript = await conformance.nsqd(scenario)
    assert [e for e in transcript if e[1] == "msg"] == [
        ("c", "msg", "<ID1>", 1, b"hello"),
        ("c", "msg", "<ID2>", 1, b"again"),
    ]


async def test_http_ping_pub_and_stats_fields(conformance: Conformance) -> None:
    async def scenario(t: Target) -> Any:
        out: list[Any] = []
        async with t.http() as http:
            r = await http.get("/ping")
            out.append((r.status_code, r.text))
            r = await http.post("/pub?topic=conf_http", content=b"body")
            out.append((r.status_code, r.text))
            r = await http.post("/pub?topic=conf_http", content=b"")
            out.append((r.status_code, r.json()))
            r = await http.post("/topic/create?topic=conf_http")
            r = await http.post("/channel/create?topic=conf_http&channel=c")
            out.append(r.status_code)
        doc = await t.stats()
        out.append(sorted(doc))
        (topic,) = [t for t in doc["topics"] if t["topic_name"] == "conf_http"]
        (channel,) = topic["channels"]
        out.append({k: v for k, v in topic.items() if k != "channels"})
        out.append(channel)
        return out

    _, out = await conformance.nsqd(scenario)
    assert out[:4] == [(200, "OK"), (200, "OK"), (400, {"message": "MSG_EMPTY"}), 200]
    assert {"version", "health", "start_time", "topics"} <= set(out[4])
    assert (out[5]["message_count"], out[5]["message_bytes"]) == (1, 4)
    assert {"channel_name", "depth", "in_flight_count", "client_count", "paused"} <= set(out[6])


async def test_info_fields(conformance: Conformance) -> None:
    async def scenario(t: Target) -> Any:
        async with t.http() as http:
            return (await http.get("/info")).json()

    _, doc = await conformance.nsqd(scenario)
    assert doc["broadcast_address"] == "127.0.0.1"
    assert (doc["tcp_port"], doc["http_port"]) == ("<nsqd:tcp_port>", "<nsqd:http_port>")
    assert doc["hostname"] == "<hostname>"
