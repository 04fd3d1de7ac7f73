"""Consumer against the scripted in-memory nsqd, in virtual time."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
import trio
import trio.testing

import trionsq

from ..support.waiting import wait_until
from .minisrv import Cluster, MiniNSQD, Queued, consumer


async def test_handler_finishes_messages(nursery: trio.Nursery) -> None:
    node = MiniNSQD(nursery)
    ids = node.put(b"a", b"b", b"c")
    seen: list[bytes] = []

    async def handler(message: trionsq.Message) -> None:
        seen.append(message.body)

    async with consumer(node, handler=handler, max_in_flight=10) as c:
        await wait_until(lambda: len(node.fins) == 3)
        assert c.stats.finished == 3
        assert c.stats.received == 3
    assert sorted(seen) == [b"a", b"b", b"c"]
    assert sorted(node.fins) == sorted(ids)
    record = node.conns[0].record
    assert [type(c).__name__ for c in record.commands[:2]] == ["Identify", "Sub"]
    assert record.rdys[0] == 1  # every connection starts at RDY 1


async def test_sync_handler_and_message_attributes(nursery: trio.Nursery) -> None:
    node = MiniNSQD(nursery)
    (msg_id,) = node.put(b"hello", attempts=2)
    got: list[trionsq.Message] = []
    async with consumer(node, handler=got.append) as c:
        await wait_until(lambda: node.fins)
        assert c.stats.finished == 1
    (message,) = got
    assert message.id == msg_id
    assert message.body == b"hello"
    assert message.attempts == 2
    assert message.timestamp == 1_700_000_000_000_000_000
    assert message.responded == "finished"


async def test_failing_handler_requeues_with_attempts_delay(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    node = MiniNSQD(nursery)
    node.put(b"x", attempts=3)

    def handler(message: trionsq.Message) -> None:
        raise RuntimeError("boom")

    async with consumer(node, handler=handler, default_requeue_delay=2.0, backoff=False) as c:
        await wait_until(lambda: node.reqs)
        assert c.stats.requeued == 1
    assert node.reqs[0][1] == 6000  # 2s x 3 attempts, in ms
    assert node.fins == []


async def test_requeue_delay_is_capped(nursery: trio.Nursery) -> None:
    node = MiniNSQD(nursery)
    node.put(b"x", attempts=4)

    async def handler(message: trionsq.Message) -> None:
        raise ValueError

    async with consumer(
        node, handler=handler, default_requeue_delay=100.0, max_requeue_delay=150.0, backoff=False
    ):
        await wait_until(lambda: node.reqs)
    assert node.reqs[0][1] == 150_000


async def test_iterator_finish_requeue_touch(nursery: trio.Nursery) -> None:
    node = MiniNSQD(nursery)
    first, second = node.put(b"one", b"two")
    async with consumer(node, max_in_flight=2, backoff=False) as c:
        received = []
        async for message in c:
            received.append(message)
            if len(received) == 2:
                break
        one, two = received
        await one.touch()
        await one.finish()
        await one.finish()  # a second answer is ignored
        await two.requeue(delay=1.5, backoff=False)
        await two.finish()  # ignored too: it was requeued
        await wait_until(lambda: node.fins and node.reqs and node.conns[0].record.touches)
    assert node.fins == [first]
    assert node.reqs == [(second, 1500)]
    assert node.conns[0].record.touches == [first]


async def test_rdy_ramps_from_one_to_max_in_flight(nursery: trio.Nursery) -> None:
    node = MiniNSQD(nursery)
    node.put(*[b"%d" % i for i in range(5)])
    async with consumer(node, max_in_flight=5) as c:
        messages = [await c.__anext__() for _ in range(5)]
        record = node.conns[0].record
        assert record.rdys[:2] == [1, 5]
        assert c.stats.connections["nsqd:4150"].in_flight == 5
        assert c.stats.rdy == 5
        assert c.is_starved()
        for message in messages:
            await message.finish()
        assert not c.is_starved()


async def test_is_starved_counts_what_was_handed_out_against_the_last_rdy(
    nursery: trio.Nursery,
) -> None:
    # The guide's rule, per connection: messages in flight at the application
    # against the last RDY sent.  Messages received but still waiting in the
    # consumer are not the application's: with them, it is not starved.
    node = MiniNSQD(nursery)
    node.put(*[b"%d" % i for i in range(10)])
    async with consumer(node, max_in_flight=10, backoff=False) as c:
        await wait_until(lambda: c.stats.received == 10)
        assert node.conns[0].record.rdys[-1] == 10
        assert not c.is_starved()  # ten received, none handed out
        taken = [await c.__anext__() for _ in range(8)]
        assert c.stats.connections["nsqd:4150"].handed_out == 8
        assert not c.is_starved()  # 8 < 0.85 x 10
        taken.append(await c.__anext__())
        assert c.is_starved()  # 9 >= 8.5: nsqd sends nothing more until answers
        await taken[0].finish()
        assert not c.is_starved()
        for message in taken[1:]:
            await message.finish()
        assert c.stats.connections["nsqd:4150"].handed_out == 0


async def test_give_up_after_max_attempts(nursery: trio.Nursery) -> None:
    node = MiniNSQD(nursery)
    (dead,) = node.put(b"poison", attempts=6)
    (alive,) = node.put(b"fine", attempts=5)
    given_up: list[bytes] = []
    handled: list[bytes] = []

    async def give_up(message: trionsq.Message) -> None:
        given_up.append(message.body)

    async with consumer(
        node, handler=lambda m: handled.append(m.body), give_up=give_up, max_attempts=5
    ) as c:
        await wait_until(lambda: len(node.fins) == 2)
        assert c.stats.given_up == 1
        assert c.stats.finished == 1
    assert given_up == [b"poison"]
    assert handled == [b"fine"]
    assert sorted(node.fins) == sorted([dead, alive])


async def test_give_up_default_logs_a_warning(
    nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    node = MiniNSQD(nursery)
    node.put(b"poison", attempts=3)
    async with consumer(node, handler=lambda m: None, max_attempts=2):
        await wait_until(lambda: node.fins)
    assert any("giving up" in r.message for r in caplog.records)


async def test_close_waits_for_handlers_then_requeues_what_they_hold(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    node = MiniNSQD(nursery)
    fast, slow, stuck = node.put(b"fast", b"slow", b"stuck")
    started = trio.Event()

    async def handler(message: trionsq.Message) -> None:
        if message.body == b"slow":
            started.set()
            await trio.sleep(3)
        elif message.body == b"stuck":
            await trio.sleep(1000)

    async with consumer(node, handler=handler, max_in_flight=3, close_timeout=10) as c:
        await started.wait()
        await wait_until(lambda: node.fins == [fast] and c.stats.received == 3)
        start = trio.current_time()
    elapsed = trio.current_time() - start
    # CLS first, then the slow handler finished during the drain, the stuck one
    # was cancelled at the deadline and its message requeued at once.
    assert elapsed == pytest.approx(10, abs=0.1)
    assert sorted(node.fins) == sorted([fast, slow])
    assert node.reqs == [(stuck, 0)]
    record = node.conns[0].record
    names = [type(cmd).__name__ for cmd in record.commands]
    assert names[names.index("Cls") :] == ["Cls", "Fin", "Req"]
    assert c.stats.finished == 2 and c.stats.requeued == 1


async def test_messages_buffered_at_close_are_requeued(nursery: trio.Nursery) -> None:
    node = MiniNSQD(nursery)
    ids = node.put(b"1", b"2", b"3")
    async with consumer(node, max_in_flight=3, close_timeout=0) as c:
        await wait_until(lambda: c.stats.received == 3)
    # None was handed out: all three go back at once, without a delay.
    assert sorted(node.reqs) == sorted((i, 0) for i in ids)
    assert node.fins == []


async def test_cancellation_requeues_at_once_what_handlers_held(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    node = MiniNSQD(nursery)
    (held,) = node.put(b"x")
    entered = trio.Event()

    async def handler(message: trionsq.Message) -> None:
        entered.set()
        await trio.sleep_forever()

    with trio.move_on_after(5):
        async with consumer(node, handler=handler, close_timeout=30):
            await entered.wait()
            await trio.sleep_forever()
    # Cancelled at 5 s: no close_timeout wait, the cancelled handler's message
    # went back with no delay.
    assert trio.current_time() == pytest.approx(5, abs=0.05)
    assert node.fins == [] and node.reqs == [(held, 0)]
    await wait_until(lambda: not node.live)


async def test_cancellation_during_the_close_timeout_wait_requeues_at_once(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    node = MiniNSQD(nursery)
    (held,) = node.put(b"x")
    entered = trio.Event()

    async def handler(message: trionsq.Message) -> None:
        entered.set()
        await trio.sleep_forever()

    with trio.move_on_after(3):
        async with consumer(node, handler=handler, close_timeout=30):
            await entered.wait()
        # The block ended at once: leaving waits for the handler...
    # ...until the deadline cancels the wait: then its message goes back.
    assert trio.current_time() == pytest.approx(3, abs=0.05)
    assert node.reqs == [(held, 0)] and node.fins == []


async def test_leaving_is_bounded_when_nsqd_never_answers_cls(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    node = MiniNSQD(nursery)
    node.ignore_cls = True
    (held,) = node.put(b"x")
    async with consumer(node, max_in_flight=1) as c:
        message = await c.__anext__()
        start = trio.current_time()
    # Leaving waited a bounded time for CLOSE_WAIT; the REQ was written anyway.
    assert trio.current_time() - start == pytest.approx(5, abs=0.05)
    assert message.responded == "requeued" and node.reqs == [(held, 0)]


@pytest.mark.parametrize(
    ("cls_delay", "straggler_after", "requeued"),
    [
        (0.0, 0.005, True),  # a quiet nsqd: the straggler follows at once
        (0.05, 0.08, True),  # a busy one: CLOSE_WAIT and the straggler both late
        # CLOSE_WAIT at once, the straggler late: not waited for (the
        # connection is closed before it comes; nsqd would time it out)
        (0.0, 0.05, False),
    ],
)
async def test_a_message_sent_after_close_wait_is_requeued_when_nsqd_is_slow_alike(
    nursery: trio.Nursery,
    autojump_clock: trio.testing.MockClock,
    cls_delay: float,
    straggler_after: float,
    requeued: bool,
) -> None:
    node = MiniNSQD(nursery)
    node.cls_delay, node.straggler_after = cls_delay, straggler_after
    (first,) = node.put(b"first")
    async with consumer(node, max_in_flight=2) as c:
        message = await c.__anext__()
        assert message.id == first
        # Queued without waking the server's sender: it goes out only as the
        # straggler, after CLOSE_WAIT.
        straggler = b"%016x" % 99
        node.queue.append(Queued(straggler, b"straggler"))
        start = trio.current_time()
    waited = trio.current_time() - start
    # The straggler is caught (and requeued) when nsqd's lateness shows in
    # CLOSE_WAIT's own delay; leaving waits at most 250 ms for it.
    assert waited < cls_delay + 0.25 + 0.01
    assert ((straggler, 0) in node.reqs) == requeued
    assert (first, 0) in node.reqs


async def test_every_nsqd_s_straggler_is_requeued_whatever_order_the_close_waits_come_in(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    # Leaving waits for the CLOSE_WAITs one after the other in one task: the
    # last nsqd answers first, the first last; each sends a straggler right
    # after its CLOSE_WAIT, and each is caught and requeued, within the bound.
    cluster = Cluster(nursery)
    delays = [0.06, 0.04, 0.02, 0.0]
    nodes = [cluster.add(f"n{i}:4150") for i in range(len(delays))]
    firsts = []
    for node, delay in zip(nodes, delays, strict=True):
        node.cls_delay, node.straggler_after = delay, 0.005
        firsts += node.put(b"first")
    addresses = [f"n{i}:4150" for i in range(len(delays))]
    stragglers = [b"%016x" % (90 + i) for i in range(len(delays))]
    async with consumer(cluster, nsqd_tcp_addresses=addresses, max_in_flight=8) as c:
        await wait_until(lambda: c.stats.received == len(delays))
        for node, straggler in zip(nodes, stragglers, strict=True):
            node.queue.append(Queued(straggler, b"straggler"))  # not sent yet
        start = trio.current_time()
    assert trio.current_time() - start < max(delays) + 0.25 + 0.01
    for node, first, straggler in zip(nodes, firsts, stragglers, strict=True):
        assert (straggler, 0) in node.reqs and (first, 0) in node.reqs


async def test_a_message_sent_after_close_wait_is_requeued_after_a_last_rdy_0(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    # RDY 0 (here max_in_flight 0; a backoff or a RDY rotation alike) then
    # CLS, read together by nsqd: its sender may have taken a message under
    # the RDY before, and writes it after CLOSE_WAIT.  The connection's RDY is
    # 0 by then, but the message must still be caught and requeued.
    node = MiniNSQD(nursery)
    node.straggler_after = 0.005
    (first,) = node.put(b"first")
    async with consumer(node, max_in_flight=2) as c:
        message = await c.__anext__()
        assert message.id == first
        straggler = b"%016x" % 99
        node.queue.append(Queued(straggler, b"straggler"))  # not sent yet
        await c.set_max_in_flight(0)
    assert node.conns[0].record.rdys[-1] == 0
    assert (straggler, 0) in node.reqs and (first, 0) in node.reqs


@pytest.mark.parametrize("slow", ["identify_delay", "sub_delay"])
async def test_leaving_does_not_wait_for_a_connection_still_subscribing(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock, slow: str
) -> None:
    # One nsqd answers IDENTIFY (or SUB) only after the consumer is gone: the
    # loop is cancelled meanwhile, leaving requeues what the other delivered
    # and does not wait for the slow one, which gets no RDY (nothing of the
    # consumer can be in flight there) and nothing else after what it had.
    cluster = Cluster(nursery)
    slow_node = cluster.add("slow:4150")
    setattr(slow_node, slow, math.inf)
    ready = cluster.add("ready:4150")
    ids = ready.put(b"1", b"2", b"3")
    addresses = ["slow:4150", "ready:4150"]
    with trio.move_on_after(60) as scope:
        async with consumer(cluster, nsqd_tcp_addresses=addresses, max_in_flight=3) as c:
            await wait_until(lambda: c.stats.received == 3)
            async for message in c:  # noqa: B007 - checked after the loop
                cancelled = trio.current_time()
                scope.cancel()
                await trio.sleep_forever()
    assert scope.cancelled_caught
    assert trio.current_time() - cancelled < 0.5  # no connect_timeout, no SUB awaited
    assert message.responded == "requeued"
    assert sorted(ready.reqs) == sorted((i, 0) for i in ids)
    (conn,) = slow_node.conns
    sent = [type(command).__name__ for command in conn.record.commands]
    assert sent == (["Identify"] if slow == "identify_delay" else ["Identify", "Sub"])
    assert conn.record.rdys == []  # SUB, then nothing: the connection was closed


async def test_reconnects_to_configured_nsqd(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    node = MiniNSQD(nursery)
    async with consumer(node, handler=lambda m: None) as c:
        await c.wait_connected()
        node.refuse = True
        await node.live[0].close()
        await trio.sleep(20)  # refused a few times, with growing delays
        assert c.connections == []
        node.refuse = False
        await wait_until(lambda: c.connections == ["nsqd:4150"], limit=120)
        node.put(b"after")
        await wait_until(lambda: c.stats.finished == 1)
    assert len(node.conns) == 2


async def test_iterating_a_handler_consumer_is_an_error(nursery: trio.Nursery) -> None:
    node = MiniNSQD(nursery)
    async with consumer(node, handler=lambda m: None) as c:
        with pytest.raises(RuntimeError):
            c.__aiter__()


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"max_in_flight": -1}, ValueError),
        ({"max_in_flight": "5"}, TypeError),
        ({"max_attempts": True}, TypeError),
        ({"nsqd_tcp_addresses": "127.0.0.1:4150"}, TypeError),
        ({"nsqd_tcp_addresses": ["nohost"]}, ValueError),
        ({"snappy": True, "deflate": True}, ValueError),
        ({"deflate_level": 10}, ValueError),
        ({"sample_rate": 100}, ValueError),
        ({"heartbeat_interval": 0}, ValueError),
        ({"msg_timeout": -1.0}, ValueError),
        ({"lookupd_poll_jitter": 2}, ValueError),
        ({"tls_cert": "c.pem"}, ValueError),
        ({"backoff": "yes"}, TypeError),
        ({"read_timeout": 10.0}, ValueError),  # must exceed heartbeat_interval
        ({"no_such_option": 1}, TypeError),
        ({"nsqd_tcp_addresses": []}, ValueError),
    ],
)
def test_options_are_validated(options: dict[str, Any], error: type[Exception]) -> None:
    options.setdefault("nsqd_tcp_addresses", ["127.0.0.1:4150"])
    with pytest.raises(error):
        trionsq.Consumer("topic", "chan", **options)


def test_names_are_validated() -> None:
    with pytest.raises(ValueError):
        trionsq.Consumer("bad topic", "chan", nsqd_tcp_addresses=["a:1"])
    with pytest.raises(ValueError):
        trionsq.Consumer("topic", "", nsqd_tcp_addresses=["a:1"])


async def test_nothing_outlives_the_async_with(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    cluster = Cluster(nursery)
    for name in ("a:1", "b:1"):
        cluster.add(name).put(b"x", b"y")
    before = list(trio.lowlevel.current_task().child_nurseries)
    async with consumer(
        cluster, nsqd_tcp_addresses=["a:1", "b:1"], handler=lambda m: None, max_in_flight=4
    ) as c:
        await wait_until(lambda: c.stats.finished == 4)
        inside = trio.lowlevel.current_task().child_nurseries
        assert len(inside) > len(before)  # the consumer's own
    assert trio.lowlevel.current_task().child_nurseries == before
    await wait_until(lambda: all(not node.live for node in cluster.nodes.values()))


async def test_iterating_outside_async_with_is_an_error() -> None:
    c = trionsq.Consumer("topic", "chan", nsqd_tcp_addresses=["a:1"])
    with pytest.raises(RuntimeError):
        await c.__anext__()


async def test_reconnect_delays_grow_exponentially(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    attempts: list[float] = []

    async def refusing(host: str, port: int) -> trio.abc.Stream:
        attempts.append(trio.current_time())
        raise OSError("connection refused")

    policy = trionsq.BackoffPolicy(base=1.0, max=8.0, multiplier=2.0, jitter=0.0)
    async with trionsq.Consumer(
        "topic", "chan", nsqd_tcp_addresses=["a:1"], connector=refusing, reconnect_backoff=policy
    ):
        await wait_until(lambda: len(attempts) == 7, limit=100, step=0.1)
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(attempts)]
    assert gaps == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]


async def test_an_unchanged_rdy_is_sent_once_however_many_messages_come(
    nursery: trio.Nursery,
) -> None:
    """nsqd v1 takes RDY as a cap on messages in flight (go-nsq's rule too):
    after the first message raises RDY 1 to the connection's share, draining
    many times that share sends no RDY again."""
    node = MiniNSQD(nursery)
    node.put(*[b"m%d" % i for i in range(40)])
    async with consumer(node, max_in_flight=4) as c:
        async for message in c:
            await message.finish()
            if c.stats.finished == 40:
                break
    await wait_until(lambda: len(node.fins) == 40)
    rdys = node.conns[0].record.rdys
    # RDY 1, then the share (4); leaving may add RDY 0 or nothing, never 4 again.
    assert rdys[:2] == [1, 4]
    assert 4 not in rdys[2:]


async def test_a_refused_sub_is_logged_and_retried(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock, caplog: Any
) -> None:
    # SUB is answered while connecting: nsqd's refusal is logged as before
    # (with its text), nothing else is sent, and the nsqd is tried again.
    from trionsq.protocol.errors import SubFailedError

    node = MiniNSQD(nursery)
    refusal = SubFailedError("SUB failed consumers for topic:chan exceeds limit of 1")
    node.sub_error = refusal
    with caplog.at_level("WARNING", logger="trionsq.consumer"):
        async with consumer(node) as c:
            await wait_until(lambda: len(node.conns) >= 2, limit=60)
            assert c.connections == []
            node.sub_error = None
            await c.wait_connected()
            assert c.connections == ["nsqd:4150"]
    failed = [r.getMessage() for r in caplog.records if "SUB failed" in r.getMessage()]
    assert failed and failed[0] == "nsqd:4150: SUB failed: " + str(refusal)
    first = [type(command).__name__ for command in node.conns[0].record.commands]
    assert first == ["Identify", "Sub"]
    assert node.conns[0].record.rdys == []


async def test_an_nsqd_that_never_answers_sub_times_out_like_a_connect(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock, caplog: Any
) -> None:
    # SUB answered within connect_timeout, as part of connecting: an nsqd
    # that never answers it is given up on after connect_timeout, and tried
    # again, never given RDY.
    node = MiniNSQD(nursery)
    node.sub_delay = math.inf
    with caplog.at_level("WARNING", logger="trionsq.consumer"):
        async with consumer(node, connect_timeout=2.0) as c:
            await wait_until(lambda: len(node.conns) >= 2, limit=60)
            assert c.connections == []
    assert any(
        r.getMessage() == "cannot connect to nsqd nsqd:4150: connect timed out after 2s"
        for r in caplog.records
    )
    assert all(conn.record.rdys == [] for conn in node.conns)
