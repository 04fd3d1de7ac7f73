"""The front ends' examples (examples/*.py), run against fakensq's fixtures."""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from trionsq import blocking

from ..support.waiting import wait_until_blocking
from .conftest import stats

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` (the examples are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def drain(address: str, topic: str, count: int) -> list[bytes]:
    got: list[bytes] = []
    with blocking.Consumer(topic, "check", nsqd_tcp_addresses=[address], max_in_flight=50) as c:
        for message in c:
            message.finish()
            got.append(message.body)
            if len(got) == count:
                break
    return got


def test_a_flask_view_publishes(nsqd: Any) -> None:
    pytest.importorskip("flask")
    example = load("flask_publish")
    app = example.create_app([nsqd.tcp_address])
    client = app.test_client()
    try:
        assert client.post("/publish/clicks", data=b"first").status_code == 201
        assert client.post("/publish-many/clicks", data="a\nb\nc").status_code == 201
        answer = client.post("/publish/bad topic!", data=b"x")
        assert answer.status_code == 400 and "not valid" in answer.get_json()["error"]
        # Every view maps the client's mistake alike, not one a 400, another a 500.
        answer = client.post("/publish-many/bad!x", data="a\nb")
        assert answer.status_code == 400 and "not valid" in answer.get_json()["error"]
        producer = app.extensions["nsq_producer"]
        assert producer.stats.published == 4
    finally:
        example.close_producer(app)
    assert sorted(drain(nsqd.tcp_address, "clicks", 4)) == [b"a", b"b", b"c", b"first"]


@pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")
def test_a_fastapi_app_consumes_in_its_lifespan(nsqd: Any) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    example = load("fastapi_consume")
    app = example.create_app([nsqd.tcp_address], topic="events")
    with TestClient(app) as client:
        with blocking.Producer([nsqd.tcp_address]) as producer:
            producer.multi_publish("events", [b"login", b"logout"])
        wait_until_blocking(lambda: sorted(client.get("/recent").json()) == ["login", "logout"])
        assert client.get("/stats").json() == {"received": 2, "finished": 2}
    # The lifespan ended: the consumer left, nothing in flight.
    assert stats(nsqd, "events", "dashboard")["in_flight_count"] == 0


@contextmanager
def _worker(address: str, *args: str) -> Iterator[subprocess.Popen[str]]:
    """The example worker, killed at the end if a failing test left it running."""
    process = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "blocking_worker.py"), "--nsqd", address, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()


def test_the_worker_script_does_its_jobs(nsqd: Any) -> None:
    with blocking.Producer([nsqd.tcp_address]) as producer:
        producer.multi_publish("jobs", [b"job-%d" % i for i in range(8)])
    with _worker(nsqd.tcp_address, "--count", "8", "--concurrency", "3") as worker:
        out, _ = worker.communicate(timeout=60)
    assert worker.returncode == 0, out
    assert "stopped after 8 job(s)" in out
    assert {f"job job-{i} " in out for i in range(8)} == {True}
    assert stats(nsqd, "jobs", "workers")["depth"] == 0


def test_the_worker_stops_cleanly_on_sigterm(nsqd: Any) -> None:
    with _worker(nsqd.tcp_address) as worker:
        assert worker.stdout is not None
        # stderr is merged in: the consumer's log lines may come before "ready".
        for line in worker.stdout:
            if line.strip() == "ready":
                break
        else:
            pytest.fail(f"the worker ended before it was ready: {worker.wait()}")
        with blocking.Producer([nsqd.tcp_address]) as producer:
            producer.multi_publish("jobs", [b"job-%d" % i for i in range(3)])
        wait_until_blocking(lambda: stats(nsqd, "jobs", "workers").get("depth") == 0)
        began = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        out, _ = worker.communicate(timeout=30)
        assert worker.returncode == 0, out
        assert time.monotonic() - began < 10
        done = int(out.split("stopped after ")[1].split()[0])
        channel = stats(nsqd, "jobs", "workers")
        # Every job is done, or back in the channel for another worker.
        assert channel["in_flight_count"] == 0
        assert channel["depth"] == 3 - done
