"""Suite-wide settings: hypothesis runs derandomized, so every run is the same;
the real NSQ binaries are found once, before pytest-xdist starts its workers;
``pki``: one CA and server certificate for the tests that need TLS."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from . import reference
from .support.tls import Pki

pytest_plugins = ["pytester"]

settings.register_profile(
    "trionsq",
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
# A search beyond the suite's fixed examples: HYPOTHESIS_RANDOM=1 draws new ones
# on every run (print_blob shows how to replay a failure).
settings.register_profile(
    "random", parent=settings.get_profile("trionsq"), derandomize=False, database=None
)
settings.load_profile("random" if os.environ.get("HYPOTHESIS_RANDOM") else "trionsq")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: two workers per core.  The suite mostly waits (on daemons
    starting, frames, timers, Spark), not computes: a serial run used about one
    minute of CPU time in eight of wall time; more workers fill the waits.
    ``PYTEST_XDIST_AUTO_NUM_WORKERS`` or ``-n N`` choose otherwise."""
    env = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
    if env:
        return int(env)
    return 2 * (os.cpu_count() or 1)


def _utf8(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # A pytest-xdist worker sends each report to the controller as UTF-8: output a
    # test captured with lone surrogates (bytes decoded with surrogateescape, as
    # a log line naming an invalid UTF-8 topic) would crash the worker and end
    # the run.  They are written as escapes instead (before xdist sends it).
    report.sections = [(title, _utf8(content)) for title, content in report.sections]
    if report.longrepr is not None:
        text = str(report.longrepr)
        if _utf8(text) != text:
            report.longrepr = _utf8(text)


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller did it
        return
    # The first use unpacks the binaries: done here, once, rather than by every
    # worker at the same time (one would rewrite an nsqd another is running).
    # The workers inherit NSQ_BIN and skip the lookup.
    folder = reference.nsq_bin()
    if folder is not None and "NSQ_BIN" not in os.environ:
        os.environ["NSQ_BIN"] = str(folder)


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA of the tests' own, with a server certificate for 127.0.0.1,
    localhost and ``nsqd`` (the host the client tests' in-memory connector
    serves: :class:`tests.client.minisrv.MiniNSQD`); :class:`tests.support.tls.Pki`."""
    return Pki(tmp_path_factory.mktemp("pki"), hosts=("127.0.0.1", "localhost", "nsqd"))
