"""Publishing over nsqd's HTTP API (``/pub``, ``/mpub``), for scripts and tests."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .protocol.errors import NSQErrorResponse, error_for_code

if TYPE_CHECKING:
    import httpx

__all__ = ["http_publish", "http_multi_publish"]


def _base(address: str) -> str:
    return (address if "://" in address else f"http://{address}").rstrip("/")


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
) -> None:
    """POST ``body`` to ``http://address/pub?topic=...`` (``defer`` in seconds)."""
    params: dict[str, str] = {"topic": topic}
    if defer is not None:
        if not math.isfinite(defer) or defer < 0:
            raise ValueError("defer must be >= 0 seconds")
        params["defer"] = str(round(defer * 1000))
    async with _client(client) as http:
        response = await http.post(f"{_base(address)}/pub", params=params, content=body)
    _raise_for(response)


async def http_multi_publish(
    address: str, topic: str, bodies: Iterable[bytes], *, client: httpx.AsyncClient | None = None
) -> None:
    """POST bodies to ``/mpub?binary=true`` (binary: bodies may contain newlines)."""
    payload = [bytes(b) for b in bodies]
    data = len(payload).to_bytes(4, "big") + b"".join(
        len(b).to_bytes(4, "big") + b for b in payload
    )
    async with _client(client) as http:
        response = await http.post(
            f"{_base(address)}/mpub", params={"topic": topic, "binary": "true"}, content=data
        )
    _raise_for(response)


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
