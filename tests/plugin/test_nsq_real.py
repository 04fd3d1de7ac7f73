"""``pytest --nsq-real=PATH``: the fixtures run the real nsqd and nsqlookupd
v1.3.0 (issue 27), so a project checks its tests against nsqd itself; with
``--nsq-faults`` the faults go through a fault proxy in front of each nsqd,
placed by the message flow as on fakensq."""

from __future__ import annotations

import pytest

from tests import reference

from .test_nsq_faults import BUGGY, CORRECT, ORDERS_PROJECT, PROJECT_INI, outcomes

# The fixtures' objects, as a project's test sees them under --nsq-real.
REAL_PROJECT = """
import httpx
import pytest
import trio
import trionsq


def test_nsqd_is_the_real_one(nsqd):
    info = httpx.get(f"http://{nsqd.http_address}/info").json()
    assert info["version"] == "1.3.0"
    assert type(nsqd).__name__ == "RealNSQD"


@pytest.mark.nsq_cluster(nsqd=2, lookupd=1)
async def test_cluster_through_the_lookupd(nsq_cluster):
    bodies = [b"%d" % i for i in range(10)]
    for address in nsq_cluster.nsqd_tcp_addresses:
        async with trionsq.Producer(nsqd_tcp_addresses=[address]) as producer:
            await producer.multi_publish("t", bodies)
    seen = []

    async def handle(message):
        seen.append(message.body)

    async with trionsq.Consumer(
        "t", "c", lookupd_http_addresses=nsq_cluster.lookupd_http_addresses,
        handler=handle, lookupd_poll_interval=0.1,
    ):
        with trio.fail_after(30):
            while len(set(seen)) < len(bodies) or len(seen) < 2 * len(bodies):
                await trio.sleep(0.02)
    assert sorted(seen) == sorted(bodies * 2)


def test_factory(nsqd_factory):
    first, second = nsqd_factory(), nsqd_factory()
    assert first.tcp_address != second.tcp_address
"""


@pytest.fixture
def nsq_bin() -> str:
    reference.require("nsqd")
    folder = reference.nsq_bin()
    assert folder is not None
    return str(folder)


def test_the_fixtures_run_the_real_daemons(pytester: pytest.Pytester, nsq_bin: str) -> None:
    pytester.makepyfile(test_real=REAL_PROJECT, test_orders=ORDERS_PROJECT)
    pytester.makeini(PROJECT_INI)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", f"--nsq-real={nsq_bin}")
    result.assert_outcomes(passed=6)
    # Without it, fakensq's nsqd: the project's real-only test says so.
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "test_real.py")
    result.assert_outcomes(passed=2, failed=1)


def test_faults_in_front_of_the_real_nsqd(pytester: pytest.Pytester, nsq_bin: str) -> None:
    pytester.makepyfile(test_orders=ORDERS_PROJECT)
    pytester.makeini(PROJECT_INI)
    failed = 0
    for seed in (1, 2, 3):
        result = pytester.runpytest_inprocess(
            "-p", "no:cacheprovider", "-rA", f"--nsq-real={nsq_bin}", f"--nsq-faults={seed}"
        )
        seen = outcomes(result)
        text = result.stdout.str()
        assert seen[CORRECT] == "passed", (seed, text)
        failed += sum(seen[test] == "failed" for test in BUGGY)
        if any(seen[test] == "failed" for test in BUGGY):
            # The replay keeps the real daemons.
            assert f"--nsq-real={nsq_bin} test_orders.py::" in text, text
            assert "[nsqd-0] drop nsqd-0, the consumer's connection" in text, text
    assert failed, "no planted bug found by seeds 1..3 in front of the real nsqd"
