"""How a program ends on SIGINT (Ctrl-C) and SIGTERM: one way for all of them.

The first signal asks for a clean stop: take nothing new, finish or requeue
what is held, print the summary where there is one, exit quietly.  A second
one aborts the clean stop (what was held is still requeued: the consumers
requeue on cancellation) and the program exits 130.  No traceback either way:
Ctrl-C is how a user ends a program, not an error.

Both signals, not only SIGTERM: a supervisor sends SIGTERM, a person at a
terminal sends SIGINT, and both mean "stop now, cleanly".

- :class:`StopOnSignals`: for a program's main thread, around a blocking wait
  (``trionsq.blocking``'s ``Consumer.run()``, an asyncio program's main
  coroutine): the first signal calls ``stop``, a second ``abort`` (default:
  raise ``KeyboardInterrupt`` where the main thread is, Python's Ctrl-C).
- :class:`TrioStopSignals`: for a ``trio.run``: installed before the run (a
  signal while it starts is kept, not lost), attached inside it to an event
  set by the first signal and a cancel scope cancelled by a second.

The ``trionsq`` tools, the ``fakensq`` commands, ``python -m fakensq.demo`` and
the examples all end this way (tests/test_entry_points.py runs each under
SIGINT).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

import trio

__all__ = ["EXIT_ABORTED", "SIGNALS", "StopOnSignals", "TrioStopSignals"]

#: The exit status after a second signal cut the clean stop short (128 + SIGINT,
#: what a shell reports for a program Ctrl-C ended).
EXIT_ABORTED = 130

#: The signals that stop a program.
SIGNALS = (signal.SIGINT, signal.SIGTERM)

log = logging.getLogger("trionsq.stopping")


def _raise_keyboard_interrupt() -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def _handling(handler: Callable[[int, FrameType | None], None]) -> Iterator[None]:
    """``handler`` for :data:`SIGNALS` while inside (the main thread only, as
    Python allows); the handlers in place before are put back on leaving."""
    previous = {sig: signal.signal(sig, handler) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class StopOnSignals:
    """SIGINT and SIGTERM while the ``with`` lasts: the first calls ``stop``,
    later ones call ``abort`` (default: raise ``KeyboardInterrupt``).

    ``stop`` and ``abort`` run in the main thread, as signal handlers: they
    must be quick and safe there (``blocking.Consumer.stop`` is).  In any other
    thread, where Python allows no signal handler, the ``with`` does nothing.
    The handlers in place before are put back on leaving.  ``received`` is the
    first signal's name (``"SIGINT"``), or ``None``; ``aborted`` is whether a
    second came.  Entered before the clients it stops start (a signal while
    they start is then a stop, not the default handler's end)::

        consumer = blocking.Consumer("jobs", "workers", handler=work, ...)
        with StopOnSignals(consumer.stop) as signals, consumer:
            consumer.run()
        print(f"stopped by {signals.received}" if signals.received else "done")
    """

    def __init__(
        self,
        stop: Callable[[], object],
        abort: Callable[[], object] = _raise_keyboard_interrupt,
    ) -> None:
        self._stop = stop
        self._abort = abort
        self.count = 0
        self.received: str | None = None
        self.aborted = False
        self._installed = contextlib.ExitStack()

    def __enter__(self) -> StopOnSignals:
        if threading.current_thread() is threading.main_thread():
            self._installed.enter_context(_handling(self._handler))
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._installed.close()

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.count == 1:
            self.received = signal.Signals(signum).name
            self._stop()
        elif not self.aborted:
            self.aborted = True
            self._abort()


class TrioStopSignals:
    """SIGINT and SIGTERM for the whole life of a ``trio.run``.

    Installed (:meth:`installed`) before the run and kept until it is over, so
    that a signal arriving while the program starts is delivered as soon as
    it runs, and one arriving as it finishes by itself is simply absorbed,
    never redelivered to a default handler that would kill the process half
    way through its exit.  Inside the run, :meth:`attach` names the ``stop``
    event the first signal sets and the cancel scope a second cancels.
    """

    def __init__(self) -> None:
        self.count = 0
        self.aborted = False
        #: the first signal's name ("SIGINT"), or None
        self.received: str | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._scope: trio.CancelScope | None = None

    @contextlib.contextmanager
    def installed(self) -> Iterator[TrioStopSignals]:
        with _handling(self._handler):
            yield self

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.received is None:
            self.received = signal.Signals(signum).name
        token = self._token
        if token is None:
            return  # before the run: seen when it attaches
        try:
            token.run_sync_soon(self._deliver, signum)
        except trio.RunFinishedError:
            pass  # the program is done: nothing left to stop

    def attach(self, stop: trio.Event, scope: trio.CancelScope) -> None:
        """From inside the run: the first signal sets ``stop``, a second
        cancels ``scope`` (signals that came before the run stop it now)."""
        self._stop, self._scope = stop, scope
        self._token = trio.lowlevel.current_trio_token()
        if self.count:
            self._deliver(signal.SIGTERM)

    def _deliver(self, signum: int) -> None:
        assert self._stop is not None and self._scope is not None
        if not self._stop.is_set():
            log.info("received %s: stopping", self.received or signal.Signals(signum).name)
            self._stop.set()
        elif self.count > 1 and not self.aborted:
            log.info("second signal: aborting")
            self.aborted = True
            self._scope.cancel()
