"""trionsq.aio end to end in asyncio programs, on fakensq and on the real nsqd v1.3.0."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest
import trio
import trio.lowlevel

import trionsq
from trionsq import aio
from trionsq.aio import guest

from ..support.nodes import BlockingDaemons, BlockingNode
from ..support.tls import Pki
from ..support.waiting import wait_until_asyncio, wait_until_blocking
from .conftest import FAST_RECONNECT, AuthServer, own_connector, registered_nsqds, stats

pytestmark = pytest.mark.usefixtures("no_threads_left")

T = TypeVar("T")


def run(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """asyncio.run, checking that no task of ours is left when main returns."""

    async def checked() -> T:
        result = await main()
        current = asyncio.current_task()
        left = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
        assert not left, f"tasks left behind: {left}"
        return result

    return asyncio.run(checked())


async def consume(
    daemon: BlockingNode, count: int, topic: str = "topic", **options: Any
) -> list[aio.Message]:
    got: list[aio.Message] = []
    options.setdefault("max_in_flight", 16)
    async with aio.Consumer(
        topic, "chan", nsqd_tcp_addresses=[daemon.tcp_address], **options
    ) as consumer:
        async for message in consumer:
            await message.finish()
            got.append(message)
            if len(got) == count:
                break
    return got


def test_publish_and_consume_exact_sets(daemon: BlockingNode) -> None:
    async def main() -> list[aio.Message]:
        async with aio.Producer([daemon.tcp_address]) as producer:
            await producer.publish("topic", b"one")
            await producer.multi_publish("topic", [b"two", b"three"])
            await producer.deferred_publish("topic", b"later", 0.2)
            await asyncio.gather(*(producer.publish("topic", b"p%d" % i) for i in range(50)))
            assert producer.stats.published == 54
        return await consume(daemon, 54)

    got = run(main)
    expected = {b"one", b"two", b"three", b"later", *(b"p%d" % i for i in range(50))}
    assert sorted(m.body for m in got) == sorted(expected)
    assert all(m.attempts == 1 and m.responded == "finished" for m in got)
    wait_until_blocking(lambda: stats(daemon, "topic", "chan").get("in_flight_count") == 0)
    assert stats(daemon, "topic", "chan")["depth"] == 0


def test_async_and_sync_handlers(daemon: BlockingNode) -> None:
    seen: list[bytes] = []

    async def main() -> None:
        async with aio.Producer([daemon.tcp_address]) as producer:
            await producer.multi_publish("topic", [b"%d" % i for i in range(40)])
        done = asyncio.Event()
        running = 0
        most = 0

        async def handler(message: aio.Message) -> None:
            nonlocal running, most
            running += 1
            most = max(most, running)
            await asyncio.sleep(0.005)
            running -= 1
            seen.append(message.body)
            if len(seen) == 40:
                done.set()

        async with aio.Consumer(
            "topic",
            "chan",
            nsqd_tcp_addresses=[daemon.tcp_address],
            handler=handler,
            max_in_flight=8,
        ):
            await asyncio.wait_for(done.wait(), 20)
        assert 1 < most <= 8
        # A plain function works too (it runs in the asyncio loop).
        async with aio.Producer([daemon.tcp_address]) as producer:
            await producer.publish("sync", b"s")
        sync_seen: list[bytes] = []
        async with aio.Consumer(
            "sync",
            "chan",
            nsqd_tcp_addresses=[daemon.tcp_address],
            handler=lambda m: sync_seen.append(m.body),
        ):
            await wait_until_asyncio(lambda: sync_seen == [b"s"])

    run(main)
    assert sorted(seen) == sorted(b"%d" % i for i in range(40))


def test_requeue_give_up_and_a_failing_handler(daemon: BlockingNode) -> None:
    given_up: list[tuple[bytes, int]] = []
    attempts: list[int] = []

    async def main() -> None:
        async with aio.Producer([daemon.tcp_address]) as producer:
            await producer.publish("topic", b"poison")
            await producer.publish("fails", b"once")

        async def give_up(message: aio.Message) -> None:
            await asyncio.sleep(0)
            given_up.append((message.body, message.attempts))

        async with aio.Consumer(
            "topic",
            "chan",
            nsqd_tcp_addresses=[daemon.tcp_address],
            max_attempts=2,
            backoff=False,
            give_up=give_up,
        ) as consumer:
            async for message in consumer:
                await message.touch()
                await message.requeue(0)
                if message.attempts == 2:
                    break
            await wait_until_asyncio(lambda: bool(given_up))

        async def handler(message: aio.Message) -> None:
            attempts.append(message.attempts)
            if message.attempts == 1:
                raise RuntimeError("not yet")

        async with aio.Consumer(
            "fails",
            "chan",
            nsqd_tcp_addresses=[daemon.tcp_address],
            handler=handler,
            backoff=trionsq.BackoffPolicy(base=0.1, max=0.2, jitter=0.0),
            default_requeue_delay=0.05,
        ) as consumer:
            await wait_until_asyncio(lambda: consumer.stats.finished == 1)
            assert consumer.stats.requeued == 1

    run(main)
    assert given_up == [(b"poison", 3)]
    assert attempts == [1, 2]
    wait_until_blocking(lambda: stats(daemon, "topic", "chan").get("depth") == 0)


def test_leaving_is_prompt_and_loses_nothing(daemon: BlockingNode) -> None:
    async def main() -> tuple[list[bytes], float, aio.Message]:
        async with aio.Producer([daemon.tcp_address]) as producer:
            await producer.multi_publish("topic", [b"%d" % i for i in range(30)])
        first: list[bytes] = []
        async with aio.Consumer(
            "topic", "chan", nsqd_tcp_addresses=[daemon.tcp_address], max_in_flight=10
        ) as consumer:
            async for message in consumer:
                first.append(message.body)
                if len(first) == 3:
                    unfinished = message
                    break
                await message.finish()
            await wait_until_asyncio(lambda: consumer.stats.received >= 10)
            began = time.monotonic()
        return first, time.monotonic() - began, unfinished

    first, took, unfinished = run(main)
    assert took < 2.0, f"leaving took {took:.2f} s"
    assert unfinished.responded == "requeued"
    channel = stats(daemon, "topic", "chan")
    assert channel["in_flight_count"] == 0 and channel["timeout_count"] == 0
    rest = asyncio.run(consume(daemon, 28))
    assert sorted([*first[:2], *(m.body for m in rest)]) == sorted(b"%d" % i for i in range(30))


def test_cancelling_the_task_that_holds_them_closes_them(daemon: BlockingNode) -> None:
    async def main() -> tuple[list[aio.Message], float]:
        async with aio.Producer([daemon.tcp_address]) as producer:
            await producer.multi_publish("topic", [b"a", b"b", b"c"])
        held: list[aio.Message] = []
        handler_started = asyncio.Event()

        async def stuck(message: aio.Message) -> None:
            handler_started.set()
            await asyncio.sleep(3600)

        async def holder() -> None:
            async with (
                aio.Producer([daemon.tcp_address]),
                aio.Consumer(
                    "topic", "chan", nsqd_tcp_addresses=[daemon.tcp_address], max_in_flight=3
                ) as consumer,
                aio.Consumer(
                    "other", "chan", nsqd_tcp_addresses=[daemon.tcp_address], handler=stuck
                ),
            ):
                async for message in consumer:
                    held.append(message)  # never settled

        async with aio.Producer([daemon.tcp_address]) as producer:
            await producer.publish("other", b"x")
        task = asyncio.create_task(holder())
        await wait_until_asyncio(lambda: len(held) == 3)
        await asyncio.wait_for(handler_started.wait(), 20)
        began = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return held, time.monotonic() - began

    held, took = run(main)
    assert took < 3.0, f"closing took {took:.2f} s"
    assert all(m.responded == "requeued" for m in held)
    assert stats(daemon, "topic", "chan")["in_flight_count"] == 0
    assert stats(daemon, "other", "chan")["in_flight_count"] == 0
    got = asyncio.run(consume(daemon, 3))
    assert sorted(m.body for m in got) == [b"a", b"b", b"c"]
    assert [m.attempts for m in asyncio.run(consume(daemon, 1, topic="other"))] == [2]


def test_an_nsqd_killed_and_restarted(nodes: BlockingDaemons) -> None:
    daemon = nodes.nsqd()

    async def main() -> list[bytes]:
        received: list[bytes] = []
        async with (
            aio.Producer([daemon.tcp_address], connect_timeout=1.0) as producer,
            aio.Consumer(
                "topic",
                "chan",
                nsqd_tcp_addresses=[daemon.tcp_address],
                handler=lambda m: received.append(m.body),
                reconnect_backoff=FAST_RECONNECT,
            ) as consumer,
        ):
            await consumer.wait_connected()
            await producer.multi_publish("topic", [b"before-%d" % i for i in range(5)])
            await wait_until_asyncio(lambda: len(received) == 5)
            await asyncio.to_thread(daemon.kill)
            with pytest.raises(trionsq.NSQConnectionError):
                await producer.publish("topic", b"lost")
            await asyncio.to_thread(daemon.start)
            await producer.multi_publish("topic", [b"after-%d" % i for i in range(5)])
            await wait_until_asyncio(lambda: len(received) == 10)
        return received

    received = run(main)
    assert sorted(received) == sorted(
        [b"before-%d" % i for i in range(5)] + [b"after-%d" % i for i in range(5)]
    )


@pytest.mark.parametrize("compression", ["snappy", "deflate"])
def test_tls_compression_and_auth(
    nodes: BlockingDaemons, pki: Pki, auth_server: AuthServer, compression: str
) -> None:
    daemon = nodes.nsqd(*pki.nsqd_flags(f"--auth-http-address={auth_server.address}"))
    options: dict[str, Any] = {
        "tls": pki.client_context(),
        "auth_secret": "open-sesame",
        compression: True,
    }

    async def main() -> list[aio.Message]:
        async with aio.Producer([daemon.tcp_address], **options) as producer:
            await producer.multi_publish("topic", [b"z" * 5000, b"secret"])
        return await consume(daemon, 2, **options)

    got = run(main)
    assert sorted(m.body for m in got) == [b"secret", b"z" * 5000]
    assert set(auth_server.seen) == {"open-sesame"}


def test_refusals_are_typed_and_closed_clients_raise(nodes: BlockingDaemons) -> None:
    daemon = nodes.nsqd("--max-msg-size=10")

    async def main() -> None:
        producer = aio.Producer([daemon.tcp_address])
        with pytest.raises(RuntimeError, match="async with"):
            await producer.publish("topic", b"x")
        async with producer:
            with pytest.raises(trionsq.BadMessageError):
                await producer.publish("topic", b"x" * 100)
            with pytest.raises(trionsq.BadTopicError):
                await producer.publish("bad topic!", b"x")
            await producer.publish("topic", b"fits")
        with pytest.raises(aio.ClientClosedError):
            await producer.publish("topic", b"x")
        consumer = aio.Consumer("topic", "chan", nsqd_tcp_addresses=[daemon.tcp_address])
        async with consumer:
            pass
        with pytest.raises(aio.ClientClosedError):
            await consumer.__anext__()
        with pytest.raises(RuntimeError, match="only once"):
            async with consumer:
                pass

    run(main)


@pytest.mark.parametrize("guest", [True, False], ids=["guest", "thread"])
def test_no_thread_or_trio_run_outlives_the_block(daemon: BlockingNode, guest: bool) -> None:
    during: set[threading.Thread] = set()
    started: set[threading.Thread] = set()  # during the block, not before it

    async def main() -> set[threading.Thread]:
        before = set(threading.enumerate())
        async with (
            aio.Producer([daemon.tcp_address], guest=guest) as producer,
            aio.Consumer(
                "topic", "chan", nsqd_tcp_addresses=[daemon.tcp_address], guest=guest
            ) as consumer,
        ):
            await producer.publish("topic", b"x")
            async for message in consumer:
                await message.finish()
                break
            during.update(threading.enumerate())
            started.update(during - before)
        # Every thread started for the clients has ended (joined) by now,
        # Trio's I/O wait worker of a guest run included; no Trio run is left.
        assert not trio.lowlevel.in_trio_run()
        return {t for t in threading.enumerate() if t not in before}

    assert run(main) == set()
    names = {t.name for t in during}
    if guest:  # one Trio run, no thread of its own; Trio's I/O wait worker
        # (Threads of earlier tests on this xdist worker may still run: the
        # Spark sink's producer thread lives until exit, by design.)
        assert not any(t.name.startswith("trionsq") for t in started)
        assert any(name.startswith("Trio thread") for name in names)
    else:
        assert {"trionsq-asyncio-producer", "trionsq-asyncio-consumer"} <= names


def test_clients_of_one_loop_share_its_guest_run(daemon: BlockingNode) -> None:
    # (producers given a connector of their own: the Trio Producer publishes,
    # in the guest run; by default the loop publishes itself, with no run)
    hosted = {"connector": own_connector}

    async def main() -> None:
        async with aio.Producer([daemon.tcp_address], **hosted) as first:
            token = trio.lowlevel.current_trio_token()  # the guest run's, on this thread
            async with aio.Producer([daemon.tcp_address], **hosted) as second:
                assert trio.lowlevel.current_trio_token() is token
                await second.publish("topic", b"2")
            await first.publish("topic", b"1")  # the run outlived the second client
        assert not trio.lowlevel.in_trio_run()
        async with aio.Producer([daemon.tcp_address]) as own:  # publishes with no run
            await own.publish("topic", b"own")
            assert not trio.lowlevel.in_trio_run()
        async with aio.Producer([daemon.tcp_address], **hosted) as third:  # a new run
            assert trio.lowlevel.current_trio_token() is not token
            await third.publish("topic", b"3")

    run(main)
    wait_until_blocking(lambda: stats(daemon, "topic").get("message_count") == 4)


def test_discovery_and_failover(nodes: BlockingDaemons) -> None:
    lookupd, nsqds = registered_nsqds(nodes)
    first, second = (nsqd.tcp_address for nsqd in nsqds)

    async def main() -> list[bytes]:
        received: list[bytes] = []
        async with aio.Consumer(
            "topic",
            "chan",
            lookupd_http_addresses=[lookupd.http_address],
            lookupd_poll_interval=0.1,
            handler=lambda m: received.append(m.body),
        ) as consumer:
            async with aio.Producer([first, second], connect_timeout=1.0) as producer:
                await producer.publish("topic", b"one")
                assert producer.address == first
                await wait_until_asyncio(lambda: consumer.connections == [first])
                # "one" reaches the consumer before its nsqd (memory only) dies:
                # subscribed is not yet delivered (a race the real nsqd loses
                # now and then under load).
                await wait_until_asyncio(lambda: received == [b"one"])
                await asyncio.to_thread(nsqds[0].kill)
                await wait_until_asyncio(lambda: producer.address is None)
                await producer.publish("topic", b"two")  # failed over
                assert producer.address == second
            await wait_until_asyncio(
                lambda: consumer.connections == [second]
            )  # found through lookupd
            await wait_until_asyncio(lambda: sorted(received) == [b"one", b"two"])
        return received

    run(main)


@pytest.fixture
def default_sigint() -> Iterator[None]:
    """Python's own SIGINT handler for the test (a test runner may have its own)."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are handled in the main thread only")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("default_sigint")
def test_ctrl_c_stays_the_asyncio_programs_and_closes_them(daemon: BlockingNode) -> None:
    held: list[aio.Message] = []

    async def main() -> None:
        async with aio.Producer([daemon.tcp_address]) as producer:
            await producer.multi_publish("topic", [b"a", b"b", b"c"])
        async with aio.Consumer(
            "topic", "chan", nsqd_tcp_addresses=[daemon.tcp_address], max_in_flight=3
        ) as consumer:
            async for message in consumer:
                held.append(message)  # never settled
                if len(held) == 3:
                    # asyncio.run's handler (not Trio's) gets it: the main task
                    # is cancelled, and asyncio.run raises KeyboardInterrupt.
                    signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
                    await asyncio.sleep(3600)

    with pytest.raises(KeyboardInterrupt):
        asyncio.run(main())
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert all(m.responded == "requeued" for m in held)
    assert not trio.lowlevel.in_trio_run()
    wait_until_blocking(lambda: stats(daemon, "topic", "chan").get("in_flight_count") == 0)
    assert sorted(m.body for m in asyncio.run(consume(daemon, 3))) == [b"a", b"b", b"c"]


@pytest.mark.usefixtures("default_sigint")
def test_a_guest_run_leaves_the_sigint_handler_alone(daemon: BlockingNode) -> None:
    # Without asyncio.run, Python's default handler is in place: Trio would
    # install its own for its run; the guest run must not.
    loop = asyncio.new_event_loop()
    try:

        async def main() -> None:
            async with aio.Producer([daemon.tcp_address]) as producer:
                assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
                await producer.publish("topic", b"x")

        loop.run_until_complete(main())
    finally:
        loop.close()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_loop_hosting_a_trio_guest_run_of_its_own_needs_guest_false(daemon: BlockingNode) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[object] = loop.create_future()
        stop = trio.Event()
        trio.lowlevel.start_guest_run(
            stop.wait,
            run_sync_soon_threadsafe=loop.call_soon_threadsafe,
            done_callback=ended.set_result,
            host_uses_signal_set_wakeup_fd=True,
        )
        token = trio.lowlevel.current_trio_token()
        try:
            with pytest.raises(aio.GuestUnavailableError, match="guest=False"):
                async with aio.Producer([daemon.tcp_address], connector=own_connector):
                    pass
            async with aio.Producer([daemon.tcp_address], guest=False) as producer:
                await producer.publish("topic", b"x")
            # The loop's own publishing needs no Trio run at all.
            async with aio.Producer([daemon.tcp_address]) as producer:
                await producer.publish("topic", b"y")
        finally:
            token.run_sync_soon(stop.set)
            await ended

    run(main)
    wait_until_blocking(lambda: stats(daemon, "topic").get("message_count") == 2)


def test_clients_of_one_run_come_and_go_independently(daemon: BlockingNode) -> None:
    async def main() -> None:
        published = asyncio.Event()

        async def short_lived(hold: bool) -> None:
            async with aio.Producer([daemon.tcp_address], connector=own_connector) as producer:
                await producer.publish("topic", b"short")
                published.set()
                if hold:
                    await asyncio.sleep(3600)

        async with aio.Producer([daemon.tcp_address], connector=own_connector) as keeper:
            task = asyncio.create_task(short_lived(hold=True))
            await asyncio.wait_for(published.wait(), 20)
            await keeper.publish("topic", b"keeper")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # The shared run goes on for the client still in its block,
            # and takes new ones, entered at once in several tasks.
            await keeper.publish("topic", b"keeper")
            await asyncio.gather(*(short_lived(hold=False) for _ in range(3)))
            await keeper.publish("topic", b"keeper")
        assert not trio.lowlevel.in_trio_run()

        # A client entering while the last one of a run leaves (the run
        # stopping) waits for its end and starts a new one.
        loop = asyncio.get_running_loop()
        left = asyncio.create_task(short_lived(hold=False))
        while (shared := guest._runs.get(loop)) is None or not shared.stopping:
            assert not left.done()
            await asyncio.sleep(0)
        await short_lived(hold=False)
        await left
        assert shared.ended.done() and guest._runs.get(loop) is None
        assert not trio.lowlevel.in_trio_run()

    run(main)
    wait_until_blocking(lambda: stats(daemon, "topic").get("message_count") == 9)


def test_a_consumers_state_can_be_read_from_another_thread(daemon: BlockingNode) -> None:
    async def main() -> None:
        async with aio.Consumer(
            "topic", "chan", nsqd_tcp_addresses=[daemon.tcp_address]
        ) as consumer:
            await consumer.wait_connected()
            # (a metrics thread, say): answered by the loop's thread meanwhile
            stats_ = await asyncio.to_thread(lambda: consumer.stats)
            assert list(stats_.connections) == [daemon.tcp_address]
            assert await asyncio.to_thread(lambda: consumer.connections) == [daemon.tcp_address]

    run(main)
