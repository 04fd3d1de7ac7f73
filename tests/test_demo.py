"""The README's main job runs to the end and exits 0."""

from __future__ import annotations

import subprocess
import sys


def test_demo_moves_every_message_end_to_end() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "trionsq.demo", "-n", "600", "--batch", "100"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "every message was received and finished" in result.stdout
    assert "published         600" in result.stdout


def test_demo_rejects_bad_arguments() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "trionsq.demo", "-n", "0"], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "must be positive" in result.stderr
