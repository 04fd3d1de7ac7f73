"""SimCluster in virtual time, its determinism, and every fault of fakensq.faults."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing

import trionsq
from fakensq import Cluster
from fakensq.testing.simulation import SimCluster
from trionsq.protocol.errors import PubFailedError

from ..support.waiting import wait_until


def consumer(cluster: SimCluster, name: str = "client", **options: Any) -> trionsq.Consumer:
    options.setdefault("lookupd_http_addresses", cluster.lookupd_http_addresses)
    options.setdefault("lookupd_poll_interval", 5.0)
    return trionsq.Consumer(
        options.pop("topic", "t"),
        options.pop("channel", "c"),
        connector=cluster.connector_for(name),
        http_transport=cluster.http_transport_for(name),
        rng=random.Random(name),
        **options,
    )


def producer(cluster: SimCluster, node: int = 0, **options: Any) -> trionsq.Producer:
    return trionsq.Producer(
        nsqd_tcp_addresses=[cluster.nsqd_tcp_addresses[node]],
        connector=cluster.connector_for("producer"),
        **options,
    )


async def test_a_minute_of_timeouts_in_virtual_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with SimCluster(nsqd=2, lookupd=2, seed=3) as cluster:
        assert cluster.nsqd_tcp_addresses == ["nsqd-0:4150", "nsqd-1:4150"]
        assert cluster.lookupd_http_addresses == ["lookupd-0:4161", "lookupd-1:4161"]
        async with producer(cluster, 1) as p:
            await p.publish("t", b"slow")
        async with consumer(cluster) as c:
            first = await c.__anext__()
            start = trio.current_time()
            second = await c.__anext__()  # never finished: redelivered after 60 s
            assert trio.current_time() - start == pytest.approx(60.0, abs=1.0)
            assert (second.id, second.attempts) == (first.id, 2)
            await second.finish()
        # The HTTP APIs are there too, through the in-memory transport.
        async with httpx.AsyncClient(transport=cluster.http_transport) as http:
            stats = (await http.get("http://nsqd-1:4151/stats?format=json")).json()
            assert stats["topics"][0]["channels"][0]["message_count"] == 1
            assert stats["faults"] == []
            nodes = (await http.get("http://lookupd-0:4161/nodes")).json()
            assert sorted(n["broadcast_address"] for n in nodes["producers"]) == [
                "nsqd-0",
                "nsqd-1",
            ]


async def scenario(seed: int, trace: list[dict[str, Any]]) -> list[tuple[bytes, int]]:
    """Two consumers, publishes, a drop and a partition; what was handled."""
    handled: list[tuple[bytes, int]] = []

    async def handler(message: trionsq.Message) -> None:
        handled.append((message.body, message.attempts))
        await trio.sleep(random.Random(message.body).random() * 3)
        if message.attempts == 1 and message.body.endswith(b"3"):
            raise RuntimeError("fail once")

    async with SimCluster(nsqd=2, lookupd=1, seed=seed, trace=trace) as cluster:
        async with producer(cluster) as p0, producer(cluster, 1) as p1:
            await p0.multi_publish("t", [b"a%d" % i for i in range(10)])
            await p1.multi_publish("t", [b"b%d" % i for i in range(10)])
        async with (
            consumer(cluster, "c1", max_in_flight=3, handler=handler, backoff=False),
            consumer(cluster, "c2", max_in_flight=2, handler=handler, backoff=False),
        ):
            await trio.sleep(2)
            await cluster.faults.drop(client="c1")
            fault = cluster.faults.partition("c2", "nsqd-0")
            await trio.sleep(20)
            fault.heal()
            await wait_until(lambda: len({b for b, _ in handled}) == 20, limit=300, step=0.5)
            await trio.sleep(100)
    return handled


async def test_same_seed_same_run_event_for_event() -> None:
    runs = []
    for _ in range(2):
        trace: list[dict[str, Any]] = []
        handled = await _in_virtual_time(scenario, 42, trace)
        runs.append((handled, trace))
    assert runs[0][1] == runs[1][1]
    assert runs[0][0] == runs[1][0]
    kinds = {e["event"] for e in runs[0][1]}
    assert {"frame", "fault", "heal", "drop", "connect"} <= kinds
    assert any(e.get("frame") == "message" for e in runs[0][1])


async def _in_virtual_time(fn: Any, *args: Any) -> Any:
    # A fresh trio.run per run (on a thread: we are inside the test's own run),
    # each with its own MockClock, as two separate test runs would be.
    def run() -> Any:
        return trio.run(fn, *args, clock=trio.testing.MockClock(autojump_threshold=0))

    return await trio.to_thread.run_sync(run)


async def test_trace_to_a_file(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    path = tmp_path / "trace.jsonl"
    async with SimCluster(trace=str(path)) as cluster:
        async with producer(cluster) as p:
            cluster.faults.fail_publishes(topic="t")
            with pytest.raises(PubFailedError):
                await p.publish("t", b"x")
    events = [json.loads(line) for line in path.read_text().splitlines()]
    assert {"t", "event"} <= set(events[0])
    assert [e["kind"] for e in events if e["event"] == "fault"] == ["fail_publishes"]
    assert any(e.get("data", "").startswith("E_PUB_FAILED") for e in events)


async def test_partition_client_from_node_and_heal(autojump_clock: trio.testing.MockClock) -> None:
    async with SimCluster(seed=1) as cluster:
        async with producer(cluster) as p:
            await p.publish("t", b"1")
        async with consumer(cluster, "c1", heartbeat_interval=5.0, read_timeout=11.0) as c:
            await (await c.__anext__()).finish()
            await trio.sleep(1)  # the FIN reaches nsqd before the partition
            fault = cluster.faults.partition("c1", "nsqd-0")
            assert cluster.nsqd(0).stats()["faults"] == [fault.describe()]
            await trio.sleep(60)  # heartbeats stop: both ends give the connection up
            assert c.connections == []
            async with producer(cluster) as p:
                await p.publish("t", b"2")
            fault.heal()
            message = await c.__anext__()  # rediscovered, reconnected
            assert message.body == b"2"
            await message.finish()
            assert cluster.nsqd(0).stats()["faults"] == []


async def test_drop_swallow_heartbeats_corrupt_truncate(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with SimCluster(seed=2) as cluster:
        async with consumer(cluster, "c1", heartbeat_interval=5.0, read_timeout=11.0) as c:
            async with producer(cluster) as p:
                await p.publish("t", b"x")
            await (await c.__anext__()).finish()
            await trio.sleep(1)  # the FIN reaches nsqd before the drop
            assert await cluster.faults.drop(client="c1") == 1
            await wait_until(
                lambda: c.stats.connections.get("nsqd-0:4150") is None, limit=300, step=0.5
            )
            await wait_until(lambda: c.connections == ["nsqd-0:4150"], limit=300, step=0.5)
            # Heartbeats swallowed: the client's read timeout ends the connection.
            fault = cluster.faults.swallow_heartbeats(client="c1")
            await trio.sleep(15)
            fault.heal()
            await wait_until(lambda: c.connections == ["nsqd-0:4150"], limit=300, step=0.5)
            # A corrupt frame and a truncated one: the client reconnects each time.
            for spoil in (cluster.faults.corrupt_next_frame, cluster.faults.truncate_next_frame):
                fault = spoil(client="c1")
                async with producer(cluster) as p:
                    await p.publish("t", b"y")
                message = await c.__anext__()  # the spoiled delivery came again
                assert message.body == b"y"
                await message.finish()
                await trio.sleep(1)
                assert not fault.active
        kinds = [f["kind"] for f in cluster.faults.tracer.events] if cluster.faults.tracer else []
        assert kinds == []  # no trace asked for


async def test_delay_and_stall(autojump_clock: trio.testing.MockClock) -> None:
    async with SimCluster() as cluster:
        async with producer(cluster) as p:
            await p.publish("t", b"w")  # connected: only the PUB's answer is delayed
            cluster.faults.delay(3.0, node="nsqd-0", client="producer", direction="out")
            start = trio.current_time()
            await p.publish("t", b"x")
            assert trio.current_time() - start == pytest.approx(3.0, abs=0.1)
            cluster.faults.heal_all()
            stall = cluster.faults.stall(node="nsqd-0", direction="in")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(p.publish, "t", b"y")
                await trio.sleep(10)
                assert cluster.nsqd(0).get_topic("t").message_count == 2
                stall.heal()
            assert cluster.nsqd(0).get_topic("t").message_count == 3


async def test_publish_and_backend_failures_show_in_stats(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with SimCluster() as cluster:
        fault = cluster.faults.fail_backend(node="nsqd-0")
        async with httpx.AsyncClient(transport=cluster.http_transport) as http:
            ping = await http.get("http://nsqd-0:4151/ping")
            assert ping.status_code == 500 and ping.text.startswith("NOK")
            stats = (await http.get("http://nsqd-0:4151/stats?format=json")).json()
            assert [f["kind"] for f in stats["faults"]] == ["fail_backend"]
            pub = await http.post("http://nsqd-0:4151/pub?topic=t", content=b"x")
            assert pub.status_code >= 500
        async with producer(cluster) as p:
            with pytest.raises(PubFailedError):
                await p.publish("t", b"x")
        fault.heal()
        async with producer(cluster) as p:
            await p.publish("t", b"x")
        assert cluster.nsqd(0).health() == "OK"


async def test_time_out_in_flight_and_pause_channel(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with SimCluster() as cluster:
        async with producer(cluster) as p:
            await p.multi_publish("t", [b"1", b"2"])
        async with consumer(cluster, max_in_flight=2) as c:
            first = await c.__anext__()
            await c.__anext__()
            assert cluster.faults.time_out_in_flight(topic="t") == 2
            for _ in range(2):
                again = await c.__anext__()
                assert again.attempts == 2
                await again.finish()
            await first.finish()  # too late: E_FIN_FAILED, logged only
            channel = cluster.nsqd(0).get_topic("t").channels["c"]
            assert channel.timeout_count == 2
            pause = cluster.faults.pause_channel("t", "c")
            assert channel.paused
            async with producer(cluster) as p:
                await p.publish("t", b"3")
            with trio.move_on_after(30):
                await c.__anext__()
                pytest.fail("delivered while paused")
            pause.heal()
            await (await c.__anext__()).finish()


async def test_auth_refused_and_hanging(autojump_clock: trio.testing.MockClock) -> None:
    def allow(query: dict[str, str]) -> dict[str, Any]:
        rule = {"topic": ".*", "channels": [".*"], "permissions": ["publish", "subscribe"]}
        return {"ttl": 3600, "identity": "tester", "authorizations": [rule]}

    async with SimCluster(nsqd_options={}) as cluster:
        cluster.nsqd(0).auth_handler = allow
        refuse = cluster.faults.refuse_auth()
        try:
            async with producer(cluster, auth_secret="s") as p:
                await p.publish("t", b"x")
        except BaseException as exc:  # the producer's nursery wraps it in a group
            assert "E_AUTH_FAILED" in _messages(exc)
        else:
            pytest.fail("AUTH was not refused")
        refuse.heal()
        hang = cluster.faults.hang_auth()
        with trio.move_on_after(20) as scope:
            async with producer(cluster, auth_secret="s", connect_timeout=60.0) as p:
                await p.publish("t", b"x")
        assert scope.cancelled_caught
        hang.heal()
        async with producer(cluster, auth_secret="s") as p:
            await p.publish("t", b"x")
        assert cluster.nsqd(0).auth_handler is allow


def _messages(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return " ".join(_messages(e) for e in exc.exceptions)
    return str(exc)


async def test_stop_keeps_messages_kill_loses_them(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with SimCluster(nsqd=1, lookupd=1, seed=5) as cluster:
        async with producer(cluster) as p:
            await p.multi_publish("t", [b"%d" % i for i in range(5)])
        cluster.nsqd(0).get_topic("t").get_channel("c")
        await cluster.faults.restart("nsqd-0")
        await trio.sleep(1)  # the restarted topic asks lookupd for channels first
        channel = cluster.nsqd(0).get_topic("t").channels["c"]
        assert channel.depth() == 5
        async with consumer(cluster) as c:
            bodies = set()
            for _ in range(5):
                message = await c.__anext__()
                bodies.add(message.body)
                await message.finish()
        assert bodies == {b"%d" % i for i in range(5)}
        async with producer(cluster) as p:
            await p.publish("t", b"lost")
        # The five were read from disk (the restart wrote them there); nsqd's
        # disk queue records its read position every 2 s (--sync-timeout):
        # killed sooner, it would read them again.
        await trio.sleep(2)
        await cluster.faults.restart("nsqd-0", kill=True)
        # As nsqd: its nsqd.dat keeps the topic and channel, memory loses the message.
        assert cluster.nsqd(0).topics["t"].channels["c"].depth() == 0
        # A lookupd outage: the nsqd registers again when it comes back.
        await cluster.faults.restart("lookupd-0")
        assert [n["broadcast_address"] for n in cluster.lookupd(0).nodes()] == ["nsqd-0"]


async def test_nsqd_partitioned_from_lookupd(autojump_clock: trio.testing.MockClock) -> None:
    async with SimCluster(nsqd=1, lookupd=2) as cluster:
        fault = cluster.faults.partition("nsqd-0", "lookupd-1")
        async with producer(cluster) as p:
            await p.publish("new-topic", b"x")
        await trio.sleep(5)
        assert "new-topic" in cluster.lookupd(0).topics()
        assert "new-topic" not in cluster.lookupd(1).topics()
        fault.heal()
        await wait_until(lambda: "new-topic" in cluster.lookupd(1).topics(), limit=60, step=0.5)


async def test_the_same_faults_over_tcp() -> None:
    """In TCP mode the faults wrap real sockets: any client meets them."""
    # Opting in to the requeue on disconnect: the message comes back at once
    # rather than after nsqd's 60 s msg-timeout (this test is about the faults).
    async with Cluster(nsqd=1, lookupd=1, nsqd_options={"requeue_on_disconnect": True}) as cluster:
        address = cluster.nsqd_tcp_addresses[0]
        async with trionsq.Producer(nsqd_tcp_addresses=[address]) as p:
            await p.publish("t", b"x")
            fault = cluster.faults.fail_publishes(node="nsqd-0")
            with pytest.raises(PubFailedError):
                await p.publish("t", b"y")
            fault.heal()
        async with trionsq.Consumer(
            "t", "c", nsqd_tcp_addresses=[address], client_id="tcp-consumer", close_timeout=0.1
        ) as c:
            with trio.fail_after(10):
                message = await c.__anext__()
            assert await cluster.faults.drop(client="tcp-consumer") == 1
            with trio.fail_after(10):
                again = await c.__anext__()  # requeued on disconnect, delivered again
            assert again.id == message.id
            await again.finish()
        stats = cluster.nsqd(0).stats()
        assert stats["faults"] == []
        assert cluster.faults.injected == 2
