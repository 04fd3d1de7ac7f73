"""One local SparkSession for every Spark test, and helpers to move messages
through fakensq from synchronous test code."""

from __future__ import annotations

import importlib.util
import os
import shutil
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest
import trio

import trionsq

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
        async with trionsq.Consumer(
            topic, channel, nsqd_tcp_addresses=[address], max_in_flight=500
        ) as consumer:
            with trio.fail_after(timeout):
                async for message in consumer:
                    received.append(message.body)
                    await message.finish()
                    if len(received) >= count:
                        break

    trio.run(main)
    return received


def wait_for(condition: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll ``condition`` until it returns something truthy (never a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


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
