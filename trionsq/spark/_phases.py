"""Time stamps of a query's start, across the driver, tasks and agents (a debug aid).

A query's first batch crosses several processes: the driver's source process
(the coordinator), each executor's Python workers (the tasks) and agents.  With
``TRIONSQ_SPARK_PHASES`` naming a file in the environment of those processes
(``spark.executorEnv.TRIONSQ_SPARK_PHASES`` for the executors), each appends a
JSON line per step it reaches (wall-clock time, pid, the step and its details),
and ``benchmarks/bench_spark.py --phases`` prints where the time went.  Unset
(the default), :func:`mark` returns at once: nothing is written, nothing timed.

A process's first line also says when the process itself started (``/proc``),
so that the cost of starting it (Python's and the imports' time) shows too.

An internal module of :mod:`trionsq.spark`; no public API.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

__all__ = ["enabled", "mark"]

_PATH = os.environ.get("TRIONSQ_SPARK_PHASES") or None
_announced: set[int] = set()


def enabled() -> bool:
    return _PATH is not None


def _process_started() -> float | None:
    """This process's start, wall-clock seconds (Linux's /proc), if known."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    # /proc/stat's btime is whole seconds: uptime (1/100 s) places the start better.
    return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")


def mark(step: str, **details: object) -> None:
    """Append ``step`` (and ``details``) with the time, if phases are recorded."""
    if _PATH is None:
        return
    entry: dict[str, object] = {"t": time.time(), "pid": os.getpid(), "step": step, **details}
    pid = os.getpid()
    if pid not in _announced:  # a forked worker is a new process: announce it too
        _announced.add(pid)
        entry["process_started"] = _process_started()
    # One write of one line on an O_APPEND file: lines of concurrent processes
    # do not interleave.
    descriptor = os.open(_PATH, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(descriptor, (json.dumps(entry, default=str) + "\n").encode())
    finally:
        os.close(descriptor)
