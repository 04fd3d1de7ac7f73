"""``--nsq-faults-check``, ``--nsq-faults-shrink`` and ``--nsq-faults-only`` on
the 40-order project of :mod:`tests.plugin.test_nsq_faults` (issue 27): a
failing seed's replay is checked to meet the same faults and fail the same way,
and its faults shrink to a schedule of at most 2 that still fails it."""

from __future__ import annotations

import re
import shlex
import sys

import pytest

from .test_nsq_faults import ORDERS_PROJECT, PROJECT_INI, outcomes

RUNNING_TOTAL = "test_orders.py::test_running_total"


@pytest.fixture
def orders(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(test_orders=ORDERS_PROJECT)
    pytester.makeini(PROJECT_INI)
    return pytester


def first_failing_seed(orders: pytest.Pytester) -> int:
    for seed in range(1, 21):
        result = orders.runpytest_inprocess(
            "-p", "no:cacheprovider", "-rA", f"--nsq-faults={seed}", RUNNING_TOTAL
        )
        if outcomes(result) == {RUNNING_TOTAL: "failed"}:
            return seed
    raise AssertionError("no seed of 1..20 fails the running total")


def test_check_reproduces_and_shrinking_keeps_at_most_two_faults(
    orders: pytest.Pytester,
) -> None:
    seed = first_failing_seed(orders)
    result = orders.runpytest_inprocess(
        "-p", "no:cacheprovider", f"--nsq-faults={seed}", "--nsq-faults-check",
        "--nsq-faults-shrink", RUNNING_TOTAL,
    )  # fmt: skip
    text = result.stdout.str()
    assert "fakensq faults: replays with the same seed" in text, text
    assert re.search(
        rf"{RUNNING_TOTAL}: reproduced: met the same \d+ fault\(s\) \(nsqd-0:\d+.*\) and "
        r"failed the same way \(AssertionError at test_orders.py:\d+: assert \d+ == 820\)",
        text,
    ), text
    shrunk = re.search(
        rf"{RUNNING_TOTAL}: shrunk from (\d+) fault\(s\) to (\d+) \((.*)\) in \d+ replays; "
        r"still fails the same way .*:\n\s+(python -m pytest .*)",
        text,
    )
    assert shrunk, text
    assert int(shrunk.group(2)) <= 2
    command = shlex.split(shrunk.group(4))
    assert f"--nsq-faults-only={shrunk.group(3).replace(', ', ',')}" in command
    # The shrunk schedule, replayed as printed, fails again.
    again = orders.run(sys.executable, *command[1:], "-rA")
    assert outcomes(again) == {RUNNING_TOTAL: "failed"}, again.stdout.str()


def test_only_naming_a_fault_never_met_is_a_usage_error(orders: pytest.Pytester) -> None:
    result = orders.runpytest_inprocess(
        "-p", "no:cacheprovider", "--nsq-faults=1", "--nsq-faults-only=nsqd-0:99",
        "test_orders.py::test_correct_consumer",
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    lines = [line for line in result.outlines if "--nsq-faults-only:" in line]
    assert len(lines) == 1, result.stdout.str()
    assert re.fullmatch(
        r"--nsq-faults-only: nsqd-0:99 was never met: no test's schedule has it "
        r"\(theirs: nsqd-0:1(, nsqd-0:\d+)*\)",
        lines[0],
    ), lines


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--nsq-faults=1", "--nsq-faults-only=nsqd0"], "--nsq-faults-only wants LABEL:N"),
        (["--nsq-faults=1", "--nsq-real=/no/such/folder"], "/no/such/folder does not exist"),
        (["--nsq-faults-check"], "need --nsq-faults=SEED"),
    ],
)
def test_bad_replay_options_are_one_line_usage_errors(
    orders: pytest.Pytester, args: list[str], error: str
) -> None:
    result = orders.runpytest_inprocess("-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.errlines if line.strip()]
    assert len(errors) == 1 and error in errors[0], result.errlines


# A test whose flow is shorter from its second run on: 40 messages the first
# time, 1 after (a file beside it counts the runs), so a replay cannot reach
# the faults placed beyond its first message.
SHRINKING_FLOW = """
import pathlib

import pytest
import trio
import trionsq

RUNS = pathlib.Path(__file__).with_name("runs.txt")


@pytest.mark.nsq_faults(kinds=["time_out"], rate=4, horizon=40)
async def test_flow_changes(nsqd):
    first = not RUNS.exists()
    RUNS.write_text("ran")
    bodies = [b"%d" % i for i in range(40 if first else 1)]
    async with trionsq.Producer(nsqd_tcp_addresses=[nsqd.tcp_address]) as producer:
        await producer.multi_publish("t", bodies)
    seen = set()

    async def handle(message):
        seen.add(message.body)

    async with trionsq.Consumer(
        "t", "c", nsqd_tcp_addresses=[nsqd.tcp_address], handler=handle, max_in_flight=4
    ):
        with trio.fail_after(30):
            while len(seen) < len(bodies):
                await trio.sleep(0.02)
    assert False, "always fails"
"""


def test_a_replay_that_does_not_reproduce_names_the_fault_not_reached(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_flow=SHRINKING_FLOW)
    pytester.makeini(PROJECT_INI)
    result = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", "--nsq-faults=3", "--nsq-faults-check"
    )
    text = result.stdout.str()
    result.assert_outcomes(failed=1)
    # The first run met faults past the 1st message; the replay (1 message) did not.
    met = re.findall(
        r"^\s+#(\d+) \[nsqd-0\] time_out nsqd-0 (?:after|at) the (\d+)\w\w ", text, re.M
    )
    beyond = [n for n, count in met if int(count) > 1]
    assert beyond, text
    assert "test_flow.py::test_flow_changes: did not reproduce:" in text, text
    for number in beyond:
        assert re.search(
            rf"^\s+fault nsqd-0:{number} was not reached this time: time_out nsqd-0 "
            r"(after the \d+\w\w message sent to a consumer|at the \d+\w\w FIN \(before nsqd "
            r"reads it\)): not reached, nsqd-0 saw \d+ (message\(s\) sent to consumers|FIN\(s\))$",
            text,
            re.M,
        ), text
    # The test failed the same way both times: only the faults differ.
    assert re.search(r"^\s+failed the same way \(AssertionError at test_flow.py:\d+", text, re.M)
