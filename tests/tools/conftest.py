"""Nothing a tool test started outlives it, even when the test fails."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .helpers import STARTED


@pytest.fixture(autouse=True)
def _kill_what_the_test_started() -> Iterator[None]:
    yield
    while STARTED:
        process = STARTED.pop()
        if process.poll() is None:
            process.kill()
            process.communicate()
