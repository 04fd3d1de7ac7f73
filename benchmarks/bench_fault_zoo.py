"""How often ``pytest --nsq-faults=SEED`` finds each planted bug of the zoo
(tests/plugin/fault_zoo.py), and what a fault run costs (issue 27).

For each seed of 1..N (default 20) the zoo project runs in a new pytest
process with ``--nsq-faults=SEED``; per planted bug: the seeds that fail it
(the correct tests must pass every seed; the zoo's LIMITS are counted
too: what the faults rarely find); then up to ``--replays`` of the
printed replay commands are run again (the fail-again rate), and with
``--shrink`` the first failing seed of each bug is shrunk
(``--nsq-faults-shrink``: the shrunk size).  Also the call phase's seconds of
each test (median and max over the seeds) against the same tests without
faults, and the load.  ``--real=NSQ_BIN``: the same through ``fakensq proxy``
in front of the real nsqd (``--nsq-real``).

    python benchmarks/bench_fault_zoo.py [--seeds 20] [--replays 15] [--shrink]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.plugin.fault_zoo import BUGGY, CORRECT, LIMITS, ZOO_PROJECT
from tests.plugin.test_nsq_faults import replay_commands

INI = "[pytest]\ntrio_mode = true\naddopts = -p no:benchmark -p no:cacheprovider\n"


def outcomes(text: str) -> dict[str, str]:
    found = {}
    for line in text.splitlines():
        match = re.match(r"^(PASSED|FAILED) (\S+)", line)
        if match:
            found[match.group(2)] = match.group(1).lower()
    return found


def durations(text: str) -> dict[str, float]:
    return {
        m.group(2): float(m.group(1)) for m in re.finditer(r"^([\d.]+)s call\s+(\S+)", text, re.M)
    }


def pytest(folder: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "--durations=0", "--durations-min=0", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return done.stdout + done.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--replays", type=int, default=15)
    parser.add_argument("--shrink", action="store_true")
    parser.add_argument("--real", default=None, help="NSQ_BIN: in front of the real nsqd")
    parser.add_argument("-k", dest="only", default=None, help="pytest's -k: which zoo tests")
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "test_zoo.py").write_text(ZOO_PROJECT)
        (folder / "pytest.ini").write_text(INI)
        extra = [f"--nsq-real={args.real}"] if args.real else []
        select = ["-k", args.only] if args.only else []
        load = [os.getloadavg()[0]]
        plain = durations(pytest(folder, *extra, *select))
        tests = [t for t in (*CORRECT, *BUGGY, *LIMITS) if t in plain]
        found: dict[str, list[int]] = {t: [] for t in tests}
        seconds: dict[str, list[float]] = {t: [] for t in tests}
        commands: list[tuple[str, list[str]]] = []
        broken: list[tuple[int, str]] = []
        for seed in range(1, args.seeds + 1):
            text = pytest(folder, f"--nsq-faults={seed}", *extra, *select)
            seen = outcomes(text)
            printed = replay_commands(text)
            for test, took in durations(text).items():
                seconds.setdefault(test, []).append(took)
            for test in tests:
                if seen.get(test) != "failed":
                    continue
                if test in CORRECT:
                    broken.append((seed, test))
                    continue
                found[test].append(seed)
                commands.append((test, printed[test]))
            load.append(os.getloadavg()[0])
            print(f"seed {seed}: failed {sorted(t for t in seen if seen[t] == 'failed')}")
        again: dict[str, list[bool]] = {}
        for test, command in commands[: args.replays] if args.replays else []:
            text = pytest(folder, *command[3:])
            again.setdefault(test, []).append(outcomes(text).get(test) == "failed")
        shrunk: dict[str, str] = {}
        if args.shrink:
            for test, seeds in found.items():
                if test in CORRECT or not seeds:
                    continue
                text = pytest(
                    folder, f"--nsq-faults={seeds[0]}", "--nsq-faults-shrink", *extra, test
                )
                match = re.search(r"shrunk from (\d+) fault\(s\) to (\d+) .*", text)
                shrunk[test] = match.group(0) if match else "(no shrink line)"
        report = {
            "found": {t: len(s) for t, s in found.items() if t not in CORRECT},
            "seeds": found,
            "correct_failed": broken,
            "replays_failed_again": {t: f"{sum(v)}/{len(v)}" for t, v in again.items()},
            "shrunk": shrunk,
            "seconds_median": {t: round(statistics.median(v), 2) for t, v in seconds.items() if v},
            "seconds_max": {t: round(max(v), 2) for t, v in seconds.items() if v},
            "seconds_without_faults": plain,
            "load": [round(min(load), 1), round(max(load), 1)],
        }
        print(json.dumps(report, indent=1))
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
