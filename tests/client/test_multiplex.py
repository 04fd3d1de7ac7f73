"""The consumer's shared I/O (trionsq.multiplex) over real TCP sockets: one
flusher writing for many connections, what a socket does not take going to the
connection's own writer, backpressure, and the connections' fallback when the
multiplexer ends."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import pytest
import trio
import trio.testing

from trionsq.config import Config
from trionsq.connection import _HIGH_WATER, Connection
from trionsq.multiplex import Multiplexer
from trionsq.protocol import commands

from .minisrv import wait_for


async def tcp_pair(*, small_buffers: bool = False) -> tuple[trio.SocketStream, trio.SocketStream]:
    """A connected (client, server) pair of real TCP streams on 127.0.0.1;
    ``small_buffers``: a few KB of socket buffer each way, so that a write of
    more soon fills them while the server does not read."""
    listener = trio.socket.socket()
    if small_buffers:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    await listener.bind(("127.0.0.1", 0))
    listener.listen()
    client_sock = trio.socket.socket()
    if small_buffers:
        client_sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    await client_sock.connect(listener.getsockname())
    server_sock, _ = await listener.accept()
    listener.close()
    return trio.SocketStream(client_sock), trio.SocketStream(server_sock)


async def read_exactly(stream: trio.SocketStream, size: int) -> bytes:
    data = bytearray()
    with trio.fail_after(30):
        while len(data) < size:
            chunk = await stream.receive_some(65536)
            assert chunk, f"EOF after {len(data)} of {size} bytes"
            data += chunk
    return bytes(data)


def pubs(tag: str, count: int, size: int = 20) -> list[bytes]:
    """Distinct commands valid in any state, so their order on the wire shows."""
    return [commands.pub("t", f"{tag}-{i}".encode().ljust(size, b".")) for i in range(count)]


@pytest.fixture
async def mux(nursery: trio.Nursery) -> AsyncIterator[Multiplexer]:
    mux = Multiplexer()
    nursery.start_soon(mux.run)
    yield mux


async def start(nursery: trio.Nursery, stream: trio.SocketStream, mux: Multiplexer) -> Connection:
    conn = Connection(stream, "peer", Config())
    nursery.start_soon(conn.run, lambda messages: None, None, mux)
    await wait_for(lambda: conn._writer_idle)  # running, its writer parked
    assert conn._mux is mux
    return conn


async def test_one_flusher_writes_for_many_connections(
    nursery: trio.Nursery, mux: Multiplexer
) -> None:
    pairs = [await tcp_pair() for _ in range(20)]
    conns = [await start(nursery, client, mux) for client, _ in pairs]
    expected: list[list[bytes]] = [[] for _ in conns]
    for round_ in range(5):
        for index, conn in enumerate(conns):
            for command in pubs(f"{index}/{round_}", 7):
                conn.send_nowait(command)
                expected[index].append(command)
        if round_ % 2:
            await trio.lowlevel.checkpoint()  # a pass between rounds, or not
    for conn in conns:
        with trio.fail_after(30):
            await conn.flush()
        assert not conn._out
    for (_, server), sent in zip(pairs, expected, strict=True):
        wanted = b"".join(sent)
        assert await read_exactly(server, len(wanted)) == wanted
    for conn in conns:
        await conn.aclose()


async def test_what_a_full_socket_does_not_take_goes_to_the_writer(
    nursery: trio.Nursery, mux: Multiplexer
) -> None:
    client, server = await tcp_pair(small_buffers=True)
    conn = await start(nursery, client, mux)
    sent = pubs("big", 20_000, size=100)  # ~2.3 MB: far more than the buffers
    for command in sent:
        conn.send_nowait(command)
    # The flusher wrote what the socket took; the writer task waits to send the rest.
    await wait_for(lambda: conn._writing)
    conn.send_nowait(commands.nop())  # queued behind, for the writer
    flushed = trio.Event()

    async def flush() -> None:
        await conn.flush()
        flushed.set()

    nursery.start_soon(flush)
    wanted = b"".join(sent) + commands.nop()
    assert await read_exactly(server, len(wanted)) == wanted
    with trio.fail_after(30):
        await flushed.wait()
    # Idle again: the next command goes through the flusher once more.
    await wait_for(lambda: conn._writer_idle)
    conn.send_nowait(commands.nop())
    assert await read_exactly(server, 4) == commands.nop()
    await conn.aclose()


async def test_send_waits_for_room_when_the_peer_does_not_read(
    nursery: trio.Nursery, mux: Multiplexer
) -> None:
    client, server = await tcp_pair(small_buffers=True)
    conn = await start(nursery, client, mux)
    sent = pubs("bp", 30_000, size=100)  # ~3.4 MB: beyond the high-water mark
    done = 0

    async def sender() -> None:
        nonlocal done
        for command in sent:
            await conn.send(command)
            done += 1

    nursery.start_soon(sender)
    await wait_for(lambda: len(conn._out) >= _HIGH_WATER)
    stuck_at = done
    assert stuck_at < len(sent)
    await trio.testing.wait_all_tasks_blocked()
    assert done == stuck_at  # send() waits while the buffer is over the mark
    wanted = b"".join(sent)
    assert await read_exactly(server, len(wanted)) == wanted
    assert done == len(sent)
    await conn.aclose()


async def test_connections_write_on_their_own_once_the_multiplexer_ends(
    nursery: trio.Nursery,
) -> None:
    mux = Multiplexer()
    scope = trio.CancelScope()

    async def run_mux() -> None:
        with scope:
            await mux.run()

    nursery.start_soon(run_mux)
    client, server = await tcp_pair()
    conn = await start(nursery, client, mux)
    conn.send_nowait(commands.nop())  # on the flusher's list ...
    scope.cancel()  # ... and the flusher cancelled
    await wait_for(lambda: not mux.running)
    conn.send_nowait(commands.nop())  # its own writer writes it
    assert await read_exactly(server, 8) == commands.nop() * 2
    await conn.aclose()
