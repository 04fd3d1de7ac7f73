"""nsqlookupd discovery: which nsqds have a topic.

:func:`lookup` asks one nsqlookupd; :func:`merge` unions the answers the way the
client guide asks (``broadcast_address:tcp_port`` is the key).  The polling loop
lives in the consumer, which owns the tasks.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .transport import format_address

if TYPE_CHECKING:
    import httpx

__all__ = ["lookup", "lookup_url", "parse_lookup_response", "merge"]

log = logging.getLogger("trionsq.lookupd")


def lookup_url(address: str) -> str:
    """``host:port`` or a full ``http(s)://`` base URL -> the ``/lookup`` URL."""
    base = address if "://" in address else f"http://{address}"
    return base.rstrip("/") + "/lookup"


def parse_lookup_response(document: Any) -> set[str]:
    """The ``host:port`` of every producer in a ``/lookup`` reply.

    Accepts the current shape (``{"producers": [...]}``) and the pre-1.0
    envelope (``{"status_code": 200, "data": {"producers": [...]}}``).  Entries
    without a usable address are skipped.
    """
    if not isinstance(document, dict):
        raise ValueError("lookup response is not a JSON object")
    if "producers" not in document and isinstance(document.get("data"), dict):
        document = document["data"]
    producers = document.get("producers")
    if not isinstance(producers, list):
        raise ValueError("lookup response has no producers list")
    found: set[str] = set()
    for producer in producers:
        if not isinstance(producer, dict):
            continue
        host = producer.get("broadcast_address")
        port = producer.get("tcp_port")
        if isinstance(host, str) and host and isinstance(port, int) and 0 < port < 65536:
            found.add(format_address(host, port))
    return found


async def lookup(client: httpx.AsyncClient, address: str, topic: str) -> set[str]:
    """Ask one nsqlookupd for ``topic``'s producers.

    A topic nsqlookupd does not know (HTTP 404) has no producers.  Other
    failures raise (``httpx.HTTPError``, ``ValueError``) for the caller to log.
    """
    response = await client.get(lookup_url(address), params={"topic": topic})
    if response.status_code == 404:
        return set()
    response.raise_for_status()
    return parse_lookup_response(response.json())


def merge(answers: Iterable[set[str] | None]) -> set[str]:
    """Union of the answers that arrived (``None`` marks a failed lookupd)."""
    merged: set[str] = set()
    for answer in answers:
        if answer is not None:
            merged |= answer
    return merged
