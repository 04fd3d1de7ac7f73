"""Every ``trionsq`` tool against its Go counterpart, on the real nsqd v1.3.0.

Same load, same run, same nsqd build: for each tool, a fresh real nsqd is
prefilled, then the Go tool and ours each drain an identical load, in turns
(who goes first alternates by round):

========================  ==================  =======================================
ours                      Go                  load, and when the run is over
========================  ==================  =======================================
``tail`` (to /dev/null)   ``nsq_tail``        100,000 messages; the channel drained
``to-file``               ``nsq_to_file``     100,000 messages; the channel drained
``to-file --gzip``        ``nsq_to_file``     100,000 messages; the channel drained
``pub``                   ``to_nsq``          stdin of 200,000 lines; the topic holds all
``to-nsq``                ``nsq_to_nsq``      100,000 messages; the channel drained and
                                              the destination topic holds all
``to-http``               ``nsq_to_http``     20,000 messages POSTed to a local counting
                                              server (``httpsink.py``); the channel drained
========================  ==================  =======================================

Messages are 100 bytes, each different.  Every consuming tool runs at two
settings: ``--max-in-flight=2500`` (nsqd's default ``--max-rdy-count``) and
``--max-in-flight=10000`` (nsqd started with ``--max-rdy-count=10000``).  nsqd
keeps everything in memory (``--mem-queue-size=1000000``), so that its disk
queue is not part of the measure.

A run is timed from the tool's process start until nsqd's ``/stats`` shows the
channel drained (for ``pub``: the topic holding every message), polled every
10 ms, so the tools' start-up counts.  Then the tool gets SIGTERM, and must
leave within 5 s.  Every run is checked: nsqd's counts exact (nothing
requeued, nothing timed out), the files' lines (``to-file``), the destination
topic's count (``to-nsq``), the sink's request count (``to-http``).  A run that
fails a check is reported and left out of the figures.

The sink's own CPU time during each ``to-http`` run is read from ``/proc`` and
printed per request after the table: it shares the machine with the tool
(``nsq_to_http`` opens a new connection for most requests, Go's transport
keeping two idle ones per host, and each costs the sink an accept and a close).

The ratio is ours over Go's rate, taken within each round (both ran on the
machine as it was then), and the figure reported is the median over rounds.
On a shared machine a single round's wall-clock ratio swings widely with what
else runs; the CPU ratio beside it (messages per CPU second of the tool's
process, every thread counted, ours over Go's) is the steadier measure of what
each tool itself costs.

"Not slower with more in flight" is read off the last column: each of our
tools' rate at the highest setting over its rate at the lowest, within each
round (median, then by round); the lines after the table add the same per CPU
second, and Go's.  The table is printed in the form ``docs/tools.md`` uses.

    python benchmarks/bench_tools.py [--rounds 3] [--only to-file,to-http]
        [--in-flight 2500,10000] [--json results.json]

The real binaries come from ``NSQ_BIN`` or ``shared/reference/nsq-bin`` above
the checkout (see ``tests/reference.py``); without them the script says so and
stops.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import reference  # noqa: E402

TOPIC = "bench"
CHANNEL = "bench"
DESTINATION_TOPIC = "bench_copy"
BODY_SIZE = 100
POLL = 0.01
#: how long a tool gets to leave after SIGTERM
EXIT_LIMIT = 5.0
#: how long a run may take before it is declared stuck
RUN_LIMIT = 120.0
DEFAULT_RDY = 2500


def body(i: int) -> bytes:
    """Message ``i``: 100 bytes, different from every other."""
    head = b"%010d " % i
    return head + b"x" * (BODY_SIZE - len(head))


@dataclass
class Env:
    """What one run works with."""

    nsqd: reference.RealDaemon
    in_flight: int
    workdir: Path
    client: httpx.Client
    destination: reference.RealDaemon | None = None
    sink: str = ""
    sink_pid: int = 0
    stdin_path: Path | None = None

    def channel(self) -> dict[str, Any] | None:
        doc = self.client.get(
            f"http://{self.nsqd.http_address}/stats",
            params={"format": "json", "topic": TOPIC, "channel": CHANNEL},
        ).json()
        for topic in doc.get("topics") or []:
            for channel in topic.get("channels") or []:
                if channel["channel_name"] == CHANNEL:
                    return dict(channel)
        return None

    def topic_count(self, daemon: reference.RealDaemon, topic: str) -> int:
        doc = self.client.get(
            f"http://{daemon.http_address}/stats", params={"format": "json", "topic": topic}
        ).json()
        for t in doc.get("topics") or []:
            if t["topic_name"] == topic:
                return int(t["message_count"])
        return 0

    def sink_count(self) -> int:
        return int(self.client.get(f"{self.sink}/_count").text.split()[0])


@dataclass
class Case:
    """One tool and its Go counterpart on one load."""

    name: str
    go: str
    messages: int
    go_argv: Callable[[Env], list[str]]
    py_argv: Callable[[Env], list[str]]
    consumes: bool = True
    uses_sink: bool = False
    verify: Callable[[Env, str], str | None] = lambda env, impl: None


def _consumer_flags(env: Env) -> list[str]:
    return [
        f"--topic={TOPIC}",
        f"--channel={CHANNEL}",
        f"--nsqd-tcp-address={env.nsqd.tcp_address}",
        f"--max-in-flight={env.in_flight}",
    ]


def _ours(*args: str) -> list[str]:
    return [sys.executable, "-m", "trionsq.cli", *args]


def _go(name: str, *args: str) -> list[str]:
    path = reference.binary(name)
    assert path is not None
    return [str(path), *args]


#: nsq_to_file syncs a batch when the consumer is starved, and what is left at
#: the end on its next ``--sync-interval`` tick (default 30s): both tools get a
#: short interval, or the Go tool's last batch would wait up to 30s.
SYNC_INTERVAL = "--sync-interval=100ms"


def _out_dir(env: Env, impl: str) -> Path:
    path = env.workdir / f"files-{impl}"
    path.mkdir(exist_ok=True)
    return path


def _check_files(env: Env, impl: str, messages: int) -> str | None:
    lines: list[bytes] = []
    for path in sorted(_out_dir(env, impl).iterdir()):
        data = path.read_bytes()
        if path.suffix == ".gz":
            data = gzip.decompress(data)
        lines.extend(data.splitlines())
    if len(lines) != messages or set(lines) != {body(i) for i in range(messages)}:
        return f"files hold {len(lines)} lines ({len(set(lines))} distinct), not {messages}"
    return None


def _check_destination(env: Env, impl: str, messages: int) -> str | None:
    assert env.destination is not None
    count = env.topic_count(env.destination, DESTINATION_TOPIC)
    return None if count == messages else f"destination topic holds {count}, not {messages}"


def _check_sink(env: Env, impl: str, messages: int) -> str | None:
    count = env.sink_count()
    return None if count == messages else f"the sink got {count} requests, not {messages}"


def cases(messages: int, http_messages: int, pub_lines: int) -> list[Case]:
    return [
        Case(
            "tail",
            "nsq_tail",
            messages,
            lambda env: _go("nsq_tail", *_consumer_flags(env)),
            lambda env: _ours("tail", *_consumer_flags(env)),
        ),
        Case(
            "to-file",
            "nsq_to_file",
            messages,
            lambda env: _go(
                "nsq_to_file",
                *_consumer_flags(env),
                f"--output-dir={_out_dir(env, 'go')}",
                SYNC_INTERVAL,
            ),
            lambda env: _ours(
                "to-file",
                *_consumer_flags(env),
                f"--output-dir={_out_dir(env, 'py')}",
                SYNC_INTERVAL,
            ),
            verify=lambda env, impl: _check_files(env, impl, messages),
        ),
        Case(
            "to-file --gzip",
            "nsq_to_file --gzip",
            messages,
            lambda env: _go(
                "nsq_to_file",
                *_consumer_flags(env),
                "--gzip",
                f"--output-dir={_out_dir(env, 'go')}",
                SYNC_INTERVAL,
            ),
            lambda env: _ours(
                "to-file",
                *_consumer_flags(env),
                "--gzip",
                f"--output-dir={_out_dir(env, 'py')}",
                SYNC_INTERVAL,
            ),
            verify=lambda env, impl: _check_files(env, impl, messages),
        ),
        Case(
            "pub",
            "to_nsq",
            pub_lines,
            lambda env: _go(
                "to_nsq", f"--topic={TOPIC}", f"--nsqd-tcp-address={env.nsqd.tcp_address}"
            ),
            lambda env: _ours(
                "pub", f"--topic={TOPIC}", f"--nsqd-tcp-address={env.nsqd.tcp_address}"
            ),
            consumes=False,
        ),
        Case(
            "to-nsq",
            "nsq_to_nsq",
            messages,
            lambda env: _go("nsq_to_nsq", *_consumer_flags(env), *_destination_flags(env)),
            lambda env: _ours("to-nsq", *_consumer_flags(env), *_destination_flags(env)),
            verify=lambda env, impl: _check_destination(env, impl, messages),
        ),
        Case(
            "to-http",
            "nsq_to_http",
            http_messages,
            lambda env: _go("nsq_to_http", *_consumer_flags(env), f"--post={env.sink}/in"),
            lambda env: _ours("to-http", *_consumer_flags(env), f"--post={env.sink}/in"),
            uses_sink=True,
            verify=lambda env, impl: _check_sink(env, impl, http_messages),
        ),
    ]


def _destination_flags(env: Env) -> list[str]:
    assert env.destination is not None
    return [
        f"--destination-nsqd-tcp-address={env.destination.tcp_address}",
        f"--destination-topic={DESTINATION_TOPIC}",
    ]


def _nsqd_flags(in_flight: int) -> list[str]:
    flags = ["--mem-queue-size=1000000", "--log-level=warn"]
    if in_flight > DEFAULT_RDY:
        flags.append(f"--max-rdy-count={in_flight}")
    return flags


def _prefill(env: Env, messages: int) -> None:
    base = f"http://{env.nsqd.http_address}"
    env.client.post(f"{base}/topic/create", params={"topic": TOPIC}).raise_for_status()
    env.client.post(
        f"{base}/channel/create", params={"topic": TOPIC, "channel": CHANNEL}
    ).raise_for_status()
    chunk = 10_000
    for start in range(0, messages, chunk):
        bodies = [body(i) for i in range(start, min(start + chunk, messages))]
        data = len(bodies).to_bytes(4, "big") + b"".join(
            len(b).to_bytes(4, "big") + b for b in bodies
        )
        env.client.post(
            f"{base}/mpub", params={"topic": TOPIC, "binary": "true"}, content=data
        ).raise_for_status()


def _done(case: Case, env: Env) -> bool:
    if not case.consumes:
        return env.topic_count(env.nsqd, TOPIC) >= case.messages
    stats = env.channel()
    if stats is None or stats["depth"] or stats["in_flight_count"] or stats["deferred_count"]:
        return False
    if case.name == "to-nsq":
        assert env.destination is not None
        return env.topic_count(env.destination, DESTINATION_TOPIC) >= case.messages
    return True


@dataclass
class Outcome:
    rate: float = 0.0
    seconds: float = 0.0
    exit_seconds: float = 0.0
    #: CPU seconds (user + system, every thread) the tool's process used
    cpu: float = 0.0
    #: CPU seconds the HTTP sink used meanwhile (``to-http``; 0 where unknown)
    sink_cpu: float = 0.0
    error: str | None = None

    @property
    def cpu_rate(self) -> float:
        """Messages per CPU second of the tool."""
        return self.rate * self.seconds / self.cpu if self.cpu > 0 else 0.0


#: The tools run as a user runs them: byte-code cached (a session that sets
#: PYTHONDONTWRITEBYTECODE would compile every module at every start) and
#: Python's own stdout buffering.
TOOL_ENV = {
    k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED")
}


def _process_cpu(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` used so far; 0 where
    ``/proc`` cannot tell (not Linux)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def _run_one(case: Case, env: Env, impl: str) -> Outcome:
    argv = case.go_argv(env) if impl == "go" else case.py_argv(env)
    stdin: IO[bytes] | None = None
    if env.stdin_path is not None:
        stdin = open(env.stdin_path, "rb")  # closed in the finally below
    err_path = env.workdir / f"{impl}.stderr"
    with open(err_path, "wb") as err:
        # The tool is the only child to end before the next reading (the sink
        # and the daemons end later): the difference is its CPU time.
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        sink_before = _process_cpu(env.sink_pid) if case.uses_sink else 0.0
        started = time.perf_counter()
        process = subprocess.Popen(
            argv,
            stdin=stdin if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            cwd=env.workdir,
            env=TOOL_ENV,
        )
        outcome = Outcome()
        try:
            while not _done(case, env):
                if process.poll() is not None and case.consumes:
                    outcome.error = f"exited early with {process.returncode}"
                    break
                if time.perf_counter() - started > RUN_LIMIT:
                    outcome.error = f"not done after {RUN_LIMIT:.0f}s"
                    break
                time.sleep(POLL)
            outcome.seconds = time.perf_counter() - started
            outcome.rate = case.messages / outcome.seconds
            if case.uses_sink:
                outcome.sink_cpu = _process_cpu(env.sink_pid) - sink_before
            stopping = time.perf_counter()
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(EXIT_LIMIT)
            except subprocess.TimeoutExpired:
                outcome.error = outcome.error or f"still running {EXIT_LIMIT:.0f}s after SIGTERM"
                process.kill()
                process.wait()
            outcome.exit_seconds = time.perf_counter() - stopping
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            outcome.cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            if process.returncode not in (0, -signal.SIGTERM) and outcome.error is None:
                outcome.error = f"exit status {process.returncode}"
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            if stdin is not None:
                stdin.close()
    if outcome.error is None:
        outcome.error = _verify(case, env, impl)
    if outcome.error is not None:
        tail = err_path.read_text(errors="replace")[-600:]
        outcome.error += f" [{' '.join(argv[:3])} ...; stderr: {tail!r}]"
    return outcome


def _verify(case: Case, env: Env, impl: str) -> str | None:
    if case.consumes:
        stats = env.channel()
        if stats is None:
            return "the channel is gone"
        wrong = {
            k: stats[k]
            for k in (
                "depth",
                "in_flight_count",
                "deferred_count",
                "requeue_count",
                "timeout_count",
            )
            if stats[k]
        }
        if stats["message_count"] != case.messages:
            wrong["message_count"] = stats["message_count"]
        if wrong:
            return f"nsqd's channel counts: {wrong}"
    else:
        count = env.topic_count(env.nsqd, TOPIC)
        if count != case.messages:
            return f"the topic holds {count}, not {case.messages}"
    return case.verify(env, impl)


def run_case(
    case: Case, in_flight: int, impl: str, client: httpx.Client, sink: str, sink_pid: int
) -> Outcome:
    """One run: fresh nsqd(s), prefill, the tool, checks."""
    workdir = Path(tempfile.mkdtemp(prefix="bench-tools-"))
    daemons: list[reference.RealDaemon] = []
    try:
        nsqd = reference.RealDaemon("nsqd", _nsqd_flags(in_flight))
        daemons.append(nsqd)
        nsqd.start()
        env = Env(nsqd, in_flight, workdir, client, sink=sink, sink_pid=sink_pid)
        if case.name == "to-nsq":
            env.destination = reference.RealDaemon("nsqd", _nsqd_flags(in_flight))
            daemons.append(env.destination)
            env.destination.start()
        if case.uses_sink:
            client.get(f"{sink}/_reset").raise_for_status()
        if case.consumes:
            _prefill(env, case.messages)
        else:
            env.stdin_path = workdir / "stdin"
            with open(env.stdin_path, "wb") as f:
                f.write(b"\n".join(body(i) for i in range(case.messages)) + b"\n")
        return _run_one(case, env, impl)
    finally:
        for daemon in daemons:
            daemon.close()
        shutil.rmtree(workdir, ignore_errors=True)


@dataclass
class Row:
    case: Case
    in_flight: int | None
    go: list[Outcome] = field(default_factory=list)
    py: list[Outcome] = field(default_factory=list)

    def ratios(self) -> list[float]:
        return [
            p.rate / g.rate
            for g, p in zip(self.go, self.py, strict=True)
            if g.error is None and p.error is None
        ]

    def cpu_ratios(self) -> list[float]:
        return [
            p.cpu_rate / g.cpu_rate
            for g, p in zip(self.go, self.py, strict=True)
            if g.error is None and p.error is None and g.cpu_rate and p.cpu_rate
        ]

    @staticmethod
    def median_rate(outcomes: list[Outcome]) -> float | None:
        rates = [o.rate for o in outcomes if o.error is None]
        return statistics.median(rates) if rates else None

    def as_dict(self) -> dict[str, Any]:
        ratios = self.ratios()
        return {
            "tool": self.case.name,
            "go": self.case.go,
            "in_flight": self.in_flight,
            "py_rate": self.median_rate(self.py),
            "go_rate": self.median_rate(self.go),
            "ratio": statistics.median(ratios) if ratios else None,
            "ratios": ratios,
            "cpu_ratio": statistics.median(cpu) if (cpu := self.cpu_ratios()) else None,
            "cpu_ratios": cpu,
            "py_sink_cpu": [o.sink_cpu for o in self.py],
            "go_sink_cpu": [o.sink_cpu for o in self.go],
            "py_exit_seconds": max((o.exit_seconds for o in self.py), default=0.0),
            "go_exit_seconds": max((o.exit_seconds for o in self.go), default=0.0),
            "errors": [
                f"{impl}: {o.error}"
                for impl, outs in (("go", self.go), ("py", self.py))
                for o in outs
                if o.error
            ],
        }


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _by_round(low: list[Outcome], high: list[Outcome], cpu: bool = False) -> list[float]:
    """Per round: the rate at the higher setting over the rate at the lower one
    (messages per CPU second with ``cpu``); rounds where either run failed are left out."""
    ratios = []
    for a, b in zip(low, high, strict=True):
        if a.error is None and b.error is None:
            x, y = (a.cpu_rate, b.cpu_rate) if cpu else (a.rate, b.rate)
            if x > 0 and y > 0:
                ratios.append(y / x)
    return ratios


@dataclass
class Growth:
    """One tool's rate at the highest in-flight setting over its rate at the lowest."""

    tool: str
    low: int
    high: int
    ours: list[float]
    ours_cpu: list[float]
    go: list[float]

    @staticmethod
    def of(rows: list[Row]) -> list[Growth]:
        by_tool: dict[str, list[Row]] = {}
        for row in rows:
            if row.in_flight is not None:
                by_tool.setdefault(row.case.name, []).append(row)
        growths = []
        for tool, tool_rows in by_tool.items():
            if len(tool_rows) < 2:
                continue
            low = min(tool_rows, key=lambda r: r.in_flight or 0)
            high = max(tool_rows, key=lambda r: r.in_flight or 0)
            assert low.in_flight is not None and high.in_flight is not None
            growths.append(
                Growth(
                    tool,
                    low.in_flight,
                    high.in_flight,
                    _by_round(low.py, high.py),
                    _by_round(low.py, high.py, cpu=True),
                    _by_round(low.go, high.go),
                )
            )
        return growths

    def as_dict(self) -> dict[str, Any]:
        def median(values: list[float]) -> float | None:
            return statistics.median(values) if values else None

        return {
            "tool": self.tool,
            "low": self.low,
            "high": self.high,
            "ratio": median(self.ours),
            "ratios": self.ours,
            "cpu_ratio": median(self.ours_cpu),
            "cpu_ratios": self.ours_cpu,
            "go_ratio": median(self.go),
            "go_ratios": self.go,
        }


def print_table(rows: list[Row]) -> None:
    growth = {g.tool: g.as_dict() for g in Growth.of(rows)}
    highs = {g["high"] for g in growth.values()}
    lows = {g["low"] for g in growth.values()}
    setting = (
        f"at {max(highs):,} / at {min(lows):,}" if len(highs) == 1 == len(lows) else "high / low"
    )
    print()
    print(
        "| tool | in flight | trionsq msg/s | Go msg/s | ratio (median) | ratios by round "
        f"| CPU ratio (median) | trionsq {setting} (median; by round) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        d = row.as_dict()
        in_flight = _fmt(d["in_flight"], ",") if d["in_flight"] else "-"
        g = growth.get(row.case.name)
        more = "-"
        if g is not None and row.in_flight == g["high"]:
            more = f"{_fmt(g['ratio'], '.2f')} ({' '.join(f'{r:.2f}' for r in g['ratios'])})"
        print(
            f"| `{d['tool']}` vs `{d['go']}` | {in_flight} "
            f"| {_fmt(d['py_rate'], ',.0f')} | {_fmt(d['go_rate'], ',.0f')} "
            f"| {_fmt(d['ratio'], '.2f')} | {' '.join(f'{r:.2f}' for r in d['ratios'])} "
            f"| {_fmt(d['cpu_ratio'], '.2f')} | {more} |"
        )
    if growth:
        print()
        print(f"More in flight ({setting}), rate ratios, median and by round:")
        for g in growth.values():
            print(
                f"  {g['tool']:<15} trionsq {_fmt(g['ratio'], '.2f')} "
                f"({' '.join(f'{r:.2f}' for r in g['ratios'])}), "
                f"per CPU second {_fmt(g['cpu_ratio'], '.2f')} "
                f"({' '.join(f'{r:.2f}' for r in g['cpu_ratios'])}); "
                f"Go {_fmt(g['go_ratio'], '.2f')} ({' '.join(f'{r:.2f}' for r in g['go_ratios'])})"
            )
    sinks = [row for row in rows if row.case.uses_sink]
    if any(o.sink_cpu for row in sinks for o in row.py + row.go):
        print()
        print("The HTTP sink's CPU per request while each tool ran (us, median; by round):")
        for row in sinks:
            n = row.case.messages
            for name, outs in ((row.case.name, row.py), (row.case.go, row.go)):
                us = [o.sink_cpu / n * 1e6 for o in outs if o.error is None and o.sink_cpu]
                print(
                    f"  {name:<15} in flight {row.in_flight or '-':>6}: "
                    f"{_fmt(statistics.median(us) if us else None, '.0f')} "
                    f"({' '.join(f'{u:.0f}' for u in us)})"
                )
    print()
    for row in rows:
        for error in row.as_dict()["errors"]:
            print(f"FAILED {row.case.name} @ {row.in_flight}: {error}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--http-messages", type=int, default=20_000)
    parser.add_argument("--pub-lines", type=int, default=200_000)
    parser.add_argument("--only", default="", help="comma-separated tools (e.g. to-file,to-http)")
    parser.add_argument("--in-flight", default="2500,10000", help="comma-separated settings")
    parser.add_argument("--json", default="", help="write the results to this file")
    args = parser.parse_args()

    if reference.nsq_bin() is None:
        print(f"bench_tools: no real NSQ binaries, nothing to compare: {reference.skip_reason()}")
        return 0
    only = {name.strip() for name in args.only.split(",") if name.strip()}
    settings = [int(x) for x in args.in_flight.split(",") if x.strip()]
    rows: list[Row] = []
    for case in cases(args.messages, args.http_messages, args.pub_lines):
        if only and case.name not in only and case.name.split()[0] not in only:
            continue
        for in_flight in settings if case.consumes else [DEFAULT_RDY]:
            rows.append(Row(case, in_flight if case.consumes else None))

    # Byte-code compiled once, as after an install.
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(ROOT / "trionsq")], env=TOOL_ENV, check=True
    )
    sink_process = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("httpsink.py"))],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert sink_process.stdout is not None
        sink = f"http://127.0.0.1:{sink_process.stdout.readline().strip()}"
        with httpx.Client(timeout=10.0) as client:
            for round_ in range(args.rounds):
                for row in rows:
                    order = ["go", "py"] if round_ % 2 == 0 else ["py", "go"]
                    for impl in order:
                        outcome = run_case(
                            row.case,
                            row.in_flight or DEFAULT_RDY,
                            impl,
                            client,
                            sink,
                            sink_process.pid,
                        )
                        (row.go if impl == "go" else row.py).append(outcome)
                        state = "ok" if outcome.error is None else f"FAILED: {outcome.error}"
                        if outcome.sink_cpu:
                            state = f"sink cpu {outcome.sink_cpu:.2f}s, {state}"
                        print(
                            f"round {round_ + 1}: {row.case.name:<15} in flight "
                            f"{row.in_flight or '-':>6} {impl}: {outcome.rate:>10,.0f} msg/s "
                            f"({outcome.seconds:.2f}s, cpu {outcome.cpu:.2f}s, "
                            f"exit {outcome.exit_seconds:.2f}s) {state}",
                            flush=True,
                        )
    finally:
        sink_process.kill()
        sink_process.wait()
    print_table(rows)
    if args.json:
        results = {
            "rows": [row.as_dict() for row in rows],
            "more_in_flight": [g.as_dict() for g in Growth.of(rows)],
        }
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 1 if any(row.as_dict()["errors"] for row in rows) else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
