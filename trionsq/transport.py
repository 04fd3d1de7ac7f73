"""The transport seam: how a client gets a byte stream to an nsqd.

Everything above this module speaks to a :class:`trio.abc.Stream`, never to a
socket.  Tests and simulations pass their own :data:`Connector` (for example one
handing out :func:`trio.testing.memory_stream_pair` halves), which is what lets
whole clusters run in virtual time without the network.
"""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable
from typing import TypeAlias

import trio

__all__ = ["Connector", "tcp_connector", "parse_address", "format_address"]

#: An async callable ``(host, port) -> stream``.  It may raise ``OSError`` (or any
#: :class:`Exception`) to report that the address cannot be reached.
Connector: TypeAlias = Callable[[str, int], Awaitable[trio.abc.Stream]]


async def tcp_connector(host: str, port: int) -> trio.abc.Stream:
    """The default :data:`Connector`: a TCP connection with ``TCP_NODELAY``
    (trio sets it), via :func:`trio.open_tcp_stream`.

    An IP address (the common case: ``nsqd_tcp_addresses``, lookupd's
    ``broadcast_address``) has one target and nothing to resolve: it is
    connected to directly, without the happy-eyeballs nursery, task and
    timer :func:`trio.open_tcp_stream` sets up for each connection (a third
    of the CPU a consumer spends connecting to an nsqd).  A failure reads as
    :func:`trio.open_tcp_stream`'s does.
    """
    family = _ip_family(host)
    if family is None:
        return await trio.open_tcp_stream(host, port)
    sock = trio.socket.socket(family, socket.SOCK_STREAM)
    try:
        await sock.connect((host, port))
    except OSError as exc:
        sock.close()
        message = f"all attempts to connect to {format_address(host, port)} failed"
        raise OSError(message) from exc
    except BaseException:
        sock.close()
        raise
    return trio.SocketStream(sock)


def _ip_family(host: str) -> socket.AddressFamily | None:
    """``AF_INET`` or ``AF_INET6`` if ``host`` is an IP address, else None."""
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
        except OSError:
            continue
        return family
    return None


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
