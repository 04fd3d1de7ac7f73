"""nsqd's statistics: the /stats JSON and text, and e2e processing latency."""

from __future__ import annotations

import math
import time
from collections import deque
from datetime import datetime
from typing import TYPE_CHECKING, Any

from trionsq.tools.flags import format_duration

from .options import BUILD, VERSION, NSQDOptions

if TYPE_CHECKING:
    from .channel import Channel
    from .node import NSQD
    from .topic import Topic

__all__ = ["LatencyStream", "build_stats", "format_text_stats", "memory_stats"]


class LatencyStream:
    """End-to-end processing latency (publish to FIN) over a sliding window.

    Only kept when ``e2e_processing_latency_percentiles`` is configured, as in
    nsqd; the result then has exact percentiles of the window's samples.
    """

    def __init__(self, options: NSQDOptions) -> None:
        self.percentiles = sorted(options.e2e_processing_latency_percentiles, reverse=True)
        self.window = options.e2e_processing_latency_window_time
        self._samples: deque[tuple[float, int]] = deque()

    @property
    def enabled(self) -> bool:
        return bool(self.percentiles)

    def add(self, timestamp_ns: int) -> None:
        if not self.percentiles:
            return
        now = time.time()
        self._samples.append((now, max(0, time.time_ns() - timestamp_ns)))
        self._trim(now)

    def _trim(self, now: float) -> None:
        while self._samples and self._samples[0][0] < now - self.window:
            self._samples.popleft()

    def result(self) -> dict[str, Any]:
        if not self.percentiles:
            return {"count": 0, "percentiles": None}
        self._trim(time.time())
        values = sorted(v for _, v in self._samples)
        out: list[dict[str, float]] = []
        for q in self.percentiles:
            value = 0.0
            if values:
                value = float(values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))])
            out.append({"quantile": q, "value": value})
        return {"count": len(values), "percentiles": out}


def backend_depth(queue: object) -> int:
    """Messages of a queue that are on disk (a memory-only queue: none)."""
    return int(getattr(queue, "backend_depth", 0))


def _channel_stats(channel: Channel, topic_filter: str, include_clients: bool) -> dict[str, Any]:
    clients: list[dict[str, Any]] | None = None
    if include_clients:
        clients = [c.stats(topic_filter) for c in channel.clients.values()]
    return {
        "channel_name": channel.name,
        "depth": channel.depth(),  # memory and disk, as nsqd's Depth()
        "backend_depth": backend_depth(channel.queue),
        "in_flight_count": len(channel.in_flight),
        "deferred_count": len(channel.deferred),
        "message_count": channel.message_count,
        "requeue_count": channel.requeue_count,
        "timeout_count": channel.timeout_count,
        "client_count": len(channel.clients),
        "clients": clients,
        "paused": channel.paused,
        "e2e_processing_latency": channel.e2e.result(),
    }


def _topic_stats(topic: Topic, channels: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "topic_name": topic.name,
        "channels": channels,
        "depth": topic.depth(),
        "backend_depth": backend_depth(topic.queue),
        "message_count": topic.message_count,
        "message_bytes": topic.message_bytes,
        "paused": topic.paused,
        # nsqd aggregates its channels' streams: none, no stream at all.
        "e2e_processing_latency": (
            topic.e2e.result() if topic.channels else {"count": 0, "percentiles": None}
        ),
    }


def build_stats(
    nsqd: NSQD,
    topic: str = "",
    channel: str = "",
    include_clients: bool = True,
    include_mem: bool = True,
) -> dict[str, Any]:
    """The /stats JSON document, as nsqd v1.3's ``doStats`` builds it.

    Go's nil slices come out as ``null``: ``topics`` when the asked-for topic
    does not exist, ``clients`` without include_clients, ``producers`` when
    there are none.
    """
    topics: list[dict[str, Any]] | None = []
    if topic:
        selected = [nsqd.topics[topic]] if topic in nsqd.topics else None
    else:
        selected = [nsqd.topics[name] for name in sorted(nsqd.topics)]
    if selected is None:
        topics = None
    else:
        assert topics is not None
        for t in selected:
            if channel:
                if channel not in t.channels:
                    continue
                chans = [t.channels[channel]]
            else:
                chans = [t.channels[name] for name in sorted(t.channels)]
            channel_docs = [_channel_stats(c, topic, include_clients) for c in chans]
            topics.append(_topic_stats(t, channel_docs))
    producers: list[dict[str, Any]] | None = None
    # nsqd's GetStats returns early, producers and all, for an unknown topic.
    if include_clients and topics is not None:
        producers = [c.stats(topic) for c in nsqd.clients.values() if c.is_producer()] or None
    doc: dict[str, Any] = {
        "version": VERSION,
        "health": nsqd.health(),
        "start_time": nsqd.start_time,
        "topics": topics,
    }
    if include_mem:
        doc["memory"] = memory_stats()
    doc["producers"] = producers
    if nsqd.hooks is not None:
        doc["faults"] = nsqd.hooks.report()  # fakensq only: the injected faults
    return doc


def memory_stats() -> dict[str, int]:
    """Go's runtime.MemStats fields, filled with what CPython can tell cheaply."""
    import gc
    import resource
    import sys

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "heap_objects": sys.getallocatedblocks(),
        "heap_idle_bytes": 0,
        "heap_in_use_bytes": rss,
        "heap_released_bytes": 0,
        "gc_pause_usec_100": 0,
        "gc_pause_usec_99": 0,
        "gc_pause_usec_95": 0,
        "next_gc_bytes": 0,
        "gc_total_runs": sum(s["collections"] for s in gc.get_stats()),
    }


def format_text_stats(doc: dict[str, Any]) -> str:
    """nsqd's plain-text /stats (``printStats``)."""
    out = [f"nsqd v{doc['version']} ({BUILD})\n"]
    out.append(f"start_time {_rfc3339(doc['start_time'])}\n")
    out.append(f"uptime {_uptime(doc['start_time'])}\n")
    out.append(f"\nHealth: {doc['health']}\n")
    mem = doc.get("memory")
    if mem:
        out.append("\nMemory:\n")
        for key, value in mem.items():
            out.append(f"   {key:<25}\t{value}\n")
    topics = doc["topics"] or []
    out.append("\nTopics: None\n" if not topics else "\nTopics:")
    for t in topics:
        prefix = "*P " if t["paused"] else "   "
        out.append(
            f"\n{prefix}[{t['topic_name']:<15}] depth: {t['depth']:<5} be-depth: "
            f"{t['backend_depth']:<5} msgs: {t['message_count']:<8} "
            f"e2e%: {_e2e(t['e2e_processing_latency'])}\n"
        )
        for c in t["channels"]:
            prefix = "   *P " if c["paused"] else "      "
            out.append(
                f"{prefix}[{c['channel_name']:<25}] depth: {c['depth']:<5} be-depth: "
                f"{c['backend_depth']:<5} inflt: {c['in_flight_count']:<4} def: "
                f"{c['deferred_count']:<4} re-q: {c['requeue_count']:<5} timeout: "
                f"{c['timeout_count']:<5} msgs: {c['message_count']:<8} "
                f"e2e%: {_e2e(c['e2e_processing_latency'])}\n"
            )
            for cl in c["clients"] or []:
                out.append(f"        {_client_text(cl)}\n")
    producers = doc.get("producers") or []
    if not producers:
        out.append("\nProducers: None\n")
    else:
        out.append("\nProducers:\n")
        for p in producers:
            out.append(f"   {_client_text(p)}\n")
    return "".join(out)


def _client_text(c: dict[str, Any]) -> str:
    """ClientV2Stats.String()."""
    # time.Since(connectTime).Truncate(time.Second)
    connected = format_duration(float(max(0, int(time.time() - c["connect_ts"]))))
    port = c["remote_address"].rpartition(":")[2]
    ident = f"{c['hostname']}:{port} {c['user_agent']}"
    pub_counts = c.get("pub_counts") or []
    if pub_counts:
        total = sum(pc["count"] for pc in pub_counts)
        topics = ",".join(f"{pc['topic']}={pc['count']}" for pc in pub_counts)
        return (
            f"[{c['version']} {ident:<21}] msgs: {total:<8} topics: {topics} connected: {connected}"
        )
    return (
        f"[{c['version']} {ident:<21}] state: {c['state']} inflt: {c['in_flight_count']:<4} "
        f"rdy: {c['ready_count']:<4} fin: {c['finish_count']:<8} re-q: {c['requeue_count']:<8} "
        f"msgs: {c['message_count']:<8} connected: {connected}"
    )


def _e2e(result: dict[str, Any]) -> str:
    """quantile.Result's String(): each percentile's value, humanized."""
    return ", ".join(_nanoseconds_to_human(p["value"]) for p in result.get("percentiles") or [])


def _nanoseconds_to_human(v: float) -> str:
    if v > 1e9:
        return f"{v / 1e9:.1f}s"
    if v > 1e6:
        return f"{v / 1e6:.1f}ms"
    if v > 1e3:
        return f"{v / 1e3:.1f}us"
    return f"{v:.1f}ns"


def _rfc3339(ts: int) -> str:
    """Go's ``time.Format(time.RFC3339)`` in local time: ``Z`` for UTC."""
    local = datetime.fromtimestamp(ts).astimezone()
    text = local.strftime("%Y-%m-%dT%H:%M:%S")
    offset = local.utcoffset()
    if not offset:
        return text + "Z"
    minutes = int(offset.total_seconds()) // 60
    sign = "+" if minutes >= 0 else "-"
    hours, mins = divmod(abs(minutes), 60)
    return f"{text}{sign}{hours:02d}:{mins:02d}"


def _uptime(ts: int) -> str:
    return format_duration(max(0.0, time.time() - ts))
