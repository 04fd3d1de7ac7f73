"""Connection handshake and upgrades (TLS, snappy, deflate, AUTH), heartbeats,
timeouts and bad input, over in-memory streams."""

from __future__ import annotations

import ssl
from typing import Any

import pytest
import trio
import trio.testing

import trionsq
from trionsq.config import Config
from trionsq.connection import CodecStream, Connection
from trionsq.protocol import codecs, commands
from trionsq.protocol.frames import encode_response

from ..support.tls import Pki
from ..support.waiting import wait_until
from .minisrv import MiniNSQD


async def round_trip(node: MiniNSQD, **options: Any) -> trionsq.Consumer:
    """Publish, then consume one message through a connection with ``options``."""
    async with trionsq.Producer(["nsqd:4150"], connector=node.connector, **options) as p:
        await p.publish("topic", b"payload" * 100)
    node.put(b"body" * 100)
    got: list[bytes] = []
    async with trionsq.Consumer(
        "topic",
        "chan",
        nsqd_tcp_addresses=["nsqd:4150"],
        connector=node.connector,
        handler=lambda m: got.append(m.body),
        **options,
    ) as consumer:
        await wait_until(lambda: node.fins)
    assert got == [b"body" * 100]
    assert node.published == [("topic", b"payload" * 100)]
    return consumer


@pytest.mark.parametrize("compression", ["snappy", "deflate"])
async def test_compression(nursery: trio.Nursery, compression: str) -> None:
    node = MiniNSQD(nursery)
    await round_trip(node, **{compression: True})
    assert node.conns[0].record.identify[compression] is True
    assert isinstance(node.conns[0].stream, CodecStream)


async def test_compression_not_offered_falls_back_to_plain(nursery: trio.Nursery) -> None:
    node = MiniNSQD(nursery, compression=False)
    await round_trip(node, snappy=True)
    assert not isinstance(node.conns[0].stream, CodecStream)


async def test_tls(nursery: trio.Nursery, pki: Pki) -> None:
    node = MiniNSQD(nursery, tls_context=pki.server_context())
    await round_trip(node, tls=pki.client_context())
    assert isinstance(node.conns[0].stream, trio.SSLStream)


async def test_tls_with_snappy_and_client_certificate(nursery: trio.Nursery, pki: Pki) -> None:
    cert_path, key_path = pki.client_files("client")
    node = MiniNSQD(nursery, tls_context=pki.server_context(ssl.CERT_REQUIRED))
    # The caller's own context carries its certificate (trionsq never loads
    # one into a context it is given: see tests/client/test_tls_secrets).
    context = pki.client_context()
    context.load_cert_chain(cert_path, key_path)
    await round_trip(node, tls=context, snappy=True)
    stream = node.conns[0].stream
    assert isinstance(stream, CodecStream) and isinstance(stream.inner, trio.SSLStream)


async def test_tls_required_but_not_offered(nursery: trio.Nursery, pki: Pki) -> None:
    node = MiniNSQD(nursery)
    config = Config(tls=pki.client_context(), connector=node.connector)
    with pytest.raises(trionsq.NegotiationError):
        await Connection.open("nsqd:4150", config)


async def test_tls_untrusted_server_fails_to_connect(nursery: trio.Nursery, pki: Pki) -> None:
    node = MiniNSQD(nursery, tls_context=pki.server_context())
    config = Config(tls=True, connector=node.connector)  # system trust: not our CA
    with pytest.raises(trionsq.NSQConnectionError, match="TLS"):
        await Connection.open("nsqd:4150", config)


async def test_auth(nursery: trio.Nursery) -> None:
    node = MiniNSQD(nursery, auth_secret=b"s3cret")
    await round_trip(node, auth_secret="s3cret")
    assert node.conns[0].record.auth == b"s3cret"
    config = Config(auth_secret="s3cret", connector=node.connector)
    conn = await Connection.open("nsqd:4150", config)
    assert conn.auth_response == {"identity": "tester", "identity_url": "", "permission_count": 1}
    await conn.aclose()


async def test_auth_refused_and_missing(nursery: trio.Nursery) -> None:
    node = MiniNSQD(nursery, auth_secret=b"s3cret")
    with pytest.raises(trionsq.AuthFailedError):
        await Connection.open("nsqd:4150", Config(auth_secret="wrong", connector=node.connector))
    with pytest.raises(trionsq.NegotiationError, match="auth_secret"):
        await Connection.open("nsqd:4150", Config(connector=node.connector))


async def test_identify_fields_and_negotiated_values(nursery: trio.Nursery) -> None:
    node = MiniNSQD(nursery, max_rdy_count=7)
    config = Config(
        connector=node.connector,
        client_id="worker-1",
        hostname="box.example",
        user_agent="test/1",
        heartbeat_interval=5.0,
        read_timeout=12.0,
        output_buffer_size=4096,
        output_buffer_timeout=0.1,
        sample_rate=20,
        msg_timeout=30.0,
        deflate_level=3,
    )
    conn = await Connection.open("nsqd:4150", config)
    assert conn.max_rdy_count == 7
    assert conn.msg_timeout == 60.0
    await conn.aclose()
    identify = node.conns[0].record.identify
    assert identify == {
        "client_id": "worker-1",
        "hostname": "box.example",
        "user_agent": "test/1",
        "feature_negotiation": True,
        "heartbeat_interval": 5000,
        "tls_v1": False,
        "snappy": False,
        "deflate": False,
        "deflate_level": 3,
        "sample_rate": 20,
        "output_buffer_size": 4096,
        "output_buffer_timeout": 100,
        "msg_timeout": 30000,
    }


async def test_old_nsqd_without_feature_negotiation(nursery: trio.Nursery) -> None:
    node = MiniNSQD(nursery, feature_negotiation=False)
    conn = await Connection.open("nsqd:4150", Config(connector=node.connector))
    assert conn.identify_response == {}
    assert conn.max_rdy_count == 2500  # the guide's assumption
    await conn.aclose()


async def test_read_timeout_closes_a_silent_connection(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    node = MiniNSQD(nursery)
    config = Config(connector=node.connector, heartbeat_interval=1.0, read_timeout=3.0)
    conn = await Connection.open("nsqd:4150", config)
    nursery.start_soon(conn.run)
    start = trio.current_time()
    await conn.wait_closed()
    assert trio.current_time() - start == pytest.approx(3.0)
    assert isinstance(conn.close_reason, trionsq.NSQConnectionError)


async def test_heartbeats_keep_it_alive_and_get_nops(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    node = MiniNSQD(nursery)
    config = Config(connector=node.connector, heartbeat_interval=1.0, read_timeout=3.0)
    conn = await Connection.open("nsqd:4150", config)
    nursery.start_soon(conn.run)
    server = node.conns[0]
    for _ in range(5):
        await trio.sleep(2.0)
        await server.send(encode_response(b"_heartbeat_"))
    await wait_until(lambda: server.record.nops == 5)
    assert not conn.closed
    await conn.aclose()


async def test_non_fatal_error_is_logged_and_connection_kept(
    nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    node = MiniNSQD(nursery)
    conn = await Connection.open("nsqd:4150", Config(connector=node.connector))
    nursery.start_soon(conn.run)
    assert await conn.request(commands.sub("t", "c")) == b"OK"
    await conn.send(commands.fin(b"0123456789abcdef"))  # not in flight: E_FIN_FAILED
    # Answered after the error (frames keep their order): the error was read.
    assert await conn.request(commands.pub("t", b"x")) == b"OK"
    assert not conn.closed
    assert any("E_FIN_FAILED" in r.message for r in caplog.records)
    await conn.aclose()


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00\x00\x00\x08\x00\x00\x00\x09garbage!",  # unknown frame type
        b"\xff\xff\xff\xff",  # negative size
        b"\x7f\x00\x00\x00",  # larger than max_frame_size
        b"\x00\x00\x00\x06\x00\x00\x00\x02ab",  # a message frame too short
        b"\x00\x00\x00\x06\x00\x00\x00\x00OK",  # a response nobody asked for
    ],
)
async def test_garbage_ends_the_connection_with_a_protocol_error(
    nursery: trio.Nursery, garbage: bytes
) -> None:
    node = MiniNSQD(nursery)
    conn = await Connection.open("nsqd:4150", Config(connector=node.connector))
    nursery.start_soon(conn.run)
    await node.conns[0].send(garbage)
    await conn.wait_closed()
    assert isinstance(conn.close_reason, trionsq.ProtocolError)
    with pytest.raises(trionsq.ConnectionClosedError):
        await conn.request(commands.nop())


async def test_garbage_during_handshake(nursery: trio.Nursery) -> None:
    async def connector(host: str, port: int) -> trio.abc.Stream:
        client, server = trio.testing.memory_stream_pair()

        async def serve() -> None:
            await server.receive_some()
            await server.send_all(encode_response(b"{not json"))

        nursery.start_soon(serve)
        return client

    with pytest.raises(trionsq.ProtocolError):
        await Connection.open("nsqd:4150", Config(connector=connector))


async def test_connect_timeout(autojump_clock: trio.testing.MockClock) -> None:
    async def hangs(host: str, port: int) -> trio.abc.Stream:
        await trio.sleep_forever()
        raise AssertionError

    start = trio.current_time()
    with pytest.raises(trionsq.NSQConnectionError, match="timed out"):
        await Connection.open("nsqd:4150", Config(connector=hangs, connect_timeout=2.0))
    assert trio.current_time() - start == pytest.approx(2.0)


async def test_consumer_reconnects_after_garbage(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    node = MiniNSQD(nursery)
    async with trionsq.Consumer(
        "topic", "chan", nsqd_tcp_addresses=["nsqd:4150"], connector=node.connector
    ) as c:
        await c.wait_connected()
        await node.conns[0].send(b"\x00\x00\x00\x05\x00\x00\x00\x07!")
        await wait_until(lambda: len(node.conns) == 2 and c.connections == ["nsqd:4150"])
        node.put(b"after")
        message = await c.__anext__()
        assert message.body == b"after"
        await message.finish()


def test_codec_stream_respects_max_bytes() -> None:
    async def main() -> None:
        left, right = trio.testing.memory_stream_pair()
        sender = CodecStream(left, codecs.DeflateEncoder(), codecs.DeflateDecoder())
        receiver = CodecStream(right, codecs.DeflateEncoder(), codecs.DeflateDecoder())
        await sender.send_all(b"abcdefgh" * 10)
        data = b""
        while len(data) < 80:
            chunk = await receiver.receive_some(7)
            assert len(chunk) <= 7
            data += chunk
        assert data == b"abcdefgh" * 10

    trio.run(main)


async def test_without_heartbeats_silence_is_not_a_failure(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    node = MiniNSQD(nursery)
    config = Config(connector=node.connector, heartbeat_interval=None, read_timeout=3.0)
    conn = await Connection.open("nsqd:4150", config)
    nursery.start_soon(conn.run)
    await trio.sleep(1000)
    assert not conn.closed
    assert node.conns[0].record.identify["heartbeat_interval"] == -1
    await conn.aclose()


async def test_connect_timeout_text_and_the_stream_closed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The stream is connected, the handshake hangs: the deadline ends it with
    # the same error as a connect that hangs, and the stream is closed.
    client, server = trio.testing.memory_stream_pair()

    async def connector(host: str, port: int) -> trio.abc.Stream:
        return client

    with pytest.raises(trionsq.NSQConnectionError) as caught:
        await Connection.open("nsqd:4150", Config(connector=connector, connect_timeout=3.0))
    assert str(caught.value) == "cannot connect to nsqd nsqd:4150: connect timed out after 3s"
    assert await server.receive_some() == commands.MAGIC_V2 + commands.identify(
        Config().replace(connector=connector, connect_timeout=3.0).identify_body()
    )
    assert await server.receive_some() == b""  # closed by the client


async def test_identify_follows_each_configuration(nursery: trio.Nursery) -> None:
    # The greeting is built once per Config, never reused for another one.
    node = MiniNSQD(nursery)
    for client_id in ("first", "second", "first"):
        conn = await Connection.open(
            "nsqd:4150", Config(connector=node.connector, client_id=client_id)
        )
        await conn.aclose()
    assert [c.record.identify["client_id"] for c in node.conns] == ["first", "second", "first"]


@pytest.mark.parametrize("reply", ["ok", "heartbeat_then_ok", "error", "garbage"])
async def test_a_request_answered_while_connecting(nursery: trio.Nursery, reply: str) -> None:
    # Connection.open(then=...): a consumer's SUB, sent once negotiated and
    # answered before the connection runs; a heartbeat meanwhile gets its NOP.
    from trionsq.connection import RequestRefused
    from trionsq.protocol.errors import BadTopicError
    from trionsq.protocol.frames import encode_error

    client, server = trio.testing.memory_stream_pair()
    sub = commands.sub("topic", "chan")
    received = bytearray()

    async def serve() -> None:
        async def read_until(end: bytes) -> None:
            while not received.endswith(end):
                received.extend(await server.receive_some())

        await read_until(b"}")  # magic and IDENTIFY's JSON body
        await server.send_all(encode_response(b'{"max_rdy_count":9}'))
        await read_until(sub)
        if reply == "heartbeat_then_ok":
            await server.send_all(encode_response(b"_heartbeat_"))
            await read_until(b"NOP\n")
        if reply == "error":
            await server.send_all(encode_error(b"E_BAD_TOPIC SUB topic name 'x' is not valid"))
        elif reply == "garbage":
            await server.send_all(encode_response(b"NOT OK"))
        else:
            await server.send_all(encode_response(b"OK"))

    async def connector(host: str, port: int) -> trio.abc.Stream:
        return client

    nursery.start_soon(serve)
    config = Config(connector=connector)
    if reply == "error":
        with pytest.raises(RequestRefused) as refused:
            await Connection.open("nsqd:4150", config, then=sub)
        assert isinstance(refused.value.error, BadTopicError)
        assert str(refused.value) == "E_BAD_TOPIC SUB topic name 'x' is not valid"
    elif reply == "garbage":
        with pytest.raises(trionsq.ProtocolError, match="expected OK"):
            await Connection.open("nsqd:4150", config, then=sub)
    else:
        conn = await Connection.open("nsqd:4150", config, then=sub)
        assert conn.max_rdy_count == 9
        assert received.endswith(sub + (b"NOP\n" if reply == "heartbeat_then_ok" else b""))
        conn.send_nowait(commands.rdy(5))  # subscribed: RDY is valid now
        await conn.aclose()
