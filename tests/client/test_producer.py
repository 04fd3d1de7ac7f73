"""Producer against the scripted in-memory nsqd."""

from __future__ import annotations

import pytest
import trio

import trionsq

from ..support.waiting import wait_until
from .minisrv import Cluster, MiniNSQD


def producer(node: MiniNSQD, **options: object) -> trionsq.Producer:
    return trionsq.Producer(
        nsqd_tcp_addresses=["nsqd:4150"],
        connector=node.connector,
        **options,  # type: ignore[arg-type]
    )


async def test_publish_multi_and_deferred(nursery: trio.Nursery) -> None:
    node = MiniNSQD(nursery)
    async with producer(node) as p:
        await p.publish("orders", b"one")
        await p.multi_publish("orders", [b"two", b"three"])
        await p.deferred_publish("orders", b"later", 1.5)
    assert node.published == [
        ("orders", b"one"),
        ("orders", b"two"),
        ("orders", b"three"),
        ("orders", b"later"),
    ]
    assert node.deferred == [("orders", 1500, b"later")]
    assert len(node.conns) == 1  # one connection for everything
    identify = node.conns[0].record.identify
    assert identify["feature_negotiation"] is True
    assert identify["heartbeat_interval"] == 30000


async def test_concurrent_publishes_are_pipelined_on_one_connection(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    node = MiniNSQD(nursery)
    node.pub_delay = 1.0  # each PUB takes one virtual second to answer
    async with producer(node, publish_window=4) as p:
        start = trio.current_time()
        async with trio.open_nursery() as publishers:
            for i in range(8):
                publishers.start_soon(p.publish, "t", b"%d" % i)
        elapsed = trio.current_time() - start
    assert sorted(body for _, body in node.published) == [b"%d" % i for i in range(8)]
    assert len(node.conns) == 1
    # The scripted server answers one PUB at a time: 8 seconds however many are
    # pipelined; what the window bounds is how many wait at once.
    assert elapsed == pytest.approx(8.0)


async def test_window_bounds_requests_awaiting_response(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    node = MiniNSQD(nursery)
    node.pub_delay = 10.0
    async with producer(node, publish_window=3) as p:
        async with trio.open_nursery() as publishers:
            for i in range(10):
                publishers.start_soon(p.publish, "t", b"x%d" % i)
            await trio.sleep(5)
            # Three PUBs are written and await their response; seven wait.
            assert p._conn is not None
            assert len(p._conn._pending) == 3
    assert len(node.published) == 10


async def test_bad_topic_raises_typed_error_locally() -> None:
    async def never(host: str, port: int) -> trio.abc.Stream:
        raise AssertionError("no connection needed")

    async with trionsq.Producer(["nsqd:4150"], connector=never) as p:
        with pytest.raises(trionsq.BadTopicError):
            await p.publish("bad topic!", b"x")
        with pytest.raises(trionsq.BadMessageError):
            await p.publish("ok", b"")
        with pytest.raises(trionsq.BadBodyError):
            await p.multi_publish("ok", [])
        with pytest.raises(ValueError):
            await p.deferred_publish("ok", b"x", -1)
        with pytest.raises(trionsq.BadMessageError, match="MPUB invalid message body size 0"):
            await p.multi_publish("ok", [b"a", b"", b"c"])
        with pytest.raises(TypeError, match="not str"):
            await p.multi_publish("ok", [b"a", "b"])  # type: ignore[list-item]
        with pytest.raises(TypeError, match="not str"):
            await p.publish("ok", "b")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="topic must be a str"):
            await p.publish(["ok"], b"x")  # type: ignore[arg-type]


async def test_bodies_of_any_bytes_like_kind(nursery: trio.Nursery) -> None:
    node = MiniNSQD(nursery)
    async with producer(node) as p:
        await p.publish("t", bytearray(b"one"))
        await p.multi_publish("t", (b for b in [b"two", memoryview(b"three"), bytearray(b"4")]))
        await p.multi_publish("t", (b"five", b"six"))
    assert [b for _, b in node.published] == [b"one", b"two", b"three", b"4", b"five", b"six"]


async def test_server_error_is_raised_and_connection_replaced(nursery: trio.Nursery) -> None:
    node = MiniNSQD(nursery)
    node.pub_errors["broken"] = trionsq.PubFailedError("PUB failed exiting")
    async with producer(node) as p:
        await p.publish("fine", b"1")
        with pytest.raises(trionsq.PubFailedError) as info:
            await p.publish("broken", b"2")
        assert info.value.fatal
        await p.publish("fine", b"3")
    assert [b for _, b in node.published] == [b"1", b"3"]
    assert len(node.conns) == 2  # the fatal error cost a reconnect


async def test_pending_publishes_fail_when_connection_drops(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    node = MiniNSQD(nursery)
    node.pub_delay = 100.0
    async with producer(node) as p:
        results: list[BaseException] = []

        async def publish() -> None:
            try:
                await p.publish("t", b"x")
            except trionsq.ConnectionClosedError as exc:
                results.append(exc)

        async with trio.open_nursery() as publishers:
            for _ in range(3):
                publishers.start_soon(publish)
            await wait_until(lambda: node.live and node.live[0].record.commands)
            await node.live[0].close()
        assert len(results) == 3


async def test_failover_to_next_address(nursery: trio.Nursery) -> None:
    cluster = Cluster(nursery)
    first = cluster.add("a:4150")
    second = cluster.add("b:4150")
    first.refuse = True
    async with trionsq.Producer(["a:4150", "b:4150"], connector=cluster.connector) as p:
        await p.publish("t", b"1")
        assert p.address == "b:4150"
        # b goes away; a is back: the next publish fails over.
        first.refuse = False
        second.refuse = True
        await second.live[0].close()
        await wait_until(lambda: p.address is None)
        await p.publish("t", b"2")
        assert p.address == "a:4150"
    assert second.published == [("t", b"1")]
    assert first.published == [("t", b"2")]


async def test_no_reachable_nsqd_raises_connection_error(nursery: trio.Nursery) -> None:
    node = MiniNSQD(nursery)
    node.refuse = True
    async with producer(node) as p:
        with pytest.raises(trionsq.NSQConnectionError, match="no nsqd reachable"):
            await p.publish("t", b"x")


async def test_heartbeat_answered_with_nop(nursery: trio.Nursery) -> None:
    node = MiniNSQD(nursery)
    async with producer(node) as p:
        await p.publish("t", b"x")
        server = node.live[0]
        from trionsq.protocol.frames import encode_response

        await server.send(encode_response(b"_heartbeat_"))
        await wait_until(lambda: server.record.nops == 1)
        await p.publish("t", b"y")  # the connection is still good
    assert len(node.conns) == 1


async def test_garbage_from_server_gives_protocol_error_and_reconnect(
    nursery: trio.Nursery,
) -> None:
    node = MiniNSQD(nursery)
    async with producer(node) as p:
        await p.publish("t", b"x")
        server = node.live[0]
        await server.send(b"\x00\x00\x00\x08\x00\x00\x00\x09garbage!")  # unknown frame type
        await wait_until(lambda: p.address is None)
        await p.publish("t", b"y")
    assert len(node.conns) == 2


async def test_publish_outside_async_with_is_an_error() -> None:
    p = trionsq.Producer(["nsqd:4150"])
    with pytest.raises(RuntimeError):
        await p.publish("t", b"x")


def test_producer_requires_an_address() -> None:
    with pytest.raises(ValueError):
        trionsq.Producer([])


async def test_cancelled_publish_keeps_responses_matched(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    node = MiniNSQD(nursery)
    node.pub_delay = 1.0
    async with producer(node) as p:
        with trio.move_on_after(0.5):
            await p.publish("t", b"abandoned")  # written; its response is not awaited
        await p.publish("t", b"next")  # gets its own response, not the abandoned one's
        assert trio.current_time() == pytest.approx(2.0)
    assert [b for _, b in node.published] == [b"abandoned", b"next"]
    assert len(node.conns) == 1


async def test_fatal_error_in_a_pipeline(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    node = MiniNSQD(nursery)
    node.pub_errors["bad"] = trionsq.PubFailedError("nope")
    node.pub_delay = 0.1
    outcomes: dict[str, object] = {}

    async def publish(topic: str, delay: float) -> None:
        await trio.sleep(delay)  # fixes the order on the wire
        try:
            await p.publish(topic, b"x")
            outcomes[topic] = "ok"
        except trionsq.NSQError as exc:
            outcomes[topic] = type(exc)

    async with producer(node) as p:
        await p.publish("warm", b"up")
        async with trio.open_nursery() as publishers:
            publishers.start_soon(publish, "first", 0.0)
            publishers.start_soon(publish, "bad", 0.001)
            publishers.start_soon(publish, "after", 0.002)
    assert outcomes == {
        "first": "ok",
        "bad": trionsq.PubFailedError,
        "after": trionsq.ConnectionClosedError,
    }


async def test_stats_count_messages_batches_errors_and_the_window(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    node = MiniNSQD(nursery)
    node.pub_errors["bad"] = trionsq.PubFailedError("nope")
    node.pub_delay = 1.0
    async with producer(node, publish_window=3) as p:
        assert p.stats == trionsq.ProducerStats(window=3)
        await p.publish("t", b"one")
        await p.multi_publish("t", [b"two", b"three"])
        await p.deferred_publish("t", b"four", 1.0)
        with pytest.raises(trionsq.PubFailedError):
            await p.publish("bad", b"x")
        with pytest.raises(TypeError):
            await p.publish("t", "not bytes")  # type: ignore[arg-type]  # refused locally
        async with trio.open_nursery() as publishers:
            for i in range(5):
                publishers.start_soon(p.publish, "t", b"%d" % i)
            await trio.sleep(0.5)
            assert p.stats.in_flight == 3  # the window is full, two wait for a place
        assert p.stats == trionsq.ProducerStats(
            published=9, batches=1, errors=1, in_flight=0, window=3
        )


async def test_window_hands_places_over_in_order(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    """Publishes waiting for a place in the window get one first come, first
    served, and a cancelled waiter gives up neither its place nor anyone's."""
    node = MiniNSQD(nursery)
    node.pub_delay = 1.0
    async with producer(node, publish_window=1) as p:
        async with trio.open_nursery() as publishers:
            for i in range(4):
                publishers.start_soon(p.publish, "t", b"%d" % i)
                await trio.sleep(0.01)  # fixes the order of arrival
            with trio.move_on_after(0.5):
                await p.publish("t", b"cancelled")  # waits for a place, gives up
        assert p.stats.in_flight == 0
        await p.publish("t", b"last")
    assert [b for _, b in node.published] == [b"0", b"1", b"2", b"3", b"last"]
