"""Interop: pynsq (the official tornado client) against fakensq over real TCP."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import nsq  # pynsq, installed by the test extra
import pytest
import trio

import fakensq

from ..support.tls import Pki
from ..support.waiting import wait_until_asyncio


def _pynsq_roundtrip(
    tcp_address: str,
    count: int,
    features: dict[str, Any],
    on_done: Any = None,
) -> list[bytes]:
    """Publish ``count`` messages with a Writer and read them with a Reader
    (FIN'ing all, REQ'ing each first attempt of every 5th)."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    from tornado.ioloop import IOLoop

    ioloop = IOLoop.current()
    received: list[bytes] = []
    done = asyncio.Event()
    errors: list[str] = []

    def handler(message: Any) -> bool:
        body = bytes(message.body)
        if int(body) % 5 == 0 and message.attempts == 1:
            message.requeue(backoff=False, delay=0)
            return None  # type: ignore[return-value]
        received.append(body)
        if len(received) == count:
            done.set()
        return True

    reader = nsq.Reader(
        topic="interop",
        channel="ch",
        message_handler=handler,
        nsqd_tcp_addresses=[tcp_address],
        max_in_flight=50,
        **features,
    )
    writer = nsq.Writer([tcp_address], **features)

    async def publish() -> None:
        # pynsq offers no event for its connection: polled, under a deadline.
        await wait_until_asyncio(lambda: writer.conns, step=0.01, what="pynsq's Writer connected")
        for start in range(0, count, 10):
            batch = [b"%d" % i for i in range(start, min(count, start + 10))]
            fut: asyncio.Future[Any] = loop.create_future()

            def callback(conn: Any, data: Any, fut: asyncio.Future[Any] = fut) -> None:
                if isinstance(data, Exception):
                    errors.append(repr(data))
                fut.set_result(data)

            writer.mpub("interop", batch, callback=callback)
            await fut
        await asyncio.wait_for(done.wait(), 20)
        if on_done is not None:
            on_done()

    try:
        loop.run_until_complete(publish())
    finally:
        reader.close()
        writer.close() if hasattr(writer, "close") else None
        ioloop.close(all_fds=False)
        loop.close()
    assert not errors, errors
    return received


# (not snappy, not deflate: pynsq breaks on them as on nsqd, where a read
# ends at one of nsqd's writes that decompresses to nothing; see
# tests/conformance/test_pynsq_codecs.py)
@pytest.mark.parametrize(
    "features",
    [
        {},
        {"output_buffer_timeout": 50, "heartbeat_interval": 1, "sample_rate": 0},
    ],
    ids=["plain", "buffering"],
)
async def test_pynsq_reader_and_writer(features: dict[str, Any]) -> None:
    async with fakensq.NSQD(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0") as nsqd:
        with trio.fail_after(30):
            received = await trio.to_thread.run_sync(
                functools.partial(_pynsq_roundtrip, nsqd.tcp_address, 60, features)
            )
        assert sorted(received, key=int) == [b"%d" % i for i in range(60)]
        channel = nsqd.stats()["topics"][0]["channels"][0]
        assert channel["requeue_count"] == 12
        assert channel["message_count"] == 60


async def test_pynsq_tls_and_auth(tmp_path: Any) -> None:
    import ssl

    pki = Pki(tmp_path)
    grant = {
        "ttl": 60,
        "identity": "pynsq",
        "authorizations": [
            {"topic": ".*", "channels": [".*"], "permissions": ["publish", "subscribe"]}
        ],
    }
    async with fakensq.NSQD(
        tcp_address="127.0.0.1:0",
        http_address="",
        ssl_context=pki.server_context(),
        tls_required=1,
        auth_handler=lambda query: grant if query["secret"] == "pw" else {},
    ) as nsqd:
        features = {
            "tls_v1": True,
            "tls_options": {"ca_certs": pki.ca_file, "cert_reqs": ssl.CERT_REQUIRED},
            "auth_secret": "pw",
            # (not snappy: pynsq breaks on snappy over TLS, on nsqd as on fakensq;
            # see tests/conformance/test_pynsq_suite.py)
        }
        seen: list[dict[str, Any]] = []

        def snapshot() -> None:
            seen.append(trio.from_thread.run_sync(nsqd.stats))

        with trio.fail_after(30):
            received = await trio.to_thread.run_sync(
                functools.partial(_pynsq_roundtrip, nsqd.tcp_address, 20, features, snapshot)
            )
        assert len(received) == 20
        client = seen[0]["topics"][0]["channels"][0]["clients"][0]
        assert client["tls"] and client["auth_identity"] == "pynsq"
