"""nsqd's ``/stats`` JSON, read the one way for every test.

nsqd (the real one and fakensq's) lists ``topics``, each with its
``channels``; a topic or channel that does not exist is simply absent, and
``topics`` is ``null`` when nsqd has none at all (hence the ``or []``)::

    stats = nsqd_stats(nsqd.http_address, topic="t")       # blocking GET
    channel = channel_entry(stats, "t", "c")              # None: no such channel
    channel_stats(nsqd.http_address, "t", "c")            # the two at once

Trio code reads the document with its own HTTP client (``Nsqd.stats`` in
:mod:`.nodes`) and walks it with :func:`topic_entry` and :func:`channel_entry`.
"""

from __future__ import annotations

from typing import Any

import httpx

__all__ = ["channel_entry", "channel_stats", "nsqd_stats", "topic_depth", "topic_entry"]

#: nsqd answers /stats in milliseconds; a loaded machine may take seconds.
TIMEOUT = 10.0


def topic_entry(stats: dict[str, Any], topic: str) -> dict[str, Any] | None:
    """``topic``'s entry in a ``/stats`` document (None if nsqd has no such topic)."""
    for entry in stats.get("topics") or []:
        if entry["topic_name"] == topic:
            found: dict[str, Any] = entry
            return found
    return None


def channel_entry(stats: dict[str, Any], topic: str, channel: str) -> dict[str, Any] | None:
    """``topic/channel``'s entry in a ``/stats`` document (None if absent)."""
    for entry in (topic_entry(stats, topic) or {}).get("channels") or []:
        if entry["channel_name"] == channel:
            found: dict[str, Any] = entry
            return found
    return None


def nsqd_stats(http_address: str, topic: str | None = None, channel: str | None = None) -> Any:
    """``GET /stats?format=json`` (narrowed to ``topic`` and ``channel`` as
    nsqd's own parameters do), from blocking code."""
    params = {"format": "json"}
    if topic is not None:
        params["topic"] = topic
    if channel is not None:
        params["channel"] = channel
    response = httpx.get(f"http://{http_address}/stats", params=params, timeout=TIMEOUT)
    response.raise_for_status()
    return response.json()


def channel_stats(http_address: str, topic: str, channel: str) -> dict[str, Any] | None:
    """The channel's entry in nsqd's ``/stats`` now (None if absent)."""
    return channel_entry(nsqd_stats(http_address, topic, channel), topic, channel)


def topic_depth(http_address: str, topic: str) -> int:
    """The topic's depth in nsqd's ``/stats`` now (0 if absent)."""
    entry = topic_entry(nsqd_stats(http_address, topic), topic)
    return 0 if entry is None else int(entry["depth"])
