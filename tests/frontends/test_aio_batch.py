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
from .conftest import stats

pytestmark = pytest.mark.usefixtures("no_threads_left")

GUEST = pytest.mark.parametrize("guest", [True, False], ids=["guest", "thread"])


class Wakes:
    """Counts the wake-ups of a producer's Trio pump by its publishes."""

    def __init__(self, producer: aio.Producer) -> None:
        hosted = producer._hosted
        assert hosted is not None
        inbox = hosted.inbox
        self.count = 0
        wake = inbox.wake

        def counted() -> None:
            self.count += 1
            wake()

        inbox.wake = counted  # type: ignore[method-assign]


def message_count(daemon: BlockingNode, topic: str) -> int:
    return int(stats(daemon, topic).get("message_count", 0))


@GUEST
def test_a_gather_or_task_group_wakes_trio_once_or_few_times(
    daemon: BlockingNode, guest: bool
) -> None:
    async def main() -> tuple[int, int, int]:
        async with aio.Producer([daemon.tcp_address], guest=guest) as producer:
            await producer.publish("topic", b"warm")
            wakes = Wakes(producer)
            await asyncio.gather(*(producer.publish("topic", b"g%d" % i) for i in range(300)))
            gathered, wakes.count = wakes.count, 0
            async with asyncio.TaskGroup() as group:
                for i in range(200):
                    group.create_task(producer.multi_publish("topic", [b"m%d" % i, b"n"]))
            grouped, wakes.count = wakes.count, 0
            for i in range(5):  # one task in a loop: nothing to batch, one each
                await producer.publish("topic", b"l%d" % i)
            looped = wakes.count
            assert producer.stats.published == 1 + 300 + 400 + 5
        return gathered, grouped, looped

    gathered, grouped, looped = asyncio.run(main())
    if guest:  # asyncio runs all the tasks of an iteration before Trio's next step
        assert (gathered, grouped) == (1, 1)
    else:  # the Trio thread may drain the inbox while the loop still publishes
        assert 1 <= gathered <= 300 // 3 and 1 <= grouped <= 200 // 3, (gathered, grouped)
    assert looped == 5
    wait_until_blocking(lambda: message_count(daemon, "topic") == 706)


@GUEST
def test_each_publish_of_a_batch_gets_its_own_answer(nodes: BlockingDaemons, guest: bool) -> None:
    daemon = nodes.nsqd("--max-msg-size=10")

    async def main() -> list[Any]:
        async with aio.Producer([daemon.tcp_address], guest=guest) as producer:
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


@GUEST
def test_a_waiter_cancelled_in_a_batch(daemon: BlockingNode, guest: bool) -> None:
    """Cancelling a task awaiting a publish stops its wait; the publish, handed
    over when the task ran, goes on; the others of its batch are unaffected."""

    async def main() -> None:
        async with aio.Producer([daemon.tcp_address], guest=guest) as producer:
            await producer.publish("topic", b"warm")
            tasks = [asyncio.create_task(producer.publish("cut", b"%d" % i)) for i in range(10)]
            never = asyncio.create_task(producer.publish("cut", b"never"))
            never.cancel()  # before it ran: its coroutine never starts
            await asyncio.sleep(0)  # the others ran: their publishes are handed over
            tasks[4].cancel()
            await asyncio.wait([*tasks, never])
            assert tasks[4].cancelled() and never.cancelled()
            assert all(t.result() is None for i, t in enumerate(tasks) if i != 4)

    asyncio.run(main())
    wait_until_blocking(lambda: message_count(daemon, "cut") == 10)


@GUEST
def test_publishes_awaited_as_the_producer_closes(daemon: BlockingNode, guest: bool) -> None:
    """Publishes handed over before the ``async with`` is left get their
    answers; later ones raise ClientClosedError."""

    async def main() -> list[Any]:
        producer = aio.Producer([daemon.tcp_address], guest=guest)
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
