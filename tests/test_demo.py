"""The README's main job runs to the end, proves at-least-once, and exits 0."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import trio

from fakensq import demo


def outcome(stdout: str, name: str) -> int:
    match = re.search(rf"^  {name}\s+(\d+)\s", stdout, re.MULTILINE)
    assert match is not None, f"no {name!r} row in:\n{stdout}"
    return int(match.group(1))


def test_demo_moves_every_message_through_a_fault() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "fakensq.demo", "-n", "600", "--batch", "100"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "every published message was processed at least once" in out
    assert outcome(out, "published") == 600
    assert outcome(out, "missing") == 0
    assert outcome(out, "requeued") > 0  # seeded handler failures were retried
    assert outcome(out, "finished") + outcome(out, "given up") == 600
    assert "nsqd 1: stopped" in out and "nsqd 1: restarted" in out
    # Not a terminal: plain progress lines on stderr, no rich escape codes anywhere.
    assert "demo: published=" in result.stderr
    assert "\x1b[" not in out + result.stderr


def test_seeded_failures_are_deterministic() -> None:
    failures = demo.Failures(seed=7, fail_rate=0.3, poison_rate=0.1)
    first = [failures.fails(f"m{i}".encode(), 1) for i in range(200)]
    again = demo.Failures(seed=7, fail_rate=0.3, poison_rate=0.1)
    assert first == [again.fails(f"m{i}".encode(), 1) for i in range(200)]
    assert 20 < sum(first) < 120
    poison = [b for b in (f"m{i}".encode() for i in range(200)) if failures.is_poison(b)]
    assert poison and all(failures.fails(b, attempt) for b in poison for attempt in (1, 2, 9))


def test_in_process_run_gives_poison_up_and_misses_nothing() -> None:
    settings = demo.Settings(
        messages=300, batch=30, poison_rate=0.05, fail_rate=0.1, live=False, fault=False
    )
    ledger = trio.run(demo.run, settings)
    assert not ledger.missing
    poison = {b for b in ledger.published if demo.Failures(1, 0, 0.05).is_poison(b)}
    assert poison and poison <= ledger.given_up
    assert ledger.failed_attempts > 0


def test_help_is_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    # The module docstring is reStructuredText for the API pages; --help shows
    # its words without the markup (as every trionsq tool's --help does).
    with pytest.raises(SystemExit) as exited:
        demo.main(["--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    assert "python -m fakensq.demo starts an embedded fakensq.Cluster" in text
    assert "``" not in text and "**" not in text and ":class:" not in text


def test_demo_rejects_bad_arguments() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "fakensq.demo", "-n", "0"], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "must be positive" in result.stderr


def test_no_drain_loses_nothing_across_the_clean_restart() -> None:
    # The stopped nsqd writes what it holds to its data path and reads it back
    # (as a real nsqd): stopped under load, nothing goes missing (the quickstart
    # says so).
    settings = demo.Settings(messages=600, batch=30, drain=False, live=False, publish_rate=2000)
    ledger = trio.run(demo.run, settings)
    assert any("stopped" in event for event in ledger.fault_log)
    assert not ledger.missing
    assert len(ledger.published) == 600
