"""One local SparkSession for every Spark test, and helpers to move messages
through fakensq from synchronous test code."""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio

import trionsq

from ..support import stats as support_stats
from ..support.waiting import wait_until_blocking

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Spark, the coordinator and the agents listen on loopback only (set before any JVM
# starts: executors inherit it).
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

# Skipped (not failed) only where Spark cannot run at all.
if importlib.util.find_spec("pyspark") is None:
    SKIP_REASON: str | None = "pyspark is not installed (pip install 'trionsq[spark]')"
elif shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    SKIP_REASON = "Spark needs Java (no java on PATH, no JAVA_HOME)"
else:
    SKIP_REASON = None
if SKIP_REASON is not None:
    collect_ignore_glob = ["test_*.py"]


def pytest_report_header() -> str | None:
    return f"tests/spark skipped: {SKIP_REASON}" if SKIP_REASON else None


# tryfirst: pytest-xdist's own hook (on each worker) reads the xdist_group marks
# to give grouped tests one worker; run after it, the marks came too late and
# every worker started its own copy.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # One pytest-xdist worker runs every Spark test: one SparkSession (a driver
    # and two executor JVMs) for them all, not one per worker.
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.xdist_group("spark"))


#: Two executor processes of one core each: tasks, agents and NSQ connections live
#: outside the driver, as on a real cluster (and one of them can be killed).
MASTER = "local-cluster[2,1,1024]"


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    from pyspark.sql import SparkSession

    from trionsq.spark import NSQDataSource

    session = (
        SparkSession.builder.master(MASTER)
        .appName("trionsq-tests")
        .config("spark.executorEnv.PYTHONPATH", os.environ.get("PYTHONPATH", ""))
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(NSQDataSource)
    try:
        yield session
    finally:
        session.stop()


def publish(address: str, topic: str, bodies: list[bytes]) -> None:
    """MPUB ``bodies`` (in chunks) with a trionsq Producer."""

    async def main() -> None:
        async with trionsq.Producer(nsqd_tcp_addresses=[address]) as producer:
            for i in range(0, len(bodies), 500):
                await producer.multi_publish(topic, bodies[i : i + 500])

    trio.run(main)


def consume(
    address: str, topic: str, channel: str, count: int, timeout: float = 20.0
) -> list[bytes]:
    """Receive and FIN ``count`` messages (fails after ``timeout`` seconds)."""
    received: list[bytes] = []

    async def main() -> None:
        # A message the source read and requeued several times (at least once
        # allows it; a loaded machine makes it likely) must still be counted
        # here: never give up on one.
        async with trionsq.Consumer(
            topic, channel, nsqd_tcp_addresses=[address], max_in_flight=500, max_attempts=0
        ) as consumer:
            with trio.fail_after(timeout):
                async for message in consumer:
                    received.append(message.body)
                    await message.finish()
                    if len(received) >= count:
                        break

    trio.run(main)
    return received


def example(name: str) -> Any:
    """Import ``examples/<name>.py`` (the examples are scripts, not a package)."""
    import sys
    from pathlib import Path

    if name in sys.modules:
        return sys.modules[name]
    path = Path(__file__).resolve().parents[2] / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# --- real nsqd and Spark's processes ---------------------------------------------------


@pytest.fixture
def real_nsqds() -> Iterator[Callable[..., Any]]:
    """``real_nsqds(count, *flags)``: started real nsqd v1.3.0 (skips without them)."""
    from tests import reference

    reference.require("nsqd")
    made: list[Any] = []

    def make(count: int = 1, *flags: str) -> list[Any]:
        daemons = [reference.RealDaemon("nsqd", ["--log-level=warn", *flags]) for _ in range(count)]
        made.extend(daemons)
        for daemon in daemons:
            daemon.start()
        return daemons

    yield make
    for daemon in made:
        daemon.close()


def http_publish(daemon: Any, topic: str, bodies: list[bytes]) -> None:
    """MPUB over HTTP in chunks (newline-separated, so bodies hold no newline)."""
    import httpx

    with httpx.Client(timeout=30) as client:
        for start in range(0, len(bodies), 5000):
            response = client.post(
                f"http://{daemon.http_address}/mpub",
                params={"topic": topic},
                content=b"\n".join(bodies[start : start + 5000]),
            )
            response.raise_for_status()


def channel_stats(nsqd: Any, topic: str = "events", channel: str = "spark") -> dict[str, Any]:
    """The channel's entry in ``nsqd``'s /stats ({} if absent)."""
    return support_stats.channel_stats(nsqd.http_address, topic, channel) or {}


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux /proc)."""
    from pathlib import Path

    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def cmdline(pid: int) -> str:
    from pathlib import Path

    try:
        return (Path(f"/proc/{pid}/cmdline").read_bytes()).replace(b"\0", b" ").decode()
    except OSError:
        return ""


def descendants(pid: int) -> set[int]:
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children(todo.pop()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def driver_pid(spark: SparkSession) -> int:
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    return int(jvm.java.lang.ProcessHandle.current().pid())


def executor_pids(spark: SparkSession) -> dict[str, int]:
    """Executor id -> pid of the executor JVMs of a local-cluster (children of the driver)."""
    found = {}
    for pid in children(driver_pid(spark)):
        line = cmdline(pid)
        if "CoarseGrainedExecutorBackend" in line:
            found[line.split("--executor-id ")[1].split()[0]] = pid
    return found


def wait_for_executors(spark: SparkSession, count: int = 2, timeout: float = 120) -> None:
    """Until ``count`` executors are registered (after one was killed, say)."""

    def registered() -> bool:
        tracker = spark.sparkContext._jsc.sc().getExecutorMemoryStatus()  # type: ignore[union-attr]
        return int(tracker.size()) - 1 >= count  # the driver's block manager counts too

    wait_until_blocking(registered, limit=timeout, what=f"{count} executors")


class FakeTaskContext:
    """What ``pyspark.TaskContext.get()`` answers inside a task: its stage, its
    attempt and its task attempt id (the source reads nothing else)."""

    def __init__(self, stage: int, attempt: int, task: int) -> None:
        self._stage, self._attempt, self._task = stage, attempt, task

    def stageId(self) -> int:
        return self._stage

    def attemptNumber(self) -> int:
        return self._attempt

    def taskAttemptId(self) -> int:
        return self._task


def as_task(
    monkeypatch: pytest.MonkeyPatch, stage: int = 1, attempt: int = 0, task: int = 0
) -> None:
    """Run what follows as if in a Spark task (:class:`FakeTaskContext`)."""
    import pyspark

    context = FakeTaskContext(stage, attempt, task)
    monkeypatch.setattr(pyspark.TaskContext, "get", classmethod(lambda cls: context))
