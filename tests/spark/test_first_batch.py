"""The first batch's partitions: as many as the executors run at once, before any
agent has said how many that is (one wave of tasks, not two)."""

from __future__ import annotations

import pytest
import trio

from trionsq.spark import coordinator as coordinator_module
from trionsq.spark._executor import executor_cores
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
