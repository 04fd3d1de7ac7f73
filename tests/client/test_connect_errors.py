"""A failed connection says what happened, the address once, in one wording
(trionsq.reasons) for the client's errors and log lines, the front ends and
the tools: ``cannot connect to nsqd ADDRESS: connection refused``, never
``ADDRESS: all attempts to connect to ADDRESS failed``; and nsqd's HTTP port
given as its TCP address says so (go-nsq's words), against the real nsqd and
fakensq, where it read as a frame of 1213486160 bytes (``HTTP``)."""

from __future__ import annotations

import asyncio
import functools
import logging

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

import trionsq
from trionsq import aio
from trionsq.blocking import Producer as BlockingProducer
from trionsq.config import Config
from trionsq.connection import Connection
from trionsq.protocol import handshake
from trionsq.reasons import cannot_connect, naming, reason

from ..support.ports import free_address, refused_address
from ..support.tls import Pki
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


def blocking_publish_error(address: str) -> str:
    """What the blocking producer (its own I/O, in the calling thread) raises
    publishing to ``address``."""
    with BlockingProducer([address], connect_timeout=60.0) as producer:
        with pytest.raises(trionsq.NSQConnectionError) as caught:
            producer.publish("topic", b"x")
    return str(caught.value)


async def test_nsqds_https_port_given_as_its_tcp_address_says_so(
    daemons: Daemons, pki: Pki
) -> None:
    # nsqd's HTTPS port reads the magic as a broken TLS hello and closes
    # without a byte (checked on nsqd v1.3.0): not "closed during handshake",
    # which reads as nsqd failing midway.
    https = free_address()
    nsqd = await daemons.nsqd(*pki.nsqd_flags(f"--https-address={https}"))
    assert nsqd.tcp_address != https
    expected = f"cannot connect to nsqd {https}: {handshake.NO_ANSWER}"
    with trio.fail_after(60):
        with pytest.raises(trionsq.NSQConnectionError) as caught:
            await Connection.open(https, Config(connect_timeout=600.0))
    assert str(caught.value) == expected
    said = await trio.to_thread.run_sync(blocking_publish_error, https)
    assert said == f"no nsqd reachable ({https}: {handshake.NO_ANSWER})"


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (b"\x15\x03\x01\x00\x02\x02\x46", handshake.TLS_ANSWER),  # a TLS alert
        (b"\x16\x03\x03\x00\x05hello", handshake.TLS_ANSWER),  # a TLS handshake record
        (b"HTTP/1.1 400 Bad Request\r\n\r\n", handshake.HTTP_ANSWER),
        (b"", handshake.NO_ANSWER),  # closed without a byte
        (b"\x00\x00", "connection closed during handshake"),  # half an answer
    ],
    ids=["tls-alert", "tls-handshake", "http", "nothing", "cut-short"],
)
async def test_a_peer_that_is_no_nsqd_is_named_for_what_it_answered(
    answer: bytes, said: str
) -> None:
    async def serve(stream: trio.SocketStream) -> None:
        # The whole greeting read first (the magic, IDENTIFY and its body):
        # a close with unread bytes would be a reset, another answer.
        greeting = b""
        while True:
            head = greeting.find(b"IDENTIFY\n")
            if head >= 0 and len(greeting) >= head + 13:
                size = int.from_bytes(greeting[head + 9 : head + 13], "big")
                if len(greeting) >= head + 13 + size:
                    break
            greeting += await stream.receive_some(4096)
        if answer:
            await stream.send_all(answer)
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        (listener,) = await nursery.start(
            functools.partial(trio.serve_tcp, serve, 0, host="127.0.0.1")
        )
        port = listener.socket.getsockname()[1]
        address = f"127.0.0.1:{port}"
        with trio.fail_after(60):
            with pytest.raises(trionsq.NSQConnectionError) as caught:
                await Connection.open(address, Config(connect_timeout=600.0))
        assert str(caught.value) == f"cannot connect to nsqd {address}: {said}"
        blocking = await trio.to_thread.run_sync(blocking_publish_error, address)
        assert blocking == f"no nsqd reachable ({address}: {said})"
        nursery.cancel_scope.cancel()


@given(st.binary(min_size=4, max_size=4))
def test_only_another_protocols_head_is_taken_for_it(header: bytes) -> None:
    said = handshake.foreign_answer(header)
    if said is not None:
        assert header == b"HTTP" or header[:2] in (b"\x15\x03", b"\x16\x03")
        assert handshake.answer_size(header, 2**40) is None
        return
    size = int.from_bytes(header, "big", signed=True)
    if size >= 4:
        assert handshake.answer_size(header, 2**40) == size
    else:
        with pytest.raises(trionsq.NSQError):
            handshake.answer_size(header, 2**40)
