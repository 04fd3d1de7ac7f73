"""nsqd's statsd integration: every ``statsd_interval``, the node's metrics over UDP.

What nsqd sends (its ``statsdLoop``), and so what fakensq sends:

- per topic: ``topic.<t>.message_count`` and ``.message_bytes`` (counters: the
  increase since the previous push), ``.depth`` and ``.backend_depth`` (gauges),
  ``.e2e_processing_latency_<p>`` (gauges, when percentiles are configured);
- per channel, under ``topic.<t>.channel.<c>.``: ``message_count``,
  ``requeue_count``, ``timeout_count`` (counters), ``depth``, ``backend_depth``,
  ``in_flight_count``, ``deferred_count``, ``clients`` (gauges) and the e2e
  percentiles;
- with ``statsd_mem_stats``: ``mem.*`` (CPython's stand-ins for Go's MemStats,
  as in ``/stats``).

Lines are ``<prefix><name>:<value>|c`` (or ``|g``), each ending in a newline,
packed whole into datagrams of at most ``statsd_udp_packet_size`` bytes.  nsqd
spreads the datagrams over the interval; fakensq sends them at once, so that a
test sees the whole push at one virtual instant.

The prefix is ``statsd_prefix`` with ``%s`` replaced by the broadcast
``address:port`` (HTTP port) with ``.`` and ``:`` turned into ``_``, and a
trailing ``.`` added when missing, as nsqd builds it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import trio

from ..golang.net import split_address
from .stats import memory_stats

if TYPE_CHECKING:
    from .node import NSQD

__all__ = ["statsd_prefix", "collect_lines", "pack_packets", "run_statsd"]

log = logging.getLogger(__name__)


def statsd_prefix(template: str, broadcast_address: str, http_port: int) -> str:
    """nsqd's prefix: ``%s`` → the mangled ``host:port``, ending with a dot."""
    if not template:
        return ""
    host_key = f"{broadcast_address}:{http_port}".replace(".", "_").replace(":", "_")
    prefix = template.replace("%s", host_key)
    return prefix if prefix.endswith(".") else prefix + "."


class _Lines:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.lines: list[bytes] = []

    def add(self, name: str, value: int, kind: str) -> None:
        self.lines.append(f"{self.prefix}{name}:{value}|{kind}\n".encode())


def _percentiles(lines: _Lines, base: str, e2e: dict[str, Any]) -> None:
    for item in e2e.get("percentiles") or []:
        # nsqd formats the quantile with %.0f of quantile*100 and the value as int.
        lines.add(
            f"{base}.e2e_processing_latency_{item['quantile'] * 100:.0f}", int(item["value"]), "g"
        )


def collect_lines(
    nsqd: NSQD,
    prefix: str,
    last: dict[str, Any],
    last_mem: dict[str, int],
) -> tuple[list[bytes], dict[str, Any], dict[str, int]]:
    """One push: the lines, and the stats/mem to diff the next push against."""
    lines = _Lines(prefix)
    doc = nsqd.stats(include_clients=False, include_mem=False)
    seen: dict[str, Any] = {}
    for topic in doc["topics"]:
        tname = topic["topic_name"]
        before = last.get(tname, {})
        base = f"topic.{tname}"
        lines.add(f"{base}.message_count", topic["message_count"] - before.get("mc", 0), "c")
        lines.add(f"{base}.message_bytes", topic["message_bytes"] - before.get("mb", 0), "c")
        lines.add(f"{base}.depth", topic["depth"], "g")
        lines.add(f"{base}.backend_depth", topic["backend_depth"], "g")
        _percentiles(lines, base, topic["e2e_processing_latency"])
        channels: dict[str, dict[str, int]] = {}
        for ch in topic["channels"]:
            cname = ch["channel_name"]
            cbefore = before.get("channels", {}).get(cname, {})
            cbase = f"{base}.channel.{cname}"
            lines.add(f"{cbase}.message_count", ch["message_count"] - cbefore.get("mc", 0), "c")
            lines.add(f"{cbase}.depth", ch["depth"], "g")
            lines.add(f"{cbase}.backend_depth", ch["backend_depth"], "g")
            lines.add(f"{cbase}.in_flight_count", ch["in_flight_count"], "g")
            lines.add(f"{cbase}.deferred_count", ch["deferred_count"], "g")
            lines.add(f"{cbase}.requeue_count", ch["requeue_count"] - cbefore.get("rq", 0), "c")
            lines.add(f"{cbase}.timeout_count", ch["timeout_count"] - cbefore.get("to", 0), "c")
            lines.add(f"{cbase}.clients", ch["client_count"], "g")
            _percentiles(lines, cbase, ch["e2e_processing_latency"])
            channels[cname] = {
                "mc": ch["message_count"],
                "rq": ch["requeue_count"],
                "to": ch["timeout_count"],
            }
        seen[tname] = {
            "mc": topic["message_count"],
            "mb": topic["message_bytes"],
            "channels": channels,
        }
    mem = last_mem
    if nsqd.options.statsd_mem_stats:
        mem = memory_stats()
        # All gauges but gc_runs, as nsqd (its docs' "mem.mem.next_gc_bytes" is a
        # typo: the code sends "mem.next_gc_bytes").
        for name in (
            "heap_objects",
            "heap_idle_bytes",
            "heap_in_use_bytes",
            "heap_released_bytes",
            "gc_pause_usec_100",
            "gc_pause_usec_99",
            "gc_pause_usec_95",
            "next_gc_bytes",
        ):
            lines.add(f"mem.{name}", mem[name], "g")
        lines.add("mem.gc_runs", mem["gc_total_runs"] - last_mem.get("gc_total_runs", 0), "c")
    return lines.lines, seen, mem


def pack_packets(lines: list[bytes], size: int) -> list[bytes]:
    """Whole lines per datagram, at most ``size`` bytes each (a longer line goes
    alone), as nsqd's boundary-buffered writer does."""
    packets: list[bytes] = []
    buf = b""
    for line in lines:
        if buf and len(buf) + len(line) > size:
            packets.append(buf)
            buf = b""
        buf += line
    if buf:
        packets.append(buf)
    return packets


async def run_statsd(nsqd: NSQD) -> None:
    """Push to ``statsd_address`` every ``statsd_interval`` until cancelled."""
    last: dict[str, Any] = {}
    last_mem: dict[str, int] = {}
    while True:
        await trio.sleep(nsqd.options.statsd_interval)
        opts = nsqd.options
        if not opts.statsd_address:
            continue
        http_port = opts.broadcast_http_port or _port(nsqd.http_address)
        prefix = statsd_prefix(opts.statsd_prefix, opts.broadcast_address, http_port)
        lines, last, last_mem = collect_lines(nsqd, prefix, last, last_mem)
        try:
            host, port = split_address(opts.statsd_address)
            sock = trio.socket.socket(type=trio.socket.SOCK_DGRAM)
            with sock:
                await sock.connect((host, port))
                for packet in pack_packets(lines, opts.statsd_udp_packet_size):
                    await sock.send(packet)
        except OSError as exc:
            # nsqd logs and carries on at the next interval.
            log.error("failed to create UDP socket to statsd(%s) - %s", opts.statsd_address, exc)


def _port(address: str) -> int:
    _, _, port = address.rpartition(":")
    return int(port) if port.isdigit() else 0
