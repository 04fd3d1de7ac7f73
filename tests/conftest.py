"""Suite-wide settings: hypothesis runs derandomized, so every run is the same;
the real NSQ binaries are found once, before pytest-xdist starts its workers."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from . import reference

pytest_plugins = ["pytester"]

settings.register_profile(
    "trionsq",
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.load_profile("trionsq")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: two workers per core.  The suite mostly waits (on daemons
    starting, frames, timers, Spark), not computes: a serial run used about one
    minute of CPU time in eight of wall time; more workers fill the waits.
    ``PYTEST_XDIST_AUTO_NUM_WORKERS`` or ``-n N`` choose otherwise."""
    env = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
    if env:
        return int(env)
    return 2 * (os.cpu_count() or 1)


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller did it
        return
    # The first use unpacks the binaries: done here, once, rather than by every
    # worker at the same time (one would rewrite an nsqd another is running).
    # The workers inherit NSQ_BIN and skip the lookup.
    folder = reference.nsq_bin()
    if folder is not None and "NSQ_BIN" not in os.environ:
        os.environ["NSQ_BIN"] = str(folder)
