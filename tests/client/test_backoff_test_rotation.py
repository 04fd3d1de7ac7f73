"""A backoff test must not stick to an nsqd that has nothing to send."""

from __future__ import annotations

import random

import trio
import trio.testing

import fakensq
import trionsq


async def run_poisoned(
    connector_nodes: dict[str, fakensq.NSQD],
    nursery: trio.Nursery,
    **options: object,
) -> tuple[trionsq.ConsumerStats, list[bytes]]:
    """One poison message on nsqd a, then five good ones on b; returns the consumer's
    stats after ten virtual minutes and the bodies handled."""

    async def connector(host: str, port: int) -> trio.abc.Stream:
        client, server = trio.testing.memory_stream_pair()
        nursery.start_soon(connector_nodes[host].handle_stream, server)
        return client

    async with trionsq.Producer(nsqd_tcp_addresses=["a:1"], connector=connector) as p:
        await p.publish("t", b"poison")
    handled: list[bytes] = []

    def handler(message: trionsq.Message) -> None:
        handled.append(message.body)
        if message.body == b"poison":
            raise RuntimeError("boom")

    async with trionsq.Consumer(
        "t",
        "c",
        nsqd_tcp_addresses=["a:1", "b:1"],
        connector=connector,
        handler=handler,
        max_in_flight=10,
        backoff=trionsq.BackoffPolicy(base=1, max=2, jitter=0),
        rng=random.Random(0),
        **options,  # type: ignore[arg-type]
    ) as consumer:
        await trio.sleep(10)  # the poison fails and the consumer backs off
        async with trionsq.Producer(nsqd_tcp_addresses=["b:1"], connector=connector) as p:
            await p.multi_publish("t", [b"on-b-%d" % i for i in range(5)])
        await trio.sleep(600)
        return consumer.stats, handled


async def test_the_test_rdy_moves_off_an_nsqd_with_nothing_to_send(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with (
        fakensq.NSQD(tcp_address="", http_address="") as a,
        fakensq.NSQD(tcp_address="", http_address="") as b,
        trio.open_nursery() as nursery,
    ):
        # The poison is requeued for an hour: nsqd a has nothing to send meanwhile.
        stats, handled = await run_poisoned(
            {"a": a, "b": b}, nursery, default_requeue_delay=3600.0, max_requeue_delay=3600.0
        )
        assert sorted(m for m in handled if m.startswith(b"on-b")) == [
            b"on-b-%d" % i for i in range(5)
        ]
        assert b.topics["t"].channels["c"].depth() == 0
        assert stats.backoff_state == "normal"
        nursery.cancel_scope.cancel()


async def test_backoff_test_moves_on_and_a_give_up_ends_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with (
        fakensq.NSQD(tcp_address="", http_address="") as a,
        fakensq.NSQD(tcp_address="", http_address="") as b,
        trio.open_nursery() as nursery,
    ):
        # Tried twice, the poison is given up: that ends the backoff test.
        stats, handled = await run_poisoned(
            {"a": a, "b": b}, nursery, max_attempts=2, default_requeue_delay=0.1
        )
        assert stats.given_up == 1
        assert stats.backoff_state == "normal"
        assert sorted(m for m in handled if m.startswith(b"on-b")) == [
            b"on-b-%d" % i for i in range(5)
        ]
        assert a.topics["t"].channels["c"].depth() == 0
        assert b.topics["t"].channels["c"].depth() == 0
        nursery.cancel_scope.cancel()
