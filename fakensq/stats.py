"""nsqd's statistics: the /stats JSON and text, and e2e processing latency."""

from __future__ import annotations

import math
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from .options import VERSION, NSQDOptions

if TYPE_CHECKING:
    from .channel import Channel
    from .nsqd import NSQD
    from .topic import Topic

__all__ = ["LatencyStream", "build_stats", "format_text_stats"]


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
        if values:
            for q in self.percentiles:
                index = min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))
                out.append({"quantile": q, "value": float(values[index])})
        return {"count": len(values), "percentiles": out or None}


def _channel_stats(channel: Channel, topic_filter: str, include_clients: bool) -> dict[str, Any]:
    clients: list[dict[str, Any]] | None = None
    if include_clients:
        clients = [c.stats(topic_filter) for c in channel.clients.values()]
    return {
        "channel_name": channel.name,
        "depth": channel.depth(),
        "backend_depth": 0,
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
        "backend_depth": 0,
        "message_count": topic.message_count,
        "message_bytes": topic.message_bytes,
        "paused": topic.paused,
        "e2e_processing_latency": topic.e2e.result(),
    }


def build_stats(
    nsqd: NSQD,
    topic: str = "",
    channel: str = "",
    include_clients: bool = True,
    include_mem: bool = True,
) -> dict[str, Any]:
    """The /stats JSON document, as nsqd v1.3's ``doStats`` builds it."""
    topics: list[dict[str, Any]] = []
    if topic:
        selected = [nsqd.topics[topic]] if topic in nsqd.topics else []
    else:
        selected = [nsqd.topics[name] for name in sorted(nsqd.topics)]
    for t in selected:
        if channel:
            if channel not in t.channels:
                continue
            chans = [t.channels[channel]]
        else:
            chans = [t.channels[name] for name in sorted(t.channels)]
        topics.append(_topic_stats(t, [_channel_stats(c, topic, include_clients) for c in chans]))
    producers: list[dict[str, Any]] | None = None
    if include_clients:
        producers = [c.stats(topic) for c in nsqd.clients.values() if c.is_producer()]
    doc: dict[str, Any] = {
        "version": VERSION,
        "health": nsqd.health(),
        "start_time": nsqd.start_time,
        "topics": topics,
    }
    if include_mem:
        doc["memory"] = _memory_stats()
    doc["producers"] = producers if producers is not None else []
    return doc


def _memory_stats() -> dict[str, int]:
    import gc
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "heap_objects": len(gc.get_objects()),
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
    lines = [f"nsqd v{doc['version']} (built w/fakensq)"]
    lines.append(f"start_time {_rfc3339(doc['start_time'])}")
    lines.append(f"uptime {_uptime(doc['start_time'])}")
    lines.append("")
    lines.append(f"Health: {doc['health']}")
    mem = doc.get("memory")
    if mem:
        lines.append("")
        lines.append("Memory:")
        for key in (
            "heap_objects",
            "heap_idle_bytes",
            "heap_in_use_bytes",
            "heap_released_bytes",
            "gc_pause_usec_100",
            "gc_pause_usec_99",
            "gc_pause_usec_95",
            "next_gc_bytes",
            "gc_total_runs",
        ):
            lines.append(f"   {key:<25}{mem[key]}")
    if not doc["topics"]:
        lines.append("")
        lines.append("NO_TOPICS")
        return "\n".join(lines) + "\n"
    lines.append("")
    lines.append("Topics:")
    for t in doc["topics"]:
        state = " *P" if t["paused"] else "   "
        lines.append(
            f"\n[{t['topic_name']:<20}]{state} depth: {t['depth']:<5} be-depth: "
            f"{t['backend_depth']:<5} msgs: {t['message_count']:<8} "
            f"e2e%: {_e2e(t['e2e_processing_latency'])}"
        )
        for c in t["channels"]:
            state = " *P" if c["paused"] else "   "
            lines.append(
                f"    [{c['channel_name']:<16}]{state} depth: {c['depth']:<5} be-depth: "
                f"{c['backend_depth']:<5} inflt: {c['in_flight_count']:<4} def: "
                f"{c['deferred_count']:<4} re-q: {c['requeue_count']:<5} timeout: "
                f"{c['timeout_count']:<5} msgs: {c['message_count']:<8} "
                f"e2e%: {_e2e(c['e2e_processing_latency'])}"
            )
            for cl in c["clients"] or []:
                lines.append(f"        {_client_text(cl)}")
    producers = doc.get("producers") or []
    if producers:
        lines.append("")
        lines.append("Producers:")
        for p in producers:
            lines.append(f"    {_client_text(p)}")
    return "\n".join(lines) + "\n"


def _client_text(c: dict[str, Any]) -> str:
    connected = _duration(time.time() - c["connect_ts"])
    text = f"[{c['version']} {c['client_id']}] connected: {connected}"
    text += (
        f" state: {c['state']} inflt: {c['in_flight_count']:<4} rdy: {c['ready_count']:<4} "
        f"fin: {c['finish_count']:<8} re-q: {c['requeue_count']:<8} msgs: {c['message_count']:<8}"
    )
    for pc in c.get("pub_counts") or []:
        text += f"\n        [{pc['topic']}] pub: {pc['count']}"
    return text


def _e2e(result: dict[str, Any]) -> str:
    parts = []
    for p in result.get("percentiles") or []:
        parts.append(f"{p['quantile'] * 100:.1f}%={_duration(p['value'] / 1e9)}")
    return ", ".join(parts)


def _rfc3339(ts: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def _uptime(ts: int) -> str:
    return _duration(max(0.0, time.time() - ts))


def _duration(seconds: float) -> str:
    """Roughly Go's time.Duration.String()."""
    if seconds < 1e-6:
        return f"{int(seconds * 1e9)}ns"
    if seconds < 1e-3:
        return f"{seconds * 1e6:g}µs"
    if seconds < 1:
        return f"{seconds * 1e3:g}ms"
    total = int(seconds)
    h, rem = divmod(total, 3600)
    m, s = divmod(rem, 60)
    frac = seconds - total
    sec = f"{s + frac:g}s"
    if h:
        return f"{h}h{m}m{sec}"
    if m:
        return f"{m}m{sec}"
    return sec
