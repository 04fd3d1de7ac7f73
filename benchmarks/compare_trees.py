"""Compare two source trees on one benchmark, rounds interleaved.

A refactoring claims "behaviour and speed stay the same"; one run of each tree
cannot show it on a shared machine, where the load drifts between runs.  This
script runs a benchmark script (``bench_client.py``, ``bench_frontends.py``...)
alternately from each tree (``PYTHONPATH`` pointing at it, the script itself
taken from that tree), reads the ``wall`` and ``cpu`` ratio columns of the
tables it prints (each already a ratio to a baseline measured in the same
process), and prints, per case, the median of each tree's ratios and
after/before::

    python benchmarks/compare_trees.py --before /tmp/old --after . --rounds 4 \\
        -- bench_client.py --sections consume,publish --rounds 1

Rows are keyed by case name and the baseline they are measured against.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

Key = tuple[str, str]


def parse_tables(text: str) -> dict[Key, tuple[float, float]]:
    """The (wall, cpu) ratios of every table row that has both, by (case, against)."""
    rows: dict[Key, tuple[float, float]] = {}
    header: str | None = None
    for line in text.splitlines():
        if line.strip().startswith("case") and " wall" in line and " cpu" in line:
            header = line
            continue
        if not line.startswith("  "):
            header = None  # a table ends at its first unindented line
            continue
        if header is None:
            continue
        wall = _column(line, header, "wall")
        cpu = _column(line, header, "cpu")
        if wall is None or cpu is None:
            continue
        name = _case_name(line)
        against = line[header.index("against") :].strip() if "against" in header else ""
        rows[(name, against)] = (wall, cpu)
    return rows


def _case_name(line: str) -> str:
    # the name ends where two spaces and a number start
    text = line.strip()
    for index in range(len(text) - 2):
        if text[index : index + 2] == "  " and (text[index + 2 :].lstrip()[:1].isdigit()):
            return text[:index].strip()
    return text


def _column(line: str, header: str, title: str) -> float | None:
    """The number right-aligned under ``title`` in ``header``."""
    end = header.index(" " + title) + 1 + len(title)
    start = end
    while start > 0 and line[start - 1 : start] not in ("", " "):
        start -= 1
    cell = line[start:end].strip()
    try:
        return float(cell)
    except ValueError:
        return None


def run(tree: Path, script: str, args: list[str]) -> str:
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run(
        [sys.executable, str(tree / "benchmarks" / script), *args],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode not in (0, 1):  # 1: a target missed, the tables are there
        raise SystemExit(f"{script} in {tree} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    options = parser.parse_args()
    trees = {"before": options.before.resolve(), "after": options.after.resolve()}
    seen: dict[str, dict[Key, list[tuple[float, float]]]] = {name: {} for name in trees}
    for round_ in range(options.rounds):
        # alternate which tree goes first, so a drift in load hits both alike
        order = list(trees) if round_ % 2 == 0 else list(reversed(trees))
        for name in order:
            rows = parse_tables(run(trees[name], options.script, options.args))
            for key, value in rows.items():
                seen[name].setdefault(key, []).append(value)
            print(f"round {round_ + 1}/{options.rounds}: {name} done", file=sys.stderr)
    command = " ".join([options.script, *options.args])
    print(f"{command}: medians of {options.rounds} interleaved runs")
    print(f"  {'case':<44} {'against':<28} {'wall b/a':>13} {'cpu b/a':>13} {'wall':>6} {'cpu':>6}")
    for key in seen["before"]:
        if key not in seen["after"]:
            continue
        before = seen["before"][key]
        after = seen["after"][key]
        wb = statistics.median(v[0] for v in before)
        cb = statistics.median(v[1] for v in before)
        wa = statistics.median(v[0] for v in after)
        ca = statistics.median(v[1] for v in after)
        print(
            f"  {key[0][:44]:<44} {key[1][:28]:<28} {wb:>6.2f}/{wa:<6.2f} {cb:>6.2f}/{ca:<6.2f}"
            f" {wa / wb if wb else float('nan'):>6.2f} {ca / cb if cb else float('nan'):>6.2f}"
        )


if __name__ == "__main__":
    main()
