"""Host and port as Go's ``net`` package writes and reads them."""

from __future__ import annotations

__all__ = ["join_host_port", "split_address", "split_host_port"]


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
