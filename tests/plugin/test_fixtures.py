"""The pytest plugin's fixtures, used as another project would use them."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import urllib.request

import pytest

from trionsq.protocol import MAGIC_V2, FrameParser, MessageFrame, Response
from trionsq.protocol import commands as cmd


def split(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


def read_frames(sock: socket.socket, parser: FrameParser, count: int) -> list[object]:
    frames: list[object] = []
    while len(frames) < count:
        data = sock.recv(65536)
        assert data, "connection closed"
        frames.extend(parser.feed(data))
    return frames


def test_a_blocking_client_publishes_and_consumes(nsqd) -> None:  # type: ignore[no-untyped-def]
    with socket.create_connection(split(nsqd.tcp_address), timeout=5) as sock:
        parser = FrameParser()
        sock.sendall(MAGIC_V2 + cmd.pub("sync", b"hello"))
        assert read_frames(sock, parser, 1) == [Response(b"OK")]
        sock.sendall(cmd.sub("sync", "c") + cmd.rdy(1))
        ok, message = read_frames(sock, parser, 2)
        assert ok == Response(b"OK")
        assert isinstance(message, MessageFrame) and message.body == b"hello"
        sock.sendall(cmd.fin(message.id))


def test_http_api_answers(nsqd) -> None:  # type: ignore[no-untyped-def]
    with urllib.request.urlopen(f"http://{nsqd.http_address}/ping", timeout=5) as response:
        assert response.read() == b"OK"


@pytest.mark.nsqd(max_rdy_count=7)
def test_marker_options_reach_the_node(nsqd) -> None:  # type: ignore[no-untyped-def]
    assert nsqd.options.max_rdy_count == 7
    with socket.create_connection(split(nsqd.tcp_address), timeout=5) as sock:
        body = json.dumps({"feature_negotiation": True}).encode()
        sock.sendall(MAGIC_V2 + b"IDENTIFY\n" + struct.pack(">l", len(body)) + body)
        (reply,) = read_frames(sock, FrameParser(), 1)
        assert isinstance(reply, Response)
        assert json.loads(reply.data)["max_rdy_count"] == 7


def test_an_asyncio_client_works_too(nsqd) -> None:  # type: ignore[no-untyped-def]
    async def publish() -> bytes:
        reader, writer = await asyncio.open_connection(*split(nsqd.tcp_address))
        writer.write(MAGIC_V2 + cmd.pub("aio", b"x"))
        await writer.drain()
        size = struct.unpack(">l", await reader.readexactly(4))[0]
        frame = await reader.readexactly(size)
        writer.close()
        await writer.wait_closed()
        return frame[4:]

    assert asyncio.run(publish()) == b"OK"


def test_nsqd_factory_starts_independent_nodes(nsqd_factory) -> None:  # type: ignore[no-untyped-def]
    a, b = nsqd_factory(), nsqd_factory()
    assert a.tcp_address != b.tcp_address


async def test_trio_tests_use_the_same_fixture(nsqd) -> None:  # type: ignore[no-untyped-def]
    import trionsq

    async with trionsq.Producer(nsqd_tcp_addresses=[nsqd.tcp_address]) as producer:
        await producer.publish("from-trio", b"x")


def test_nsqlookupd_fixture(nsqlookupd) -> None:  # type: ignore[no-untyped-def]
    with urllib.request.urlopen(f"http://{nsqlookupd.http_address}/ping", timeout=5) as r:
        assert r.read() == b"OK"


@pytest.mark.nsq_cluster(nsqd=2, lookupd=2)
def test_cluster_fixture_is_registered(nsq_cluster) -> None:  # type: ignore[no-untyped-def]
    assert len(nsq_cluster.nsqd_tcp_addresses) == 2
    for lookupd in nsq_cluster.lookupd_http_addresses:
        with urllib.request.urlopen(f"http://{lookupd}/nodes", timeout=5) as r:
            assert len(json.load(r)["producers"]) == 2


def test_another_project_gets_the_fixtures_without_conftest(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import urllib.request

        def test_uses_nsqd(nsqd):
            with urllib.request.urlopen(f"http://{nsqd.http_address}/ping") as r:
                assert r.read() == b"OK"
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
