"""The last minutes of every topic's and channel's numbers, for the charts.

The admin reads the cluster every ``watch_interval`` (the same reads as the
timeline); each read adds a sample per topic and per channel: depth, in-flight
count, message count and backlog (a topic's depth plus its channels') summed
over the nodes.  :meth:`History.series` turns
them into evenly spaced points: depth (the last value in each step) and rate
(messages per second between steps).  A message count that goes down (a node
restarted or left) breaks the rate line instead of drawing a negative rate.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from .data import Snapshot

__all__ = ["History", "Series", "HISTORY_WINDOW", "CHART_WINDOW", "CHART_STEPS"]

#: How far back samples are kept (seconds).
HISTORY_WINDOW = 600.0
#: How far back the charts look (seconds).
CHART_WINDOW = 300.0
#: Points per chart line.
CHART_STEPS = 100


@dataclass(frozen=True)
class Sample:
    at: float
    depth: int
    in_flight: int
    messages: int
    #: What waits to be handled: a topic's own depth plus its channels'.
    backlog: int


@dataclass(frozen=True)
class Series:
    """Evenly spaced points ending now: ``(time, value or None)``."""

    name: str
    rate: list[tuple[float, float | None]]
    depth: list[tuple[float, float | None]]
    in_flight: list[tuple[float, float | None]]
    backlog: list[tuple[float, float | None]]


Key = tuple[str, ...]


class History:
    """Samples per topic (``("topic", T)``) and channel (``("channel", T, C)``)."""

    def __init__(self, window: float = HISTORY_WINDOW, chart_window: float = CHART_WINDOW) -> None:
        self.window = max(window, chart_window)
        #: How far back the charts look (seconds).
        self.chart_window = chart_window
        self._samples: dict[Key, deque[Sample]] = {}

    def add(self, snap: Snapshot, at: float | None = None) -> None:
        """One read of the cluster."""
        now = snap.taken if at is None else at
        for t in snap.topics.values():
            if t.lookupd_only:
                continue
            in_flight = sum(c.in_flight_count for c in t.channels.values())
            backlog = t.depth + sum(c.depth for c in t.channels.values())
            self._add(("topic", t.name), Sample(now, t.depth, in_flight, t.message_count, backlog))
            for c in t.channels.values():
                self._add(
                    ("channel", t.name, c.name),
                    Sample(now, c.depth, c.in_flight_count, c.message_count, c.depth),
                )
        for key in [
            k for k, samples in self._samples.items() if samples[-1].at < now - self.window
        ]:
            del self._samples[key]

    def _add(self, key: Key, sample: Sample) -> None:
        samples = self._samples.setdefault(key, deque())
        samples.append(sample)
        while samples and samples[0].at < sample.at - self.window:
            samples.popleft()

    def __contains__(self, key: Key) -> bool:
        return key in self._samples

    def series(
        self,
        key: Key,
        name: str,
        *,
        window: float | None = None,
        steps: int = CHART_STEPS,
        now: float | None = None,
    ) -> Series:
        """``key``'s last ``window`` seconds (the chart window) in ``steps`` points."""
        window = self.chart_window if window is None else window
        end = time.time() if now is None else now
        step = window / steps
        samples = list(self._samples.get(key, ()))
        rate: list[tuple[float, float | None]] = []
        depth: list[tuple[float, float | None]] = []
        in_flight: list[tuple[float, float | None]] = []
        backlog: list[tuple[float, float | None]] = []
        i = 0
        previous: Sample | None = None
        # The sample at or before the first step's start anchors the first rate.
        start = end - window
        while i < len(samples) and samples[i].at <= start:
            previous = samples[i]
            i += 1
        for n in range(1, steps + 1):
            edge = start + n * step
            last: Sample | None = None
            while i < len(samples) and samples[i].at <= edge:
                last = samples[i]
                i += 1
            if last is None:
                for line in (rate, depth, in_flight, backlog):
                    line.append((edge, None))
                continue
            depth.append((edge, float(last.depth)))
            in_flight.append((edge, float(last.in_flight)))
            backlog.append((edge, float(last.backlog)))
            if previous is None or last.messages < previous.messages or last.at <= previous.at:
                rate.append((edge, None))
            else:
                rate.append((edge, (last.messages - previous.messages) / (last.at - previous.at)))
            previous = last
        return Series(name, rate, depth, in_flight, backlog)
