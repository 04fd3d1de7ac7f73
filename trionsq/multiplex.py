"""Shared I/O for a consumer's plain-TCP connections: one task reads, one writes.

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

Reads likewise (where the platform has ``select.epoll``): the multiplexer's
reader owns an epoll object of its own, each socket registered once
(level-triggered), not once per read as a task's ``wait_readable`` is.  It
waits until that epoll object is readable (an epoll descriptor is itself
pollable), reads each ready socket once, and hands its frames on as the
connection's own reader would; then it waits again, which is a checkpoint.
The connection's task meanwhile parks; whatever ends the connection in the
shared reader (its end, a fatal error frame, garbage, an error of the
callback) is raised in that task, so the connection ends exactly as it would
reading on its own, and one connection's end touches no other.
"""

from __future__ import annotations

import select
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import outcome
import trio

if TYPE_CHECKING:
    from .connection import Connection

#: whether reads can be shared (Linux): elsewhere each connection reads itself
_EPOLL = hasattr(select, "epoll")

#: what the shared reader does with one read of a connection: None, or an
#: awaitable its callback returned (which the connection's own task awaits)
ReadOne: TypeAlias = Callable[[], Awaitable[None] | None]

__all__ = ["Flushed", "Multiplexer"]


class Flushed(Protocol):
    """What the shared flusher needs of a connection: the connection's
    internal API for it (:class:`~trionsq.connection.Connection` has it)."""

    def mux_write(self) -> None:
        """Write what is queued now, as the connection's writer would."""

    def mux_released(self) -> None:
        """The flusher no longer writes for it: its own writer takes over."""


class _Reading:
    """A connection the shared reader reads: its socket and its parked task."""

    __slots__ = ("conn", "fd", "read_one", "task")

    def __init__(self, conn: Connection, fd: int, read_one: ReadOne, task: trio.lowlevel.Task):
        self.conn = conn
        self.fd = fd
        self.read_one = read_one
        self.task = task


class Multiplexer:
    """The shared flusher and reader of a set of connections (see the
    module's docstring).

    Run :meth:`run` in a task for as long as the connections may use it, and
    pass the multiplexer to :meth:`Connection.run
    <trionsq.connection.Connection.run>`.  When :meth:`run` ends, the
    connections still using it fall back to their own reader and writer.
    """

    def __init__(self) -> None:
        # Connections with commands queued for the flusher, in queueing order.
        self._dirty: list[Flushed] = []
        self._flusher: trio.lowlevel.Task | None = None  # parked, waiting for work
        #: whether the flusher still takes work (False once :meth:`run` ended)
        self.running = True
        # The reader's epoll object, while run() runs, and the sockets in it.
        self._epoll: select.epoll | None = None
        self._readings: dict[int, _Reading] = {}

    # --- writing ---

    def flush_later(self, conn: Flushed) -> None:
        """Have ``conn``'s queued commands written in the flusher's next turn
        (called once per batch: when a command is queued while its writer is
        idle; the connection then queues further commands behind it)."""
        if not self.running:
            conn.mux_released()  # no flusher any more: its own writer writes
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
    async def _flush_loop(self) -> None:
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
                conn.mux_write()

    # --- reading ---

    @property
    def reads(self) -> bool:
        """Whether connections may leave their reads to the shared reader now."""
        return self._epoll is not None

    async def read_for(
        self, conn: Connection, fd: int, read_one: ReadOne
    ) -> Awaitable[None] | None:
        """Park the calling task (``conn``'s reader) while the shared reader
        reads ``fd``, calling ``read_one()`` each time it is readable.

        Raises what ``read_one`` raised (the socket is out of the reader by
        then); returns the awaitable it returned (the connection awaits it,
        then calls this again), or None when the multiplexer ended (the
        connection reads on its own from then on).  Cancelled, the socket
        leaves the reader at once.
        """
        epoll = self._epoll
        if epoll is None:
            await trio.lowlevel.checkpoint()
            return None
        reading = _Reading(conn, fd, read_one, trio.lowlevel.current_task())
        epoll.register(fd, select.EPOLLIN)
        self._readings[fd] = reading

        def abort(raise_cancel: Any) -> trio.lowlevel.Abort:
            self._forget(reading)
            return trio.lowlevel.Abort.SUCCEEDED

        result: Awaitable[None] | None = await trio.lowlevel.wait_task_rescheduled(abort)
        return result

    def stop_reading(self, fd: int) -> None:
        """Take ``fd`` out of the reader before its socket is closed (its number
        may be the next socket's at once); the connection's parked task
        returns (as its own reader does after a close, with nothing to say)."""
        reading = self._readings.get(fd)
        if reading is not None and self._forget(reading):
            trio.lowlevel.reschedule(reading.task, outcome.Error(trio.ClosedResourceError()))

    def _forget(self, reading: _Reading) -> bool:
        """Unregister ``reading``'s socket; whether it was still registered."""
        if self._readings.get(reading.fd) is not reading:
            return False
        del self._readings[reading.fd]
        if self._epoll is not None:
            try:
                self._epoll.unregister(reading.fd)
            except (OSError, ValueError):
                pass  # closed already: the kernel has dropped it
        return True

    @trio.lowlevel.enable_ki_protection
    async def _read_loop(self, epoll: select.epoll) -> None:
        wait_readable = trio.lowlevel.wait_readable
        poll = epoll.poll
        epoll_fd = epoll.fileno()
        readings = self._readings
        while True:
            # A checkpoint: between two rounds of reads, every other task
            # runs (the ones the last round woke among them).
            await wait_readable(epoll_fd)
            for fd, _ in poll(0):
                reading = readings.get(fd)
                if reading is None:
                    continue  # left the reader during this round
                try:
                    waiting = reading.read_one()
                except BaseException as exc:  # everything goes to its own task
                    if self._forget(reading):
                        trio.lowlevel.reschedule(reading.task, outcome.Error(exc))
                    continue
                if waiting is not None and self._forget(reading):
                    # Its callback has something to wait for: the connection's
                    # own task waits, not the reader (the others go on).
                    trio.lowlevel.reschedule(reading.task, outcome.Value(waiting))

    # --- running ---

    @trio.lowlevel.enable_ki_protection
    async def run(self) -> None:
        """Flush and read for the connections until cancelled (KI-protected,
        as the connections' own loops are)."""
        epoll = select.epoll() if _EPOLL else None
        try:
            async with trio.open_nursery() as nursery:
                if epoll is not None:
                    self._epoll = epoll
                    nursery.start_soon(self._read_loop, epoll)
                await self._flush_loop()
        finally:
            self.running = False
            self._flusher = None
            dirty, self._dirty = self._dirty, []
            for conn in dirty:
                conn.mux_released()
            readings = list(self._readings.values())
            for reading in readings:
                if self._forget(reading):
                    trio.lowlevel.reschedule(reading.task, outcome.Value(None))
            self._epoll = None
            if epoll is not None:
                epoll.close()
