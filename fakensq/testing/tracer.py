"""The trace of a fault run: every frame the nodes exchange, every fault's
start and end, as JSON-ready events with their (virtual) time."""

from __future__ import annotations

import json
from typing import IO, Any

import trio

__all__ = ["Tracer"]


class Tracer:
    """Records events as JSON-serialisable dicts with their (virtual) time.

    ``sink`` is a list (events are appended to it) or a path (JSON lines, written
    as they happen, for debugging a failing run).  Times are seconds since the
    tracer's first event, so that runs on a ``MockClock`` compare equal.
    """

    def __init__(self, sink: list[dict[str, Any]] | str | None = None) -> None:
        self.events: list[dict[str, Any]] = sink if isinstance(sink, list) else []
        self._file: IO[str] | None = None
        if isinstance(sink, str):
            # Synchronous, line-buffered writes: the trace is a debugging aid and a
            # crash must not lose its tail.
            self._file = open(sink, "w", buffering=1, encoding="utf-8")
        self._t0: float | None = None

    def record(self, event: str, **fields: Any) -> None:
        now = trio.current_time()
        if self._t0 is None:
            self._t0 = now
        doc = {"t": round(now - self._t0, 6), "event": event, **fields}
        self.events.append(doc)
        if self._file is not None:
            self._file.write(json.dumps(doc, sort_keys=True) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
