"""Every ```python block in docs/ and the README runs, so the docs cannot rot.

Each runs as a new user would run it: in a fresh folder outside the
repository, with the package and nothing of the repository's (no conftest, no
pytest.ini, no PYTEST_* settings of this run).

A block right after a ``<!-- pytest -->`` line is a test module: it is saved in
that folder and run by ``pytest`` there, with fakensq's plugin (installed with
the package), as another project would run it; if it also has an
``if __name__ == "__main__":`` part, it runs as a script too.  The
configuration such a module needs is what the page itself shows: a block right
after a ``<!-- pytest.ini -->`` line is the folder's ``pytest.ini`` for the
page's test modules after it; none, and there is none.  Any other block runs
as a script.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(
    r"^(?:<!-- (?P<kind>pytest|pytest\.ini) -->\n)?```(?P<lang>python|ini)\n(?P<code>.*?)^```",
    re.DOTALL | re.MULTILINE,
)
#: seconds an example may run before it counts as hung
EXAMPLE_TIMEOUT = 600


def examples() -> list[tuple[str, str, str, str | None]]:
    """(where, how, code, the page's pytest.ini then): how is "script" or "pytest"."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        ini: str | None = None
        number = 0
        for match in BLOCK.finditer(path.read_text()):
            kind, code = match.group("kind"), match.group("code")
            if kind == "pytest.ini":
                ini = code
                continue
            if match.group("lang") != "python":
                continue
            number += 1
            where = f"{path.relative_to(ROOT)}#{number}"
            if kind == "pytest":
                found.append((where, "pytest", code, ini))
                if re.search(r'^if __name__ == "__main__":', code, re.MULTILINE):
                    found.append((f"{where}-script", "script", code, None))
            else:
                found.append((where, "script", code, None))
    return found


def new_user_env() -> dict[str, str]:
    """This environment less what this pytest run set for itself; this tree's
    packages importable (the package is installed from the main checkout)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = str(ROOT)
    return env


@pytest.mark.parametrize(
    ("where", "how", "code", "ini"), examples(), ids=[w for w, *_ in examples()]
)
def test_docs_example_runs(
    where: str, how: str, code: str, ini: str | None, tmp_path: Path
) -> None:
    # Outside the repository: no conftest.py or pytest.ini of ours above it.
    assert ROOT not in tmp_path.parents
    if how == "pytest":
        (tmp_path / "test_example.py").write_text(code)
        if ini is not None:
            (tmp_path / "pytest.ini").write_text(ini)
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    else:
        # A fresh interpreter each: examples call trio.run and must not share state.
        # In a folder of its own: nsqds keep their metadata (nsqd.dat, disk queues)
        # in the working directory, which must not be the repository.
        command = [sys.executable, "-c", code]
    # A guard against a hung example, not a speed check: a Spark example starts a
    # JVM and executor processes, which on a machine this busy took over 120 s.
    result = subprocess.run(
        command,
        cwd=tmp_path,
        env=new_user_env(),
        capture_output=True,
        text=True,
        timeout=EXAMPLE_TIMEOUT,
    )
    assert result.returncode == 0, f"{where} failed:\n{result.stdout}\n{result.stderr}"


def test_the_pages_test_modules_are_found() -> None:
    found = {where: (how, ini) for where, how, _code, ini in examples()}
    # docs/testing.md's first block is the module a new user copies first: run
    # by pytest with the configuration the page shows, and as a script.
    assert found["docs/testing.md#1"] == ("pytest", "[pytest]\ntrio_mode = true\n")
    assert found["docs/testing.md#1-script"][0] == "script"
