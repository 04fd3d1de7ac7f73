"""The default connector over real sockets: IP addresses connected to
directly, host names through trio.open_tcp_stream, failures alike."""

from __future__ import annotations

import socket
from typing import Any

import pytest
import trio

import trionsq
from trionsq.config import Config
from trionsq.connection import Connection
from trionsq.transport import tcp_connector

from ..support.ports import free_port


async def _listener(family: socket.AddressFamily, host: str) -> trio.SocketListener:
    sock = trio.socket.socket(family, socket.SOCK_STREAM)
    await sock.bind((host, 0))
    sock.listen()
    return trio.SocketListener(sock)


@pytest.mark.parametrize(
    ("family", "host"), [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")]
)
async def test_an_ip_address_is_connected_to_directly(
    family: socket.AddressFamily, host: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if family == socket.AF_INET6 and not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        listener = await _listener(family, host)
    except OSError as exc:
        pytest.skip(f"cannot listen on {host}: {exc}")

    async def not_used(*args: Any, **kwargs: Any) -> trio.SocketStream:
        raise AssertionError("an IP address needs no resolving")

    monkeypatch.setattr(trio, "open_tcp_stream", not_used)
    port = listener.socket.getsockname()[1]
    async with listener:
        with trio.fail_after(10):
            stream = await tcp_connector(host, port)
            assert isinstance(stream, trio.SocketStream)
            assert stream.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            server = await listener.accept()
            await stream.send_all(b"ping")
            assert await server.receive_some() == b"ping"
            await stream.aclose()
            assert await server.receive_some() == b""
            await server.aclose()


async def test_a_refused_ip_address_fails_as_open_tcp_stream_does() -> None:
    port = free_port()  # bound, then released: connecting is refused
    with trio.fail_after(10):
        with pytest.raises(OSError) as ours:
            await tcp_connector("127.0.0.1", port)
        with pytest.raises(OSError) as trios:
            await trio.open_tcp_stream("127.0.0.1", port)
    assert str(ours.value) == str(trios.value)
    assert str(ours.value) == f"all attempts to connect to 127.0.0.1:{port} failed"
    # the connection's error names the address once, and the OS reason
    with trio.fail_after(10), pytest.raises(trionsq.NSQConnectionError) as caught:
        await Connection.open(f"127.0.0.1:{port}", Config())
    assert str(caught.value) == f"cannot connect to nsqd 127.0.0.1:{port}: connection refused"
    assert caught.value.__cause__ is not None  # what trio raised, kept


async def test_a_host_name_goes_through_open_tcp_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    listener = await _listener(socket.AF_INET, "127.0.0.1")
    port = listener.socket.getsockname()[1]
    asked: list[tuple[str, int]] = []
    real = trio.open_tcp_stream

    async def recorded(host: str, port: int, **kwargs: Any) -> trio.SocketStream:
        asked.append((host, port))
        return await real("127.0.0.1", port, **kwargs)

    monkeypatch.setattr(trio, "open_tcp_stream", recorded)
    async with listener:
        with trio.fail_after(10):
            stream = await tcp_connector("localhost", port)
            server = await listener.accept()
            await stream.aclose()
            await server.aclose()
    assert asked == [("localhost", port)]


async def test_cancelling_a_direct_connect_closes_its_socket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[trio.socket.SocketType] = []
    real = trio.socket.socket

    def recording(*args: Any, **kwargs: Any) -> trio.socket.SocketType:
        sock = real(*args, **kwargs)
        made.append(sock)
        return sock

    monkeypatch.setattr(trio.socket, "socket", recording)
    with trio.CancelScope() as scope:
        scope.cancel()
        # 192.0.2.1 (TEST-NET-1) never answers; cancelled before or during connect.
        await tcp_connector("192.0.2.1", 4150)
    assert scope.cancelled_caught
    assert made and all(sock.fileno() == -1 for sock in made)


async def _serve_once(
    listener: trio.SocketListener, answer: Any, task_status: Any = trio.TASK_STATUS_IGNORED
) -> None:
    task_status.started()
    stream = await listener.accept()
    assert isinstance(stream, trio.SocketStream)
    try:
        await answer(stream)
    finally:
        await stream.aclose()


def _ok_identify() -> bytes:
    from trionsq.protocol.frames import encode_response

    return encode_response(b'{"max_rdy_count":7}')


@pytest.mark.parametrize("pieces", [1, 3])
async def test_the_handshake_reads_a_real_socket_in_any_pieces(pieces: int) -> None:
    listener = await _listener(socket.AF_INET, "127.0.0.1")
    port = listener.socket.getsockname()[1]
    answer_frame = _ok_identify()

    async def answer(stream: trio.SocketStream) -> None:
        await stream.receive_some()
        step = -(-len(answer_frame) // pieces)
        for start in range(0, len(answer_frame), step):
            await stream.send_all(answer_frame[start : start + step])
            await trio.sleep(0.01)  # separate reads, most likely; right either way
        await stream.receive_some()  # until the client closes

    async with listener, trio.open_nursery() as nursery:
        await nursery.start(_serve_once, listener, answer)
        with trio.fail_after(10):
            conn = await Connection.open(f"127.0.0.1:{port}", Config())
        assert conn.max_rdy_count == 7
        stream = conn._stream
        assert isinstance(stream, trio.SocketStream)
        await conn.aclose()
        assert stream.socket.fileno() == -1


@pytest.mark.parametrize("how", ["close", "reset"])
async def test_a_real_socket_lost_during_the_handshake(how: str) -> None:
    listener = await _listener(socket.AF_INET, "127.0.0.1")
    port = listener.socket.getsockname()[1]

    async def answer(stream: trio.SocketStream) -> None:
        await stream.receive_some()
        if how == "reset":  # RST instead of FIN
            stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")

    async with listener, trio.open_nursery() as nursery:
        await nursery.start(_serve_once, listener, answer)
        with trio.fail_after(10), pytest.raises(trionsq.NSQConnectionError) as caught:
            await Connection.open(f"127.0.0.1:{port}", Config())
    text = str(caught.value)
    if how == "close":  # before a byte of an answer: no nsqd closes so
        assert text == (
            f"cannot connect to nsqd 127.0.0.1:{port}: closed without answering the "
            "protocol's greeting (is this a nsqd TCP endpoint? nsqd's HTTPS port closes so)"
        )
    else:
        assert text == f"cannot connect to nsqd 127.0.0.1:{port}: connection reset by peer"


async def test_closing_a_real_connection_in_a_cancelled_scope() -> None:
    # Connection.aclose closes the socket at once and is a checkpoint that
    # does not raise, like trio.aclose_forcefully; the cancellation comes next.
    listener = await _listener(socket.AF_INET, "127.0.0.1")
    port = listener.socket.getsockname()[1]

    async def answer(stream: trio.SocketStream) -> None:
        await stream.receive_some()
        await stream.send_all(_ok_identify())
        assert await stream.receive_some() == b""

    async with listener, trio.open_nursery() as nursery:
        await nursery.start(_serve_once, listener, answer)
        with trio.fail_after(10):
            conn = await Connection.open(f"127.0.0.1:{port}", Config())
        stream = conn._stream
        assert isinstance(stream, trio.SocketStream)
        with trio.CancelScope() as scope:
            scope.cancel()
            await conn.aclose()
            closed = stream.socket.fileno() == -1
            await trio.lowlevel.checkpoint()
        assert closed and scope.cancelled_caught and conn.closed
