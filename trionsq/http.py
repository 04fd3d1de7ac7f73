"""Publishing over nsqd's HTTP API (``/pub``, ``/mpub``), for scripts and tests.

Instrumented as the TCP publishes are (:mod:`trionsq.telemetry`): a PRODUCER
span each, the sent-messages counter and the operation duration, the HTTP
endpoint as ``server.address``/``server.port``; ``config`` gives the
telemetry options (providers, ``telemetry``, ``trace_context``,
``telemetry_attributes``), the defaults otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from . import telemetry
from .config import Config
from .protocol.errors import NSQErrorResponse, error_for_code
from .telemetry.producing import DEFERRED_PUBLISH, MULTI_PUBLISH, PUBLISH

if TYPE_CHECKING:
    import httpx

__all__ = ["http_publish", "http_multi_publish"]


def _base(address: str) -> str:
    return (address if "://" in address else f"http://{address}").rstrip("/")


def _endpoint(base: str) -> str | None:
    """``host:port`` of an HTTP base URL (the scheme's port when none is given)."""
    try:
        parts = urlsplit(base)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    host = parts.hostname
    if not host:
        return None
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


#: the telemetry options when no config is given (made on first use)
_default: Config | None = None


async def _traced(
    config: Config | None,
    base: str,
    operation: str,
    topic: str,
    bodies: list[bytes],
    delay: float | None,
    send: Callable[[list[bytes]], Awaitable[None]],
) -> None:
    """``send(bodies)`` in a publish's span (wrapped in the trace context
    envelope with ``trace_context``), counted; as is when nothing is recorded."""
    global _default
    if config is None:
        config = _default = _default or Config()
    traced = telemetry.for_producer(config, lambda: _endpoint(base))
    if traced is None:
        await send(bodies)
        return
    publish = traced.start(operation, topic, len(bodies), delay)
    try:
        await send([traced.wrap(publish, body) for body in bodies])
    except BaseException as exc:
        traced.end(publish, exc)
        raise
    traced.end(publish, None)


def _raise_for(response: httpx.Response) -> None:
    if response.status_code == 200:
        return
    # nsqd answers e.g. 400 {"message": "INVALID_TOPIC"} (or plain text in v0).
    try:
        message = str(response.json().get("message", ""))
    except (ValueError, AttributeError):
        message = response.text.strip()
    code = _HTTP_CODES.get(message, f"E_{message}" if message else "E_HTTP")
    error: NSQErrorResponse = error_for_code(code, f"HTTP {response.status_code} {message}")
    raise error


# nsqd's HTTP error messages, as the TCP error codes that mean the same.
_HTTP_CODES = {
    "INVALID_TOPIC": "E_BAD_TOPIC",
    "MISSING_ARG_TOPIC": "E_BAD_TOPIC",
    "MSG_EMPTY": "E_BAD_MESSAGE",
    "MSG_TOO_BIG": "E_BAD_MESSAGE",
    "BODY_TOO_BIG": "E_BAD_BODY",
    "BAD_BODY": "E_BAD_BODY",
    "INVALID_DEFER": "E_INVALID",
    "EXITING": "E_PUB_FAILED",
}


async def http_publish(
    address: str,
    topic: str,
    body: bytes,
    *,
    defer: float | None = None,
    client: httpx.AsyncClient | None = None,
    config: Config | None = None,
) -> None:
    """POST ``body`` to ``http://address/pub?topic=...`` (``defer`` in seconds);
    ``config``: the telemetry options (see the module doc)."""
    params: dict[str, str] = {"topic": topic}
    if defer is not None:
        if not math.isfinite(defer) or defer < 0:
            raise ValueError("defer must be >= 0 seconds")
        params["defer"] = str(round(defer * 1000))
    base = _base(address)

    async def send(bodies: list[bytes]) -> None:
        async with _client(client) as http:
            response = await http.post(f"{base}/pub", params=params, content=bodies[0])
        _raise_for(response)

    operation = PUBLISH if defer is None else DEFERRED_PUBLISH
    await _traced(config, base, operation, topic, [body], defer, send)


async def http_multi_publish(
    address: str,
    topic: str,
    bodies: Iterable[bytes],
    *,
    client: httpx.AsyncClient | None = None,
    config: Config | None = None,
) -> None:
    """POST bodies to ``/mpub?binary=true`` (binary: bodies may contain
    newlines); ``config``: the telemetry options (see the module doc)."""
    base = _base(address)

    async def send(payload: list[bytes]) -> None:
        data = len(payload).to_bytes(4, "big") + b"".join(
            len(b).to_bytes(4, "big") + b for b in payload
        )
        async with _client(client) as http:
            response = await http.post(
                f"{base}/mpub", params={"topic": topic, "binary": "true"}, content=data
            )
        _raise_for(response)

    payload = [bytes(b) for b in bodies]
    await _traced(config, base, MULTI_PUBLISH, topic, payload, None, send)


class _client:
    """Use the caller's client, or a fresh one closed afterwards."""

    def __init__(self, client: httpx.AsyncClient | None) -> None:
        self._given = client
        self._own: httpx.AsyncClient | None = None

    async def __aenter__(self) -> httpx.AsyncClient:
        if self._given is not None:
            return self._given
        import httpx  # imported on use: importing trionsq does not load httpx

        self._own = httpx.AsyncClient()
        return self._own

    async def __aexit__(self, *exc: object) -> None:
        if self._own is not None:
            await self._own.aclose()
