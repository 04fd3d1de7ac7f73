"""The asyncio Producer's hand-over into its Trio core, as asyncio code calls it
(issue 29 item 3): the publishes awaited in one iteration of the asyncio loop
wake the Trio pump once (the inbox's ``awake`` rule), not once each, and every
guarantee of one publish holds for each publish of such a batch."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import trionsq
from trionsq import aio
from trionsq.connection import ConnectionClosedError

from ..support.nodes import BlockingDaemons, BlockingNode
from ..support.waiting import wait_until_blocking
from .conftest import own_connector, stats

pytestmark = pytest.mark.usefixtures("no_threads_left")


#: the asyncio Producer's three ways of publishing: the loop's own (the
#: default), the Trio Producer in the loop's guest run, on a Trio thread
MODE_OPTIONS: dict[str, dict[str, Any]] = {
    "direct": {},
    "guest": {"connector": own_connector},
    "thread": {"guest": False},
}
MODES = pytest.mark.parametrize("mode", list(MODE_OPTIONS))


class Wakes:
    """Counts how often a producer's publishes wake its Trio pump (hosted),
    or are written on the socket (the loop's own publishing)."""

    def __init__(self, producer: aio.Producer) -> None:
        self.count = 0
        hosted = producer._hosted
        if hosted is None:
            publisher = producer._publisher
            assert publisher is not None and publisher.conn is not None
            conn = publisher.conn
            write = conn._write

            def written(datas: list[bytes], waiters: list[Any]) -> None:
                self.count += 1
                write(datas, waiters)

            conn._write = written  # type: ignore[method-assign]
            return
        inbox = hosted.inbox
        wake = inbox.wake

        def counted() -> None:
            self.count += 1
            wake()

        inbox.wake = counted  # type: ignore[method-assign]


def message_count(daemon: BlockingNode, topic: str) -> int:
    return int(stats(daemon, topic).get("message_count", 0))


@MODES
def test_a_gather_or_task_group_is_handed_over_at_once_or_few_times(
    daemon: BlockingNode, mode: str
) -> None:
    async def main() -> tuple[int, int, int]:
        async with aio.Producer([daemon.tcp_address], **MODE_OPTIONS[mode]) as producer:
            await producer.publish("topic", b"warm")
            wakes = Wakes(producer)
            await asyncio.gather(*(producer.publish("topic", b"g%d" % i) for i in range(250)))
            gathered, wakes.count = wakes.count, 0
            async with asyncio.TaskGroup() as group:
                for i in range(200):
                    group.create_task(producer.multi_publish("topic", [b"m%d" % i, b"n"]))
            grouped, wakes.count = wakes.count, 0
            for i in range(5):  # one task in a loop: nothing to batch, one each
                await producer.publish("topic", b"l%d" % i)
            looped = wakes.count
            assert producer.stats.published == 1 + 250 + 400 + 5
        return gathered, grouped, looped

    gathered, grouped, looped = asyncio.run(main())
    if mode == "direct":  # the first goes alone at once, the rest of the iteration's in one write
        assert (gathered, grouped) == (2, 2)
    elif mode == "guest":  # asyncio runs all the tasks of an iteration before Trio's next step
        assert (gathered, grouped) == (1, 1)
    else:  # the Trio thread may drain the inbox while the loop still publishes
        assert 1 <= gathered <= 250 // 3 and 1 <= grouped <= 200 // 3, (gathered, grouped)
    assert looped == 5
    wait_until_blocking(lambda: message_count(daemon, "topic") == 656)


@MODES
def test_each_publish_of_a_batch_gets_its_own_answer(nodes: BlockingDaemons, mode: str) -> None:
    daemon = nodes.nsqd("--max-msg-size=10")

    async def main() -> list[Any]:
        async with aio.Producer([daemon.tcp_address], **MODE_OPTIONS[mode]) as producer:
            await producer.publish("topic", b"warm")
            calls = []
            for i in range(40):
                if i % 10 == 3:
                    calls.append(producer.publish("bad topic!", b"x"))
                elif i % 10 == 7:
                    calls.append(producer.multi_publish("topic", []))
                else:
                    calls.append(producer.publish("topic", b"ok%d" % i))
            # nsqd's refusal last: nsqd closes the connection after it
            calls.append(producer.publish("topic", b"x" * 100))
            results = await asyncio.gather(*calls, return_exceptions=True)
            await producer.publish("topic", b"after")  # on a new connection
        return results

    results = asyncio.run(main())
    for i, result in enumerate(results[:40]):
        if i % 10 == 3:
            assert isinstance(result, trionsq.BadTopicError), (i, result)
        elif i % 10 == 7:
            assert isinstance(result, trionsq.BadBodyError), (i, result)
        else:
            assert result is None, (i, result)
    assert isinstance(results[40], trionsq.BadMessageError)
    wait_until_blocking(lambda: message_count(daemon, "topic") == 1 + 32 + 1)


@MODES
def test_a_waiter_cancelled_in_a_batch(daemon: BlockingNode, mode: str) -> None:
    """Cancelling a task awaiting a publish stops its wait; the publish, handed
    over at the call, goes on; the others of its batch are unaffected.  A
    publish's future is a task's coroutine as well (create_task takes it)."""

    async def main() -> None:
        async with aio.Producer([daemon.tcp_address], **MODE_OPTIONS[mode]) as producer:
            await producer.publish("topic", b"warm")
            tasks = [asyncio.create_task(producer.publish("cut", b"%d" % i)) for i in range(10)]
            early = asyncio.create_task(producer.publish("cut", b"early"))
            early.cancel()  # before the task ran: its publish was handed over at the call
            await asyncio.sleep(0)
            # (Awaiting its answer, unless the answer came first: a Trio thread
            # publishes while this one is kept off the CPU, and a task whose
            # future is done when it first runs is done at once.)
            awaiting = tasks[4].cancel()
            direct = producer.publish("cut", b"direct")
            direct.cancel()  # the future itself: its wait is over, not the publish
            await asyncio.wait([*tasks, early])
            assert early.cancelled() and direct.cancelled()
            assert tasks[4].cancelled() if awaiting else tasks[4].result() is None
            assert all(t.result() is None for i, t in enumerate(tasks) if i != 4)
            await producer.publish("cut", b"last")  # nsqd answers in order: all answered

    asyncio.run(main())
    wait_until_blocking(lambda: message_count(daemon, "cut") == 13)


@MODES
def test_publishes_awaited_as_the_producer_closes(daemon: BlockingNode, mode: str) -> None:
    """Publishes handed over before the ``async with`` is left get their
    answers; later ones raise ClientClosedError."""

    async def main() -> list[Any]:
        producer = aio.Producer([daemon.tcp_address], **MODE_OPTIONS[mode])
        await producer.__aenter__()
        tasks = [asyncio.create_task(producer.publish("closing", b"%d" % i)) for i in range(20)]
        await asyncio.sleep(0)  # they ran: their publishes are handed over
        await producer.aclose()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        with pytest.raises(aio.ClientClosedError):
            await producer.publish("closing", b"late")
        return done

    results = asyncio.run(main())
    assert all(r is None or isinstance(r, ConnectionClosedError) for r in results), results
    assert results == [None] * 20
    wait_until_blocking(lambda: message_count(daemon, "closing") == 20)


class TaskCount:
    """Counts the asyncio Tasks the running loop makes (its task factory)."""

    def __init__(self) -> None:
        self.count = 0
        loop = asyncio.get_running_loop()

        def factory(
            loop: asyncio.AbstractEventLoop, coro: Any, **options: Any
        ) -> asyncio.Task[Any]:
            self.count += 1
            return asyncio.Task(coro, loop=loop, **options)

        loop.set_task_factory(factory)


@MODES
def test_a_gather_of_publishes_makes_no_task(daemon: BlockingNode, mode: str) -> None:
    """The publish methods return futures, not coroutines: ``asyncio.gather``
    takes them as they are, with no Task per publish."""

    async def main() -> int:
        async with aio.Producer([daemon.tcp_address], **MODE_OPTIONS[mode]) as producer:
            await producer.publish("topic", b"warm")
            tasks = TaskCount()
            await asyncio.gather(
                *(producer.publish("topic", b"p%d" % i) for i in range(100)),
                *(producer.multi_publish("topic", [b"m%d" % i, b"n"]) for i in range(50)),
                *(producer.deferred_publish("topic", b"d%d" % i, 0.01) for i in range(50)),
            )
            made = tasks.count
            assert producer.stats.published == 1 + 100 + 100 + 50
        return made

    assert asyncio.run(main()) == 0
    wait_until_blocking(lambda: message_count(daemon, "topic") == 251)


@MODES
def test_a_publish_starts_at_the_call(daemon: BlockingNode, mode: str) -> None:
    """Handed over at the call: a future never awaited publishes all the same
    (nsqd answers in order, so it is done once a later one is); the state
    errors raise at the call, with nothing to await."""

    async def main() -> None:
        producer = aio.Producer([daemon.tcp_address], **MODE_OPTIONS[mode])
        with pytest.raises(RuntimeError, match="inside 'async with'"):
            producer.publish("topic", b"not entered")  # no await: raised at the call
        async with producer:
            first = producer.publish("topic", b"never awaited")
            assert isinstance(first, asyncio.Future) and not first.done()
            producer.multi_publish("topic", [b"m1", b"m2"])  # dropped at once
            producer.deferred_publish("topic", b"d", 0.01)
            await producer.publish("topic", b"awaited")
            assert first.done() and first.result() is None
        with pytest.raises(aio.ClientClosedError):
            producer.publish("topic", b"closed")
        with pytest.raises(aio.ClientClosedError):
            producer.multi_publish("topic", [b"closed"])

    asyncio.run(main())
    wait_until_blocking(lambda: message_count(daemon, "topic") == 5)


@MODES
def test_a_task_group_takes_publishes_as_coroutines(daemon: BlockingNode, mode: str) -> None:
    """``TaskGroup.create_task`` and ``asyncio.create_task`` take only
    coroutines: a publish's future is one too, its task's result the answer."""

    async def main() -> None:
        async with aio.Producer([daemon.tcp_address], **MODE_OPTIONS[mode]) as producer:
            async with asyncio.TaskGroup() as group:
                ok = group.create_task(producer.publish("topic", b"ok"))
                both = group.create_task(producer.multi_publish("topic", [b"a", b"b"]))
            assert ok.result() is None and both.result() is None
            refused = asyncio.create_task(producer.publish("bad topic!", b"x"))
            with pytest.raises(trionsq.BadTopicError):
                await refused

    asyncio.run(main())
    wait_until_blocking(lambda: message_count(daemon, "topic") == 3)
