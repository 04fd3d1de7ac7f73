"""Shared I/O for a consumer's plain-TCP connections: one task writes for all.

A consumer spread over many nsqds has little to read or write on each at a
time (at RDY 50, a read brings at most 50 messages and their FINs are one
write).  With a writer task per connection, every write costs task steps of
its own (the wake-up, then the checkpoint that lets the FINs of the other
runnable tasks pile up), and a Trio task step costs more than the write.  The
:class:`Multiplexer` makes that cost per scheduler pass instead: a connection
whose writer is idle, when a command is queued, puts itself on one list and
the multiplexer's flusher task, woken once for all of them, writes each one's
buffer with a plain non-blocking write.  What a socket does not take (or an
error) goes to that connection's own writer task, which sends it or ends the
connection exactly as it does without the multiplexer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from .connection import Connection

__all__ = ["Multiplexer"]


class Multiplexer:
    """The shared flusher of a set of connections (see the module's docstring).

    Run :meth:`run` in a task for as long as the connections may use it, and
    pass the multiplexer to :meth:`Connection.run
    <trionsq.connection.Connection.run>`.  When :meth:`run` ends, the
    connections still using it fall back to their own writer tasks.
    """

    def __init__(self) -> None:
        # Connections with commands queued for the flusher, in queueing order.
        self._dirty: list[Connection] = []
        self._flusher: trio.lowlevel.Task | None = None  # parked, waiting for work
        #: whether the flusher still takes work (False once :meth:`run` ended)
        self.running = True

    def flush_later(self, conn: Connection) -> None:
        """Have ``conn``'s queued commands written in the flusher's next turn
        (called once per batch: when a command is queued while its writer is
        idle; the connection then queues further commands behind it)."""
        if not self.running:
            conn._wake_writer.set()  # no flusher any more: its own writer writes
            return
        self._dirty.append(conn)
        task = self._flusher
        if task is not None:
            self._flusher = None
            trio.lowlevel.reschedule(task)

    def _abort_park(self, raise_cancel: Any) -> trio.lowlevel.Abort:
        self._flusher = None
        return trio.lowlevel.Abort.SUCCEEDED

    @trio.lowlevel.enable_ki_protection
    async def run(self) -> None:
        """Flush dirty connections until cancelled (KI-protected, as are the
        connections' own loops)."""
        try:
            while True:
                if not self._dirty:
                    self._flusher = trio.lowlevel.current_task()
                    await trio.lowlevel.wait_task_rescheduled(self._abort_park)
                # Woken by the first command queued: let the tasks already
                # runnable queue theirs too (the FINs of a read, a RDY), so that
                # each connection's go out in one write, not one each.
                await trio.lowlevel.cancel_shielded_checkpoint()
                dirty, self._dirty = self._dirty, []
                for conn in dirty:
                    conn._write_now()
        finally:
            self.running = False
            self._flusher = None
            dirty, self._dirty = self._dirty, []
            for conn in dirty:
                conn._wake_writer.set()
