"""Listening on an address as nsqd's ``--tcp-address``/``--http-address`` mean it.

nsqd v1.3.0 listens on TCP when the address splits into host and port (Go's
``net.SplitHostPort``: ``127.0.0.1:4150``, ``:4150``, ``[::1]:4150``), and on
a Unix socket at that path otherwise (``/run/nsqd.sock``); its listener removes
the socket file when it closes.  :func:`open_listeners` does the same, and says
which address it bound (the real port when port 0 was asked).
"""

from __future__ import annotations

import os
import socket

import trio

from ..golang.net import go_split_host_port as _split_host_port
from ..golang.net import listen_error

__all__ = [
    "UNIX_REMOTE_ADDRESS",
    "address_network",
    "open_listeners",
    "listen_error",
    "UnixListener",
]

#: What Go reports as the remote address of a Unix socket's client.
UNIX_REMOTE_ADDRESS = "@"


def address_network(address: str) -> str:
    """nsqd's ``util.TypeOfAddr``: ``"tcp"`` for ``host:port``, else ``"unix"``."""
    return "tcp" if _split_host_port(address) is not None else "unix"


class UnixListener(trio.abc.Listener[trio.SocketStream]):
    """A listening Unix socket whose file goes when it closes (as Go's does)."""

    def __init__(self, sock: trio.socket.SocketType, path: str) -> None:
        self._listener = trio.SocketListener(sock)
        self.socket = sock
        self.path = path

    async def accept(self) -> trio.SocketStream:
        return await self._listener.accept()

    async def aclose(self) -> None:
        try:
            await self._listener.aclose()
        finally:
            try:
                os.unlink(self.path)
            except OSError:
                pass


async def open_listeners(
    address: str,
) -> tuple[list[trio.abc.Listener[trio.SocketStream]], str]:
    """Listen on ``address`` (module doc); the listeners and the bound address
    (``host:port`` with the real port, or the socket's path)."""
    split = _split_host_port(address)
    if split is None:
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            await sock.bind(address)
            sock.listen(socket.SOMAXCONN)
        except BaseException:
            sock.close()
            raise
        return [UnixListener(sock, address)], address
    host, port_text = split
    try:
        port = socket.getservbyname(port_text, "tcp") if not port_text.isdigit() else int(port_text)
    except OSError:
        raise OSError(f"listen tcp: address {port_text}: unknown port") from None
    if not 0 <= port <= 65535:
        raise OSError(f"listen tcp: address {port_text}: invalid port")
    tcp = await trio.open_tcp_listeners(port, host=host or None)
    bound = tcp[0].socket.getsockname()
    bound_host = str(bound[0])
    text = f"[{bound_host}]:{bound[1]}" if ":" in bound_host else f"{bound_host}:{bound[1]}"
    return list(tcp), text


def is_unix_stream(stream: trio.abc.Stream) -> bool:
    """True for a stream accepted on a Unix socket."""
    sock = getattr(stream, "socket", None)
    return sock is not None and sock.family == socket.AF_UNIX
