"""nsqd conformance: written once against an address; expected values are real
nsqd v1.3's (its protocol_v2.go, http.go and stats.go)."""

from __future__ import annotations

import httpx
import pytest
import trio

from trionsq.protocol import commands as cmds

from ..fakensq.helpers import RawClient
from .conftest import Target


async def _raw(target: Target) -> RawClient:
    return await RawClient.connect(target.tcp_address)


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"HELLO world\n", b"E_INVALID invalid command HELLO"),
        (cmds.fin(b"0" * 16), b"E_INVALID cannot FIN in current state"),
        (cmds.rdy(1), b"E_INVALID cannot RDY in current state"),
        (b"SUB a|b c\n", b'E_BAD_TOPIC SUB topic name "a|b" is not valid'),
        (cmds.pub("t", b""), b"E_BAD_MESSAGE PUB invalid message body size 0"),
        (cmds.identify({"sample_rate": 100}), b"E_BAD_BODY IDENTIFY sample rate (100) is invalid"),
    ],
)
async def test_protocol_errors(nsqd_under_test: Target, data: bytes, error: bytes) -> None:
    with trio.fail_after(10):
        c = await _raw(nsqd_under_test)
        await c.send(data)
        assert await c.read_error() == error
        await c.aclose()


async def test_identify_reply_fields(nsqd_under_test: Target) -> None:
    with trio.fail_after(10):
        c = await _raw(nsqd_under_test)
        doc = await c.identify(client_id="conformance")
        await c.aclose()
    assert {
        "max_rdy_count",
        "version",
        "max_msg_timeout",
        "msg_timeout",
        "tls_v1",
        "deflate",
        "deflate_level",
        "max_deflate_level",
        "snappy",
        "sample_rate",
        "auth_required",
        "output_buffer_size",
        "output_buffer_timeout",
    } <= set(doc)
    assert (doc["max_rdy_count"], doc["msg_timeout"], doc["max_msg_timeout"]) == (
        2500,
        60000,
        900000,
    )
    assert (doc["tls_v1"], doc["auth_required"], doc["sample_rate"]) == (False, False, 0)


async def test_pub_sub_fin_round_trip(nsqd_under_test: Target) -> None:
    with trio.fail_after(10):
        consumer = await _raw(nsqd_under_test)
        await consumer.identify()
        await consumer.sub("conformance", "ch", rdy=1)
        producer = await _raw(nsqd_under_test)
        await producer.pub("conformance", b"hello")
        msg = await consumer.read_message()
        assert (msg.body, msg.attempts, len(msg.id)) == (b"hello", 1, 16)
        await consumer.send(cmds.fin(msg.id))
        await consumer.send(cmds.nop())  # FIN has no reply: a NOP after it proves no error
        await producer.pub("conformance", b"again")  # and the channel goes on
        assert (await consumer.read_message()).body == b"again"
        await consumer.aclose()
        await producer.aclose()


async def test_http_ping_pub_and_stats_fields(nsqd_under_test: Target) -> None:
    base = f"http://{nsqd_under_test.http_address}"
    async with httpx.AsyncClient(timeout=10) as client:
        r = await client.get(f"{base}/ping")
        assert (r.status_code, r.text) == (200, "OK")
        r = await client.post(f"{base}/pub?topic=conf_http", content=b"body")
        assert (r.status_code, r.text) == (200, "OK")
        r = await client.post(f"{base}/pub?topic=conf_http", content=b"")
        assert (r.status_code, r.json()) == (400, {"message": "MSG_EMPTY"})
        r = await client.post(f"{base}/topic/create?topic=conf_http")
        r = await client.post(f"{base}/channel/create?topic=conf_http&channel=c")
        assert r.status_code == 200
        doc = (await client.get(f"{base}/stats?format=json")).json()
    assert {"version", "health", "start_time", "topics"} <= set(doc)
    (topic,) = [t for t in doc["topics"] if t["topic_name"] == "conf_http"]
    assert {
        "topic_name",
        "channels",
        "depth",
        "backend_depth",
        "message_count",
        "message_bytes",
        "paused",
        "e2e_processing_latency",
    } <= set(topic)
    assert (topic["message_count"], topic["message_bytes"]) == (1, 4)
    (channel,) = topic["channels"]
    assert {
        "channel_name",
        "depth",
        "backend_depth",
        "in_flight_count",
        "deferred_count",
        "message_count",
        "requeue_count",
        "timeout_count",
        "client_count",
        "clients",
        "paused",
        "e2e_processing_latency",
    } <= set(channel)


async def test_info_fields(nsqd_under_test: Target) -> None:
    async with httpx.AsyncClient(timeout=10) as client:
        doc = (await client.get(f"http://{nsqd_under_test.http_address}/info")).json()
    assert {
        "version",
        "broadcast_address",
        "hostname",
        "http_port",
        "tcp_port",
        "start_time",
    } <= set(doc)
    assert doc["broadcast_address"] == "127.0.0.1"
    assert doc["tcp_port"] == int(nsqd_under_test.tcp_address.rpartition(":")[2])
    assert doc["http_port"] == int(nsqd_under_test.http_address.rpartition(":")[2])
