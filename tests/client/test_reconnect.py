"""A consumer's reconnect delays to a configured nsqd (``reconnect_backoff``)
start again after a connection that worked: an nsqd restarted under it is
connected to again within ``base`` (1 s), however many failures came before
(issue 30: a consumer whose connection had lived 10 s took 5.8 s, the delays
reset only after a connection lived ``max``, 60 s).  Failures to connect,
and connections ended by what the nsqd sent, still make them grow."""

from __future__ import annotations

import itertools
import logging
import re

import pytest
import trio
import trio.testing

import trionsq

from ..support.waiting import wait_until
from .daemons import Daemons, consumer, publish
from .minisrv import MiniNSQD

#: no jitter: the delays are exact
POLICY = trionsq.BackoffPolicy(base=1.0, max=60.0, multiplier=2.0, jitter=0.0)
#: an unknown frame type: the connection ends with a protocol error
GARBAGE = b"\x00\x00\x00\x05\x00\x00\x00\x07!"


def _recording(node: MiniNSQD, attempts: list[float]) -> trionsq.transport.Connector:
    async def connector(host: str, port: int) -> trio.abc.Stream:
        attempts.append(trio.current_time())
        return await node.connector(host, port)

    return connector


def _consumer(node: MiniNSQD, attempts: list[float]) -> trionsq.Consumer:
    """A consumer of nsqd:4150 recording when it connects."""
    return trionsq.Consumer(
        "topic",
        "chan",
        nsqd_tcp_addresses=["nsqd:4150"],
        connector=_recording(node, attempts),
        reconnect_backoff=POLICY,
    )


def _gaps(times: list[float]) -> list[float]:
    return [round(b - a, 3) for a, b in itertools.pairwise(times)]


async def test_a_connection_that_worked_starts_the_delays_again(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    node = MiniNSQD(nursery)
    attempts: list[float] = []
    node.refuse = True  # the consumer starts before its nsqd: the delays grow
    async with _consumer(node, attempts) as c:
        await wait_until(lambda: len(attempts) == 5, limit=100)
        assert _gaps(attempts) == [1.0, 2.0, 4.0, 8.0]
        node.refuse = False
        await c.wait_connected()
        await trio.sleep(10)  # it lives 10 s, then nsqd restarts
        lost = trio.current_time()
        await node.live[0].close()
        await wait_until(lambda: len(node.live) == 1 and c.connections == ["nsqd:4150"])
        assert attempts[-1] - lost == pytest.approx(1.0)  # base, not 32 s
        # Down for longer: from base again, growing.
        node.refuse = True
        before = len(attempts)
        lost = trio.current_time()
        await node.live[0].close()
        await wait_until(lambda: len(attempts) == before + 4, limit=100)
        assert _gaps([lost, *attempts[before:]]) == [1.0, 2.0, 4.0, 8.0]


async def test_connections_ended_by_what_nsqd_sent_keep_the_delays_growing(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    node = MiniNSQD(nursery)
    attempts: list[float] = []
    async with _consumer(node, attempts):
        for served in range(1, 5):
            await wait_until(lambda n=served: len(node.conns) == n and node.conns[-1].subscribed)
            await node.conns[-1].send(GARBAGE)
        await wait_until(lambda: len(attempts) == 5, limit=100)
    # (the garbage goes out at wait_for's next step, a millisecond on)
    assert _gaps(attempts) == pytest.approx([1.0, 2.0, 4.0, 8.0], abs=0.01)


async def test_a_restarted_nsqd_is_reconnected_to_after_base_each_time(
    daemons: Daemons, caplog: pytest.LogCaptureFixture
) -> None:
    """nsqd (real and fakensq) stopped and started three times under a
    consumer: each time its connection is lost, the next attempt is planned
    within ``base`` (before: the failures of every restart added up, 2 s,
    4 s, ... however long the connections had worked), and it reconnects."""
    caplog.set_level(logging.INFO, logger="trionsq.consumer")
    nsqd = await daemons.nsqd()
    got: list[bytes] = []
    async with consumer([nsqd], handler=lambda m: got.append(m.body)) as c:
        for restart in range(3):
            body = b"before restart %d" % restart
            await publish(nsqd, "topic", [body])
            await wait_until(lambda b=body: b in got, limit=60, step=0.01)
            await nsqd.stop()
            await nsqd.start()
        await publish(nsqd, "topic", [b"after"])
        await wait_until(lambda: b"after" in got, limit=60, step=0.01)
        assert c.connections == [nsqd.tcp_address]
    # The first delay after each subscription's loss.
    after_loss: list[float] = []
    subscribed = False
    for record in caplog.records:
        text = record.getMessage()
        if "subscribed to topic/chan" in text:
            subscribed = True
        elif subscribed and (found := re.match(r"reconnecting to \S+ in ([\d.]+)s", text)):
            after_loss.append(float(found.group(1)))
            subscribed = False
    assert len(after_loss) == 3, [r.getMessage() for r in caplog.records]
    assert all(delay <= 1.0 for delay in after_loss), after_loss
