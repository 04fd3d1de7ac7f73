"""fakensq's nsqd over in-memory streams: the whole client in virtual time."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
import trio.testing

import fakensq
import trionsq

from ..support.waiting import wait_until

NSQD: Any = getattr(fakensq, "NSQD", None)
pytestmark = pytest.mark.skipif(NSQD is None, reason="fakensq.NSQD is not available")


class InMemory:
    """A connector that serves each connection with ``nsqd.handle_stream``."""

    def __init__(self, nsqd: Any, nursery: trio.Nursery) -> None:
        self.nsqd = nsqd
        self.nursery = nursery

    async def __call__(self, host: str, port: int) -> trio.abc.Stream:
        client, server = trio.testing.memory_stream_pair()
        self.nursery.start_soon(self.nsqd.handle_stream, server)
        return client


@pytest.fixture
async def connector(nursery: trio.Nursery, tmp_path: Any) -> AsyncIterator[InMemory]:
    async with NSQD(
        tcp_address="", http_address="", data_path=str(tmp_path), msg_timeout=10.0
    ) as n:
        yield InMemory(n, nursery)


def options(connector: InMemory, **extra: Any) -> dict[str, Any]:
    return {"nsqd_tcp_addresses": ["nsqd:4150"], "connector": connector, **extra}


async def test_untouched_message_times_out_and_comes_back(
    connector: InMemory, autojump_clock: trio.testing.MockClock
) -> None:
    async with trionsq.Producer(**options(connector)) as producer:
        await producer.publish("topic", b"slow")
    async with trionsq.Consumer("topic", "chan", **options(connector)) as consumer:
        first = await consumer.__anext__()
        start = trio.current_time()
        second = await consumer.__anext__()  # nobody touched it: nsqd redelivers
        assert trio.current_time() - start == pytest.approx(10.0, abs=1.5)
        assert (second.id, second.attempts) == (first.id, 2)
        await second.finish()
        await first.finish()  # too late: E_FIN_FAILED, logged, not fatal
        await trio.sleep(1)
        assert consumer.connections == ["nsqd:4150"]


async def test_touch_keeps_a_message(
    connector: InMemory, autojump_clock: trio.testing.MockClock
) -> None:
    async with trionsq.Producer(**options(connector)) as producer:
        await producer.publish("topic", b"long job")
    async with trionsq.Consumer("topic", "chan", **options(connector)) as consumer:
        message = await consumer.__anext__()
        for _ in range(5):
            await trio.sleep(8)
            await message.touch()
        await message.finish()
        with trio.move_on_after(30):
            again = await consumer.__anext__()
            pytest.fail(f"redelivered despite the touches: {again!r}")
    assert consumer.stats.finished == 1


async def test_deferred_publish_and_requeue_delay_in_virtual_time(
    connector: InMemory, autojump_clock: trio.testing.MockClock
) -> None:
    async with trionsq.Producer(**options(connector)) as producer:
        await producer.deferred_publish("topic", b"later", 30.0)
    start = trio.current_time()
    async with trionsq.Consumer("topic", "chan", **options(connector, backoff=False)) as c:
        message = await c.__anext__()
        assert trio.current_time() - start == pytest.approx(30.0, abs=1.5)
        await message.requeue(delay=5.0)
        requeued_at = trio.current_time()
        again = await c.__anext__()
        assert trio.current_time() - requeued_at == pytest.approx(5.0, abs=1.5)
        await again.finish()


async def test_backoff_against_nsqd(
    connector: InMemory, autojump_clock: trio.testing.MockClock
) -> None:
    policy = trionsq.BackoffPolicy(base=2.0, max=16.0, jitter=0.0)
    failures = 3
    handled: list[tuple[float, int]] = []

    def handler(message: trionsq.Message) -> None:
        nonlocal failures
        handled.append((trio.current_time(), message.attempts))
        if failures:
            failures -= 1
            raise RuntimeError("failing")

    async with trionsq.Producer(**options(connector)) as producer:
        await producer.publish("topic", b"x")
    async with trionsq.Consumer(
        "topic",
        "chan",
        **options(connector, backoff=policy, default_requeue_delay=0.0, max_in_flight=5),
        handler=handler,
    ) as c:
        await wait_until(lambda: c.stats.finished == 1, limit=120, step=0.01)
        assert c.stats.requeued == 3
        # Three failures (level 3), then one success: level 2, pausing 4 s.
        assert (c.stats.backoff_state, c.stats.backoff_level) == ("paused", 2)
    times = [t - handled[0][0] for t, _ in handled]
    # Pauses of 2, 4 and 8 s between deliveries, each retried by a single RDY 1.
    assert times == pytest.approx([0.0, 2.0, 6.0, 14.0], abs=0.1)
    assert [a for _, a in handled] == [1, 2, 3, 4]


async def test_rdy_never_exceeds_nsqds_max_rdy_count(
    nursery: trio.Nursery, tmp_path: Any, autojump_clock: trio.testing.MockClock
) -> None:
    async with NSQD(
        tcp_address="", http_address="", data_path=str(tmp_path), max_rdy_count=3
    ) as nsqd:
        connector = InMemory(nsqd, nursery)
        async with trionsq.Producer(**options(connector)) as producer:
            await producer.multi_publish("topic", [b"%d" % i for i in range(20)])
        in_flight = peak = 0

        async def handler(message: trionsq.Message) -> None:
            nonlocal in_flight, peak
            in_flight += 1
            peak = max(peak, in_flight)
            await trio.sleep(1)
            in_flight -= 1

        async with trionsq.Consumer(
            "topic", "chan", **options(connector, max_in_flight=10), handler=handler
        ) as c:
            await wait_until(lambda: c.stats.finished == 20, limit=100, step=0.1)
            assert c.stats.connections["nsqd:4150"].max_rdy_count == 3
            assert c.stats.rdy == 3
        assert peak == 3
        assert len(c.connections) == 0
