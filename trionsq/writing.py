"""A connection's write path: commands queued, requests matched to their
answers, the writer, and a producer's socket lent to a lone requester.

Commands are appended to one buffer that one writer sends (its own task, or
the consumer's shared flusher: :mod:`trionsq.multiplex`), many commands in one
write when they pile up; a request's place in the queue of answers is taken in
the same step as its bytes, so the two orders agree.  Every command queued
meets the protocol's state table first (:mod:`trionsq.protocol.states`).
:class:`Writing` holds these for :class:`~trionsq.connection.Connection`,
which inherits them; the writer's state and the socket's loan are one state
each (:class:`Writer`, :class:`Loan`), moved along their tables.
"""

from __future__ import annotations

import math
import os
from collections import deque
from typing import TYPE_CHECKING, Any

import trio

from .config import Config
from .handshake import RECEIVE_SIZE, NSQConnectionError
from .lifecycle import CLOSED, OPEN, Life, Lifecycle, Moves, State
from .message import cancel_may_be_pending
from .protocol import states
from .protocol.frames import FRAME_TYPE_RESPONSE, OK, encode_frame

if TYPE_CHECKING:
    from .multiplex import Multiplexer

__all__ = [
    "HIGH_WATER",
    "LOAN_MOVES",
    "OK_FRAME",
    "WRITER_MOVES",
    "ConnectionClosedError",
    "Loan",
    "PendingResponse",
    "Writer",
    "Writing",
]

#: queued bytes above which senders wait for the writer (backpressure)
HIGH_WATER = 1024 * 1024
#: an ``OK`` response frame, as nsqd sends it
OK_FRAME = encode_frame(FRAME_TYPE_RESPONSE, OK)
OK_FRAME_SIZE = len(OK_FRAME)
#: how long a producer's reader leaves its socket to a lone requester (see
#: Connection._lend) before it looks whether anyone still reads it
_LEND_PERIOD = 0.05


class ConnectionClosedError(NSQConnectionError):
    """The connection ended before the request got its response."""


class Loan(State):
    """Who reads a producer's socket (see :meth:`Connection.request`)."""

    #: the reader task watches the socket (it may not be parked right now)
    READING = "reading"
    #: the reader is parked and lends the socket: the next lone request may
    #: write and read its own answer
    LENT = "lent"
    #: the reader is parked and a requester waits on the socket for its answer
    BORROWED = "borrowed"


READING, LENT, BORROWED = Loan.READING, Loan.LENT, Loan.BORROWED

#: The loan's moves: the reader lends the socket and takes it back (at the end
#: of a lending period with nobody on it, or given back); a lone request
#: borrows it and gives it back (its answer read: LENT again; anything else
#: read, or more requests queued meanwhile: the reader reads again).
LOAN_MOVES = Moves(
    "Connection loan",
    READING,
    {READING: {LENT}, LENT: {READING, BORROWED}, BORROWED: {LENT, READING}},
)


class Writer(State):
    """Where the connection's writes are (see :meth:`Connection.send_nowait`)."""

    #: parked with nothing queued: the first command queued arranges a write
    #: (wakes the writer task, or hands the connection to the multiplexer)
    IDLE = "idle"
    #: a write is arranged (or the writer is about to look at the buffer):
    #: commands queued now go with it
    BUSY = "busy"
    #: the writer task is sending a buffer it took (:meth:`Connection.flush`
    #: waits for it)
    WRITING = "writing"


IDLE, BUSY, WRITING = Writer.IDLE, Writer.BUSY, Writer.WRITING

#: The writer's moves.  It starts BUSY: commands queued before it runs are
#: found when it comes round.
WRITER_MOVES = Moves(
    "Connection writer",
    BUSY,
    {IDLE: {BUSY}, BUSY: {IDLE, WRITING}, WRITING: {BUSY}},
)


class PendingResponse:
    """A request's response to come (see :meth:`Connection.request_nowait`).

    No :class:`trio.Event` per request: the first task awaiting :meth:`result`
    parks itself and the reader reschedules it directly (one pipelined publish
    costs one wake-up, nothing more).  A waiter that is cancelled leaves the
    pending in the connection's queue: its response is still taken off in
    order when it comes, and dropped, so later responses meet their requests.
    """

    __slots__ = ("_event", "_task", "done", "error", "value")

    def __init__(self) -> None:
        self.value = b""
        self.error: BaseException | None = None
        #: whether the response (or the connection's end) has arrived
        self.done = False
        self._task: trio.lowlevel.Task | None = None  # the parked waiter
        self._event: trio.Event | None = None  # for further waiters (rare)

    def _abort(self, raise_cancel: Any) -> trio.lowlevel.Abort:
        self._task = None  # cancelled: the response, when it comes, is dropped
        return trio.lowlevel.Abort.SUCCEEDED

    async def wait(self) -> None:
        """Wait until :attr:`done` (a checkpoint, like :meth:`trio.Event.wait`)."""
        if self.done:
            await trio.lowlevel.checkpoint()
        elif self._task is None:
            self._task = trio.lowlevel.current_task()
            await trio.lowlevel.wait_task_rescheduled(self._abort)
        else:
            if self._event is None:
                self._event = trio.Event()
            await self._event.wait()

    @property
    def event(self) -> trio.Event:
        """A :class:`trio.Event` set when :attr:`done` (made on first use)."""
        if self._event is None:
            self._event = trio.Event()
            if self.done:
                self._event.set()
        return self._event

    async def result(self) -> bytes:
        """Wait for the response; an error frame raises its typed error, the
        connection's end :class:`ConnectionClosedError`."""
        await self.wait()
        if self.error is not None:
            raise self.error
        return self.value

    def set(self, value: bytes) -> None:
        self.value = value
        self.done = True
        task = self._task
        if task is not None:
            self._task = None
            trio.lowlevel.reschedule(task)
        if self._event is not None:
            self._event.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.set(b"")


class Writing:
    """The write path's steps, for :class:`~trionsq.connection.Connection`
    (which inherits them, and sets these attributes up)."""

    address: str
    config: Config
    life: Lifecycle[Life]
    writer: Lifecycle[Writer]
    loan: Lifecycle[Loan]
    state: states.ConnState
    _watched: frozenset[int]
    _stream: trio.abc.Stream
    _out: bytearray
    _wake_writer: trio.Event
    _drained: trio.Event
    _fd: int
    _mux: Multiplexer | None
    _lone: bool
    _reader: trio.lowlevel.Task | None
    _handed: bytes | None
    _read_deadline: float
    _pending: deque[PendingResponse]

    def _follow(self, data: bytes) -> None:
        """The state table, for a command about to be queued: nsqd's error for a
        command not valid in this state (raised here; nothing is sent), else the
        state after it.  A command's state applies from the moment it is queued:
        nsqd reads commands in order and closes the connection when a SUB or
        CLS fails, so every later command meets the state it leads to."""
        name = states.command_name(data)
        states.check(self.state, name)
        after = states.state_after(self.state, name)
        if after is not self.state:
            self.state = after
            self._watched = states.watched(after)

    async def send(self, data: bytes) -> None:
        """Queue a command that gets no response (RDY, FIN, REQ, TOUCH, NOP).

        It is written by the connection's writer task (see :meth:`flush`); if the
        connection is already closed, raises :class:`ConnectionClosedError`.
        """
        # Commands are appended to one buffer that the writer task sends: writes
        # are serialized, several commands go out in one send, and a caller
        # cancelled here never leaves half a command on the wire.
        await trio.lowlevel.checkpoint_if_cancelled()
        while len(self._out) >= HIGH_WATER and self.life.state is OPEN:
            await self._drained.wait()
        self.send_nowait(data)

    def send_nowait(self, data: bytes) -> None:
        """Queue a command that gets no response, without waiting for room.

        For commands whose volume something else bounds, such as a consumer's
        FIN, REQ and RDY (one per message nsqd handed out, or per RDY decision):
        they skip :meth:`send`'s backpressure and its checkpoint.  Raises
        :class:`ConnectionClosedError` if the connection is closed.
        """
        if self.life.state is not OPEN:
            raise ConnectionClosedError(f"{self.address}: connection is closed")
        if data and data[0] in self._watched:
            self._follow(data)
        self._out += data
        if self.writer.state is IDLE:
            self._start_writing()

    async def request(self, data: bytes) -> bytes:
        """Send a command and wait for its response (``OK``, ``CLOSE_WAIT``, JSON).

        An error frame in reply raises its typed error; a connection that ends
        first raises :class:`ConnectionClosedError`.
        """
        # send's steps, inline, with the request's place queued with its bytes.
        if cancel_may_be_pending():
            await trio.lowlevel.checkpoint_if_cancelled()
        while len(self._out) >= HIGH_WATER and self.life.state is OPEN:
            await self._drained.wait()
        if self.life.state is not OPEN:
            raise ConnectionClosedError(f"{self.address}: connection is closed")
        if data and data[0] in self._watched:
            self._follow(data)
        pending = PendingResponse()
        loan = self.loan
        idle = self.writer.state is IDLE
        if loan.state is LENT and not self._pending and not self._out and idle and self._fd >= 0:
            # The reader lent the socket (it answered a lone request last):
            # write, then read the response here, one task step a round trip.
            self._pending.append(pending)
            fd = self._fd
            loan.move(BORROWED)
            self._send_at_once(data)
            return await self._borrow(fd, pending)
        if idle and self._lone and not self._pending and not self._out and self._fd >= 0:
            # Nothing else awaits a response, nothing is queued, and the last
            # read answered one request alone (one task's round trips: MPUB
            # after MPUB): send it from here, no task switch to the writer.
            # Otherwise the writer coalesces what the woken tasks queue.
            self._pending.append(pending)
            if loan.state is LENT:
                self._give_back(None)  # its response is the reader's to read
            self._send_at_once(data)
        else:
            # In the same step as the bytes: responses come back in this order.
            self._pending.append(pending)
            if loan.state is LENT:
                self._give_back(None)
            self._out += data
            if self.writer.state is IDLE:
                self._start_writing()
        # pending.result(), inline: park until the reader hands the response over.
        pending._task = trio.lowlevel.current_task()
        await trio.lowlevel.wait_task_rescheduled(pending._abort)
        if pending.error is not None:
            raise pending.error
        return pending.value

    async def _borrow(self, fd: int, pending: PendingResponse) -> bytes:
        """Wait for the response to a lone request on the socket the reader
        lent: a read of exactly one ``OK`` is the answer; anything else (a
        heartbeat, an error, a piece of a frame, the end) is handed back to
        the reader, which deals with it as with its own read and answers
        ``pending`` (or fails it) in order."""
        handed: bytes | None = None
        self._read_deadline = trio.current_time() + self.config.read_timeout
        try:
            await trio.lowlevel.wait_readable(fd)
            if self._fd == fd:  # else closed meanwhile: the reader finds out how
                try:
                    handed = os.read(fd, RECEIVE_SIZE)
                except OSError:
                    handed = None  # the reader's own read meets the error again
        except trio.ClosedResourceError:
            # The connection ended (and failed this request) under the wait.
            self._read_deadline = math.inf
            self._end_borrow()
            self._give_back(None)
            if pending.error is not None:
                raise pending.error from None
            raise ConnectionClosedError(f"{self.address}: connection closed") from None
        except BaseException:
            # Cancelled: the response, when it comes, is the reader's to
            # drop, in order, as for any request given up.
            self._read_deadline = math.inf
            self._end_borrow()
            self._give_back(None)
            raise
        self._read_deadline = math.inf
        self._end_borrow()
        pendings = self._pending
        if handed == OK_FRAME and pendings and pendings[0] is pending:
            pendings.popleft()
            if pendings:  # others queued requests meanwhile: the reader answers them
                self._give_back(None)
            return OK
        self._give_back(handed)
        if not pending.done:  # (the connection may have ended meanwhile)
            pending._task = trio.lowlevel.current_task()
            await trio.lowlevel.wait_task_rescheduled(pending._abort)
        if pending.error is not None:
            raise pending.error
        return pending.value

    def _end_borrow(self) -> None:
        """A borrower is done waiting on the socket: it is lent again (the
        reader is still parked), unless the reader left meanwhile (the
        connection ended: see :meth:`_lend`)."""
        if self.loan.state is BORROWED:
            self.loan.move(LENT)

    def _give_back(self, data: bytes | None) -> None:
        """End a loan of the socket: the reader reads it again, starting with
        ``data`` (what a requester read and is not the answer it expected).
        While a requester borrows it, the borrower gives it back when it is
        done (it finds what was queued meanwhile): nothing to do now."""
        if data is not None:
            self._handed = data
        if self.loan.state is LENT:
            self.loan.move(READING)
            # Woken once: a reader whose lending period ended in the same
            # scheduler pass is runnable already (not parked) and finds
            # READING when it runs.
            reader, self._reader = self._reader, None
            if reader is not None:
                trio.lowlevel.reschedule(reader)

    def _abort_lend(self, raise_cancel: Any) -> trio.lowlevel.Abort:
        # The lending period is over.  A borrower keeps the socket (the
        # reader parks again at once: see _lend).  Trio reschedules the
        # reader: it is no longer parked, nobody else may wake it.
        self._reader = None
        if self.loan.state is LENT:
            self.loan.move(READING)
        return trio.lowlevel.Abort.SUCCEEDED

    async def _lend(self) -> bytes | None:
        """Leave the socket to lone requesters (see :meth:`request`), each of
        which reads its own response: no wake-up of the reader, then of the
        requester, a round trip.  Returns what a requester handed back, or
        None when the reader must watch the socket again: handed back without
        data, or a period ended with nobody waiting on it (heartbeats, nsqd
        closing the connection), which bounds how long it goes unwatched."""
        reader = trio.lowlevel.current_task()
        loan = self.loan
        loan.move(LENT)
        while True:
            self._reader = reader  # parked: the one to wake (see _give_back)
            with trio.move_on_after(_LEND_PERIOD):
                await trio.lowlevel.wait_task_rescheduled(self._abort_lend)
            # Given back (READING already), or the period is over: with a
            # borrower on the socket, park again (as one step: nobody saw the
            # reader awake), unless the connection ended.
            if loan.state is not BORROWED or self.life.state is not OPEN:
                if loan.state is not READING:
                    loan.move(READING)  # a borrower meets the end itself
                handed, self._handed = self._handed, None
                return handed

    def _send_at_once(self, data: bytes) -> None:
        """Write ``data`` to the socket now, from the calling task, while the
        writer is parked with nothing queued (so the order holds).  A plain
        non-blocking write: no yield, so no cancellation can cut a command in
        half; what the socket does not take (all of it, on an error) goes to
        the writer, which sends it or meets the error and ends the connection."""
        try:
            sent = os.write(self._fd, data)
        except OSError:  # BlockingIOError among them
            sent = 0
        if sent < len(data):
            self._out += memoryview(data)[sent:]
            self._move_writer(BUSY)
            self._wake_writer.set()

    def request_nowait(self, data: bytes) -> PendingResponse:
        """Queue a command that gets a response, without waiting (for room or
        for the response): await the returned :meth:`PendingResponse.result`.

        For the few commands whose volume nothing makes large, such as a
        consumer's CLS, queued in the same step as the commands around it.
        Raises :class:`ConnectionClosedError` if the connection is closed.
        """
        if self.life.state is not OPEN:
            raise ConnectionClosedError(f"{self.address}: connection is closed")
        if data and data[0] in self._watched:
            self._follow(data)
        pending = PendingResponse()
        self._pending.append(pending)
        if self.loan.state is LENT:
            self._give_back(None)  # its response is the reader's to read
        self._out += data
        if self.writer.state is IDLE:
            self._start_writing()
        return pending

    @property
    def backlogged(self) -> bool:
        """Whether the commands queued and not written yet reach the mark
        above which :meth:`send` waits (nsqd is not reading them): a consumer
        then reads no more from this connection (each message read means a
        FIN or REQ to write) until :meth:`wait_for_room`."""
        return len(self._out) >= HIGH_WATER

    async def wait_for_room(self) -> None:
        """Wait until the commands queued are below :attr:`backlogged`'s mark
        (or the connection has ended)."""
        await trio.lowlevel.checkpoint()
        while len(self._out) >= HIGH_WATER and self.life.state is OPEN:
            await self._drained.wait()

    async def flush(self) -> None:
        """Wait until everything queued so far has been written (or the
        connection has ended)."""
        while (self._out or self.writer.state is WRITING) and self.life.state is not CLOSED:
            await self._drained.wait()

    async def _write_loop(self) -> None:
        while True:
            if not self._out:
                self._drained.set()
                self._drained = trio.Event()
                self._wake_writer = trio.Event()
                self._move_writer(IDLE)
                await self._wake_writer.wait()
                # Woken by the first command queued: let the tasks already
                # runnable queue theirs too (the FINs of a read, a RDY, other
                # publishes), so that they go out in one send, not one each.
                await trio.lowlevel.cancel_shielded_checkpoint()
                continue
            # Swap buffers rather than copy: senders append to a fresh one.
            data, self._out = self._out, bytearray()
            self._move_writer(WRITING)
            fd = self._fd
            if fd >= 0:
                # A plain TCP socket: write what it takes now, without
                # send_all's wrappers and the yield after it (a read's FINs
                # are one send: at many connections, one for few messages).
                # The rest, or an error, is send_all's to wait for or raise.
                try:
                    sent = os.write(fd, data)
                except OSError:
                    sent = 0
                if sent < len(data):
                    await self._stream.send_all(memoryview(data)[sent:])
            else:
                await self._stream.send_all(data)
            self._move_writer(BUSY)

    def _move_writer(self, to: Writer) -> None:
        """The writer's one move (:data:`WRITER_MOVES`); a move to where it
        is already is none (woken by a partial write, it is BUSY still)."""
        writer = self.writer
        if writer.state is not to:
            writer.move(to)

    def _start_writing(self) -> None:
        """The first command queued while the writer is idle: have it written,
        by the shared flusher if there is one, else by the writer task (once a
        batch of commands, not once a command)."""
        self._move_writer(BUSY)
        if self._mux is None:
            self._wake_writer.set()
        else:
            self._mux.flush_later(self)

    # The multiplexer's side (trionsq.multiplex, and nothing else, calls
    # these two): the shared flusher writes for the connection, or leaves the
    # writing to its own writer task again.

    def mux_released(self) -> None:
        """For :mod:`trionsq.multiplex` only: it will not write for this
        connection (it ended); the connection's own writer task writes what
        is queued."""
        self._wake_writer.set()

    def mux_write(self) -> None:
        """For :mod:`trionsq.multiplex` only: the shared flusher's turn: write what
        is queued with one non-blocking write, as the writer would.  No yield,
        so no cancellation cuts a command in half; what the socket does not
        take (all of it, on an error) goes to the writer task, which sends it
        or meets the error and ends the connection."""
        fd = self._fd
        if fd < 0:
            return  # closed meanwhile: nothing more is written
        data, self._out = self._out, bytearray()
        if data:
            try:
                sent = os.write(fd, data)
            except OSError:  # BlockingIOError among them
                sent = 0
            if sent < len(data):
                del data[:sent]
                self._out = data
                self._wake_writer.set()  # it is parked, not idle: it takes over
                return
        self._move_writer(IDLE)
        self._drained.set()
        self._drained = trio.Event()
