"""Blocking publishes done by the calling thread: the sync driver of the publish core.

A blocking ``publish()`` costs a round trip and little more when the thread that
calls it writes the command and reads the answer itself, on a blocking socket,
with no hop to another thread (the hosted producer's Trio thread costs two
thread switches a call).  This module drives :class:`~trionsq.publishing.PublishCore`
and :class:`~trionsq.publishing.Answers` that way:

- :class:`~trionsq.link.Link`: one handshaken nsqd connection on a blocking socket: the
  handshake (:mod:`trionsq.protocol.handshake`: TLS through an in-memory
  :class:`ssl.SSLObject`, snappy or deflate through :mod:`trionsq.protocol.codecs`,
  AUTH), then bytes out and bytes in.
- :class:`DirectConnection`: publishes on one link.  A thread alone on it
  takes the lean path: it writes its command, reads, and compares the
  answer with ``OK`` as a raw socket loop does, holding the connection's
  lock for that round trip (no queue, no slot, no wake-ups; a thread that
  comes meanwhile waits for the lock, within its ``timeout`` if it has one);
  anything else that comes (a heartbeat first, an error frame, the end of
  the stream) is read again by the general path.  Threads publishing on it
  at once are pipelined: a publish queues its command and the answer it
  awaits (one order, under a short lock); one thread at a time leads: it
  writes every command queued (its own and those of the threads that
  queued while it read) in one write, reads the answers for every publish
  in flight, hands each to its thread, and once its own has come hands the
  lead on to the oldest publish still waiting (leader/follower).
- :class:`~trionsq.blocking.pool.DirectPublisher` (its own module): the
  producer's side: a pool of connections (a
  publishing thread takes one nobody publishes on, or opens one up to
  ``max_connections``, and puts it back; past the cap threads share busy
  ones, pipelined), which nsqd (failover through
  :class:`~trionsq.publishing.Rotation`), reconnecting, the counters, and a
  keeper thread that sends ``NOP`` on a connection idle for half a
  heartbeat interval (nsqd closes a connection silent for two).

What a caller may assume when a connection dies during its call:

- A command is never left half-written for the next caller: a write that
  fails or is interrupted part-way ends the connection at once (nsqd never
  executes a command cut short), and the next publish opens a new one.
- A publish whose command was not wholly written (the write failed before
  its last byte, or the connection was found dead, or ended, while it was
  queued) was not published: it is retried once on a new connection
  (failing over; not on another idle one of the pool, which may have died
  with the first), so the caller does not see it; when that fails too it
  raises :class:`~trionsq.publishing.NotPublishedError`.  In a write of
  several threads' commands, those wholly written before the failure are
  written ones (below), the rest not written.
- A write interrupted (``KeyboardInterrupt`` in the main thread) ends the
  connection likewise; the interrupt goes on to the caller, with no promise
  on that publish nor on the others of the same write (a signal is looked at
  once a send returned: they may have been written whole), as if written:
  none is retried.
- A publish written whole whose answer never came raises
  :class:`~trionsq.ConnectionClosedError`: nsqd may or may not have
  published it (never retried: that could publish it twice).  Those written
  after a publish nsqd refused raise ``NotPublishedError`` (nsqd closes the
  connection after an error frame without executing what follows).
"""

from __future__ import annotations

import select
import threading
import time

from ..connection import ConnectionClosedError
from ..link import Link
from ..protocol import commands
from ..protocol.errors import NSQError, NSQErrorResponse
from ..publishing import OK_FRAME, Answers, Counters, NotPublishedError
from ..reasons import reason

__all__ = ["DirectConnection", "NotWrittenError"]

#: a connection nothing was read from for this long is looked at before a
#: publish is written on it (nsqd may have closed it meanwhile: then the
#: publish goes to a new connection, certainly not published twice)
_IDLE_CHECK = 1.0
_NOP = commands.nop()
_monotonic = time.monotonic


class NotWrittenError(NotPublishedError):
    """This publish's command was not written whole (the connection was over
    before it, or its write failed part-way): certainly not published."""


class _Deadline(Exception):
    """The caller's own ``timeout`` passed while it read (not the connection's fault)."""


class _Slot:
    """One publish awaiting its answer (the completion :class:`Answers` hands
    it to): its thread sleeps on ``wake`` unless it is the reader."""

    __slots__ = ("done", "error", "gone", "lead", "wake", "woken")

    def __init__(self) -> None:
        self.wake: threading.Lock | None = None
        #: where the leader collects the wake-ups of the answers it hands out
        #: (a follower's: see DirectConnection._wake_answered)
        self.woken: list[threading.Lock] | None = None
        self.error: BaseException | None = None
        self.done = False
        self.lead = False  # handed the reading
        self.gone = False  # its thread gave up waiting (timeout, interrupt)

    def set_result(self, value: None) -> None:
        self.done = True
        wake = self.wake
        if wake is not None:
            self.woken.append(wake)  # type: ignore[union-attr]

    def set_exception(self, error: BaseException) -> None:
        self.error = error
        self.done = True
        wake = self.wake
        if wake is not None:
            _release(wake)


_thread_wakes = threading.local()


def _wake_lock() -> threading.Lock:
    """The calling thread's lock to sleep on as a follower, held (one a
    thread, reused: a thread follows one publish at a time).  A release
    meant for a publish of its past may come late: its sleep then wakes
    early and looks at its slot, as any wake-up does."""
    try:
        wake: threading.Lock = _thread_wakes.lock
    except AttributeError:
        wake = _thread_wakes.lock = threading.Lock()
    wake.acquire(blocking=False)
    return wake


def _release(lock: threading.Lock) -> None:
    try:
        lock.release()
    except RuntimeError:  # released already (woken twice: it looks at its slot)
        pass


class DirectConnection:
    """Publishes from any threads on one :class:`Link`, pipelined; the calling
    threads do the I/O (see the module's description)."""

    def __init__(self, link: Link, counters: Counters | None = None) -> None:
        self.link = link
        self.address = link.address
        #: guards the queue (commands and the answers awaited, one order) and
        #: the roles; never held across I/O but the rare NOP of an idle one
        self._lock = threading.Lock()
        #: what this connection's answers counted (its reader alone counts:
        #: each connection its own, summed by the publisher)
        self.counters = Counters() if counters is None else counters
        self.answers: Answers[_Slot] = Answers(self.counters, link.config.max_frame_size)
        #: whether a thread holds the lead (the writing and the reading; read
        #: without the lock: a hint)
        self.reading = False
        #: why the connection ended (None while it lives)
        self.over: BaseException | None = None
        #: writes so far (the keeper looks whether it moves)
        self.writes = 0
        #: publishes queued on this connection so far (flush's and close's marks)
        self.queued = 0
        #: when an answer (or a heartbeat) was read last (the idle check's
        #: and the keeper's clock)
        self.last_read = time.monotonic()
        #: the socket, for the lean path (None: TLS or compression)
        self._plain = None if link.transformed else link.sock
        #: commands queued and not yet taken by the leader's write: the last
        #: ``len(_unsent)`` publishes of ``answers.waiting``
        self._unsent: list[bytes] = []
        self._nops = 0  # heartbeats to answer at the next write
        #: the followers whose answers the leader read, to wake before its
        #: next system call (see _wake_answered)
        self._woken: list[threading.Lock] = []
        #: (mark, lock) of threads waiting until the publishes queued before
        #: their mark have their outcome (flush, close)
        self._watchers: list[tuple[int, threading.Lock]] = []
        #: a lean publish is on its round trip (it holds the lock meanwhile)
        self._leaning = False

    def publish(self, data: bytes, batch: int, timeout: float | None) -> None:
        """Write ``data`` (a publish of ``batch``, see :class:`PublishCore`) and
        return once nsqd acknowledged it; raises nsqd's error, a
        ConnectionClosedError (may have been published), NotPublishedError
        (certainly not), :class:`NotWrittenError` (not written: the caller may
        send it elsewhere) or TimeoutError."""
        if timeout is not None or self._plain is None:
            self._publish(data, batch, timeout)
            return
        now = _monotonic()
        lock = self._lock
        # (From here to the write, no call: an interrupt, raised at a call,
        # cannot leave the lock held with nobody on the path.)
        lock.acquire()
        answers = self.answers
        if (
            self.reading
            or self.over is not None
            or answers.waiting
            or answers.partial
            or self._nops
            or now - self.last_read > _IDLE_CHECK
        ):
            lock.release()
            self._publish(data, batch, timeout)
            return
        # The lean path: alone on a plain connection, live and read lately,
        # no timeout of its own: write, read, compare with OK (as a raw
        # socket loop does), all under the lock: nobody else can queue,
        # read or look meanwhile (a thread sharing the connection waits one
        # round trip for the lock; the keeper skips it; close shuts the
        # socket under it, see close), so nothing else is kept: no slot
        # queued, no lead taken.  Nobody led before, so nothing was put back
        # to read again: the link's receive is the socket's recv itself.
        # Whatever else happens (an error, anything but OK) goes to the
        # general path, as if this publish had queued and led.
        self.queued += 1  # (a flush's mark taken meanwhile counts it)
        self._leaning = True
        try:
            self._plain.sendall(data)
        except BaseException as exc:
            slot = self._lean_failed(batch)
            self.link.sent_whole = 0  # (one command: not whole, or unknown for an interrupt)
            self._write_failed(exc, 1, 0)
            if not isinstance(exc, Exception):
                raise
            raise slot.error or NotWrittenError(self.address) from exc
        try:
            got = self.link.receive()
        except BaseException as exc:
            self.writes += 1
            slot = self._lean_failed(batch)
            self._lead_failed(exc)
            if not isinstance(exc, Exception):
                raise
            raise slot.error or _closed(self.address, exc) from None
        self.writes += 1
        if got == OK_FRAME:
            self.last_read = now
            counters = self.counters  # (as Answers.received counts an OK)
            counters.published += batch or 1
            if batch:
                counters.batches += 1
            self._leaning = False
            lock.release()
            return
        # Anything else (a heartbeat first, an error frame, the end): the
        # general reader reads it again.
        self.link.put_back(got)
        slot = self._lean_failed(batch)
        self._lead(slot, None, written=True)
        if slot.error is not None:
            raise slot.error

    def _lean_failed(self, batch: int) -> _Slot:
        """(Under the lock, taken by the lean path) the lean publish leaves
        its path: queued as if by the general path, its thread leading, the
        lock released."""
        slot = _Slot()
        self.answers.waiting.append((slot, batch))
        self.reading = True
        self._leaning = False
        self._lock.release()
        return slot

    def _publish(self, data: bytes, batch: int, timeout: float | None) -> None:
        """:meth:`publish`'s general path (shared, pipelined)."""
        slot = _Slot()
        lock = self._lock
        lead = False
        nops = 0
        if timeout is None:
            lock.acquire()
        else:
            # (A lean publish holds the lock for its round trip.)
            start = _monotonic()
            if not lock.acquire(timeout=timeout):
                raise TimeoutError(
                    f"{self.address}: busy for {timeout} s (not written: not published)"
                )
            timeout = max(timeout - (_monotonic() - start), 0.0)
        try:
            if self.over is not None:
                raise NotWrittenError(f"{self.address}: the connection is over")
            lead = not self.reading
            if lead:
                self.reading = True
                if not self.answers.waiting and self._idle():
                    self._look()  # nothing read for a while: nsqd may have closed it
            else:
                slot.wake = _wake_lock()
                slot.woken = self._woken
            # Queued for the leader's next write (this thread's, if it leads);
            # its answer awaited in the same order.
            self.answers.waiting.append((slot, batch))
            unsent = self._unsent
            unsent.append(data)
            self.queued += 1
            if lead:  # (what it writes first, taken now: one turn of the lock)
                self._unsent = []
                nops, self._nops = self._nops, 0
        except BaseException as exc:
            # Whatever cut this short (an error, an interrupt between two
            # steps) ends the connection, unless it ended already: no lead
            # left taken by nobody.
            if self.over is None:
                self._end_locked(NotWrittenError(f"{self.address}: {reason(exc)}"), exc)
            if not isinstance(exc, Exception) or isinstance(exc, NotWrittenError):
                raise
            if slot.error is not None:
                raise slot.error from exc
            raise NotWrittenError(f"{self.address}: {reason(exc)}") from exc
        finally:
            lock.release()
        if lead:
            self._lead(slot, timeout, unsent, nops)
        else:
            self._follow(slot, timeout)
        if slot.error is not None:
            raise slot.error

    # --- writing ---

    def _write_unsent(self) -> None:
        """The leader's write of every command queued (its followers' with its
        own), with the NOPs owed (see :meth:`_write`)."""
        with self._lock:
            commands = self._unsent
            self._unsent = []
            nops, self._nops = self._nops, 0
        if commands or nops:
            self._write(commands, nops)

    def _write(self, commands: list[bytes], nops: int) -> None:
        """The leader's write of ``commands`` taken from the queue (with
        ``nops`` NOPs first) in one write, outside the lock (only the leader
        writes).  Cut short (an error, an interrupt), the connection
        ends: the commands not written whole fail with NotWrittenError (nsqd
        never executes a command cut short once the connection ends), the
        ones before them as written (unanswered: they may have been
        published); an interrupt leaves the write's own commands unknown,
        all as written.  nsqd's refusal found by the leader after a failed
        write (see :meth:`_answers_left`) fails its publish with it."""
        count = len(commands)
        if nops:
            commands = [_NOP] * nops + commands
        try:
            self.link.send(commands)
        except BaseException as exc:
            self._write_failed(exc, count, nops)
            raise
        self.writes += 1

    def _write_failed(self, exc: BaseException, count: int, nops: int) -> None:
        """A leader's write of ``count`` publishes (after ``nops`` NOPs) failed
        with ``exc``: the connection ends (see :meth:`_write`)."""
        with self._lock:
            if self.over is None:
                written = max(self.link.sent_whole - nops, 0)
                cut = None
                if isinstance(exc, Exception) and written < count:
                    # Those after the one cut short (this write's, then the
                    # queued): not written.  The one cut short stays while
                    # nsqd's answers are read: nsqd may have refused it
                    # (E_BAD_MESSAGE before its body) before it closed.
                    self._fail_unsent(count - written - 1 + len(self._unsent), exc)
                    cut = self.answers.waiting[-1][0] if self.answers.waiting else None
                refusal = self._answers_left() if isinstance(exc, OSError) else None
                if cut is not None and not cut.done:
                    self._fail_unsent(1, exc)
                self._end_locked(
                    NotWrittenError(f"{self.address}: the write failed ({reason(exc)})"),
                    refusal or exc,
                )

    def _fail_unsent(self, count: int, exc: BaseException) -> None:
        """(Under the lock) the last ``count`` publishes awaited were not
        written whole: they fail with NotWrittenError (their callers may send
        them elsewhere), and the queue of unsent commands empties."""
        self._unsent = []
        waiting = self.answers.waiting
        error = NotWrittenError(f"{self.address}: not written ({reason(exc)})")
        for _ in range(min(count, len(waiting))):
            slot, _ = waiting.pop()
            slot.set_exception(error)

    def _write_locked(self, data: bytes) -> None:
        """A NOP, written under the lock while nobody leads (a write of
        nothing else)."""
        try:
            self.link.send([data])
        except BaseException as exc:
            self._end_locked(
                NotWrittenError(f"{self.address}: the write failed ({reason(exc)})"), exc
            )
            raise
        self.writes += 1

    def _answers_left(self) -> Exception | None:
        """After a write failed, by the connection's reader: the answers nsqd
        sent before it ended the connection, as far as they can be read now.
        nsqd answers a command it refuses before reading its body (a body
        over --max-msg-size: E_BAD_MESSAGE) and closes; the body's bytes it
        never read make its close a reset, which fails the write, while its
        answer waits to be read.  Returns the error an error frame raised
        (its publish failed with it), else None."""
        link = self.link
        try:
            while link.readable_now():
                data = link.receive()
                if not data:
                    if link.transformed and not link.closed_by_peer:
                        continue
                    return None
                self.answers.received(data)
        except Exception as exc:  # nsqd's error (its publish failed), or the end
            return exc if isinstance(exc, NSQErrorResponse) else None
        return None

    def _idle(self) -> bool:
        return time.monotonic() - self.last_read > _IDLE_CHECK

    def _look(self) -> None:
        """Read what waits on an idle connection before writing on it (under
        the lock, as its reader): heartbeats get their NOP; the end of the
        stream or an error ends it (raising: nothing was written yet)."""
        link = self.link
        while link.readable_now():
            data = link.receive()
            if not data:
                if link.transformed and not link.closed_by_peer:
                    continue
                raise ConnectionClosedError(f"{self.address}: nsqd closed the connection")
            heartbeats = self.answers.received(data)
            self.last_read = time.monotonic()
            for _ in range(heartbeats):
                self._write_locked(_NOP)

    def alive(self) -> bool:
        """Whether the connection lives, as far as can be told without
        waiting: an idle one that nobody reads is looked at (an nsqd that
        closed it is noticed here, not at the next publish)."""
        if self.over is None and self._lock.acquire(blocking=False):
            try:
                self._look_if_idle()
            finally:
                self._lock.release()
        return self.over is None

    def keep_alive(self) -> None:
        """The keeper's call, when nothing was written for a heartbeat
        interval: read what waits if nobody reads, and send a NOP (nsqd
        closes a connection silent for two intervals)."""
        if not self._lock.acquire(blocking=False):
            return  # somebody is queueing: the connection is not idle
        try:
            if self.reading:
                return  # a leader writes and reads: not idle
            self._look_if_idle()
            if self.over is None:
                self._write_locked(_NOP)
        except Exception as exc:
            if self.over is None:
                self._end_locked(_closed(self.address, exc), exc)
        finally:
            self._lock.release()

    def _look_if_idle(self) -> None:
        """:meth:`_look` (under the lock) if nobody reads and nothing waits for
        an answer; what it finds wrong ends the connection."""
        if self.over is not None or self.reading or self.answers.waiting:
            return
        self.reading = True
        try:
            self._look()
        except Exception as exc:
            if self.over is None:
                self._end_locked(_closed(self.address, exc), exc)
        finally:
            self.reading = False

    # --- leading: writing what is queued and reading (one thread at a time) ---

    def _lead(
        self,
        slot: _Slot,
        timeout: float | None,
        first: list[bytes] | None = None,
        nops: int = 0,
        written: bool = False,
    ) -> None:
        """Write what is queued (``first``, taken from the queue already, then
        the followers' commands) and read answers, for every publish in
        flight, until ``slot``'s has come; then hand the lead on.  What
        followers queue while the leader reads goes out in its next write,
        all at once."""
        link, answers = self.link, self.answers
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            if written:  # (the lean path wrote it)
                pass
            elif first is None:  # (handed the lead: what is queued, taken now)
                self._write_unsent()
            else:
                self._write(first, nops)
            while not slot.done:
                if deadline is not None and not _wait_readable(link, deadline):
                    raise _Deadline
                data = link.receive()
                if not data:
                    if link.transformed and not link.closed_by_peer:
                        continue  # a TLS record or compressed chunk not complete yet
                    raise ConnectionClosedError(f"{self.address}: nsqd closed the connection")
                self._nops += answers.received(data)
                if self._woken:
                    self._wake_answered()
                if self._watchers:
                    self._wake_watchers()
                if self._unsent or self._nops:
                    self._write_unsent()
            self.last_read = time.monotonic()
        except _Deadline:
            slot.gone = True
            self._hand_on()
            raise TimeoutError(
                f"nsqd did not answer within {timeout} s (it may still publish)"
            ) from None
        except BaseException as exc:
            self._lead_failed(exc)
            if not isinstance(exc, Exception):
                raise
            return
        self._hand_on()

    def _lead_failed(self, exc: BaseException) -> None:
        """The leader's read failed with ``exc``: the connection is over
        (nsqd's error frame failed its publish and those after it already;
        the end of the stream, an error, an interrupt fail the rest as not
        answered)."""
        with self._lock:
            self._end_locked(_closed(self.address, exc), exc)

    def _follow(self, slot: _Slot, timeout: float | None) -> None:
        """Sleep until the leader hands ``slot`` its answer, or the lead."""
        wake = slot.wake
        assert wake is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                if deadline is None:
                    woken = wake.acquire()
                else:
                    woken = wake.acquire(timeout=max(deadline - time.monotonic(), 0.0))
            except BaseException:
                self._give_up(slot)
                raise
            if slot.done:
                return
            if not woken:
                self._give_up(slot)
                if slot.done:
                    return
                raise TimeoutError(f"nsqd did not answer within {timeout} s (it may still publish)")
            if slot.lead:
                left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
                self._lead(slot, left)
                return

    def _wake_answered(self) -> None:
        """Wake the followers whose answers a read handed out, all at once
        after it (the leader goes on to its next system call at once, which
        lets them have the GIL), not one at a time while it hands out the
        rest."""
        woken = self._woken  # (the slots hold it: emptied, not replaced)
        pop = woken.pop  # (one at a time: close() may empty it meanwhile)
        while woken:
            try:
                wake = pop()
            except IndexError:
                return
            _release(wake)

    def _give_up(self, slot: _Slot) -> None:
        with self._lock:
            slot.gone = True
            promoted = slot.lead and not slot.done
        if promoted:
            self._hand_on()

    def _hand_on(self) -> None:
        """Give the lead to the oldest publish still waiting whose thread
        waits (it writes what is queued, then reads); with none, nobody leads
        until the next publish."""
        if self._woken:
            self._wake_answered()
        with self._lock:
            self.reading = False
            if self.over is not None:
                return
            for waiting, _ in self.answers.waiting:
                if not waiting.gone and waiting.wake is not None:
                    waiting.lead = True
                    self.reading = True
                    _release(waiting.wake)
                    return
            if self._watchers:
                self._wake_watchers_locked()

    # --- waiting for outcomes (flush, close) ---

    def settled(self) -> int:
        """How many of the publishes queued so far have their outcome (answered
        or failed; under the lock: a lean publish holds it until its outcome)."""
        return self.queued - len(self.answers.waiting)

    def in_flight(self) -> int:
        """Publishes awaiting their answer here (a lean one among them)."""
        return len(self.answers.waiting) + self._leaning

    def wait_settled(self, mark: int, timeout: float | None) -> bool:
        """Wait until the first ``mark`` publishes queued here have their
        outcome, or the connection ended; False if ``timeout`` passed first."""
        deadline = None if timeout is None else _monotonic() + max(timeout, 0.0)
        if not self._lock.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
            return False  # a lean publish still awaits its answer
        try:
            if self.over is not None or self.settled() >= mark:
                return True
            wake = threading.Lock()
            wake.acquire()
            self._watchers.append((mark, wake))
        finally:
            self._lock.release()
        left = -1.0 if deadline is None else max(deadline - _monotonic(), 0.0)
        if wake.acquire(timeout=left):
            return True
        with self._lock:
            if (mark, wake) in self._watchers:
                self._watchers.remove((mark, wake))
            return self.over is not None or self.settled() >= mark

    def _wake_watchers(self) -> None:
        with self._lock:
            self._wake_watchers_locked()

    def _wake_watchers_locked(self) -> None:
        settled, ended = self.settled(), self.over is not None
        keep = []
        for mark, wake in self._watchers:
            if ended or settled >= mark:
                wake.release()
            else:
                keep.append((mark, wake))
        self._watchers = keep

    # --- the end ---

    def _end_locked(self, error: ConnectionClosedError, cause: BaseException) -> None:
        """End the connection (under the lock) for ``cause``: the publishes
        queued and not taken by a write fail with NotWrittenError, the others
        in flight with ``error`` as a ConnectionClosedError (written, or being
        written: they may have been published).  nsqd's refusal (``cause``)
        is kept as :attr:`over`: it says nothing against nsqd itself
        (failover)."""
        if self._woken:  # (answers read before the end: their threads go on)
            self._wake_answered()
        if self.over is not None:
            return
        self.over = cause if isinstance(cause, NSQErrorResponse) else error
        if self._unsent:
            self._fail_unsent(len(self._unsent), cause)
        others = ConnectionClosedError(str(error)) if type(error) is NotWrittenError else error
        others.__cause__ = cause if cause is not error else None
        self.answers.end(others)
        self.reading = False
        self.link.shut()
        if self._watchers:
            self._wake_watchers_locked()

    def close(self, error: ConnectionClosedError) -> None:
        """End the connection: the publishes on it fail with ``error``.  A lean
        publish holds the lock for its round trip: the socket is shut under
        it first (its write or read fails at once, and it leaves the lock)."""
        if not self._lock.acquire(blocking=False):
            self.link.shut()
            self._lock.acquire()
        try:
            self._end_locked(error, error)
        finally:
            self._lock.release()


def _closed(address: str, exc: BaseException) -> ConnectionClosedError:
    """What the publishes in flight fail with when ``exc`` ended their connection."""
    if isinstance(exc, ConnectionClosedError):
        return exc
    if isinstance(exc, NSQError):  # nsqd's refusal: its publish failed with it
        return NotPublishedError(f"not published: nsqd refused a publish before it ({exc})")
    if isinstance(exc, BlockingIOError):
        return ConnectionClosedError(f"{address}: no answer within read_timeout")
    return ConnectionClosedError(f"{address}: {reason(exc) or type(exc).__name__}")


def _wait_readable(link: Link, deadline: float) -> bool:
    if link.readable_now():
        return True
    left = deadline - time.monotonic()
    if left <= 0:
        return False
    ready, _, _ = select.select([link.sock], [], [], left)
    return bool(ready)
