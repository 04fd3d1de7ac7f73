"""NSQ to Parquet with Spark, against Go's ``nsq_to_file``, on real nsqds, in one run.

The load: ``--nsqds`` real nsqd v1.3.0 at their default settings, each prefilled
with ``--messages`` 100-byte messages (each different) on topic ``bench``,
channel ``archive``.  Every contender drains the same nsqds, refilled before
each turn:

- **Go ``nsq_to_file``** ``--max-in-flight=2500``: timed from its start until its
  output files hold every message (``nsq_to_file`` FINs after an fsync, and the
  last partial batch waits for its 30 s sync interval: the time the data is in
  its files is the fair figure); the files are read as they grow, each byte once
  (until 2026-11-28 every file was read whole every 10 ms: a core's worth of
  reads by the end, beside ``nsq_to_file``, which slowed the baseline);
- **Spark ``format("nsq")``** to Parquet, ``Trigger.AvailableNow``, with nothing
  but topic, channel and addresses set, on ``--master`` (default
  ``local-cluster[2,1,1024]``: two executor processes of one core each): timed
  from ``start()`` until the query has committed every batch, with the time to
  the first committed batch (the query's source process, the executors' agents
  starting and connecting) and the steady rate after it reported apart.  The
  Spark session, its executors and their Python workers are up before the clock
  starts: a warm-up streaming query (from memory to Parquet) runs first, so that
  Spark's own one-time costs (JIT, code generation, imports) are not counted;
- **Spark's floor**: the same query over a Python streaming source that makes
  the same rows from memory on the executors (no NSQ), in batches as big as the
  nsq query's were: what Spark itself costs, for reference.

Every run is checked: the Parquet output holds every message exactly once, each
nsqd's channel is drained with nothing in flight, and every subscribing
connection nsqd saw came from an executor's agent (``user_agent`` names its
executor and pid, and no pid is the driver's).  The per-executor rates come from
nsqd's ``/stats`` (FINs per client), sampled during the run.

``--phases`` records when each step of the query's start happened, in every
process it crosses (the driver's source process, the tasks, the agents: see
``trionsq/spark/_phases.py``), and prints the first batch's timeline.

``--cpu`` prints the CPU seconds each kind of process of this script's tree
used during each contender's run (nsqd, ``nsq_to_file``, the agents, the
executors' and the driver's JVMs, the tasks' Python workers, the source's
process; read from ``/proc``, sampled every 0.1 s, which costs this script a
little CPU itself): where the machine's cores went.

The query is waited for in the JVM (``awaitTermination``), and the first
batch's commit taken from Spark's progress report (its trigger's start plus its
duration): until 2026-11-28 this script asked for ``recentProgress`` every 20
ms, which cost the driver's JVM and this process over a CPU second per run, on
the two cores Spark was measured on.

``--scaling`` adds the same Spark query on ``local-cluster[1,1,1024]`` and
``local-cluster[3,1,1024]`` (one and three executors of one core each).

    python benchmarks/bench_spark.py [--messages 200000] [--nsqds 3] [--rounds 1]
        [--master 'local-cluster[2,1,1024]'] [--scaling] [--json results.json]
        [--option connections_per_nsqd=8 ...]   # experiments; the defaults otherwise
        [--phases]                              # the first batch's timeline
        [--cpu]                                 # CPU seconds per kind of process
        [--warmup 20000]                        # rows of the warm-up query

The real binaries come from ``NSQ_BIN`` or ``shared/reference/nsq-bin`` above the
checkout (see ``tests/reference.py``); without them the script says so and stops.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import reference  # noqa: E402

TOPIC = "bench"
CHANNEL = "archive"
BODY_SIZE = 100
GO_IN_FLIGHT = 2500
RUN_LIMIT = 900.0
_USER_AGENT = re.compile(r"spark-agent executor=(\S+) pid=(\d+)")
#: --phases: the file every process of the query appends its steps to
PHASES: Path | None = None
#: --cpu: CPU seconds per group of processes during each contender's run
CPU = False


@dataclass
class Result:
    name: str
    messages: int
    seconds: float
    #: Spark only: time to the first committed batch, and the rate after it
    first_batch_seconds: float | None = None
    steady_rate: float | None = None
    batches: int = 0
    #: executor id -> messages FINed
    per_executor: dict[str, int] = field(default_factory=dict)
    cores: str = ""
    #: Spark's phases, median ms over the batches after the first
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.messages / self.seconds


def body(nsqd: int, index: int) -> bytes:
    return (b"%02d:%08d:" % (nsqd, index)).ljust(BODY_SIZE, b"x")


def prefill(daemons: list[reference.RealDaemon], count: int) -> None:
    with httpx.Client(timeout=60) as client:
        for n, daemon in enumerate(daemons):
            url = f"http://{daemon.http_address}"
            client.post(f"{url}/channel/create", params={"topic": TOPIC, "channel": CHANNEL})
            for start in range(0, count, 10_000):
                stop = min(count, start + 10_000)
                data = b"\n".join(body(n, i) for i in range(start, stop))
                response = client.post(f"{url}/mpub", params={"topic": TOPIC}, content=data)
                response.raise_for_status()


def channel_stats(daemon: reference.RealDaemon) -> dict[str, Any]:
    stats = httpx.get(f"http://{daemon.http_address}/stats?format=json", timeout=10).json()
    for topic in stats["topics"]:
        if topic["topic_name"] == TOPIC:
            for channel in topic["channels"]:
                if channel["channel_name"] == CHANNEL:
                    return dict(channel)
    return {}


def check_drained(daemons: list[reference.RealDaemon], what: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        left = [
            (channel_stats(d).get("depth"), channel_stats(d).get("in_flight_count"))
            for d in daemons
        ]
        if all(pair == (0, 0) for pair in left):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: nsqd not drained: (depth, in flight) = {left}")
        time.sleep(0.1)


# --- Go ----------------------------------------------------------------------------


def run_go(daemons: list[reference.RealDaemon], total: int) -> Result:
    out = Path(tempfile.mkdtemp(prefix="bench-go-"))
    binary = reference.binary("nsq_to_file")
    assert binary is not None
    argv = [
        str(binary),
        f"--topic={TOPIC}",
        f"--channel={CHANNEL}",
        f"--max-in-flight={GO_IN_FLIGHT}",
        f"--output-dir={out}",
        "--log-level=warn",
        *[f"--nsqd-tcp-address={d.tcp_address}" for d in daemons],
    ]

    # Each file's lines counted once: re-reading every file every 10 ms (as this did
    # before) kept a core busy with 60 MB of reads by the end, beside nsq_to_file
    # on a 2-core machine, and so slowed the baseline.
    seen: dict[Path, tuple[int, int]] = {}  # path -> (bytes read, lines in them)

    def lines() -> int:
        for path in out.iterdir():
            offset, count = seen.get(path, (0, 0))
            with path.open("rb") as f:
                if f.seek(0, os.SEEK_END) < offset:  # rewritten: count again
                    offset, count = 0, 0
                f.seek(offset)
                for chunk in iter(lambda f=f: f.read(1 << 20), b""):
                    offset += len(chunk)
                    count += chunk.count(b"\n")
            seen[path] = (offset, count)
        return sum(count for path, (_, count) in seen.items() if path.exists())

    cpu = CpuSampler() if CPU else None
    started = time.perf_counter()
    if cpu is not None:
        cpu.__enter__()
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while lines() < total:
            if time.perf_counter() - started > RUN_LIMIT:
                raise TimeoutError("nsq_to_file did not finish")
            time.sleep(0.01)
        elapsed = time.perf_counter() - started
        if cpu is not None:
            cpu.__exit__()
            print_cpu("Go nsq_to_file", elapsed, cpu.totals())
        written = lines()
        assert written == total, f"nsq_to_file wrote {written} lines, expected {total}"
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
        shutil.rmtree(out, ignore_errors=True)
    # Its last partial batch is FINed at the next sync; requeued at its exit.  Drain
    # what is left so that the next contender starts from empty channels.
    _drain_leftovers(daemons)
    return Result("Go nsq_to_file", total, elapsed, cores="any")


def _drain_leftovers(daemons: list[reference.RealDaemon]) -> None:
    for daemon in daemons:
        httpx.post(
            f"http://{daemon.http_address}/channel/empty",
            params={"topic": TOPIC, "channel": CHANNEL},
            timeout=10,
        )


# --- Spark -------------------------------------------------------------------------


def _memory_source() -> Any:
    """A Python streaming source making ``rows`` rows like the nsq source's, on the
    executors, ``per_batch`` at a time (Spark's floor)."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
    from pyspark.sql.streaming.datasource import ReadAllAvailable, SupportsTriggerAvailableNow

    from trionsq.spark import SCHEMA

    class Slice(InputPartition):  # type: ignore[misc]
        def __init__(self, first: int, last: int) -> None:
            super().__init__(first)
            self.first, self.last = first, last

    class Reader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
        def __init__(self, rows: int, per_batch: int, partitions: int) -> None:
            self.rows, self.per_batch, self.parts = rows, per_batch, partitions

        def initialOffset(self) -> dict[str, int]:
            return {"n": 0}

        def getDefaultReadLimit(self) -> Any:
            return ReadAllAvailable()

        def prepareForTriggerAvailableNow(self) -> None:
            pass

        def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:
            return {"n": min(self.rows, start["n"] + self.per_batch)}

        def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[Any]:
            a, b = start["n"], end["n"]
            cuts = [a + (b - a) * i // self.parts for i in range(self.parts + 1)]
            return [Slice(x, y) for x, y in itertools.pairwise(cuts) if y > x]

        def read(self, partition: Any) -> Any:
            import pyarrow as pa

            from trionsq.spark.source import arrow_schema

            n = partition.last - partition.first
            now = time.time_ns() // 1000
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array([body(0, i) for i in range(partition.first, partition.last)]),
                    pa.array([f"{i:016x}" for i in range(partition.first, partition.last)]),
                    pa.array([now] * n, pa.timestamp("us", tz="UTC")),
                    pa.array([1] * n, pa.int32()),
                    pa.array(["127.0.0.1:4150"] * n),
                    pa.array([TOPIC] * n),
                ],
                schema=arrow_schema(),
            )

    class Memory(DataSource):  # type: ignore[misc]
        @classmethod
        def name(cls) -> str:
            return "bench_memory"

        def schema(self) -> Any:
            return SCHEMA

        def streamReader(self, schema: Any) -> Any:
            o = self.options
            return Reader(int(o["rows"]), int(o["per_batch"]), int(o["partitions"]))

    return Memory


def run_floor(spark: Any, master: str, total: int, per_batch: int) -> Result:
    tmp = Path(tempfile.mkdtemp(prefix="bench-floor-"))
    try:
        partitions = 2 * _executor_count(master)
        started = time.perf_counter()
        query = (
            spark.readStream.format("bench_memory")
            .option("rows", total)
            .option("per_batch", per_batch)
            .option("partitions", partitions)
            .load()
            .writeStream.format("parquet")
            .option("checkpointLocation", str(tmp / "checkpoint"))
            .trigger(availableNow=True)
            .start(str(tmp / "out"))
        )
        query.awaitTermination()
        elapsed = time.perf_counter() - started
        progress = [p for p in query.recentProgress if p["numInputRows"]]
        first = progress[0]["durationMs"]["triggerExecution"] / 1000
        rest = sum(p["numInputRows"] for p in progress[1:])
        return Result(
            f"Spark's floor: same rows from memory, {master}",
            total,
            elapsed,
            first_batch_seconds=first,
            steady_rate=rest / (elapsed - first) if rest and elapsed > first else None,
            batches=len(progress),
            cores=master,
            phases=_phases(progress),
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class ClientSampler:
    """Samples nsqd's client list: FINs per executor, and who subscribed."""

    def __init__(self, daemons: list[reference.RealDaemon]) -> None:
        self.daemons = daemons
        self.finished: dict[tuple[str, str], int] = {}
        self.user_agents: set[str] = set()
        self._agents: dict[tuple[str, str], str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ClientSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.sample()

    def sample(self) -> None:
        for daemon in self.daemons:
            try:
                channel = channel_stats(daemon)
            except httpx.HTTPError:
                continue
            for client in channel.get("clients", []):
                key = (daemon.tcp_address, client["remote_address"])
                self.user_agents.add(client["user_agent"])
                self.finished[key] = max(self.finished.get(key, 0), client["finish_count"])
                self._agents[key] = client["user_agent"]

    def per_executor(self) -> dict[str, int]:
        totals: dict[str, int] = defaultdict(int)
        for key, count in self.finished.items():
            agent = self._agents.get(key)
            if agent is None:
                continue
            match = _USER_AGENT.search(agent)
            totals[match.group(1) if match else agent] += count
        return dict(totals)

    def pids(self) -> set[int]:
        return {int(m.group(2)) for ua in self.user_agents if (m := _USER_AGENT.search(ua))}


class CpuSampler:
    """--cpu: every process's CPU time (Linux's /proc) at the start and the end of a
    contender's run, summed by kind of process (nsqd, the agents, the executors'
    JVMs...): where the machine's cores went."""

    _GROUPS = (
        ("trionsq.spark.agent", "agents"),
        ("nsq_to_file", "nsq_to_file"),
        ("CoarseGrainedExecutorBackend", "executor JVMs"),
        ("SparkSubmit", "driver JVM"),
        ("pyspark.daemon", "Python workers (tasks)"),
        ("pyspark/daemon", "Python workers (tasks)"),
        ("python_streaming_source_runner", "source process (coordinator)"),
        ("bench_spark", "this script"),
        ("nsqd", "nsqd"),
        ("java", "other JVMs"),
        ("python", "other Python"),
    )

    def __init__(self) -> None:
        self._tick = os.sysconf("SC_CLK_TCK")
        self._first: dict[int, tuple[str, float]] = {}
        self._before: set[int] = set()
        self._last: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CpuSampler:
        self._sample()
        self._before = set(self._first)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _run(self) -> None:
        # Processes that start and end within the run (the agents, Python workers)
        # are seen by the samples in between.
        while not self._stop.wait(0.1):
            self._sample()

    def _group(self, command: str) -> str:
        for needle, name in self._GROUPS:
            if needle in command:
                return name
        return "other"

    def _sample(self) -> None:
        # Only this script's process tree: other jobs on a shared machine (their own
        # nsqds, JVMs, Pythons) are not this benchmark's cost.
        seen: dict[int, tuple[int, str, float]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                command = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            cpu = (int(fields[11]) + int(fields[12])) / self._tick
            group = self._group(command.decode(errors="replace"))
            seen[int(entry)] = (int(fields[1]), group, cpu)
        ours = {os.getpid()}
        grew = True
        while grew:
            grew = False
            for pid, (parent, _, _) in seen.items():
                if parent in ours and pid not in ours:
                    ours.add(pid)
                    grew = True
        for pid in ours:
            _, group, cpu = seen[pid]
            self._first.setdefault(pid, (group, cpu))
            self._last[pid] = (group, cpu)

    def totals(self) -> dict[str, float]:
        totals: dict[str, float] = defaultdict(float)
        for pid, (group, cpu) in self._last.items():
            # A process born during the run: all of its time counts.
            totals[group] += cpu - (self._first[pid][1] if pid in self._before else 0.0)
        return dict(sorted(totals.items(), key=lambda item: -item[1]))


def print_cpu(name: str, seconds: float, totals: dict[str, float]) -> None:
    parts = ", ".join(f"{group} {cpu:.2f}" for group, cpu in totals.items() if cpu >= 0.05)
    print(
        f"  CPU seconds during {name} ({seconds:.2f} s, {sum(totals.values()):.2f} CPU s): {parts}"
    )


def spark_session(master: str, warmup: int = 20_000) -> Any:
    from pyspark.sql import SparkSession

    from trionsq.spark import NSQDataSource

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (
        SparkSession.builder.master(master)
        .appName("bench-spark")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.executorEnv.PYTHONPATH", os.environ.get("PYTHONPATH", str(ROOT)))
        .config("spark.executorEnv.TRIONSQ_SPARK_PHASES", str(PHASES or ""))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(NSQDataSource)
    spark.dataSource.register(_memory_source())
    # Executors up, Python workers forked and warm, Spark's code generated, before
    # any clock starts.
    executors = _executor_count(master)
    spark.sparkContext.parallelize(range(executors * 4), executors * 4).map(lambda x: x).count()
    run_floor(spark, master, warmup, min(warmup, 100_000))
    return spark


def _executor_count(master: str) -> int:
    match = re.match(r"local-cluster\[(\d+),", master)
    return int(match.group(1)) if match else 1


def _phases(progress: list[dict[str, Any]]) -> dict[str, float]:
    """Median milliseconds of each of Spark's phases, over the batches after the first."""
    later = progress[1:] or progress
    names = {name for p in later for name in p["durationMs"]}
    return {
        name: statistics.median(p["durationMs"].get(name, 0) for p in later)
        for name in sorted(names)
    }


def _driver_pids(spark: Any) -> set[int]:
    jvm = spark.sparkContext._jvm
    return {os.getpid(), int(jvm.java.lang.ProcessHandle.current().pid())}


def run_spark(
    spark: Any,
    master: str,
    daemons: list[reference.RealDaemon],
    total: int,
    options: dict[str, str],
) -> Result:
    tmp = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    try:
        if PHASES is not None:
            PHASES.write_text("")
        cpu = CpuSampler() if CPU else None
        with ClientSampler(daemons) as sampler:
            if cpu is not None:
                cpu.__enter__()
            started = time.perf_counter()
            started_wall = time.time()
            query = (
                spark.readStream.format("nsq")
                .option("topic", TOPIC)
                .option("channel", CHANNEL)
                .option("nsqd_tcp_addresses", ",".join(d.tcp_address for d in daemons))
                .options(**options)
                .load()
                .writeStream.format("parquet")
                .option("checkpointLocation", str(tmp / "checkpoint"))
                .trigger(availableNow=True)
                .start(str(tmp / "out"))
            )
            # Waited for in the JVM, not polled: asking for recentProgress every
            # 20 ms (as this did until 2026-11-28) cost the driver's JVM and this
            # process over a CPU second per run, on the cores Spark was measured on.
            if not query.awaitTermination(RUN_LIMIT):
                query.stop()
                raise TimeoutError("the Spark query did not finish")
            elapsed = time.perf_counter() - started
            if cpu is not None:
                cpu.__exit__()
                print_cpu("the Spark query", elapsed, cpu.totals())
        first_commit_wall = _first_commit(query.recentProgress)
        progress = [p for p in query.recentProgress if p["numInputRows"]]
        if PHASES is not None and first_commit_wall is not None:
            # Each query's timeline kept beside the file, for a closer look.
            shutil.copy(PHASES, PHASES.with_name(f"phases-{started_wall:.0f}.jsonl"))
            print(f"  (timeline kept in {PHASES.with_name(f'phases-{started_wall:.0f}.jsonl')})")
            print_phases(PHASES, started_wall, first_commit_wall, query.recentProgress)
            print(f"  {elapsed:+8.3f}  the query ended (awaitTermination returned)")
        read = sum(p["numInputRows"] for p in progress)
        assert read == total, f"the query read {read} rows, expected {total}"
        rows = spark.read.parquet(str(tmp / "out"))
        written = rows.count()
        distinct = rows.select("body").distinct().count()
        assert written == distinct == total, (
            f"{written} rows, {distinct} distinct, expected {total}"
        )
        check_drained(daemons, "spark")
        driver = _driver_pids(spark)
        executors = sampler.pids()
        assert executors and not executors & driver, (
            f"subscribers' pids {executors} include the driver's {driver}"
        )
        assert all("spark-agent" in ua for ua in sampler.user_agents), sampler.user_agents
        first_seconds = (first_commit_wall or started_wall) - started_wall
        rest = sum(p["numInputRows"] for p in progress[1:])
        steady = rest / (elapsed - first_seconds) if rest and elapsed > first_seconds else None
        return Result(
            f"Spark format('nsq'), {master}",
            total,
            elapsed,
            first_batch_seconds=first_seconds,
            steady_rate=steady,
            batches=len(progress),
            per_executor=sampler.per_executor(),
            cores=master,
            phases=_phases(progress),
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _first_commit(progress: list[dict[str, Any]]) -> float | None:
    """When the first batch with rows was committed (wall clock): its trigger's
    start plus its duration (Spark reports a batch's progress once committed)."""
    for p in progress:
        if p["numInputRows"]:
            began = datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00"))
            return began.timestamp() + p["durationMs"]["triggerExecution"] / 1000
    return None


def print_phases(
    path: Path, started: float, first_commit: float, progress: list[dict[str, Any]]
) -> None:
    """The first batch's timeline: each step's first time in each process, in
    seconds from ``start()``, then Spark's own phases of the first batches."""
    entries = [json.loads(line) for line in path.read_text().splitlines() if line]
    print(f"\n  phases (s from start(); first commit seen at +{first_commit - started:.3f}):")
    seen: set[tuple[str, int, str]] = set()
    for entry in sorted(entries, key=lambda e: e["t"]):
        if entry["t"] > first_commit + 0.5:
            break
        details = {
            k: v for k, v in entry.items() if k not in ("t", "pid", "step", "process_started")
        }
        key = (entry["step"], entry["pid"], json.dumps(details, sort_keys=True))
        if key in seen:
            continue
        seen.add(key)
        if entry.get("process_started"):
            print(
                f"  {entry['process_started'] - started:+8.3f}  pid {entry['pid']:>7}  "
                "(process started)"
            )
        text = " ".join(f"{k}={v}" for k, v in details.items())
        print(f"  {entry['t'] - started:+8.3f}  pid {entry['pid']:>7}  {entry['step']} {text}")
    for p in progress[:3]:
        print(f"  Spark batch {p['batchId']}: {p['numInputRows']} rows, ms {p['durationMs']}")
    print("  ... the end:")
    for entry in [e for e in entries if e["t"] > first_commit + 0.5][-8:]:
        text = " ".join(f"{k}={v}" for k, v in entry.items() if k not in ("t", "pid", "step"))
        print(f"  {entry['t'] - started:+8.3f}  pid {entry['pid']:>7}  {entry['step']} {text}")
    for p in progress[-3:]:
        print(f"  Spark batch {p['batchId']}: {p['numInputRows']} rows, ms {p['durationMs']}")


# --- main --------------------------------------------------------------------------


def report(rounds: list[dict[str, Result]], baseline: str) -> None:
    names = list(rounds[0])
    header = f"{'contender':<52} {'msg/s':>9} {'ratio':>6} {'first batch':>12}"
    print(f"\n{header} {'steady msg/s':>13} {'s. ratio':>9}")
    for name in names:
        rates = [r[name].rate / r[baseline].rate for r in rounds]
        steady = [r[name].steady_rate / r[baseline].rate for r in rounds if r[name].steady_rate]
        result = rounds[-1][name]
        first = f"{result.first_batch_seconds:.1f} s" if result.first_batch_seconds else ""
        steady_rate = f"{result.steady_rate:,.0f}" if result.steady_rate else ""
        print(
            f"{name:<52} {statistics.median(r[name].rate for r in rounds):>9,.0f} "
            f"{statistics.median(rates):>6.2f} {first:>12} {steady_rate:>13} "
            f"{statistics.median(steady) if steady else float('nan'):>9.2f}"
        )
        if result.per_executor:
            seconds = result.seconds - (result.first_batch_seconds or 0)
            parts = ", ".join(
                f"executor {e}: {n:,} ({n / result.seconds:,.0f}/s overall)"
                for e, n in sorted(result.per_executor.items())
            )
            print(f"{'':<4}{parts}; {result.batches} batches; steady part {seconds:.1f} s")
        if result.phases:
            phases = ", ".join(f"{k} {v:,.0f}" for k, v in result.phases.items() if v)
            print(f"{'':<4}median ms per batch after the first: {phases}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000, help="per nsqd")
    parser.add_argument("--nsqds", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--master", default="local-cluster[2,1,1024]")
    parser.add_argument("--scaling", action="store_true")
    parser.add_argument("--json")
    parser.add_argument("--option", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=VALUE[,NAME=VALUE]",
        help="also run the query with these source options, in the same round",
    )
    parser.add_argument("--no-floor", action="store_true", help="skip Spark's floor")
    parser.add_argument(
        "--warmup", type=int, default=20_000, help="rows of the warm-up query (from memory)"
    )
    parser.add_argument(
        "--cpu", action="store_true", help="CPU seconds per kind of process in each run"
    )
    parser.add_argument(
        "--phases", action="store_true", help="print the first batch's timeline (each step)"
    )
    args = parser.parse_args()
    if args.cpu:
        global CPU
        CPU = True
    if args.phases:
        global PHASES
        PHASES = Path(tempfile.mkdtemp(prefix="bench-phases-")) / "phases.jsonl"
        PHASES.touch()
        os.environ["TRIONSQ_SPARK_PHASES"] = str(PHASES)
    options = dict(option.split("=", 1) for option in args.option)
    if reference.binary("nsqd") is None or reference.binary("nsq_to_file") is None:
        sys.exit(f"no real NSQ binaries: {reference.skip_reason()}")
    total = args.messages * args.nsqds
    masters = [args.master]
    if args.scaling:
        masters += [
            m for m in ("local-cluster[1,1,1024]", "local-cluster[3,1,1024]") if m not in masters
        ]
    daemons = [reference.RealDaemon("nsqd", ["--log-level=warn"]) for _ in range(args.nsqds)]
    rounds: list[dict[str, Result]] = []
    try:
        for daemon in daemons:
            daemon.start()
        sessions: dict[str, Any] = {}
        for number in range(args.rounds):
            results: dict[str, Result] = {}
            prefill(daemons, args.messages)
            results["go"] = run_go(daemons, total)
            print(f"round {number + 1}: Go nsq_to_file {results['go'].rate:,.0f} msg/s", flush=True)
            for master in masters:
                spark = sessions.get(master)
                if spark is None:
                    for other in list(sessions.values()):
                        other.stop()
                    sessions.clear()
                    spark = sessions[master] = spark_session(master, args.warmup)
                prefill(daemons, args.messages)
                result = run_spark(spark, master, daemons, total, options)
                results[master] = result
                print(
                    f"round {number + 1}: {result.name} {result.rate:,.0f} msg/s "
                    f"(first batch {result.first_batch_seconds:.1f} s, steady "
                    f"{result.steady_rate or 0:,.0f} msg/s)",
                    flush=True,
                )
                if master == args.master:
                    for index, variant in enumerate(args.variant):
                        extra = dict(item.split("=", 1) for item in variant.split(","))
                        prefill(daemons, args.messages)
                        other = run_spark(spark, master, daemons, total, {**options, **extra})
                        other.name += f" with {variant}"
                        if args.variant.count(variant) > 1:  # a variant run twice: both kept
                            other.name += f" (#{index + 1})"
                        results[f"{master} {variant} {index}"] = other
                        print(
                            f"round {number + 1}: {other.name} {other.rate:,.0f} msg/s", flush=True
                        )
                if not args.no_floor and master == args.master:
                    per_batch = max(1, total // max(1, result.batches))
                    floor = run_floor(spark, master, total, per_batch)
                    results["floor"] = floor
                    print(f"round {number + 1}: {floor.name} {floor.rate:,.0f} rows/s", flush=True)
            rounds.append({r.name: r for r in results.values()})
        for spark in sessions.values():
            spark.stop()
    finally:
        for daemon in daemons:
            daemon.close()
    print(
        f"\n{args.nsqds} real nsqd v1.3.0 (defaults) x {args.messages:,} messages of "
        f"{BODY_SIZE} bytes; {os.cpu_count()} cores on this machine; {args.rounds} round(s)"
        + (f"; source options {options}" if options else "")
    )
    report(rounds, "Go nsq_to_file")
    if args.json:
        Path(args.json).write_text(
            json.dumps([{k: asdict(v) for k, v in r.items()} for r in rounds], indent=2)
        )


if __name__ == "__main__":
    main()
