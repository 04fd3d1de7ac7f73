"""Static checks run as part of the suite, so that the one test command covers them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_mypy_strict_on_the_packages() -> None:
    result = run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_check() -> None:
    result = run("ruff", "check", "--output-format", "concise", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format() -> None:
    result = run("ruff", "format", "--check", "trionsq", "fakensq")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("package", ["trionsq", "fakensq"])
def test_packages_ship_py_typed(package: str) -> None:
    assert (ROOT / package / "py.typed").is_file()


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = "python -m pip install -e '.[test]' && python -m pytest"
    assert command in readme
    assert command in ci
    assert shutil.which("bash")
