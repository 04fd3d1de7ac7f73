"""Why an agent's connections fail, in a line (the reasons a failed read gives).

An internal module of :mod:`trionsq.spark`; no public API.
"""

from __future__ import annotations

import socket

import trio

from ..lookupd import lookup
from ._options import SourceOptions

__all__ = ["probe", "reason", "unreachable_reason"]


async def unreachable_reason(options: SourceOptions) -> str:
    """Why no nsqd could be reached, one line, by asking each address directly."""
    connection = options.connection
    timeout = connection.connect_timeout
    reasons: list[str] = []
    for address in connection.nsqd_tcp_addresses:
        reasons.append(f"nsqd {address}: {await probe(address, timeout)}")
    if connection.lookupd_http_addresses:
        # Imported here: httpx (with its command line's imports) costs every
        # agent's start a tenth of a second, and only this diagnosis needs it.
        import httpx

        async with httpx.AsyncClient(timeout=timeout) as client:
            for address in connection.lookupd_http_addresses:
                try:
                    found = await lookup(client, address, options.topic)
                    reasons.append(
                        f"lookupd {address}: {len(found)} nsqd(s) for topic {options.topic!r}"
                    )
                except (httpx.HTTPError, ValueError) as exc:
                    reasons.append(f"lookupd {address}: {exc}")
    return (
        f"no nsqd connection for {options.topic}/{options.channel} after "
        f"{timeout:g}s: " + "; ".join(reasons)
    )


async def probe(address: str, seconds: float) -> str:
    """Why a TCP connection to ``address`` fails, in the OS's words."""
    host, _, port = address.rpartition(":")
    try:
        with trio.fail_after(seconds):
            infos = await trio.socket.getaddrinfo(
                host.strip("[]"), int(port), type=socket.SOCK_STREAM
            )
            family, kind, proto, _, target = infos[0]
            with trio.socket.socket(family, kind, proto) as sock:
                await sock.connect(target)
    except trio.TooSlowError:
        return f"no answer within {seconds:g}s"
    except OSError as exc:
        return exc.strerror or str(exc)
    return "reachable, but the handshake or SUB failed (see the executor's log)"


def reason(exc: BaseException) -> str:
    """An exception in a few words (a failed TLS handshake says why underneath)."""
    cause = exc.__cause__ or exc.__context__
    if isinstance(exc, trio.BrokenResourceError) and cause is not None:
        return f"{exc} ({cause})"
    return str(exc) or type(exc).__name__
