"""Feature negotiation: TLS, snappy, deflate, output buffering, sampling."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
import trio

import fakensq
from trionsq.protocol import commands as cmds
from trionsq.protocol.codecs import DeflateDecoder, DeflateEncoder, SnappyDecoder, SnappyEncoder

from ..support.tls import Pki
from .helpers import RawClient, memory_client


@pytest.fixture
async def nsqd() -> AsyncIterator[fakensq.NSQD]:
    async with fakensq.NSQD(tcp_address="", http_address="") as node:
        yield node


async def test_identify_reply_fields(nsqd: fakensq.NSQD, nursery: trio.Nursery) -> None:
    c = await memory_client(nsqd, nursery)
    doc = await c.identify(deflate_level=9, output_buffer_size=-1, msg_timeout=2000)
    assert list(doc) == [
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
    ]
    assert doc["msg_timeout"] == 2000
    assert doc["max_msg_timeout"] == 900000
    assert doc["output_buffer_size"] == 1
    assert doc["output_buffer_timeout"] == 0
    assert doc["tls_v1"] is False  # no TLS configured
    assert doc["deflate"] is False and doc["deflate_level"] == 6


@pytest.mark.parametrize("codec", ["snappy", "deflate"])
async def test_compression_with_pipelined_commands(
    nsqd: fakensq.NSQD, nursery: trio.Nursery, codec: str
) -> None:
    c = await memory_client(nsqd, nursery)
    encoder = SnappyEncoder() if codec == "snappy" else DeflateEncoder(3)
    ident = cmds.identify({"feature_negotiation": True, codec: True, "deflate_level": 3})
    # The PUB arrives compressed in the same segment as IDENTIFY: nsqd reads the
    # compressed stream through a new reader, so what the old one held is lost.
    await c.send(ident + encoder.encode(cmds.pub("t", b"lost") + cmds.sub("t", "c")))
    doc = json.loads(await c.read_response())
    assert doc[codec] is True
    if codec == "deflate":
        assert doc["deflate_level"] == 3
    c.encoder = SnappyEncoder() if codec == "snappy" else DeflateEncoder(3)
    c.decoder = SnappyDecoder() if codec == "snappy" else DeflateDecoder()
    rest = c.parser.take_buffer()
    c.frames.extend(c.parser.feed(c.decoder.decode(rest)))
    assert await c.read_response() == b"OK"  # the upgrade
    # A client that waited for the answer: its commands arrive.
    await c.send(cmds.pub("t", b"compressed!") + cmds.sub("t", "c"))
    assert await c.read_response() == b"OK"  # PUB
    assert await c.read_response() == b"OK"  # SUB
    await c.send(cmds.rdy(1))
    assert (await c.read_message()).body == b"compressed!"
    assert nsqd.topics["t"].message_count == 1
    assert nsqd.clients[max(nsqd.clients)].stats()[codec] is True


async def _upgrade_tls(c: RawClient, pki: Pki, **identify: object) -> dict[str, object]:
    await c.send(cmds.identify({"feature_negotiation": True, "tls_v1": True, **identify}))
    doc: dict[str, object] = json.loads(await c.read_response())
    assert doc["tls_v1"] is True
    c.stream = trio.SSLStream(c.stream, pki.client_context(), server_hostname="127.0.0.1")
    assert await c.read_response() == b"OK"
    return doc


async def test_tls_upgrade_over_tcp(pki: Pki) -> None:
    async with fakensq.NSQD(
        tcp_address="127.0.0.1:0", http_address="", ssl_context=pki.server_context(), tls_required=1
    ) as nsqd:
        with trio.fail_after(5):
            c = await RawClient.connect(nsqd.tcp_address)
            await _upgrade_tls(c, pki)
            await c.pub("t", b"secret")
            await c.sub("t", "c", rdy=1)
            assert (await c.read_message()).body == b"secret"
            stats = nsqd.stats()["topics"][0]["channels"][0]["clients"][0]
            assert stats["tls"] is True
            assert stats["tls_version"].startswith("TLS1.")
            assert stats["tls_cipher_suite"]


async def test_tls_then_snappy(pki: Pki, nursery: trio.Nursery) -> None:
    async with fakensq.NSQD(
        tcp_address="", http_address="", ssl_context=pki.server_context()
    ) as nsqd:
        c = await memory_client(nsqd, nursery)
        await _upgrade_tls(c, pki, snappy=True)
        c.encoder, c.decoder = SnappyEncoder(), SnappyDecoder()
        assert await c.read_response() == b"OK"
        await c.pub("t", b"both")


async def test_output_buffering(
    autojump_clock: trio.abc.Clock, nsqd: fakensq.NSQD, nursery: trio.Nursery
) -> None:
    c = await memory_client(nsqd, nursery)
    await c.identify(output_buffer_timeout=1000, output_buffer_size=64 * 1024)
    await c.sub("t", "c", rdy=10)
    await trio.testing.wait_all_tasks_blocked()
    topic = nsqd.get_topic("t")
    start = trio.current_time()
    topic.put(topic.new_message(b"1"))
    await c.read_message()
    assert trio.current_time() - start == pytest.approx(1.0)  # held for the timeout
    # a full buffer goes at once
    start = trio.current_time()
    topic.put_many([topic.new_message(b"x" * 40000), topic.new_message(b"y" * 40000)])
    await c.read_message()
    assert trio.current_time() == start
    # no RDY left: flushed at once
    await trio.sleep(5)
    start = trio.current_time()
    topic.put_many([topic.new_message(b"z") for _ in range(7)])
    for _ in range(8):
        await c.read_message()
    assert trio.current_time() == start


async def test_unbuffered_output(
    autojump_clock: trio.abc.Clock, nsqd: fakensq.NSQD, nursery: trio.Nursery
) -> None:
    c = await memory_client(nsqd, nursery)
    await c.identify(output_buffer_size=-1)
    await c.sub("t", "c", rdy=10)
    topic = nsqd.get_topic("t")
    start = trio.current_time()
    topic.put(topic.new_message(b"1"))
    await c.read_message()
    assert trio.current_time() == start


async def test_sample_rate(nursery: trio.Nursery) -> None:
    async with fakensq.NSQD(tcp_address="", http_address="", seed=7) as nsqd:
        c = await memory_client(nsqd, nursery)
        await c.identify(sample_rate=30, output_buffer_size=-1)
        await c.sub("t", "c", rdy=2500)
        await trio.testing.wait_all_tasks_blocked()
        topic = nsqd.get_topic("t")
        topic.put_many([topic.new_message(b"%d" % i) for i in range(1000)])
        channel = topic.channels["c"]
        got = len(channel.in_flight)
        # nsqd keeps a message when rand(100) <= rate: 31% on average
        assert 250 < got < 370
        assert channel.depth() == 0  # the others are gone for this channel
