"""Live progress for long-running tools: rich on a terminal, plain lines otherwise.

A :class:`Progress` holds named counters that the tool bumps.  On a terminal
(stdout is a TTY) a ``rich.live.Live`` table is redrawn a few times a second;
otherwise plain status lines go to stderr: every ``interval`` seconds, and/or
every ``every`` counts of the ``rate_of`` counter (the Go tools'
``--status-every N``), with the response times of those last ``every``
(99th and 95th percentile, mean) when the tool records them.  Either way
:meth:`Progress.summary` prints the final totals on stderr when the tool ends.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TextIO

import trio

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["Progress"]

_REFRESH = 0.25


@contextlib.contextmanager
def _logging_through_live() -> Iterator[None]:
    """Log handlers writing to the terminal write through the live display
    while it lasts, so that their lines appear above the table.

    The display redraws itself in place: a line written to the terminal behind
    its back is drawn over at the next refresh (the tools' INFO lines vanished
    while the table ran) and leaves the frame half drawn.  ``Live`` sends
    ``sys.stdout`` and ``sys.stderr`` through its console while it runs; a
    ``logging.StreamHandler`` set up before keeps the stream it was given, so it
    is pointed at the redirected one for as long as the display lasts.
    """
    from rich.file_proxy import FileProxy

    # The terminal's streams as they were, each to its redirected stand-in.
    streams = {
        id(current.rich_proxied_file): current
        for current in (sys.stdout, sys.stderr)
        if isinstance(current, FileProxy)
    }
    moved: list[tuple[logging.StreamHandler[Any], Any]] = []
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for logger in loggers:
        if not isinstance(logger, logging.Logger):
            continue  # a placeholder of the logger tree
        for handler in logger.handlers:
            if type(handler) is not logging.StreamHandler:
                continue  # a file, a socket...: not the terminal
            redirected = streams.get(id(handler.stream))
            if redirected is not None:
                moved.append((handler, handler.stream))
                handler.setStream(redirected)
    try:
        yield
    finally:
        for handler, stream in moved:
            handler.setStream(stream)


class Progress:
    """Counters of one tool run, with their rate and an optional backlog.

    ``rate_of`` names the counter whose per-second rate is shown (and whose
    count ``every`` counts); ``backlog`` (when given) is called at each refresh
    (messages held but not yet done).
    """

    def __init__(
        self,
        title: str,
        counters: list[str],
        *,
        rate_of: str | None = None,
        backlog: Callable[[], int] | None = None,
        interval: float | None = None,
        every: int = 0,
        live: bool | None = None,
        stderr: TextIO | None = None,
    ) -> None:
        self.title = title
        self.counts: dict[str, int] = dict.fromkeys(counters, 0)
        self.info: dict[str, str] = {}
        self.rate_of = rate_of or counters[0]
        self.backlog = backlog
        self.interval = interval
        self.every = max(0, every)
        self.live = sys.stdout.isatty() if live is None else live
        self.stderr = stderr if stderr is not None else sys.stderr
        self._started = time.monotonic()
        self._last = (self._started, 0)
        self._rate = 0.0
        self._next_line = self.every
        self._timings: list[float] = []

    def add(self, name: str, amount: int = 1) -> None:
        count = self.counts.get(name, 0) + amount
        self.counts[name] = count
        if self.every and name == self.rate_of and count >= self._next_line:
            # One line at each multiple of ``every`` (the Go tools' --status-every
            # N: a line every N messages), however the count came: a batch of 200
            # acknowledged at once that passes 250 gives the line of the 250th,
            # and one that passes two multiples gives two lines.
            if not self.live:
                self._update_rate()
            while count >= self._next_line:
                if not self.live:
                    line = self.line(timings=True, at=self._next_line)
                    print(line, file=self.stderr, flush=True)
                self._next_line += self.every
            self._timings.clear()

    def time(self, seconds: float) -> None:
        """Record one response time, for the next status line's percentiles."""
        if self.every:
            self._timings.append(seconds)

    def _update_rate(self) -> float:
        now = time.monotonic()
        then, count = self._last
        current = self.counts.get(self.rate_of, 0)
        if now - then > 0:
            self._rate = (current - count) / (now - then)
        self._last = (now, current)
        return self._rate

    def _fields(self, at: int | None = None) -> list[tuple[str, str]]:
        counts = dict(self.counts)
        if at is not None:
            counts[self.rate_of] = at
        fields = [(name, f"{value:,}") for name, value in counts.items()]
        fields.append((f"{self.rate_of}/s", f"{self._rate:,.1f}"))
        if self.backlog is not None:
            fields.append(("backlog", f"{self.backlog():,}"))
        fields.extend(self.info.items())
        return fields

    def line(self, timings: bool = False, at: int | None = None) -> str:
        """The plain-text form: ``title: name=value name=value ...`` (``at``: the
        ``rate_of`` counter shown at that count, a status line's multiple)."""
        text = f"{self.title}: " + " ".join(f"{k}={v}" for k, v in self._fields(at))
        if timings and self._timings:
            ordered = sorted(self._timings)
            p99, p95 = (ordered[min(len(ordered) - 1, int(q * len(ordered)))] for q in (0.99, 0.95))
            mean = sum(ordered) / len(ordered)
            text += (
                f" - 99th: {p99 * 1000:.2f}ms - 95th: {p95 * 1000:.2f}ms - avg: {mean * 1000:.2f}ms"
            )
        return text

    def table(self) -> Table:
        """The rich form: one row per counter (narrow terminals stay readable)."""
        from rich.table import Table  # only a terminal pays for importing rich

        table = Table(title=self.title, title_justify="left", show_header=False)
        table.add_column("name", style="bold")
        table.add_column("value", justify="right")
        for name, value in self._fields():
            table.add_row(name, value)
        return table

    async def run(self) -> None:
        """Redraw until cancelled (start it in the tool's nursery)."""
        if self.live:
            from rich.console import Console
            from rich.live import Live

            console = Console(file=sys.stdout)
            live = Live(
                self.table(),
                console=console,
                auto_refresh=False,
                transient=False,
                redirect_stdout=True,
                redirect_stderr=True,
            )
            with live, _logging_through_live():
                try:
                    while True:
                        await trio.sleep(_REFRESH)
                        self._update_rate()
                        live.update(self.table(), refresh=True)
                finally:
                    live.update(self.table(), refresh=True)
        elif self.interval:
            while True:
                await trio.sleep(self.interval)
                self._update_rate()
                print(self.line(), file=self.stderr, flush=True)
        else:
            await trio.sleep_forever()

    def summary(self) -> str:
        """Print (on stderr) and return the totals, with the mean rate of the run."""
        elapsed = time.monotonic() - self._started
        self._rate = self.counts.get(self.rate_of, 0) / elapsed if elapsed > 0 else 0.0
        text = self.line().replace(f"{self.title}: ", f"{self.title} done: ", 1)
        text += f" elapsed={elapsed:.1f}s"
        print(text, file=self.stderr, flush=True)
        return text
