"""Every ```python block in docs/ and the README runs, so the docs cannot rot."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def examples() -> list[tuple[str, str]]:
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for i, match in enumerate(BLOCK.finditer(path.read_text())):
            found.append((f"{path.relative_to(ROOT)}#{i + 1}", match.group(1)))
    return found


@pytest.mark.parametrize(("where", "code"), examples(), ids=[w for w, _ in examples()])
def test_docs_example_runs(where: str, code: str) -> None:
    # A fresh interpreter each: examples call trio.run and must not share state.
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, f"{where} failed:\n{result.stdout}\n{result.stderr}"
