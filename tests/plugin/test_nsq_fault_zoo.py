"""``pytest --nsq-faults=SEED`` on the zoo of planted bugs (tests/plugin/fault_zoo.py).

Each planted bug is a habit that breaks under nsqd's at-least-once delivery:
counting deliveries, stopping after as many deliveries as published, a side
effect per delivery, assuming order, skipping redeliveries, deduplicating
within a batch only, a publisher that publishes again when an answer is late,
one that takes a late answer for a failure.  The suite runs a few seeds (the
correct tests pass, every planted bug fails for at least one of them);
``benchmarks/bench_fault_zoo.py`` counts seeds 1..20 for each (the figures in
docs/faults-tutorial.md).
"""

from __future__ import annotations

import pytest

from .fault_zoo import BUGGY, CORRECT, ZOO_PROJECT
from .test_nsq_faults import PROJECT_INI, outcomes

#: Two seeds: each finds every planted bug of BUGGY (seeds 1..20 with
#: benchmarks/bench_fault_zoo.py: each bug all or nearly all of them).
SEEDS = (1, 2)
#: The zoo's bugs that tests/plugin/test_nsq_faults.py's project has too
#: (counting deliveries, a running total) are left to it here, and the
#: zoo's LIMITS (what the faults rarely find) to the benchmark.
PLANTED = tuple(t for t in BUGGY if "counts_deliveries" not in t and "running_total" not in t)
SELECT = "not counts_deliveries and not running_total and not drains_until_quiet"


def test_every_planted_bug_is_found_and_the_correct_tests_pass(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_zoo=ZOO_PROJECT)
    pytester.makeini(PROJECT_INI)
    # Without faults every test passes: the bugs are latent.
    pytester.runpytest_inprocess("-p", "no:cacheprovider", "-k", SELECT).assert_outcomes(
        passed=len(CORRECT) + len(PLANTED)
    )
    found: dict[str, list[int]] = {test: [] for test in PLANTED}
    for seed in SEEDS:
        result = pytester.runpytest_inprocess(
            "-p", "no:cacheprovider", "-rA", "-k", SELECT, f"--nsq-faults={seed}"
        )
        seen = outcomes(result)
        for test in CORRECT:
            assert seen[test] == "passed", (seed, result.stdout.str())
        for test in PLANTED:
            if seen[test] == "failed":
                found[test].append(seed)
    print(f"seeds of {SEEDS} that find each planted bug: {found}")
    missed = [test for test, seeds in found.items() if not seeds]
    assert not missed, found
