"""Live progress: plain lines when not a terminal, a rich table when one (virtual time)."""

from __future__ import annotations

import io
import sys

import pytest
import trio
import trio.testing

from trionsq.tools.progress import Progress


async def test_plain_lines_every_interval(autojump_clock: trio.testing.MockClock) -> None:
    err = io.StringIO()
    progress = Progress(
        "job", ["done", "failed"], backlog=lambda: 7, interval=1.0, live=False, stderr=err
    )
    progress.info["phase"] = "warm"
    async with trio.open_nursery() as nursery:
        nursery.start_soon(progress.run)
        progress.add("done", 3)
        await trio.sleep(2.5)
        nursery.cancel_scope.cancel()
    lines = err.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("job: done=3 failed=0 done/s=")
    assert lines[0].endswith("backlog=7 phase=warm")
    summary = progress.summary()
    assert summary.startswith("job done: done=3 failed=0") and "elapsed=" in summary


def test_a_status_line_every_n_however_the_count_comes() -> None:
    err = io.StringIO()
    progress = Progress("to-nsq", ["published"], every=250, live=False, stderr=err)
    # Batches of 200 acknowledged at once, as MPUBs are, then one of 600.
    for amount in (200, 200, 200, 200, 200, 600, 1):
        progress.add("published", amount)
    shown = [
        int(line.split("published=")[1].split()[0].replace(",", ""))
        for line in err.getvalue().splitlines()
    ]
    # The documented --status-every: the 250th, the 500th... (not the batch ends
    # 400, 600, 800: a line every ~200).
    assert shown == [250, 500, 750, 1000, 1250, 1500]


async def test_rich_table_on_a_terminal(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    progress = Progress("job", ["published"], live=True, stderr=io.StringIO())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(progress.run)
        progress.add("published", 1234)
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    text = out.getvalue()
    assert "job" in text and "published" in text and "1,234" in text
