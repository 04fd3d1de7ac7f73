"""Channel semantics: distribution, pause, empty, timeouts, disconnects."""

from __future__ import annotations

import httpx
import pytest
import trio

import fakensq
from trionsq.protocol import commands as cmds

from .helpers import RawClient, memory_client


async def _distribution(seed: int) -> list[int]:
    async with fakensq.NSQD(tcp_address="", http_address="", seed=seed) as nsqd:
        async with trio.open_nursery() as nursery:
            clients = []
            for _ in range(3):
                c = await memory_client(nsqd, nursery)
                await c.identify(output_buffer_size=-1)
                await c.sub("t", "c", rdy=100)
                clients.append(c)
            await trio.testing.wait_all_tasks_blocked()
            topic = nsqd.get_topic("t")
            topic.put_many(topic.new_messages([b"m"] * 90))
            counts = [c.in_flight_count for c in nsqd.topics["t"].channels["c"].clients.values()]
            nursery.cancel_scope.cancel()
    return counts


async def test_messages_spread_over_ready_clients_deterministically() -> None:
    first = await _distribution(seed=11)
    assert sum(first) == 90
    assert all(n > 15 for n in first)
    assert await _distribution(seed=11) == first


async def test_pause_and_empty(nursery: trio.Nursery) -> None:
    async with fakensq.NSQD(tcp_address="", http_address="") as nsqd:
        c = await memory_client(nsqd, nursery)
        await c.identify(output_buffer_size=-1)
        await c.sub("t", "c", rdy=2)
        await trio.testing.wait_all_tasks_blocked()
        channel = nsqd.topics["t"].channels["c"]
        channel.pause()
        topic = nsqd.topics["t"]
        topic.put_many(topic.new_messages([b"1", b"2", b"3"]))
        assert channel.depth() == 3 and not channel.in_flight
        channel.unpause()
        await c.read_message()
        await c.read_message()
        assert channel.depth() == 1 and len(channel.in_flight) == 2
        channel.empty()  # in flight too: the client may take more again
        assert channel.depth() == 0 and not channel.in_flight
        topic.put(topic.new_message(b"4"))
        assert (await c.read_message()).body == b"4"


async def test_dropped_consumer_without_requeue_waits_for_timeout(
    autojump_clock: trio.abc.Clock, nursery: trio.Nursery
) -> None:
    async with fakensq.NSQD(
        tcp_address="", http_address="", requeue_on_disconnect=False, msg_timeout=10.0
    ) as nsqd:
        a = await memory_client(nsqd, nursery)
        await a.sub("t", "c", rdy=1)
        b = await memory_client(nsqd, nursery)
        await b.sub("t", "c", rdy=1)
        await trio.testing.wait_all_tasks_blocked()
        topic = nsqd.topics["t"]
        topic.put(topic.new_message(b"x"))
        await trio.testing.wait_all_tasks_blocked()
        owner = next(iter(nsqd.topics["t"].channels["c"].in_flight.values())).client
        assert owner is not None
        # a connected first, so its server-side id is the smaller one
        holder, other = (a, b) if owner.id == min(nsqd.clients) else (b, a)
        start = trio.current_time()
        await holder.aclose()
        msg = await other.read_message()
        assert msg.attempts == 2
        assert trio.current_time() - start >= 9.0  # nsqd's behaviour: the timeout


async def test_each_client_has_its_msg_timeout(
    autojump_clock: trio.abc.Clock, nursery: trio.Nursery
) -> None:
    # exact_timers: the timeout acted on when due, not at nsqd's next queue scan
    async with fakensq.NSQD(tcp_address="", http_address="", exact_timers=True) as nsqd:
        c = await memory_client(nsqd, nursery)
        await c.identify(msg_timeout=3000, output_buffer_size=-1)
        await c.sub("t", "c", rdy=1)
        await trio.testing.wait_all_tasks_blocked()
        topic = nsqd.topics["t"]
        topic.put(topic.new_message(b"x"))
        await c.read_message()
        start = trio.current_time()
        again = await c.read_message()
        assert again.attempts == 2
        assert trio.current_time() - start == 3.0


async def test_options_and_head(nursery: trio.Nursery) -> None:
    async with fakensq.NSQD(tcp_address="", http_address="127.0.0.1:0") as nsqd:
        async with httpx.AsyncClient(base_url=f"http://{nsqd.http_address}") as http:
            r = await http.options("/pub")
            assert (r.status_code, r.headers["allow"]) == (200, "OPTIONS, POST")
            r = await http.head("/ping")
            assert r.status_code == 405


async def test_consumer_and_producer_on_one_connection(nursery: trio.Nursery) -> None:
    async with fakensq.NSQD(tcp_address="", http_address="") as nsqd:
        c: RawClient = await memory_client(nsqd, nursery)
        await c.sub("t", "c", rdy=5)
        await c.send(cmds.pub("t", b"self"))
        frames = [await c.read_frame(), await c.read_frame()]
        assert {type(f).__name__ for f in frames} == {"Response", "MessageFrame"}


async def test_e2e_processing_latency_percentiles(nursery: trio.Nursery) -> None:
    async with fakensq.NSQD(
        tcp_address="", http_address="", e2e_processing_latency_percentiles=[0.5, 0.99]
    ) as nsqd:
        c = await memory_client(nsqd, nursery)
        await c.identify(output_buffer_size=-1)
        await c.sub("t", "c", rdy=10)
        await trio.testing.wait_all_tasks_blocked()
        topic = nsqd.topics["t"]
        topic.put_many(topic.new_messages([b"a", b"b", b"c"]))
        for _ in range(3):
            await c.send(cmds.fin((await c.read_message()).id))
        await c.send(cmds.nop())
        await trio.testing.wait_all_tasks_blocked()
        result = nsqd.stats()["topics"][0]["channels"][0]["e2e_processing_latency"]
        assert result["count"] == 3
        assert [p["quantile"] for p in result["percentiles"]] == [0.99, 0.5]
        assert all(p["value"] >= 0 for p in result["percentiles"])


async def test_ephemeral_overflow_is_dropped(nursery: trio.Nursery) -> None:
    async with fakensq.NSQD(tcp_address="", http_address="", mem_queue_size=5) as nsqd:
        topic = nsqd.get_topic("t#ephemeral")
        topic.put_many(topic.new_messages([b"%d" % i for i in range(8)]))
        assert topic.depth() == 5  # the topic's own queue, no channel yet
        durable = nsqd.get_topic("t")
        durable.get_channel("kept")
        c = await memory_client(nsqd, nursery)
        await c.identify(output_buffer_size=-1)
        await c.sub("t", "e#ephemeral", rdy=2)
        await trio.testing.wait_all_tasks_blocked()
        durable.put_many(durable.new_messages([b"%d" % i for i in range(10)]))
        ephemeral = durable.channels["e#ephemeral"]
        assert len(ephemeral.in_flight) == 2
        assert ephemeral.depth() == 5  # 3 dropped
        assert ephemeral.message_count == 10
        assert durable.channels["kept"].depth() == 10  # a disk would hold these


async def test_timeouts_at_nsqd_queue_scan(
    autojump_clock: trio.abc.Clock, nursery: trio.Nursery
) -> None:
    # nsqd acts on timeouts in its queue scan: every 100 ms, over the channels
    # listed at its start and at each 5 s refresh.
    async with fakensq.NSQD(tcp_address="", http_address="") as nsqd:
        started = trio.current_time()
        c = await memory_client(nsqd, nursery)
        await c.identify(msg_timeout=1000, output_buffer_size=-1)
        await c.sub("t", "c", rdy=1)  # a channel made after the start
        topic = nsqd.topics["t"]
        topic.put(topic.new_message(b"x"))
        await c.read_message()
        again = await c.read_message()
        assert (again.attempts, trio.current_time() - started) == (2, 5.0)
        await c.send(cmds.fin(again.id))
        await trio.sleep(0.03)
        topic.put(topic.new_message(b"y"))
        start = trio.current_time()
        await c.read_message()
        late = await c.read_message()  # known to the scan now: the first tick after 1 s
        assert late.attempts == 2
        assert trio.current_time() - start == pytest.approx(1.07)
