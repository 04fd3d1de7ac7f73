"""trionsq.blocking end to end, on fakensq and on the real nsqd v1.3.0."""

from __future__ import annotations

import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import trionsq
from trionsq import blocking

from ..support.nodes import BlockingDaemons, BlockingNode
from ..support.tls import Pki
from ..support.waiting import wait_until_blocking
from .conftest import FAST_RECONNECT, AuthServer, registered_nsqds, stats

pytestmark = pytest.mark.usefixtures("no_threads_left")


def consume(
    daemon: BlockingNode, count: int, topic: str = "topic", **options: Any
) -> list[blocking.Message]:
    """Iterate until ``count`` messages came, finishing each."""
    got: list[blocking.Message] = []
    options.setdefault("max_in_flight", 16)
    with blocking.Consumer(topic, "chan", nsqd_tcp_addresses=[daemon.tcp_address], **options) as c:
        if count == 0:
            return got
        for message in c:
            message.finish()
            got.append(message)
            if len(got) == count:
                break
    return got


def test_publish_and_consume_exact_sets(daemon: BlockingNode) -> None:
    with blocking.Producer([daemon.tcp_address]) as producer:
        producer.publish("topic", b"one")
        producer.multi_publish("topic", [b"two", b"three"])
        producer.deferred_publish("topic", b"later", 0.2)
        # Many threads share the producer's pipelined window...
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: producer.publish("topic", b"t%d" % i), range(40)))
        # ...and one thread can keep many publishes in flight.
        futures = [producer.publish_async("topic", b"f%d" % i) for i in range(40)]
        assert [f.result(10) for f in futures] == [None] * 40
        assert producer.flush(10)
        assert producer.stats.published == 84 and producer.stats.in_flight == 0
    expected = {b"one", b"two", b"three", b"later"}
    expected |= {b"t%d" % i for i in range(40)} | {b"f%d" % i for i in range(40)}
    got = consume(daemon, len(expected))
    assert sorted(m.body for m in got) == sorted(expected)
    assert all(m.attempts == 1 and len(m.id) == 16 and m.has_responded for m in got)
    wait_until_blocking(lambda: stats(daemon, "topic", "chan").get("in_flight_count") == 0)
    assert stats(daemon, "topic", "chan")["depth"] == 0


def test_threads_share_a_small_window_and_close_wakes_those_waiting(daemon: BlockingNode) -> None:
    # Window 3, 8 threads: callers sleep while it is full and are woken as
    # answers free places; never more than 3 await nsqd's answer.
    most = 0
    with blocking.Producer([daemon.tcp_address], publish_window=3) as producer:

        def work(thread: int) -> None:
            nonlocal most
            futures = []
            for i in range(50):
                futures.append(producer.publish_async("topic", b"w%d-%d" % (thread, i)))
                most = max(most, producer.stats.in_flight)
            assert [f.result(10) for f in futures] == [None] * 50

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(work, range(8)))
        assert producer.flush(10) and producer.stats.in_flight == 0
        assert producer.stats.published == 400 and most <= 3
    # Threads flooding a window of 1 (most asleep for a place at any time):
    # close() wakes them, and each raises ClientClosedError.
    with blocking.Producer([daemon.tcp_address], publish_window=1) as producer:
        errors: list[BaseException] = []
        started = threading.Barrier(5)

        def flood() -> None:
            started.wait()
            try:
                while True:
                    producer.publish_async("flood", b"x")
            except blocking.ClientClosedError as exc:
                errors.append(exc)

        threads = [threading.Thread(target=flood) for _ in range(4)]
        for thread in threads:
            thread.start()
        started.wait()
        wait_until_blocking(lambda: producer.stats.published >= 20)
        producer.close()
        for thread in threads:
            thread.join(10)
        assert not any(thread.is_alive() for thread in threads) and len(errors) == 4
    got = consume(daemon, 400, max_in_flight=100)
    assert sorted(m.body for m in got) == sorted(
        b"w%d-%d" % (t, i) for t in range(8) for i in range(50)
    )


def test_a_handler_on_a_pool_of_threads(daemon: BlockingNode) -> None:
    with blocking.Producer([daemon.tcp_address]) as producer:
        producer.multi_publish("topic", [b"%d" % i for i in range(60)])
    seen: list[bytes] = []
    threads: set[str] = set()
    lock = threading.Lock()
    running = 0
    most = 0

    def handler(message: blocking.Message) -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
            threads.add(threading.current_thread().name)
        time.sleep(0.005)  # blocking work, in a thread of the pool
        with lock:
            running -= 1
            seen.append(message.body)
            if len(seen) == 60:
                consumer.stop()

    consumer = blocking.Consumer(
        "topic", "chan", nsqd_tcp_addresses=[daemon.tcp_address], handler=handler, concurrency=4
    )
    with consumer:
        assert consumer.config.max_in_flight == 4  # follows concurrency
        assert consumer.run(timeout=20)
    assert sorted(seen) == sorted(b"%d" % i for i in range(60))
    assert 1 < most <= 4 and len(threads) <= 4
    assert consumer.stats.finished == 60
    wait_until_blocking(lambda: stats(daemon, "topic", "chan").get("depth") == 0)


def test_handlers_that_block_get_every_thread_of_the_pool(daemon: BlockingNode) -> None:
    # A batch wakes one thread of the pool; the others are woken while its
    # messages wait: four handlers meet at a barrier only if all four run.
    with blocking.Producer([daemon.tcp_address]) as producer:
        producer.multi_publish("topic", [b"%d" % i for i in range(8)])
    barrier = threading.Barrier(4, timeout=10)
    seen: list[bytes] = []

    def handler(message: blocking.Message) -> None:
        barrier.wait()
        seen.append(message.body)
        if len(seen) == 8:
            consumer.stop()

    consumer = blocking.Consumer(
        "topic", "chan", nsqd_tcp_addresses=[daemon.tcp_address], handler=handler, concurrency=4
    )
    with consumer:
        assert consumer.run(timeout=20)
    assert sorted(seen) == sorted(b"%d" % i for i in range(8))
    assert consumer.stats.finished == 8 and consumer.stats.requeued == 0


def test_requeue_touch_and_give_up(daemon: BlockingNode) -> None:
    with blocking.Producer([daemon.tcp_address]) as producer:
        producer.publish("topic", b"again")
        producer.publish("topic", b"poison")
    given_up: list[tuple[bytes, int, str]] = []
    bodies: list[tuple[bytes, int]] = []

    def give_up(message: blocking.Message) -> None:
        given_up.append((message.body, message.attempts, threading.current_thread().name))

    with blocking.Consumer(
        "topic",
        "chan",
        nsqd_tcp_addresses=[daemon.tcp_address],
        max_in_flight=2,
        max_attempts=2,
        backoff=False,
        give_up=give_up,
    ) as consumer:
        for message in consumer:
            bodies.append((message.body, message.attempts))
            if message.body == b"again" and message.attempts == 1:
                message.touch()
                message.requeue(0)
                message.finish()  # the first answer wins
                assert message.responded == "requeued"
            elif message.body == b"poison":
                message.requeue(0)
            else:
                message.finish()
            if (b"again", 2) in bodies and (b"poison", 2) in bodies:
                break
        wait_until_blocking(lambda: bool(given_up))  # the third delivery goes to give_up
    assert (b"again", 1) in bodies and (b"again", 2) in bodies
    assert [(b, a) for b, a, _ in given_up] == [(b"poison", 3)]
    assert given_up[0][2].endswith("-helper")  # not on the loop's thread
    wait_until_blocking(lambda: stats(daemon, "topic", "chan").get("depth") == 0)
    wait_until_blocking(lambda: stats(daemon, "topic", "chan").get("in_flight_count") == 0)


def test_a_failing_handler_requeues_with_backoff(daemon: BlockingNode) -> None:
    with blocking.Producer([daemon.tcp_address]) as producer:
        producer.publish("topic", b"fails once")
    attempts: list[int] = []
    states: list[str] = []

    def handler(message: blocking.Message) -> None:
        attempts.append(message.attempts)
        if message.attempts == 1:
            raise RuntimeError("not yet")
        consumer.stop()

    consumer = blocking.Consumer(
        "topic",
        "chan",
        nsqd_tcp_addresses=[daemon.tcp_address],
        handler=handler,
        backoff=trionsq.BackoffPolicy(base=0.1, max=0.2, jitter=0.0),
        default_requeue_delay=0.05,
    )
    with consumer:
        wait_until_blocking(lambda: consumer.stats.requeued == 1)
        states.append(consumer.stats.backoff_state)
        assert consumer.run(timeout=20)
    assert attempts == [1, 2]
    assert states[0] != trionsq.BackoffState.NORMAL.value
    assert consumer.stats.finished == 1


def test_leaving_the_loop_is_prompt_and_loses_nothing(daemon: BlockingNode) -> None:
    with blocking.Producer([daemon.tcp_address]) as producer:
        producer.multi_publish("topic", [b"%d" % i for i in range(30)])
    first: list[bytes] = []
    with blocking.Consumer(
        "topic", "chan", nsqd_tcp_addresses=[daemon.tcp_address], max_in_flight=10
    ) as consumer:
        for message in consumer:
            first.append(message.body)
            if len(first) == 3:
                unfinished = message  # handed out, never settled
                break
            message.finish()
        wait_until_blocking(lambda: consumer.stats.received >= 10)
        started = time.monotonic()
    took = time.monotonic() - started
    assert took < 2.0, f"leaving took {took:.2f} s"
    assert unfinished.responded == "requeued"
    # Nothing of it is in flight at nsqd; every message is there for the next consumer.
    channel = stats(daemon, "topic", "chan")
    assert channel["in_flight_count"] == 0 and channel["timeout_count"] == 0
    rest = consume(daemon, 28)
    assert sorted([*first[:2], *(m.body for m in rest)]) == sorted(b"%d" % i for i in range(30))


def test_a_stuck_handler_gets_close_timeout_then_its_message_is_requeued(daemon: BlockingNode) -> None:
    with blocking.Producer([daemon.tcp_address]) as producer:
        producer.multi_publish("topic", [b"stuck", b"quick"])
    release = threading.Event()
    started = threading.Event()
    handled: list[bytes] = []

    def handler(message: blocking.Message) -> None:
        if message.body == b"stuck":
            started.set()
            release.wait(20)
        handled.append(message.body)

    consumer = blocking.Consumer(
        "topic",
        "chan",
        nsqd_tcp_addresses=[daemon.tcp_address],
        handler=handler,
        concurrency=2,
        close_timeout=0.3,
    )
    with consumer:
        assert started.wait(10)
        wait_until_blocking(lambda: b"quick" in handled)
        begin = time.monotonic()
        threading.Timer(1.0, release.set).start()  # lets the thread end after the close
    took = time.monotonic() - begin
    assert 0.25 < took < 3.0, f"leaving took {took:.2f} s"
    assert consumer.stats.finished == 1
    got = consume(daemon, 1)
    assert [(m.body, m.attempts) for m in got] == [(b"stuck", 2)]


def test_ctrl_c_in_the_main_thread_closes_promptly_and_requeues(daemon: BlockingNode) -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    with blocking.Producer([daemon.tcp_address]) as producer:
        producer.multi_publish("topic", [b"a", b"b", b"c"])
    held: list[blocking.Message] = []

    def interrupt() -> None:
        wait_until_blocking(lambda: len(held) >= 2)
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    helper = threading.Thread(target=interrupt)
    helper.start()
    begin = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        with blocking.Consumer(
            "topic", "chan", nsqd_tcp_addresses=[daemon.tcp_address], max_in_flight=3
        ) as consumer:
            for message in consumer:
                held.append(message)  # never settled: Ctrl-C comes meanwhile
    helper.join()
    assert time.monotonic() - begin < 5.0
    assert all(m.responded == "requeued" for m in held)
    assert consumer.closed
    assert stats(daemon, "topic", "chan")["in_flight_count"] == 0
    assert sorted(m.body for m in consume(daemon, 3)) == [b"a", b"b", b"c"]


def test_an_nsqd_killed_and_restarted(nodes: BlockingDaemons) -> None:
    daemon = nodes.nsqd()
    received: list[bytes] = []
    lock = threading.Lock()

    def handler(message: blocking.Message) -> None:
        with lock:
            received.append(message.body)

    with (
        blocking.Producer([daemon.tcp_address], connect_timeout=1.0) as producer,
        blocking.Consumer(
            "topic",
            "chan",
            nsqd_tcp_addresses=[daemon.tcp_address],
            handler=handler,
            reconnect_backoff=FAST_RECONNECT,
        ) as consumer,
    ):
        consumer.wait_connected(timeout=10)
        producer.multi_publish("topic", [b"before-%d" % i for i in range(5)])
        wait_until_blocking(lambda: len(received) == 5)
        daemon.kill()
        with pytest.raises(trionsq.NSQConnectionError):
            producer.publish("topic", b"lost")  # nobody there
        daemon.start()
        # The producer reconnects on its next publish; the consumer on its own.
        producer.multi_publish("topic", [b"after-%d" % i for i in range(5)])
        wait_until_blocking(lambda: len(received) == 10)
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
    with blocking.Producer([daemon.tcp_address], **options) as producer:
        producer.multi_publish("topic", [b"z" * 5000, b"secret"])
    got = consume(daemon, 2, **options)
    assert sorted(m.body for m in got) == [b"secret", b"z" * 5000]
    assert set(auth_server.seen) == {"open-sesame"}


def test_nsqd_refusals_are_typed_and_the_producer_goes_on(nodes: BlockingDaemons) -> None:
    daemon = nodes.nsqd("--max-msg-size=10")
    with blocking.Producer([daemon.tcp_address]) as producer:
        with pytest.raises(trionsq.BadMessageError):
            producer.publish("topic", b"x" * 100)
        future = producer.publish_async("topic", b"y" * 100)
        with pytest.raises(trionsq.BadMessageError):
            future.result(10)
        with pytest.raises(trionsq.BadTopicError):
            producer.publish("bad topic!", b"x")
        producer.publish("topic", b"fits")
    assert [m.body for m in consume(daemon, 1)] == [b"fits"]


def test_closed_clients_raise_and_never_hang(daemon: BlockingNode) -> None:
    producer = blocking.Producer([daemon.tcp_address])
    with pytest.raises(RuntimeError, match="start"):
        producer.publish("topic", b"x")
    with producer:
        producer.publish("topic", b"x")
    for call in (
        lambda: producer.publish("topic", b"x"),
        lambda: producer.publish_async("flood", b"x"),
        lambda: producer.multi_publish("topic", [b"x"]),
    ):
        with pytest.raises(blocking.ClientClosedError):
            call()
    assert isinstance(blocking.ClientClosedError("x"), trionsq.ConnectionClosedError)
    consumer = blocking.Consumer("topic", "chan", nsqd_tcp_addresses=[daemon.tcp_address])
    with consumer:
        pass
    with pytest.raises(blocking.ClientClosedError):
        next(iter(consumer))
    with pytest.raises(blocking.ClientClosedError):
        consumer.wait_connected(1)
    with pytest.raises(RuntimeError, match="only once"):
        consumer.start()


async def test_blocking_calls_from_a_trio_task_raise_at_once(daemon: BlockingNode) -> None:
    producer = blocking.Producer([daemon.tcp_address])
    with pytest.raises(blocking.BlockingInTrioError, match="inside a Trio run"):
        producer.start()
    consumer = blocking.Consumer("topic", "chan", nsqd_tcp_addresses=[daemon.tcp_address])
    with pytest.raises(blocking.BlockingInTrioError):
        consumer.start()


def test_the_producer_fails_over_when_an_nsqd_dies(nodes: BlockingDaemons) -> None:
    _, nsqds = registered_nsqds(nodes)
    first, second = (nsqd.tcp_address for nsqd in nsqds)
    with blocking.Producer([first, second], connect_timeout=1.0) as producer:
        producer.publish("topic", b"to-first")
        assert producer.address == first
        nsqds[0].kill()
        wait_until_blocking(lambda: producer.address is None)
        producer.publish("topic", b"to-second")
        assert producer.address == second
    with blocking.Consumer("topic", "chan", nsqd_tcp_addresses=[second]) as consumer:
        assert next(iter(consumer)).body == b"to-second"


def test_discovery_as_nsqds_come_and_go(nodes: BlockingDaemons) -> None:
    lookupd, nsqds = registered_nsqds(nodes)
    addresses = [nsqd.tcp_address for nsqd in nsqds]
    for index, address in enumerate(addresses):
        with blocking.Producer([address]) as producer:
            producer.publish("topic", b"from-%d" % index)
    received: list[bytes] = []
    lock = threading.Lock()

    def handler(message: blocking.Message) -> None:
        with lock:
            received.append(message.body)

    with blocking.Consumer(
        "topic",
        "chan",
        lookupd_http_addresses=[lookupd.http_address],
        lookupd_poll_interval=0.1,
        handler=handler,
        concurrency=2,
    ) as consumer:
        wait_until_blocking(lambda: sorted(received) == [b"from-0", b"from-1"])
        assert consumer.connections == sorted(addresses)
        nsqds[1].kill()  # gone: the consumer lets it go
        wait_until_blocking(lambda: consumer.connections == [addresses[0]])
        nsqds[1].start()  # back: found again through nsqlookupd
        with blocking.Producer([addresses[1]]) as producer:
            producer.publish("topic", b"again")
        wait_until_blocking(lambda: b"again" in received)


def test_touch_keeps_a_slow_message_and_rdy_bounds_what_comes(nodes: BlockingDaemons) -> None:
    # A timeout 7 touch intervals long: a crowded machine may stall this
    # thread or the client's for a while without nsqd timing a message out.
    daemon = nodes.nsqd("--msg-timeout=2s")
    with blocking.Producer([daemon.tcp_address]) as producer:
        producer.multi_publish("topic", [b"%d" % i for i in range(12)])
    with blocking.Consumer(
        "topic", "chan", nsqd_tcp_addresses=[daemon.tcp_address], max_in_flight=4
    ) as consumer:
        held = [next(iter(consumer)) for _ in range(4)]
        # RDY 4: nsqd hands out 4 and no more while they are unanswered.
        wait_until_blocking(lambda: stats(daemon, "topic", "chan").get("in_flight_count") == 4)
        for _ in range(8):  # 2.4 s, past the 2 s msg_timeout, touched every 0.3 s
            time.sleep(0.3)
            for message in held:
                message.touch()
            assert stats(daemon, "topic", "chan")["in_flight_count"] == 4
            assert consumer.stats.received == 4
        for message in held:
            message.finish()
        rest = []
        for message in consumer:
            message.finish()
            rest.append(message)
            if len(rest) == 8:
                break
    channel = stats(daemon, "topic", "chan")
    assert channel["timeout_count"] == 0 and channel["requeue_count"] == 0
    assert all(m.attempts == 1 for m in held + rest)
    assert sorted(int(m.body) for m in held + rest) == list(range(12))
