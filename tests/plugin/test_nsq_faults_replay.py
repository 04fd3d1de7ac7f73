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
