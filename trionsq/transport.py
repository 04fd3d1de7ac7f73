"""The transport seam: how a client gets a byte stream to an nsqd.

Everything above this module speaks to a :class:`trio.abc.Stream`, never to a
socket.  Tests and simulations pass their own :data:`Connector` (for example one
handing out :func:`trio.testing.memory_stream_pair` halves), which is what lets
whole clusters run in virtual time without the network.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeAlias

import trio

__all__ = ["Connector", "tcp_connector", "parse_address", "format_address"]

#: An async callable ``(host, port) -> stream``.  It may raise ``OSError`` (or any
#: :class:`Exception`) to report that the address cannot be reached.
Connector: TypeAlias = Callable[[str, int], Awaitable[trio.abc.Stream]]


async def tcp_connector(host: str, port: int) -> trio.abc.Stream:
    """The default :data:`Connector`: a TCP connection with ``TCP_NODELAY``
    (trio sets it), via :func:`trio.open_tcp_stream`."""
    return await trio.open_tcp_stream(host, port)


def parse_address(address: str) -> tuple[str, int]:
    """Split ``"host:port"`` (or ``"[v6]:port"``) into ``(host, port)``.

    Raises :class:`ValueError` on anything else, with the address in the text.
    """
    if not isinstance(address, str):
        raise TypeError(f"address must be a 'host:port' string, not {type(address).__name__}")
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"invalid address {address!r}: expected 'host:port'")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"invalid address {address!r}: write IPv6 hosts as '[host]:port'")
    port = int(port_text)
    if not 0 < port < 65536:
        raise ValueError(f"invalid address {address!r}: port out of range")
    return host, port


def format_address(host: str, port: int) -> str:
    """The inverse of :func:`parse_address`."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
