"""Executable ``nsqd`` and ``nsqlookupd`` stand-ins for the real binaries.

Test suites of other projects often start ``nsqd`` and ``nsqlookupd`` by name
from ``PATH``.  ``fakensq shims DIR`` (or :func:`write_shims`) writes two small
Python scripts there, bound to the current interpreter, that run fakensq's
daemons with the real ones' flags; put DIR first on ``PATH``.  The scripts
``exec`` nothing: the Python process *is* the daemon, so signals sent to its pid
(SIGTERM, SIGINT) reach it directly.

Installing the package puts no ``nsqd`` or ``nsqlookupd`` on ``PATH`` (only
``fakensq`` and ``trionsq``): the real binaries' names are taken only where
asked, in the folder given here.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

__all__ = ["write_shims", "SHIMS"]

#: Shim name → the :mod:`fakensq.cli` function it runs.
SHIMS = {"nsqd": "nsqd_main", "nsqlookupd": "nsqlookupd_main"}

_TEMPLATE = """\
#!{python}
# fakensq stand-in for the real `{name}` binary (written by `fakensq shims`).
import sys

from fakensq.cli import {function}

sys.exit({function}())
"""


def write_shims(directory: str | os.PathLike[str], python: str | None = None) -> list[Path]:
    """Write executable ``nsqd`` and ``nsqlookupd`` into ``directory`` (created if
    needed), running ``python`` (default: this interpreter).  Returns their paths."""
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    interpreter = python or sys.executable
    written = []
    for name, function in SHIMS.items():
        path = target / name
        path.write_text(_TEMPLATE.format(python=interpreter, name=name, function=function))
        mode = path.stat().st_mode
        path.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        written.append(path)
    return written
