"""A connection's life, its writer and its socket's loan, and a consumer's life:
one state each, moved along its table (trionsq.connection's CONNECTION_MOVES,
WRITER_MOVES, LOAN_MOVES; trionsq.consumer's MOVES)."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

import trionsq
from trionsq import consumer as consumer_module
from trionsq.config import Config
from trionsq.connection import (
    CONNECTION_MOVES,
    LOAN_MOVES,
    WRITER_MOVES,
    Connection,
    ConnectionClosedError,
    Loan,
    Writer,
)
from trionsq.lifecycle import CLOSED, CLOSING, NEW, OPEN, OPENING, Lifecycle, LifecycleError, Moves
from trionsq.protocol import commands

from ..support.tables import reachable
from ..support.waiting import wait_until
from .minisrv import MiniNSQD

TABLES: dict[str, Moves[Any]] = {
    "life": CONNECTION_MOVES,
    "writer": WRITER_MOVES,
    "loan": LOAN_MOVES,
    "consumer": consumer_module.MOVES,
}


@pytest.mark.parametrize("name", sorted(TABLES))
def test_every_state_is_reached_and_left_for_where_it_ends(name: str) -> None:
    moves = TABLES[name]
    # (lives are of the shared Life enum: a connection has four of its states)
    every = (
        {OPENING, OPEN, CLOSING, CLOSED}
        if name == "life"
        else {NEW, OPENING, OPEN, CLOSING, CLOSED}
        if name == "consumer"
        else set(type(moves.initial))
    )
    assert reachable(moves, moves.initial) == every
    if name in ("life", "consumer"):
        assert not moves.table.get(CLOSED)  # the end
        for state in every:
            assert CLOSED in reachable(moves, state)
    else:  # the writer and the loan go round for as long as the connection runs
        for state in every:
            assert moves.initial in reachable(moves, state)


def test_a_connection_refuses_a_move_its_table_lacks() -> None:
    life = Lifecycle(CONNECTION_MOVES)
    assert life.state is OPENING
    with pytest.raises(LifecycleError, match="Connection: no move from opening to closing"):
        life.move(CLOSING)
    life.move(OPEN)
    life.move(CLOSED)
    with pytest.raises(LifecycleError):
        life.move(OPEN)
    assert Lifecycle(WRITER_MOVES).state is Writer.BUSY
    assert Lifecycle(LOAN_MOVES).state is Loan.READING


async def test_opened_closed_by_its_owner(nursery: trio.Nursery) -> None:
    node = MiniNSQD(nursery)
    config = Config(connector=node.connector)
    conn = await Connection.open("nsqd:4150", config)
    assert conn.life.state is OPEN and not conn.closed
    nursery.start_soon(conn.run)
    assert await conn.request(commands.pub("topic", b"x")) == b"OK"
    await conn.flush()
    await conn.aclose()
    assert conn.life.state is CLOSED and conn.closed
    assert conn.close_reason is None  # closed, not lost
    with pytest.raises(ConnectionClosedError):
        conn.send_nowait(commands.nop())
    await conn.aclose()  # again: nothing moves
    assert conn.life.state is CLOSED


async def test_lost_goes_from_open_to_closed_with_its_reason(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    node = MiniNSQD(nursery)
    conn = await Connection.open("nsqd:4150", Config(connector=node.connector))
    nursery.start_soon(conn.run)
    pending = conn.request_nowait(commands.pub("topic", b"x"))
    await pending.wait()
    await node.conns[0].close()
    await conn.wait_closed()
    assert conn.life.state is CLOSED
    assert conn.close_reason is not None and "closed by nsqd" in str(conn.close_reason)
    with pytest.raises(ConnectionClosedError):
        await conn.request(commands.pub("topic", b"y"))


async def test_the_writer_rests_idle_and_a_command_wakes_it(nursery: trio.Nursery) -> None:
    node = MiniNSQD(nursery)
    conn = await Connection.open("nsqd:4150", Config(connector=node.connector))
    assert conn.writer.state is Writer.BUSY  # not running yet: it finds what is queued
    nursery.start_soon(conn.run)
    await wait_until(lambda: conn.writer.state is Writer.IDLE)
    conn.send_nowait(commands.nop())
    assert conn.writer.state is Writer.BUSY
    await conn.flush()
    await wait_until(lambda: conn.writer.state is Writer.IDLE)
    await conn.aclose()


async def test_a_consumer_is_entered_once_and_its_flow_stops_once(nursery: trio.Nursery) -> None:
    node = MiniNSQD(nursery)
    consumer = trionsq.Consumer(
        "topic", "chan", nsqd_tcp_addresses=["nsqd:4150"], connector=node.connector
    )
    assert consumer._life.state is NEW
    with pytest.raises(RuntimeError, match="inside 'async with'"):
        await consumer.__anext__()
    async with consumer:
        assert consumer._life.state is OPEN
        await consumer.wait_connected()
        with pytest.raises(LifecycleError, match="entered only once"):
            await consumer.__aenter__()
    assert consumer._life.state is CLOSED
    assert consumer.take_ready(10) == []  # its flow stopped: nothing handed out
    with pytest.raises(StopAsyncIteration):
        await consumer.__anext__()
