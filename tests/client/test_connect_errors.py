"""A failed connection says what happened, the address once, in one wording
(trionsq.reasons) for the client's errors and log lines, the front ends and
the tools: ``cannot connect to nsqd ADDRESS: connection refused``, never
``ADDRESS: all attempts to connect to ADDRESS failed``; and nsqd's HTTP port
given as its TCP address says so (go-nsq's words), against the real nsqd and
fakensq, where it read as a frame of 1213486160 bytes (``HTTP``)."""

from __future__ import annotations

import asyncio
import logging

import pytest
import trio

import trionsq
from trionsq import aio
from trionsq.blocking import Producer as BlockingProducer
from trionsq.config import Config
from trionsq.connection import Connection
from trionsq.reasons import cannot_connect, naming, reason

from ..support.ports import refused_address
from ..support.waiting import wait_until
from ..tools.helpers import run_tool
from .daemons import Daemons

HTTP_ANSWER = (
    "unexpected HTTP response, a nsqd TCP endpoint is required (is this nsqd's HTTP port?)"
)


def test_the_wording_is_said_once_however_often_it_is_passed_on() -> None:
    address = "127.0.0.1:4150"
    first = trionsq.NSQConnectionError(cannot_connect(address, "connection refused"))
    assert str(first) == "cannot connect to nsqd 127.0.0.1:4150: connection refused"
    assert cannot_connect(address, first) == str(first)
    assert naming(address, first) == "127.0.0.1:4150: connection refused"
    assert reason(first, address) == "connection refused"
    # an error naming the address the older way loses it too
    assert reason(ValueError(f"{address}: frame too big"), address) == "frame too big"


async def test_the_producer_says_why_each_nsqd_failed(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="trionsq")
    with refused_address() as one, refused_address() as two, trio.fail_after(30):
        async with trionsq.Producer([one, two]) as producer:
            with pytest.raises(trionsq.NSQConnectionError) as caught:
                await producer.publish("topic", b"x")
    assert str(caught.value) == (
        f"no nsqd reachable ({one}: connection refused; {two}: connection refused)"
    )
    lines = [r.getMessage() for r in caplog.records if r.name == "trionsq.producer"]
    assert lines == [f"cannot connect to nsqd {a}: connection refused" for a in (one, two)]


async def test_the_consumer_logs_why_it_cannot_connect(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="trionsq.consumer")
    with refused_address() as dead:
        expected = f"cannot connect to nsqd {dead}: connection refused"
        async with trionsq.Consumer("topic", "chan", nsqd_tcp_addresses=[dead]):
            # the consumer's first attempt, on a real socket
            await wait_until(lambda: any(r.getMessage() == expected for r in caplog.records))


def test_the_blocking_and_asyncio_front_ends_raise_the_clients_error() -> None:
    with refused_address() as dead:
        expected = f"no nsqd reachable ({dead}: connection refused)"
        with BlockingProducer([dead]) as producer:
            with pytest.raises(trionsq.NSQConnectionError) as caught:
                producer.publish("topic", b"x")
        assert str(caught.value) == expected

        async def publish() -> None:
            async with aio.Producer([dead]) as producer:
                await producer.publish("topic", b"x")

        with pytest.raises(trionsq.NSQConnectionError) as caught:
            asyncio.run(publish())
        assert str(caught.value) == expected


def test_a_tool_says_it_in_the_same_words() -> None:
    with refused_address() as dead:
        ours = run_tool("tail", "--topic=t", f"--nsqd-tcp-address={dead}")
    assert ours.returncode == 1
    assert ours.stderr.decode().splitlines()[-1] == (
        f"trionsq tail: error: cannot connect to nsqd {dead}: connection refused"
    )


async def test_nsqds_http_port_given_as_its_tcp_address_says_so(
    daemons: Daemons, caplog: pytest.LogCaptureFixture
) -> None:
    nsqd = await daemons.nsqd()
    address = nsqd.http_address
    expected = f"cannot connect to nsqd {address}: {HTTP_ANSWER}"
    # nsqd's HTTP server answers the magic at once (400 Bad Request): the
    # error comes then, not at connect_timeout.
    config = Config(connect_timeout=600.0)
    with trio.fail_after(60):
        with pytest.raises(trionsq.NSQConnectionError) as caught:
            await Connection.open(address, config)
        assert str(caught.value) == expected

        async with trionsq.Producer([address], connect_timeout=600.0) as producer:
            with pytest.raises(trionsq.NSQConnectionError) as caught:
                await producer.publish("topic", b"x")
        assert str(caught.value) == f"no nsqd reachable ({address}: {HTTP_ANSWER})"

        caplog.set_level(logging.WARNING, logger="trionsq.consumer")
        async with trionsq.Consumer(
            "topic", "chan", nsqd_tcp_addresses=[address], connect_timeout=600.0
        ) as c:
            await wait_until(lambda: any(r.getMessage() == expected for r in caplog.records))
            assert c.connections == []

        # (a thread: fakensq answers in this test's Trio loop)
        ours = await trio.to_thread.run_sync(
            lambda: run_tool("tail", "--topic=t", f"--nsqd-tcp-address={address}")
        )
    assert ours.returncode == 1
    assert ours.stderr.decode().splitlines()[-1] == f"trionsq tail: error: {expected}"
