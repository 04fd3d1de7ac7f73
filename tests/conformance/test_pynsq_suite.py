"""pynsq's own ``ReaderIntegrationTest`` cases (TLS and snappy), on fakensq and nsqd.

pynsq 0.9.1's ``test_conn_subscribe``, ``test_conn_messages``,
``test_reader_messages`` and ``test_reader_coro`` connect with ``tls_v1`` and
``snappy`` (``tls_options={'cert_reqs': CERT_NONE}``, a 4096-byte output
buffer, 50 ms timeout, 10 s heartbeats).  They fail on nsqd v1.3.0, and must
fail on fakensq the same way (``python tests/peer_suites.py pynsq`` runs the
suite itself).  Why they fail:

nsqd writes each snappy chunk with golang/snappy's unbuffered ``Writer``:
a chunk that does not compress (the ``OK`` of every answer) is two writes, its
8-byte header then its data, and over TLS each write is a record of its own.
pynsq's ``SnappySocket.recv`` reads one record (``SSLSocket.recv`` returns
one record at a time), gets a chunk header that decompresses to nothing and
raises ``socket.error(EWOULDBLOCK)``, a plain ``OSError(11)`` in Python 3,
not the ``BlockingIOError`` tornado expects: tornado closes the stream.  The
``OK`` after the snappy upgrade comes within the upgrade's bytes (pynsq reads
them all at once), so the first answer read through ``SnappySocket``, SUB's
``OK``, is where the connection ends.

Each case here is the suite's case written again (same options, same
steps), on a daemon of this run's ports, and reports what pynsq saw.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import Callable
from typing import Any

import nsq  # pynsq, installed by the test extra
import pytest
import tornado.gen
import trio

from ..support.tls import Pki
from .conftest import Conformance, Target

#: pynsq's ReaderIntegrationTest.identify_options.
IDENTIFY_OPTIONS: dict[str, Any] = {
    "user_agent": "sup",
    "snappy": True,
    "tls_v1": True,
    "tls_options": {"cert_reqs": ssl.CERT_NONE},
    "heartbeat_interval": 10,
    "output_buffer_size": 4096,
    "output_buffer_timeout": 50,
}

#: How long a case waits for what it waits for (pynsq's tests: 5 s).
CASE_TIMEOUT = 10.0


def _stream_error(conn: Any) -> str:
    error = getattr(conn.stream, "error", None) if conn.stream is not None else None
    return repr(error)


def _run_pynsq(case: Callable[[asyncio.Future[str]], None]) -> str:
    """Run a pynsq case on its own event loop (in a worker thread); its outcome."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    from tornado.ioloop import IOLoop

    ioloop = IOLoop.current()
    try:
        outcome: asyncio.Future[str] = loop.create_future()
        case(outcome)
        return loop.run_until_complete(asyncio.wait_for(outcome, CASE_TIMEOUT))
    except TimeoutError:
        return "timed out"
    finally:
        ioloop.close(all_fds=True)
        loop.close()


def _conn_subscribe(host: str, port: int, topic: str, done: asyncio.Future[str]) -> None:
    c = nsq.AsyncConn(host, port, **IDENTIFY_OPTIONS)

    def on_ready(**kwargs: Any) -> None:
        c.on("response", lambda **kw: done.done() or done.set_result(f"response {kw['data']!r}"))
        c.send(nsq.protocol.subscribe(topic, "ch"))

    def on_close(**kwargs: Any) -> None:
        if not done.done():
            done.set_result(f"closed after SUB: {_stream_error(c)}")

    c.on("ready", on_ready)
    c.on("close", on_close)
    c.connect()


def _conn_messages(host: str, port: int, topic: str, done: asyncio.Future[str]) -> None:
    c = nsq.AsyncConn(host, port, **IDENTIFY_OPTIONS)
    count = 0

    def on_message(**kwargs: Any) -> None:
        nonlocal count
        count += 1
        if c.in_flight == 5 and not done.done():
            done.set_result("5 messages")

    def on_ready(**kwargs: Any) -> None:
        c.on("message", on_message)
        c.send(nsq.protocol.subscribe(topic, "ch"))
        c.send_rdy(5)

    def on_close(**kwargs: Any) -> None:
        if not done.done():
            done.set_result(f"closed after {count} messages: {_stream_error(c)}")

    c.on("ready", on_ready)
    c.on("close", on_close)
    c.connect()


def _reader(
    host: str, port: int, topic: str, n: int, max_in_flight: int, coro: bool
) -> Callable[[asyncio.Future[str]], None]:
    def case(done: asyncio.Future[str]) -> None:
        count = 0

        def handler(msg: Any) -> bool:
            nonlocal count
            assert msg.body == b"sup"
            count += 1
            if count >= n and not done.done():
                done.set_result(f"{n} messages")
            return True

        @tornado.gen.coroutine  # type: ignore[misc]
        def coro_handler(msg: Any) -> Any:
            yield tornado.gen.sleep(0.1)
            return handler(msg)

        class Reader(nsq.Reader):  # type: ignore[misc]
            def _on_connection_close(self, conn: Any, **kwargs: Any) -> None:
                if not done.done():
                    done.set_result(f"closed after {count} messages: {_stream_error(conn)}")
                super()._on_connection_close(conn, **kwargs)

        reader = Reader(
            nsqd_tcp_addresses=[f"{host}:{port}"],
            topic=topic,
            channel="ch",
            message_handler=coro_handler if coro else handler,
            max_in_flight=max_in_flight,
            **IDENTIFY_OPTIONS,
        )
        done.add_done_callback(lambda _: reader.close())

    return case


async def _publish(t: Target, topic: str, n: int) -> None:
    async with t.http() as http:
        for _ in range(n):
            (await http.post("/pub", params={"topic": topic}, content=b"sup")).raise_for_status()


CASES = ["test_conn_subscribe", "test_conn_messages", "test_reader_messages", "test_reader_coro"]

#: What pynsq sees, on fakensq and on nsqd: SnappySocket's OSError(11)
#: (EWOULDBLOCK without the errno attribute tornado would have recognised).
BROKEN = "closed after {}: OSError(11)"


@pytest.mark.parametrize("case", CASES)
async def test_pynsq_reader_integration_fails_on_both(
    conformance: Conformance, pki: Pki, case: str
) -> None:
    async def scenario(t: Target) -> Any:
        host, port = t.tcp_address.rsplit(":", 1)
        topic = f"pynsq_{case}"
        if case == "test_conn_subscribe":
            run = functools.partial(_conn_subscribe, host, int(port), topic)
        elif case == "test_conn_messages":
            await _publish(t, topic, 5)
            run = functools.partial(_conn_messages, host, int(port), topic)
        elif case == "test_reader_messages":
            await _publish(t, topic, 500)
            run = _reader(host, int(port), topic, 500, 100, coro=False)
        else:
            await _publish(t, topic, 20)
            run = _reader(host, int(port), topic, 20, 10, coro=True)
        with trio.fail_after(CASE_TIMEOUT + 10):
            return await trio.to_thread.run_sync(_run_pynsq, run)

    expected = BROKEN.format("SUB" if case == "test_conn_subscribe" else "0 messages")
    await conformance.nsqd(
        scenario,
        "--snappy",
        *pki.nsqd_flags(),
        expect=([], expected),
    )


async def test_pynsq_tls_alone_works_on_both(
    conformance: Conformance, pki: Pki
) -> None:
    # Without snappy, the same pynsq reads nsqd's TLS records through tornado's
    # SSL stream, which reads every record there is: no difference shows.
    async def scenario(t: Target) -> Any:
        host, port = t.tcp_address.rsplit(":", 1)
        await _publish(t, "plain_tls", 5)
        options = {**IDENTIFY_OPTIONS, "snappy": False}

        def case(done: asyncio.Future[str]) -> None:
            c = nsq.AsyncConn(host, int(port), **options)
            count = 0

            def on_message(**kwargs: Any) -> None:
                nonlocal count
                count += 1
                if count == 5:
                    done.set_result("5 messages")

            def on_ready(**kwargs: Any) -> None:
                c.on("message", on_message)
                c.send(nsq.protocol.subscribe("plain_tls", "ch"))
                c.send_rdy(5)

            c.on("ready", on_ready)
            c.connect()

        with trio.fail_after(CASE_TIMEOUT + 10):
            return await trio.to_thread.run_sync(_run_pynsq, case)

    await conformance.nsqd(
        scenario,
        *pki.nsqd_flags(),
        expect=([], "5 messages"),
    )
