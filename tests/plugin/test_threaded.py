"""BackgroundNode: a Trio node served from a thread, for code that is not Trio."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from fakensq.testing.threaded import BackgroundNode


class Echo:
    address: tuple[str, int]
    closed = False


@asynccontextmanager
async def echo_server() -> AsyncIterator[Echo]:
    echo = Echo()

    async def handle(stream: trio.SocketStream) -> None:
        async for data in stream:
            await stream.send_all(data)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, handle, 0)
        echo.address = listeners[0].socket.getsockname()[:2]
        try:
            yield echo
        finally:
            echo.closed = True
            nursery.cancel_scope.cancel()


def test_a_blocking_client_talks_to_a_trio_node() -> None:
    with BackgroundNode(echo_server) as echo:
        with socket.create_connection(echo.address, timeout=5) as sock:
            sock.sendall(b"ping")
            assert sock.recv(4) == b"ping"
    assert echo.closed


def test_call_runs_in_the_nodes_loop() -> None:
    node = BackgroundNode(echo_server)
    node.start()
    try:
        assert node.call(trio.sleep, 0) is None
    finally:
        node.stop()


def test_a_node_that_fails_to_start_reports_why() -> None:
    @asynccontextmanager
    async def broken() -> AsyncIterator[None]:
        raise OSError("port taken")
        yield

    with pytest.raises(RuntimeError, match="failed to start") as info:
        BackgroundNode(broken).start()
    assert isinstance(info.value.__cause__, OSError)
