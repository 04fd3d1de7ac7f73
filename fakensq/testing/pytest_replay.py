"""Replays of a fault run: ``--nsq-faults-check``, ``--nsq-faults-shrink``, and
the check of ``--nsq-faults-only``.

Each failing test's last report carries what it met and how it ended
(:func:`fakensq.testing.pytest_faults.record_outcome`); at the end of the
session (on xdist's controller too) this module replays such tests as a user
would, with the very command line the report prints, in a pytest of their own
that writes the same record back (``--nsq-faults-record``):

- the check (madsim's determinism check) runs each failing test once more and
  says whether it met the same faults and failed the same way (the same
  exception at the same line), or why not: which fault it did not reach, or
  which it met that the first run did not;
- shrinking is delta debugging (Zeller's ddmin) over the faults a failing test
  met, each candidate a replay with ``--nsq-faults-only``: the smallest set
  that still fails it the same way, printed as the command that replays it.

With ``--nsq-faults-only``, a fault it names that no test met is a usage
error: one line, and pytest exits with 4.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any, Final

import pytest

from .flow import format_only
from .pytest_faults import settings_of

__all__ = ["ReplayLog", "ddmin"]

#: How long one replay may take before it counts as hung (seconds).
REPLAY_TIMEOUT: Final = 300.0

_LOG: Final = pytest.StashKey["ReplayLog"]()


class ReplayLog:
    """What the session's fault runs met, by test (from their reports); a
    plugin of the session's (its hooks below)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.records: dict[str, dict[str, Any]] = {}
        #: lines about ``--nsq-faults-only`` faults no test met
        self.unmet_only: list[str] = []

    @staticmethod
    def of(config: pytest.Config) -> ReplayLog:
        log = config.stash.get(_LOG, None)
        if log is None:
            log = config.stash[_LOG] = ReplayLog(config)
        return log

    # -- the session's hooks (also on xdist's controller, which gets the reports)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "teardown":
            self.collect(report)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.check_only(self.config)
        if self.unmet_only:
            session.exitstatus = pytest.ExitCode.USAGE_ERROR

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        terminal_summary(terminalreporter, self.config)

    def collect(self, report: pytest.TestReport) -> None:
        for name, value in report.user_properties:
            if name == "nsq_faults":
                self.records[report.nodeid] = json.loads(str(value))

    def check_only(self, config: pytest.Config) -> None:
        """Note each fault ``--nsq-faults-only`` names that no test met."""
        settings = settings_of(config)
        if settings is None or not settings.only or not self.records:
            return
        met = {key for doc in self.records.values() for key in doc.get("met", ())}
        for label, ids in sorted(settings.only.items()):
            for n in sorted(ids):
                key = f"{label}:{n}"
                if key in met:
                    continue
                why = next(
                    (d["not_met"][key] for d in self.records.values() if key in d["not_met"]),
                    None,
                )
                if why is None:
                    scheduled = sorted({k for d in self.records.values() for k in d["scheduled"]})
                    why = f"no test's schedule has it (theirs: {', '.join(scheduled) or 'none'})"
                self.unmet_only.append(f"--nsq-faults-only: {key} was never met: {why}")

    def failures(self) -> list[dict[str, Any]]:
        return [d for d in self.records.values() if d.get("outcome") == "failed"]


def replay(
    config: pytest.Config, args: Sequence[str], nodeid: str, timeout: float = REPLAY_TIMEOUT
) -> dict[str, Any] | None:
    """Run ``pytest ARGS`` as its report prints it, from where this run
    started; the record of ``nodeid`` (None: it did not run to its end)."""
    fd, path = tempfile.mkstemp(prefix="nsq-faults-", suffix=".jsonl")
    os.close(fd)
    command = [
        sys.executable,
        "-m",
        "pytest",
        *args,
        "-q",
        "-p",
        "no:cacheprovider",
        f"--nsq-faults-record={path}",
    ]
    try:
        subprocess.run(
            command,
            cwd=config.invocation_params.dir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout,
            check=False,
        )
        with open(path, encoding="utf-8") as lines:
            docs = [json.loads(line) for line in lines if line.strip()]
    except (subprocess.TimeoutExpired, OSError, ValueError):
        return None
    finally:
        os.unlink(path)
    return next((d for d in docs if d.get("nodeid") == nodeid), None)


def _how(doc: dict[str, Any]) -> str:
    if doc.get("outcome") != "failed":
        return "passed"
    return f"{doc['error']} at {doc['where']}: {doc.get('message', '')}"


def same_failure(first: dict[str, Any], again: dict[str, Any] | None) -> bool:
    """Whether ``again`` failed as ``first`` did: the same exception, raised
    at the same line (its message may differ: a total, a count)."""
    return (
        again is not None
        and again.get("outcome") == "failed"
        and (again.get("error"), again.get("where")) == (first.get("error"), first.get("where"))
    )


def check(config: pytest.Config, first: dict[str, Any]) -> list[str]:
    """Run a failing test again with its seed; lines saying whether it met
    the same faults and failed the same way, or why not."""
    again = replay(config, first["replay"], first["nodeid"])
    if again is None:
        return [f"{first['nodeid']}: the replay did not run to its end (hung or crashed)"]
    met, met_again = first["met"], again["met"]
    lines = []
    same_faults = sorted(met) == sorted(met_again)
    same_way = same_failure(first, again)
    if same_faults and same_way:
        faults = ", ".join(met) or "no fault"
        lines.append(
            f"{first['nodeid']}: reproduced: met the same {len(met)} fault(s) ({faults}) "
            f"and failed the same way ({_how(first)})"
        )
        return lines
    lines.append(f"{first['nodeid']}: did not reproduce:")
    for key in met:
        if key not in met_again:
            why = again["not_met"].get(key, "not in the replay's schedule")
            lines.append(f"  fault {key} was not reached this time: {why}")
    for key in met_again:
        if key not in met:
            lines.append(f"  fault {key} was met this time, not the first")
    if same_faults:
        lines.append(f"  met the same faults ({', '.join(met) or 'none'})")
    if not same_way:
        lines.append(f"  first {_how(first)}; this time {_how(again)}")
    else:
        lines.append(f"  failed the same way ({_how(first)})")
    return lines


def ddmin(items: Sequence[str], fails: Callable[[list[str]], bool]) -> list[str]:
    """Zeller's delta debugging: a smallest-found subset of ``items`` for which
    ``fails`` holds (``fails(list(items))`` is taken as true).  Each subset is
    tried at most once."""
    tried: dict[tuple[str, ...], bool] = {}

    def test(subset: list[str]) -> bool:
        key = tuple(subset)
        if key not in tried:
            tried[key] = fails(subset)
        return tried[key]

    current = list(items)
    n = 2
    while len(current) >= 2:
        size = math.ceil(len(current) / n)
        chunks = [current[i : i + size] for i in range(0, len(current), size)]
        for chunk in chunks:
            if test(chunk):
                current, n = chunk, 2
                break
        else:
            for chunk in chunks:
                rest = [x for x in current if x not in chunk]
                if rest and test(rest):
                    current, n = rest, max(n - 1, 2)
                    break
            else:
                if n >= len(current):
                    break
                n = min(len(current), n * 2)
    return current


def shrink(config: pytest.Config, first: dict[str, Any]) -> list[str]:
    """The smallest set of the faults a failing test met that still fails
    it the same way, as lines ending in the command that replays it."""
    nodeid = first["nodeid"]
    met: list[str] = list(first["met"])
    runs = 0

    def fails(keys: list[str]) -> bool:
        nonlocal runs
        runs += 1
        return same_failure(first, replay(config, _with_only(first["replay"], keys), nodeid))

    if not met:
        return [f"{nodeid}: nothing to shrink: it met no fault placed by the message flow"]
    if fails([]):
        return [f"{nodeid}: it fails the same way with no fault at all: the faults are not why"]
    smallest = ddmin(met, fails) if len(met) > 1 else met
    still = fails(smallest)
    command = " ".join(["python -m pytest", *_with_only(first["replay"], smallest)])
    verdict = "still fails the same way" if still else "did NOT fail again on its check run"
    return [
        f"{nodeid}: shrunk from {len(met)} fault(s) to {len(smallest)} "
        f"({', '.join(smallest)}) in {runs} replays; {verdict} ({_how(first)}):",
        f"  {command}",
    ]


def _with_only(args: Sequence[str], keys: Sequence[str]) -> list[str]:
    only = format_only((k.rpartition(":")[0], int(k.rpartition(":")[2])) for k in keys)
    kept = [a for a in args if not a.startswith("--nsq-faults-only=")]
    return [kept[0], f"--nsq-faults-only={only}", *kept[1:]]


def terminal_summary(reporter: Any, config: pytest.Config) -> None:
    """The session's end: the unmet ``--nsq-faults-only`` faults, then the
    checks and the shrinking asked for."""
    settings = settings_of(config)
    if settings is None:
        return
    log = ReplayLog.of(config)
    for line in log.unmet_only:
        reporter.write_line(line, red=True)
    failures = log.failures()
    if settings.check and failures:
        reporter.section("fakensq faults: replays with the same seed")
        for doc in failures:
            for line in check(config, doc):
                reporter.write_line(line)
    if settings.shrink and failures:
        reporter.section("fakensq faults: shrunk")
        for doc in failures:
            for line in shrink(config, doc):
                reporter.write_line(line)
