"""The README says what the suite needs beyond Python and pip, and what it
installs itself: every outside thing a part of the suite skips without."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_readme_names_what_the_suite_uses_from_outside_python() -> None:
    readme = (ROOT / "README.md").read_text()
    # What the suite's skips look for (read from the conftests, so a new one
    # shows here): the JVM for Spark, a Chromium for the browser, the real NSQ.
    spark = (ROOT / "tests" / "spark" / "conftest.py").read_text()
    assert 'shutil.which("java")' in spark and "JAVA_HOME" in spark
    admin = (ROOT / "tests" / "admin" / "conftest.py").read_text()
    chromium = re.search(r'^CHROMIUM = "([^"]+)"', admin, re.M)
    assert chromium is not None and '"install", "-y"' in admin
    reference = (ROOT / "tests" / "reference.py").read_text()
    assert 'os.environ.get("NSQ_BIN")' in reference
    for needed in ("Java", "JAVA_HOME", chromium.group(1), "apt-get install chromium", "NSQ_BIN"):
        assert needed in readme, needed
    # And it no longer says the suite needs nothing else.
    assert "Both need only Python 3.11 and pip" not in readme
