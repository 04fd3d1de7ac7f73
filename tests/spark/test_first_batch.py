"""A query's start: the first batch's partitions are as many as the executors run
at once, before any agent has said how many that is (one wave of tasks, not two);
a task that starts its executor's agent goes on the moment the agent listens."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import trio

from trionsq.spark import coordinator as coordinator_module
from trionsq.spark._agent_client import _wait_closed
from trionsq.spark._executor import ExecutorIdentity, executor_cores
from trionsq.spark._options import parse_source_options
from trionsq.spark.coordinator import Coordinator

OPTIONS = parse_source_options(
    {
        "topic": "t",
        "channel": "c",
        "nsqd_tcp_addresses": "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
    }
)


@pytest.mark.parametrize(
    ("settings", "cores"),
    [
        ({"spark.master": "local"}, 1),
        ({"spark.master": "local[3]"}, 3),
        ({"spark.master": "local[4,2]"}, 4),
        ({"spark.master": "local[*]"}, None),  # this machine's: checked below
        ({"spark.master": "local-cluster[2,1,1024]"}, 2),
        ({"spark.master": "local-cluster[3, 2, 512]"}, 6),
        (
            {
                "spark.master": "yarn",
                "spark.executor.instances": "5",
                "spark.executor.cores": "4",
            },
            20,
        ),
        ({"spark.master": "yarn", "spark.executor.instances": "5"}, None),
        ({"spark.master": "spark://host:7077"}, None),
        (
            {
                "spark.master": "k8s://x",
                "spark.executor.instances": "x",
                "spark.executor.cores": "2",
            },
            None,
        ),
        ({"spark.master": "local[nope]"}, None),
        ({}, None),
        (None, None),
    ],
)
def test_the_cores_the_drivers_settings_give(
    settings: dict[str, str] | None, cores: int | None
) -> None:
    import os

    if settings == {"spark.master": "local[*]"}:
        cores = os.cpu_count() or 1
    assert executor_cores(settings) == cores


@pytest.mark.parametrize(
    ("master", "partitions"),
    [("local-cluster[2,1,1024]", 2), ("local[5]", 5), ("spark://host:7077", 3)],
)
def test_the_first_batch_has_a_partition_per_task_slot(
    monkeypatch: pytest.MonkeyPatch, master: str, partitions: int
) -> None:
    """Before any agent linked: the master's cores (else one per nsqd, at least 2);
    three partitions on two slots ran the first batch in two waves."""
    monkeypatch.setattr(coordinator_module, "driver_settings", lambda: {"spark.master": master})

    async def main() -> None:
        coordinator = Coordinator(OPTIONS)
        async with trio.open_nursery() as nursery:
            await nursery.start(coordinator.serve)
            assert await coordinator.latest(0, None) == 1
            assert coordinator.plan(1).partitions == partitions
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_an_agent_closes_its_ready_pipe_once_tasks_can_connect(tmp_path: Path) -> None:
    """The starting task waits on this pipe, not on a polling loop: at its EOF the
    agent's socket takes a connection at the first try."""
    identity = ExecutorIdentity("test-ready", "127.0.0.1", 1, os.getpid())
    path = str(tmp_path / "agent.sock")
    ready, ready_w = os.pipe()
    argv = [sys.executable, "-m", "trionsq.spark.agent", "--socket", path]
    argv += ["--identity", json.dumps(asdict(identity)), "--ready-fd", str(ready_w)]
    agent = subprocess.Popen(argv, pass_fds=(ready_w,), stdin=subprocess.DEVNULL)
    os.close(ready_w)
    try:
        with open(ready, "rb", buffering=0) as pipe:
            _wait_closed(pipe, 60)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(path)
        assert agent.poll() is None
    finally:
        agent.terminate()
        agent.wait(30)
