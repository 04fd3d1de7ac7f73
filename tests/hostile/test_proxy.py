"""Hostile peers of ``fakensq proxy`` (a FaultProxy in front of a real nsqd):
its TCP listener, which relays every byte and follows NSQ's framing on the way
(the commands, IDENTIFY's names, the frames), and its HTTP API.

The proxy's own memory is measured (tracemalloc: the upstream nsqd is the real
one, in its own process); the relay must end alone and lose nothing of the
other connections.
"""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fakensq.testing.faults import Faults, FaultyStream
from fakensq.testing.proxy import FaultProxy
from trionsq.protocol import commands as cmds
from trionsq.protocol.frames import Error, FrameParser, Response

from .. import reference
from .peers import TIMEOUT, MiB, ask, closed_by_peer, connect, exchange, flood, get, traced_peak
from .test_nsqd_http import MAX_HEAD, _head_of, _post

GiB = 1024 * MiB


@asynccontextmanager
async def _proxied(*flags: str) -> AsyncIterator[FaultProxy]:
    reference.require("nsqd")
    async with reference.open_nsqd(*flags) as nsqd, FaultProxy(nsqd.tcp_address) as proxy:
        yield proxy


async def _answers(stream: trio.SocketStream, n: int) -> list[Any]:
    """The next ``n`` frames (responses and errors as text), or fewer and
    "closed"."""
    parser = FrameParser(max_frame_size=128 * MiB)
    got: list[Any] = []
    with trio.fail_after(TIMEOUT):
        while len(got) < n:
            data = await stream.receive_some(65536)
            if not data:
                return [*got, "closed"]
            for frame in parser.feed(bytes(data)):
                if isinstance(frame, Response | Error):
                    got.append(frame.data.decode())
    return got


async def _publish_through(proxy: FaultProxy, topic: str) -> list[Any]:
    stream = await connect(proxy.tcp_address)
    try:
        await stream.send_all(cmds.MAGIC_V2 + cmds.pub(topic, b"served"))
        return await _answers(stream, 1)
    finally:
        await stream.aclose()


async def test_line_without_newline() -> None:
    """1 GiB with no newline through the proxy: nsqd closes at 16 KiB, the
    relay ends, the proxy holds no more than a read or two meanwhile."""
    async with _proxied() as proxy:
        with traced_peak() as peak:
            stream = await connect(proxy.tcp_address)
            with trio.fail_after(TIMEOUT):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(closed_by_peer, stream)
                    await stream.send_all(cmds.MAGIC_V2)
                    sent = await flood(stream, GiB, b"A" * (64 * 1024))
            await stream.aclose()
            assert await _publish_through(proxy, "t") == ["OK"]
        print(f"PEAK proxy 1 GiB line: {peak.mib:.2f} MiB (sent {sent / MiB:.1f} MiB)")
        assert sent < GiB
        assert peak.bytes < 8 * MiB


@pytest.mark.parametrize("command", [b"PUB t\n", b"MPUB t\n", b"DPUB t 0\n"])
async def test_large_body(command: bytes) -> None:
    """A 60 MiB body, which an nsqd with 64 MiB limits takes: the proxy relays
    it without holding it (before: it kept every body whole, up to 64 MiB, to
    step over it)."""
    big = 64 * MiB
    async with _proxied(f"--max-msg-size={big}", f"--max-body-size={big}") as proxy:
        with traced_peak() as peak:
            stream = await connect(proxy.tcp_address)
            await stream.send_all(cmds.MAGIC_V2 + command)
            body = 60 * MiB
            if command.startswith(b"MPUB"):
                await stream.send_all(struct.pack(">ll", body + 8, 1))
            await stream.send_all(struct.pack(">l", body))
            with trio.fail_after(TIMEOUT):
                await flood(stream, body, b"B" * MiB)
            answers = await _answers(stream, 1)
            await stream.aclose()
        print(f"PEAK proxy 60 MiB {command.split()[0].decode()} body: {peak.mib:.2f} MiB")
        assert answers == ["OK"]
        assert peak.bytes < 8 * MiB


async def test_consumer_that_never_reads() -> None:
    """SUB with RDY 200 through the proxy and never a read, while 200 messages
    of 64 KiB are published: the relay stops reading from nsqd (its socket
    full), nsqd's write deadline ends the connection, the proxy holds one read;
    a consumer after it gets every message."""
    async with _proxied() as proxy:
        with traced_peak() as peak:
            deaf = await connect(proxy.tcp_address)
            body = {"heartbeat_interval": 1000, "msg_timeout": 1000}
            await deaf.send_all(
                cmds.MAGIC_V2 + cmds.identify(body) + cmds.sub("t", "c") + cmds.rdy(200)
            )
            producer = await connect(proxy.tcp_address)
            await producer.send_all(cmds.MAGIC_V2)
            for start in range(0, 200, 20):
                bodies = [b"%04d" % i + b"." * (64 * 1024 - 4) for i in range(start, start + 20)]
                await producer.send_all(cmds.mpub("t", bodies))
                assert await _answers(producer, 1) == ["OK"]
            with trio.fail_after(TIMEOUT):
                await closed_by_peer(deaf)  # (what was sent before the close, read here)
            await producer.aclose()
        from .peers import drain

        got = sorted(b[:4] for b in await drain(proxy.tcp_address, "t", "c", 200))
        print(f"PEAK proxy never-reading consumer: {peak.mib:.2f} MiB")
        assert got == [b"%04d" % i for i in range(200)]
        assert peak.bytes < 8 * MiB


# --- garbage at every offset, both ways, through the framing scanner ----------------

VALID_IN = b"".join(
    [
        cmds.MAGIC_V2,
        cmds.identify({"client_id": "c", "hostname": "h", "msg_timeout": 5000}),
        cmds.pub("t", b"one"),
        cmds.mpub("t", [b"two", b"three"]),
        cmds.sub("t", "c"),
        cmds.rdy(3),
        cmds.nop(),
    ]
)
VALID_OUT = b"".join(
    [
        struct.pack(">ll", 6, 0) + b"OK",
        struct.pack(">ll", 15, 0) + b"_heartbeat_",
        struct.pack(">llqH16s", 30 + 3, 2, 1, 1, b"0" * 16) + b"one",
        struct.pack(">ll", 30, 1) + b"E_INVALID invalid command X",
    ]
)


def _spoil(data: bytes, offset: int, how: str, garbage: bytes) -> bytes:
    offset = min(offset, len(data))
    if how == "replace":
        return data[:offset] + garbage[:1] + data[offset + 1 :]
    if how == "insert":
        return data[:offset] + garbage + data[offset:]
    return data[:offset] + garbage


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    offset=st.integers(0, max(len(VALID_IN), len(VALID_OUT))),
    how=st.sampled_from(["replace", "insert", "garbage_tail"]),
    garbage=st.binary(min_size=1, max_size=64),
    chunk=st.integers(1, 300),
)
async def test_scanner_takes_any_bytes(offset: int, how: str, garbage: bytes, chunk: int) -> None:
    """The proxy's view of the stream (the client's commands, nsqd's frames)
    spoiled at one offset and cut into chunks: nothing raises, the client's
    bytes are relayed as they came, nsqd's whole frames too (an unfinished
    one waits), and what the scanner holds stays within what it was given."""
    inbound = _spoil(VALID_IN, offset, how, garbage)
    outbound = _spoil(VALID_OUT, offset, how, garbage)
    client, server = trio.testing.memory_stream_pair()
    faults = Faults(None)
    stream = FaultyStream(server, faults, "nsqd-0", "127.0.0.1:1", parse_nsq=True)
    relayed = bytearray()
    for start in range(0, len(inbound), chunk):
        await client.send_all(inbound[start : start + chunk])
        relayed += await stream.receive_some(chunk)
    assert relayed == inbound
    for start in range(0, len(outbound), chunk):
        await stream.send_all(outbound[start : start + chunk])
    # nsqd's frames go on whole: a frame not complete yet (its size spoiled)
    # waits in the scanner; everything before it has gone, as it came.
    held = len(stream._out_buf)
    received = bytearray()
    while len(received) < len(outbound) - held:
        received += await client.receive_some()
    assert received + stream._out_buf == outbound
    assert held <= len(outbound) and len(stream._in_buf) <= len(inbound)


# --- the HTTP API ---------------------------------------------------------------------

HTTP_CASES = [
    (_head_of(MAX_HEAD + 1), (431, "closed")),
    (_post("/ping", GiB, b""), (405, "closed")),
    (_post("/faults/stall", 300 * 1024, b"y" * (300 * 1024)), (200, "closed")),
    (_post("/faults/stall", 100 * 1024, b"y" * (100 * 1024)), (200, 200)),
]


@pytest.mark.parametrize(("data", "expected"), HTTP_CASES, ids=["head", "unread", "300K", "100K"])
async def test_http_api(data: bytes, expected: tuple[Any, Any]) -> None:
    """Its HTTP API is Go-like as nsqd's (no handler of it reads a body): a
    head past 1 MiB + 4 KiB gets a 431; a body is left unread, up to 256 KiB
    dropped to keep the connection, else closed; 30 heads that never end do
    not stop others."""
    async with _proxied() as proxy:
        assert proxy.http_address is not None
        with traced_peak() as peak:
            status, _, _, after = await exchange(proxy.http_address, data, then=get("/ping"))
            slow = [await connect(proxy.http_address) for _ in range(30)]
            for stream in slow:
                await stream.send_all(b"GET /ping HTTP/1.1\r\nHost: x\r\n")
            served = await ask(proxy.http_address, get("/faults"))
            for stream in slow:
                await stream.aclose()
        print(f"PEAK proxy http {data[:20]!r}: {peak.mib:.2f} MiB")
        assert (status, after) == expected
        assert served.status == 200
        assert peak.bytes < 8 * MiB


async def test_large_message_to_a_consumer() -> None:
    """A 60 MiB message through the proxy to its consumer: relayed as it comes,
    not held whole (frame faults see its head)."""
    big = 64 * MiB
    async with _proxied(f"--max-msg-size={big}", f"--max-body-size={big}") as proxy:
        producer = await connect(proxy.tcp_address)
        await producer.send_all(cmds.MAGIC_V2 + cmds.pub("t", b"C" * (60 * MiB)))
        assert await _answers(producer, 1) == ["OK"]
        await producer.aclose()
        with traced_peak() as peak:
            consumer = await connect(proxy.tcp_address)
            await consumer.send_all(cmds.MAGIC_V2 + cmds.sub("t", "c") + cmds.rdy(1))
            assert await _answers(consumer, 1) == ["OK"]
            got = 0
            with trio.fail_after(TIMEOUT):
                while got < 60 * MiB + 34:
                    got += len(await consumer.receive_some(1024 * 1024))
            await consumer.aclose()
        print(f"PEAK proxy 60 MiB message to a consumer: {peak.mib:.2f} MiB")
        assert peak.bytes < 8 * MiB
