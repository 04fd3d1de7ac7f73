"""The front ends' lives: one enum, a table of moves each, one place that moves it."""

from __future__ import annotations

import asyncio
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trionsq import aio, blocking
from trionsq.aio import consumer as aio_consumer
from trionsq.aio import producer as aio_producer
from trionsq.blocking import consumer as blocking_consumer
from trionsq.hosting.producer import ClientClosedError
from trionsq.lifecycle import CLOSED, NEW, OPEN, OPENING, Life, Lifecycle, LifecycleError, Moves

from ..support.nodes import BlockingNode
from ..support.tables import reachable

#: every front end's table
TABLES = {
    "blocking.Consumer": blocking_consumer.MOVES,
    "aio.Consumer": aio_consumer.MOVES,
    "aio.Producer": aio_producer.MOVES,
}


@pytest.mark.parametrize("name", sorted(TABLES))
def test_every_state_of_a_table_is_lived_and_every_life_can_end(name: str) -> None:
    moves = TABLES[name]
    states = set(moves.table) | {t for targets in moves.table.values() for t in targets}
    assert moves.initial is NEW
    assert reachable(moves, NEW) == states
    for state in states:
        assert CLOSED in reachable(moves, state), f"{name}: no end from {state}"
    assert not moves.table.get(CLOSED), f"{name}: closed is not final"


@given(st.lists(st.sampled_from(list(Life)), max_size=30), st.sampled_from(sorted(TABLES)))
def test_a_lifecycle_moves_only_along_its_table(targets: list[Life], name: str) -> None:
    moves = TABLES[name]
    life = Lifecycle(moves)
    for target in targets:
        before = life.state
        if moves.allows(before, target):
            assert life.move(target) is before
            assert life.state is target
        else:
            with pytest.raises(LifecycleError):
                life.move(target)
            assert life.state is before


def test_a_refused_move_says_why_in_the_objects_words() -> None:
    moves = Moves("thing", NEW, {NEW: {OPEN}, OPEN: {CLOSED}}, refusals={OPEN: "once ({state})"})
    life = Lifecycle(moves)
    life.move(OPEN)
    with pytest.raises(LifecycleError, match=r"^once \(open\)$"):
        life.move(OPEN)
    with pytest.raises(LifecycleError, match="thing: no move from open to new"):
        life.move(NEW)
    assert repr(life) == "<thing open>"
    assert isinstance(LifecycleError(), RuntimeError)


def test_a_blocking_consumer_starts_once(daemon: BlockingNode) -> None:
    consumer = blocking.Consumer("topic", "chan", nsqd_tcp_addresses=[daemon.tcp_address])
    assert "new" in repr(consumer) and not consumer.closed
    with pytest.raises(RuntimeError, match=r"only once \(it is open\)"):
        consumer.start().start()
    consumer.close()
    assert consumer.closed
    consumer.close()  # again: nothing to do
    with pytest.raises(RuntimeError, match=r"only once \(it is closed\)"):
        consumer.start()
    never_started = blocking.Consumer("topic", "chan", nsqd_tcp_addresses=[daemon.tcp_address])
    never_started.close()
    assert never_started.closed


def test_an_aio_consumer_closed_while_it_is_entered_ends_what_it_started(
    daemon: BlockingNode,
) -> None:
    before = set(threading.enumerate())

    async def main() -> None:
        consumer = aio.Consumer(
            "topic", "chan", nsqd_tcp_addresses=[daemon.tcp_address], guest=False
        )

        async def enter() -> None:
            async with consumer:
                raise AssertionError("the block runs although it was closed")

        entering = asyncio.create_task(enter())
        await asyncio.sleep(0)
        assert "opening" in repr(consumer)
        await consumer.aclose()
        assert consumer.closed
        with pytest.raises(LifecycleError, match="closed while it was being entered"):
            await entering
        assert consumer.closed

    asyncio.run(main())
    left = [t for t in set(threading.enumerate()) - before if t.is_alive()]
    assert not left, f"threads left behind: {left}"


def test_an_aio_producer_closes_once_and_refuses_publishes_while_closing(
    daemon: BlockingNode,
) -> None:
    async def main() -> None:
        producer = aio.Producer([daemon.tcp_address], guest=False)
        assert "new" in repr(producer) and not producer.closed
        async with producer:
            assert "open" in repr(producer)
            await producer.publish("topic", b"body")
            with pytest.raises(LifecycleError, match="only once"):
                await producer.__aenter__()
            closing = asyncio.create_task(producer.aclose())
            await asyncio.sleep(0)
            assert producer.closed  # closing counts as closed: publishing is over
            with pytest.raises(ClientClosedError):
                await producer.publish("topic", b"late")
            await closing
        assert "closed" in repr(producer)
        await producer.aclose()  # again: nothing to do

    asyncio.run(main())


@pytest.mark.parametrize("name", sorted(TABLES))
def test_the_tables_refuse_a_second_start_in_the_callers_words(name: str) -> None:
    life = Lifecycle(TABLES[name])
    life.move(OPENING)
    with pytest.raises(LifecycleError, match="only once"):
        life.move(OPENING)
    assert life.state is OPENING
