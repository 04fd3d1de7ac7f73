"""Host and port as Go's ``net`` package writes and reads them."""

from __future__ import annotations

import os
import socket
from collections.abc import Awaitable, Callable
from typing import NoReturn, TypeVar

import trio

__all__ = [
    "ListenError",
    "accept_forever",
    "check_listen",
    "go_split_host_port",
    "join_host_port",
    "listen_error",
    "split_address",
    "split_host_port",
]


def split_host_port(address: str) -> tuple[str, int]:
    """``"host:port"`` (``"[::1]:4160"`` for IPv6) → ``(host, port)``."""
    host, sep, port = address.rpartition(":")
    if not sep:
        raise ValueError(f"address {address}: missing port in address")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        return host, int(port)
    except ValueError:
        raise ValueError(f"address {address}: invalid port") from None


def join_host_port(host: str, port: int) -> str:
    """Go's ``net.JoinHostPort``."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` (port 0 allowed) to ``(host, port)``."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"invalid address {address!r}: expected 'host:port'")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "0.0.0.0", int(port)


def go_split_host_port(address: str) -> tuple[str, str] | None:
    """Go's ``net.SplitHostPort``, None where it fails."""
    if address.startswith("["):
        end = address.find("]")
        if end < 0 or address[end + 1 : end + 2] != ":":
            return None
        host, port = address[1:end], address[end + 2 :]
        if ":" in port or "[" in port or "]" in port:
            return None
        return host, port
    host, sep, port = address.rpartition(":")
    if not sep or ":" in host or "[" in address or "]" in address:
        return None
    return host, port


def _go_reason(exc: OSError) -> str:
    reason = exc.strerror or str(exc)
    return reason[:1].lower() + reason[1:]


def _dns_server(resolv_conf: str = "/etc/resolv.conf") -> str:
    """`` on 10.0.0.53:53`` as Go's resolver names the DNS server that said no
    (the first of resolv.conf's), or "" without one."""
    try:
        with open(resolv_conf, encoding="utf-8") as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 2 and fields[0] == "nameserver":
                    return f" on {join_host_port(fields[1], 53)}"
    except OSError:
        pass
    return ""


def listen_error(address: str, *, unix: bool = True) -> str | None:
    """What Go's ``net.Listen`` would fail with on ``address`` now (its text), or
    None.  The daemons check their addresses so before serving, to report a
    refused address as nsqd does (``unix`` False: TCP only, as nsqlookupd)."""
    split = go_split_host_port(address)
    if split is None:
        if not unix:
            return f"listen tcp: address {address}: missing port in address"
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.bind(address)
        except OSError as exc:
            return f"listen unix {address}: bind: {_go_reason(exc)}"
        finally:
            probe.close()
        try:
            os.unlink(address)
        except OSError:
            pass
        return None
    host, port_text = split
    if port_text.isdigit():
        port = int(port_text)
        if port > 65535:
            return f"listen tcp: address {port_text}: invalid port"
    else:
        try:  # a service name, as Go looks it up
            port = socket.getservbyname(port_text, "tcp")
        except OSError:
            return f"listen tcp: lookup tcp/{port_text}: unknown port"
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM)
    except OSError:
        return f"listen tcp: lookup {host}{_dns_server()}: no such host"
    family, kind, proto, _, sockaddr = infos[0]
    probe = socket.socket(family, kind, proto)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(sockaddr)
    except OSError as exc:
        return f"listen tcp {address}: bind: {_go_reason(exc)}"
    finally:
        probe.close()
    return None


class ListenError(OSError):
    """A daemon could not listen on an address: the text is nsqd's own,
    ``listen (127.0.0.1:4150) failed - listen tcp 127.0.0.1:4150: bind: address
    already in use`` (the real daemon exits with it, after ``failed to
    instantiate nsqd - ``).  ``address`` is the address asked for."""

    def __init__(self, address: str, reason: str) -> None:
        super().__init__(f"listen ({address}) failed - {reason}")
        self.address = address
        self.reason = reason

    def __str__(self) -> str:
        return str(self.args[0])


def check_listen(*addresses: str, unix: bool = True) -> None:
    """Raise :class:`ListenError` for the first of ``addresses`` (in the order
    the daemon listens; empty ones skipped) that Go's ``net.Listen`` would refuse."""
    for address in addresses:
        if address:
            reason = listen_error(address, unix=unix)
            if reason is not None:
                raise ListenError(address, reason)


_Stream = TypeVar("_Stream", bound=trio.abc.Stream)


async def accept_forever(
    listener: trio.abc.Listener[_Stream],
    handle: Callable[[_Stream], Awaitable[object]],
    nursery: trio.Nursery,
    failed: Callable[[OSError], object],
) -> NoReturn:
    """Accept connections for ever, each served by ``handle`` in ``nursery``;
    an accept that fails (EMFILE and friends) is told to ``failed`` and tried
    again after a short pause: Go's servers keep serving."""
    while True:
        try:
            stream = await listener.accept()
        except OSError as exc:
            failed(exc)
            await trio.sleep(0.01)
            continue
        nursery.start_soon(handle, stream)
