"""Live progress: plain lines when not a terminal, a rich table when one (virtual time)."""

from __future__ import annotations

import io
import logging
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


class _Terminal(io.StringIO):
    """What a terminal is to rich and to logging: a stream that is a TTY."""

    def isatty(self) -> bool:
        return True


async def test_logs_show_above_the_live_table_and_its_last_frame_is_whole(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    pyte = pytest.importorskip("pyte")
    terminal = _Terminal()
    # stdout and stderr are the one terminal, as in a shell.
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setenv("COLUMNS", "80")
    # A tool's logging is set up before the table starts (basicConfig on stderr).
    handler = logging.StreamHandler(sys.stderr)
    log = logging.getLogger("tests.progress.tool")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        progress = Progress("to-file t", ["written", "open"], live=True, stderr=terminal)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(progress.run)
            progress.add("written", 10)
            await trio.sleep(1)
            log.info("[t] opening /tmp/out/t.log")
            progress.add("open")
            await trio.sleep(1)
            log.info("[t] still writing")
            await trio.sleep(1)
            nursery.cancel_scope.cancel()
    finally:
        log.removeHandler(handler)
    # What a person sees: the output played on a terminal emulator (a newline
    # is a carriage return and a line feed on a terminal).
    screen = pyte.Screen(80, 40)
    pyte.Stream(screen).feed(terminal.getvalue().replace("\n", "\r\n"))
    lines = [line.rstrip() for line in screen.display]
    shown = "\n".join(lines)
    # The log lines are on the screen, above the table, each once.
    opening = [i for i, line in enumerate(lines) if "[t] opening /tmp/out/t.log" in line]
    still = [i for i, line in enumerate(lines) if "[t] still writing" in line]
    title = [i for i, line in enumerate(lines) if line.startswith("to-file t")]
    assert len(opening) == 1 and len(still) == 1 and len(title) == 1, shown
    assert opening[0] < still[0] < title[0], shown
    # One table, whole, with the last counts: nothing half drawn around it.
    assert sum(1 for line in lines if line.startswith("┏") or line.startswith("┌")) == 1, shown
    bottom = [i for i, line in enumerate(lines) if line.startswith("└")]
    assert len(bottom) == 1 and bottom[0] > title[0], shown
    assert any("open" in line and "1" in line for line in lines[title[0] : bottom[0]]), shown
