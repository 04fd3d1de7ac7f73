"""nsqd's core, on fakensq: TCP serving, IDENTIFY, SUB/PUB/MPUB/DPUB, RDY/FIN/REQ/TOUCH, CLS,
heartbeats, HTTP publishing, and running in the caller's nursery."""

from __future__ import annotations

import json

import httpx
import pytest
import trio

import fakensq
from trionsq.protocol import commands as cmds

from ..support.waiting import wait_until
from .helpers import RawClient


async def test_pub_sub_fin() -> None:
    async with fakensq.NSQD(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0") as nsqd:
        with trio.fail_after(5):
            consumer = await RawClient.connect(nsqd.tcp_address)
            doc = await consumer.identify(client_id="c1")
            assert doc["version"] == "1.3.0"
            assert doc["max_rdy_count"] == 2500
            await consumer.sub("t", "ch", rdy=10)
            producer = await RawClient.connect(nsqd.tcp_address)
            await producer.pub("t", b"hello")
            msg = await consumer.read_message()
            assert msg.body == b"hello"
            assert msg.attempts == 1
            assert len(msg.id) == 16
            await consumer.send(cmds.fin(msg.id))
            await producer.send(cmds.mpub("t", [b"a", b"b", b"c"]))
            assert await producer.read_response() == b"OK"
            bodies = [(await consumer.read_message()).body for _ in range(3)]
            assert bodies == [b"a", b"b", b"c"]
            stats = nsqd.stats()
            channel = stats["topics"][0]["channels"][0]
            assert channel["message_count"] == 4
            assert channel["in_flight_count"] == 3
            await consumer.aclose()
            await producer.aclose()


async def test_messages_wait_in_topic_until_channel() -> None:
    async with fakensq.NSQD(tcp_address="127.0.0.1:0", http_address="") as nsqd:
        with trio.fail_after(5):
            producer = await RawClient.connect(nsqd.tcp_address)
            await producer.pub("t", b"early")
            assert nsqd.stats()["topics"][0]["depth"] == 1
            a = await RawClient.connect(nsqd.tcp_address)
            await a.identify()
            await a.sub("t", "a", rdy=1)
            assert (await a.read_message()).body == b"early"
            b = await RawClient.connect(nsqd.tcp_address)
            await b.identify()
            await b.sub("t", "b", rdy=1)
            await producer.pub("t", b"both")
            assert (await b.read_message()).body == b"both"
            # a has RDY 1 and one in flight: it gets it after FIN
            await a.send(cmds.fin((await a.read_message()).id if False else b"0" * 16))
            err = await a.read_error()
            assert err == b"E_FIN_FAILED FIN 0000000000000000 failed ID not in flight"


async def test_rdy_limits_in_flight_and_req_redelivers(autojump_clock: trio.abc.Clock) -> None:
    server_client, client_stream = trio.testing.memory_stream_pair()
    async with fakensq.NSQD(tcp_address="", http_address="") as nsqd, trio.open_nursery() as n:
        n.start_soon(nsqd.handle_stream, server_client)
        c = RawClient(client_stream)
        await c.send(cmds.MAGIC_V2)
        await c.identify(msg_timeout=5000)
        await c.sub("t", "c", rdy=1)
        topic = nsqd.get_topic("t")
        topic.put_many([topic.new_message(b"1"), topic.new_message(b"2")])
        m1 = await c.read_message()
        assert m1.body == b"1"
        with trio.move_on_after(1):
            await c.read_message()
            raise AssertionError("RDY 1 allows one message in flight")
        await c.send(cmds.req(m1.id, 0))
        m = await c.read_message()
        assert m.body == b"2"
        await c.send(cmds.fin(m.id))
        m = await c.read_message()
        assert (m.body, m.attempts) == (b"1", 2)
        # no FIN: times out after msg_timeout (5 s), redelivered with attempts 3
        start = trio.current_time()
        m = await c.read_message()
        assert (m.body, m.attempts) == (b"1", 3)
        assert 4.9 < trio.current_time() - start < 5.5
        assert nsqd.stats()["topics"][0]["channels"][0]["timeout_count"] == 1
        n.cancel_scope.cancel()


async def test_dpub_and_req_delay(autojump_clock: trio.abc.Clock) -> None:
    server_client, client_stream = trio.testing.memory_stream_pair()
    async with fakensq.NSQD(tcp_address="", http_address="") as nsqd, trio.open_nursery() as n:
        n.start_soon(nsqd.handle_stream, server_client)
        c = RawClient(client_stream)
        await c.send(cmds.MAGIC_V2)
        await c.identify()
        await c.sub("t", "c", rdy=5)
        start = trio.current_time()
        await c.send(cmds.dpub("t", 3000, b"later"))
        assert await c.read_response() == b"OK"
        assert nsqd.stats()["topics"][0]["channels"][0]["deferred_count"] == 1
        m = await c.read_message()
        # Due after 3 s, but nsqd's queue scan first looks at a channel made
        # after its start at its refresh, 5 s after the start.
        assert 5.0 <= trio.current_time() - start <= 5.25  # + output_buffer_timeout
        start = trio.current_time()
        await c.send(cmds.req(m.id, 2000))
        m = await c.read_message()
        assert m.attempts == 2
        # Now known to the scan: due after 2 s, acted on at the next 100 ms tick.
        assert 2.0 <= trio.current_time() - start <= 2.35
        stats = nsqd.stats()["topics"][0]["channels"][0]
        assert stats["requeue_count"] == 1
        n.cancel_scope.cancel()


async def test_touch_extends_deadline(autojump_clock: trio.abc.Clock) -> None:
    server_client, client_stream = trio.testing.memory_stream_pair()
    async with fakensq.NSQD(tcp_address="", http_address="") as nsqd, trio.open_nursery() as n:
        n.start_soon(nsqd.handle_stream, server_client)
        c = RawClient(client_stream)
        await c.send(cmds.MAGIC_V2)
        await c.identify(msg_timeout=2000)
        await c.sub("t", "c", rdy=1)
        topic = nsqd.get_topic("t")
        topic.put(topic.new_message(b"x"))
        m = await c.read_message()
        start = trio.current_time()
        for _ in range(3):
            await trio.sleep(1.5)
            await c.send(cmds.touch(m.id))
        m2 = await c.read_message()
        assert m2.attempts == 2
        assert 6.4 < trio.current_time() - start < 6.6
        n.cancel_scope.cancel()


async def test_heartbeats_and_read_timeout(autojump_clock: trio.abc.Clock) -> None:
    server_client, client_stream = trio.testing.memory_stream_pair()
    async with fakensq.NSQD(tcp_address="", http_address="") as nsqd, trio.open_nursery() as n:
        n.start_soon(nsqd.handle_stream, server_client)
        c = RawClient(client_stream)
        await c.send(cmds.MAGIC_V2)
        await c.identify(heartbeat_interval=1000)
        start = trio.current_time()
        frame = await c.read_frame(skip_heartbeats=False)
        assert frame.data == b"_heartbeat_"  # type: ignore[union-attr]
        assert 0.9 < trio.current_time() - start < 1.1
        await c.send(cmds.nop())
        # no more commands: closed after 2 heartbeat intervals of silence
        await c.expect_closed()
        assert 3.0 <= trio.current_time() - start <= 3.25  # + output_buffer_timeout
        n.cancel_scope.cancel()


@pytest.mark.parametrize("requeue_on_disconnect", [False, True])
async def test_cls_and_requeue_on_disconnect(requeue_on_disconnect: bool) -> None:
    async with fakensq.NSQD(
        tcp_address="127.0.0.1:0", http_address="", requeue_on_disconnect=requeue_on_disconnect
    ) as nsqd:
        with trio.fail_after(5):
            c = await RawClient.connect(nsqd.tcp_address)
            await c.identify()
            await c.sub("t", "c", rdy=2)
            topic = nsqd.get_topic("t")
            topic.put_many([topic.new_message(b"1"), topic.new_message(b"2")])
            m1 = await c.read_message()
            m2 = await c.read_message()
            await c.send(cmds.cls())
            assert await c.read_response() == b"CLOSE_WAIT"
            await c.send(cmds.rdy(5))  # ignored after CLS
            await c.send(cmds.fin(m1.id))
            await c.send(cmds.nop())
            await c.aclose()
            channel = nsqd.topics["t"].channels["c"]
            await wait_until(lambda: not channel.clients)
            if requeue_on_disconnect:
                # the opt-in: straight back to the queue
                assert (channel.depth(), list(channel.in_flight)) == (1, [])
            else:
                # nsqd v1.3.0: in flight until its msg-timeout
                assert (channel.depth(), list(channel.in_flight)) == (0, [m2.id])


async def test_http_pub_mpub_ping() -> None:
    async with fakensq.NSQD(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0") as nsqd:
        url = f"http://{nsqd.http_address}"
        async with httpx.AsyncClient() as http:
            r = await http.get(f"{url}/ping")
            assert (r.status_code, r.text) == (200, "OK")
            r = await http.post(f"{url}/pub?topic=t", content=b"hi")
            assert (r.status_code, r.text) == (200, "OK")
            r = await http.post(f"{url}/mpub?topic=t", content=b"a\nb\n\nc")
            assert (r.status_code, r.text) == (200, "OK")
            r = await http.post(f"{url}/pub?topic=t&defer=1000", content=b"d")
            assert r.status_code == 200
            r = await http.post(f"{url}/pub", content=b"x")
            assert (r.status_code, json.loads(r.text)) == (400, {"message": "MISSING_ARG_TOPIC"})
            r = await http.get(f"{url}/pub?topic=t")
            assert (r.status_code, r.json()) == (405, {"message": "METHOD_NOT_ALLOWED"})
            r = await http.get(f"{url}/nope")
            assert (r.status_code, r.json()) == (404, {"message": "NOT_FOUND"})
        topic = nsqd.topics["t"]
        assert topic.message_count == 5
        assert topic.depth() == 5


async def test_run_in_callers_nursery_and_options_object(nursery: trio.Nursery) -> None:
    opts = fakensq.NSQDOptions(tcp_address="127.0.0.1:0", http_address="", max_rdy_count=7)
    nsqd = fakensq.NSQD(options=opts, msg_timeout=5.0)
    await nursery.start(nsqd.run)
    assert nsqd.options.max_rdy_count == 7 and nsqd.options.msg_timeout == 5.0
    with trio.fail_after(5):
        c = await RawClient.connect(nsqd.tcp_address)
        doc = await c.identify()
        assert doc["max_rdy_count"] == 7 and doc["msg_timeout"] == 5000
        await c.aclose()
