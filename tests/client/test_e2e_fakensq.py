"""End to end over real loopback TCP against fakensq's nsqd."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
import trustme

import fakensq
import trionsq

from .minisrv import wait_for

NSQD: Any = getattr(fakensq, "NSQD", None)
pytestmark = pytest.mark.skipif(NSQD is None, reason="fakensq.NSQD is not available")


@pytest.fixture
async def nsqd() -> AsyncIterator[Any]:
    async with NSQD(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0") as node:
        yield node


async def collect(address: str, count: int, **options: Any) -> list[trionsq.Message]:
    got: list[trionsq.Message] = []
    async with trionsq.Consumer(
        "topic", "chan", nsqd_tcp_addresses=[address], handler=got.append, **options
    ):
        await wait_for(lambda: len(got) >= count, limit=10)
    return got


async def test_publish_and_consume(nsqd: Any) -> None:
    async with trionsq.Producer(nsqd_tcp_addresses=[nsqd.tcp_address]) as producer:
        await producer.publish("topic", b"one")
        await producer.multi_publish("topic", [b"two", b"three"])
        async with trio.open_nursery() as publishers:
            for i in range(50):
                publishers.start_soon(producer.publish, "topic", b"p%d" % i)
        await producer.deferred_publish("topic", b"later", 0.2)
    got = await collect(nsqd.tcp_address, 54, max_in_flight=16)
    bodies = sorted(m.body for m in got)
    assert bodies == sorted([b"one", b"two", b"three", b"later", *(b"p%d" % i for i in range(50))])
    assert all(m.attempts == 1 and len(m.id) == 16 and m.timestamp > 0 for m in got)


async def test_server_side_errors_are_typed(nsqd: Any) -> None:
    async with NSQD(
        tcp_address="127.0.0.1:0", http_address="127.0.0.1:0", max_msg_size=10
    ) as small:
        async with trionsq.Producer([small.tcp_address]) as producer:
            with pytest.raises(trionsq.BadMessageError):
                await producer.publish("topic", b"x" * 100)
            await producer.publish("topic", b"fits")  # reconnected after the fatal error


async def test_requeue_redelivers_with_more_attempts(nsqd: Any) -> None:
    async with trionsq.Producer([nsqd.tcp_address]) as producer:
        await producer.publish("topic", b"again")
    async with trionsq.Consumer(
        "topic", "chan", nsqd_tcp_addresses=[nsqd.tcp_address], backoff=False
    ) as consumer:
        with trio.fail_after(10):
            first = await consumer.__anext__()
            await first.requeue(delay=0)
            second = await consumer.__anext__()
            await second.touch()
            await second.finish()
    assert (first.id, first.attempts) == (second.id, 1)
    assert second.attempts == 2


@pytest.mark.parametrize("compression", ["snappy", "deflate"])
async def test_compression(nsqd: Any, compression: str) -> None:
    options = {compression: True}
    async with trionsq.Producer([nsqd.tcp_address], **options) as producer:
        await producer.multi_publish("topic", [b"z" * 5000, b"y" * 10])
    got = await collect(nsqd.tcp_address, 2, max_in_flight=2, **options)
    assert sorted(m.body for m in got) == [b"y" * 10, b"z" * 5000]


async def test_tls_and_auth() -> None:
    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    client = ssl.create_default_context()
    ca.configure_trust(client)
    secrets: list[str] = []

    def auth(query: dict[str, str]) -> dict[str, Any]:
        secrets.append(query["secret"])
        return {
            "ttl": 3600,
            "identity": "tester",
            "authorizations": [
                {"topic": ".*", "channels": [".*"], "permissions": ["subscribe", "publish"]}
            ],
        }

    async with NSQD(
        tcp_address="127.0.0.1:0", http_address="127.0.0.1:0", ssl_context=server, auth_handler=auth
    ) as node:
        options: dict[str, Any] = {"tls": client, "auth_secret": "open-sesame", "snappy": True}
        async with trionsq.Producer([node.tcp_address], **options) as producer:
            await producer.publish("topic", b"secret message")
        got = await collect(node.tcp_address, 1, **options)
    assert [m.body for m in got] == [b"secret message"]
    assert secrets and set(secrets) == {"open-sesame"}


async def test_clean_close_finishes_only_what_handlers_finished(nsqd: Any) -> None:
    # nsqd v1.3.0 leaves a gone consumer's messages in flight until msg-timeout;
    # fakensq's opt-in requeue_on_disconnect stands in until the Consumer requeues
    # what it cannot settle when it closes (issue 13); then this line can go.
    nsqd.requeue_on_disconnect = True
    async with trionsq.Producer([nsqd.tcp_address]) as producer:
        await producer.multi_publish("topic", [b"slow", b"stuck"])
    slow_started = trio.Event()

    async def handler(message: trionsq.Message) -> None:
        if message.body == b"slow":
            slow_started.set()
            await trio.sleep(0.2)
        else:
            await trio.sleep_forever()

    async with trionsq.Consumer(
        "topic",
        "chan",
        nsqd_tcp_addresses=[nsqd.tcp_address],
        handler=handler,
        max_in_flight=2,
        close_timeout=0.5,
    ) as consumer:
        with trio.fail_after(10):
            await slow_started.wait()
            await wait_for(lambda: consumer.stats.received == 2)
    assert consumer.stats.finished == 1
    # The stuck one was not finished: another consumer gets it again.
    got = await collect(nsqd.tcp_address, 1)
    assert [(m.body, m.attempts) for m in got] == [(b"stuck", 2)]


async def test_many_nsqds_drained_with_small_max_in_flight() -> None:
    async with (
        NSQD(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0") as a,
        NSQD(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0") as b,
        NSQD(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0") as c,
    ):
        nodes = [a, b, c]
        for index, node in enumerate(nodes):
            async with trionsq.Producer([node.tcp_address]) as producer:
                await producer.multi_publish("topic", [b"%d-%d" % (index, i) for i in range(5)])
        got: list[bytes] = []
        async with trionsq.Consumer(
            "topic",
            "chan",
            nsqd_tcp_addresses=[n.tcp_address for n in nodes],
            handler=lambda m: got.append(m.body),
            max_in_flight=2,
            low_rdy_idle_timeout=0.2,
        ):
            await wait_for(lambda: len(got) == 15, limit=20)
    assert sorted(got) == sorted(b"%d-%d" % (n, i) for n in range(3) for i in range(5))


async def test_producer_fails_over_when_an_nsqd_stops(nursery: trio.Nursery) -> None:
    stop_first = trio.Event()

    async def run_first(*, task_status: trio.TaskStatus[Any]) -> None:
        async with NSQD(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0") as node:
            task_status.started(node)
            await stop_first.wait()

    first = await nursery.start(run_first)
    async with NSQD(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0") as second:
        addresses = [first.tcp_address, second.tcp_address]
        async with trionsq.Producer(addresses, connect_timeout=2.0) as producer:
            await producer.publish("topic", b"to-first")
            assert producer.address == first.tcp_address
            stop_first.set()
            await wait_for(lambda: producer.address is None, limit=10)
            await producer.publish("topic", b"to-second")
            assert producer.address == second.tcp_address
        got = await collect(second.tcp_address, 1)
    assert [m.body for m in got] == [b"to-second"]


async def test_discovery_through_fakensq_lookupds() -> None:
    cluster_module = pytest.importorskip("fakensq.cluster")
    async with cluster_module.Cluster(nsqd=2, lookupd=2) as cluster:
        for index, address in enumerate(cluster.nsqd_tcp_addresses):
            async with trionsq.Producer([address]) as producer:
                await producer.publish("topic", b"from-%d" % index)
        got: list[bytes] = []
        async with trionsq.Consumer(
            "topic",
            "chan",
            lookupd_http_addresses=cluster.lookupd_http_addresses,
            lookupd_poll_interval=0.1,
            handler=lambda m: got.append(m.body),
            max_in_flight=4,
        ) as consumer:
            await wait_for(lambda: len(got) == 2, limit=10)
            assert consumer.connections == sorted(cluster.nsqd_tcp_addresses)
    assert sorted(got) == [b"from-0", b"from-1"]
