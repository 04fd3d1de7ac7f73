"""Every ```python block in docs/ and the README runs, so the docs cannot rot.

A block right after a ``<!-- pytest -->`` line is a test module: it is written to
a temporary project and run by pytest there, with fakensq's plugin, as another
project would run it.  Any other block runs as a script.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"^(<!-- pytest -->\n)?```python\n(.*?)^```", re.DOTALL | re.MULTILINE)
#: seconds an example may run before it counts as hung
EXAMPLE_TIMEOUT = 600


def examples() -> list[tuple[str, str, bool]]:
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for i, match in enumerate(BLOCK.finditer(path.read_text())):
            where = f"{path.relative_to(ROOT)}#{i + 1}"
            found.append((where, match.group(2), match.group(1) is not None))
    return found


@pytest.mark.parametrize(("where", "code", "is_test"), examples(), ids=[w for w, *_ in examples()])
def test_docs_example_runs(where: str, code: str, is_test: bool, tmp_path: Path) -> None:
    if is_test:
        (tmp_path / "test_example.py").write_text(code)
        (tmp_path / "pytest.ini").write_text("[pytest]\ntrio_mode = true\n")
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        cwd = tmp_path
    else:
        # A fresh interpreter each: examples call trio.run and must not share state.
        # In a folder of its own: nsqds keep their metadata (nsqd.dat, fakensq.dat)
        # in the working directory, which must not be the repository.
        command, cwd = [sys.executable, "-c", code], tmp_path
    # This tree's packages, wherever the example runs.
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    # A guard against a hung example, not a speed check: a Spark example starts a
    # JVM and executor processes, which on a machine this busy took over 120 s.
    result = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=EXAMPLE_TIMEOUT
    )
    assert result.returncode == 0, f"{where} failed:\n{result.stdout}\n{result.stderr}"
