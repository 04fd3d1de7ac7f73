"""Blocking publishes done by the calling thread: the sync driver of the publish core.

A blocking ``publish()`` costs a round trip and little more when the thread that
calls it writes the command and reads the answer itself, on a blocking socket,
with no hop to another thread (the hosted producer's Trio thread costs two
thread switches a call).  This module drives :class:`~trionsq.publishing.PublishCore`
and :class:`~trionsq.publishing.Answers` that way:

- :class:`~trionsq.blocking.link.Link`: one handshaken nsqd connection on a blocking socket: the
  handshake (:mod:`trionsq.protocol.handshake`: TLS through an in-memory
  :class:`ssl.SSLObject`, snappy or deflate through :mod:`trionsq.protocol.codecs`,
  AUTH), then bytes out and bytes in.
- :class:`DirectConnection`: publishes from many threads on one link,
  pipelined.  A publish writes its command under the connection's lock (so
  the commands on the wire and the publishes awaiting answers are in one
  order), then waits for its answer.  One thread at a time reads (the
  *reader*): it reads answers for every publish in flight, in order, hands
  each to its thread, and when its own has come hands the reading on to the
  oldest publish still waiting (leader/follower).  One thread alone is its own
  reader: write, read, done.
- :class:`DirectPublisher`: the producer's side: which nsqd (failover through
  :class:`~trionsq.publishing.Rotation`), reconnecting, the counters, and a
  keeper thread that sends ``NOP`` on a connection idle for a heartbeat
  interval (nsqd closes a connection silent for two).  A thread that finds
  the connection's reading taken uses a spare connection to the same nsqd
  whose reading is free (opened on demand, :data:`MAX_CONNECTIONS` in all):
  threads then mostly read their own answers, as on sockets of their own,
  and pipeline on a shared connection only beyond that.

What a caller may assume when a connection dies during its call:

- A command is never left half-written for the next caller: a write that
  fails or is interrupted part-way ends the connection at once (nsqd never
  executes a command cut short), and the next publish opens a new one.
- A publish whose command was not wholly written (the write failed, or the
  connection was found dead before it) was not published: it is retried once
  on a fresh connection (failing over), so the caller does not see it; when
  that fails too it raises :class:`~trionsq.publishing.NotPublishedError`.
- A write interrupted (``KeyboardInterrupt`` in the main thread) ends the
  connection likewise; the interrupt goes on to the caller, with no promise
  on that one publish (``sendall`` looks for signals after its last bytes
  too: they may have been written whole), and it is never retried.
- A publish written whole whose answer never came raises
  :class:`~trionsq.ConnectionClosedError`: nsqd may or may not have
  published it (never retried: that could publish it twice).  Those written
  after a publish nsqd refused raise ``NotPublishedError`` (nsqd closes the
  connection after an error frame without executing what follows).
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Callable

from ..config import Config
from ..connection import ConnectionClosedError
from ..protocol import commands
from ..protocol.errors import NSQError, NSQErrorResponse
from ..publishing import Answers, Counters, NotPublishedError, PublishCore, Rotation
from ..reasons import reason
from .link import Link

__all__ = ["DirectConnection", "DirectPublisher", "NotWrittenError"]

#: a connection nothing was read from for this long is looked at before a
#: publish is written on it (nsqd may have closed it meanwhile: then the
#: publish goes to a new connection, certainly not published twice)
_IDLE_CHECK = 1.0
_NOP = commands.nop()
#: connections a blocking producer opens to its nsqd at most (see DirectPublisher)
MAX_CONNECTIONS = 4


class NotWrittenError(NotPublishedError):
    """This publish's command was not written whole (the connection was over
    before it, or its write failed part-way): certainly not published."""


class _Deadline(Exception):
    """The caller's own ``timeout`` passed while it read (not the connection's fault)."""


class _Slot:
    """One publish awaiting its answer (the completion :class:`Answers` hands
    it to): its thread sleeps on ``wake`` unless it is the reader."""

    __slots__ = ("done", "error", "gone", "lead", "wake")

    def __init__(self) -> None:
        self.wake: threading.Lock | None = None
        self.error: BaseException | None = None
        self.done = False
        self.lead = False  # handed the reading
        self.gone = False  # its thread gave up waiting (timeout, interrupt)

    def set_result(self, value: None) -> None:
        self.done = True
        wake = self.wake
        if wake is not None:
            _release(wake)

    def set_exception(self, error: BaseException) -> None:
        self.error = error
        self.done = True
        wake = self.wake
        if wake is not None:
            _release(wake)


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
        self._lock = threading.Lock()  # the wire's order: writes and the answer queue
        #: what this connection's answers counted (its reader alone counts:
        #: each connection its own, summed by the publisher)
        self.counters = Counters() if counters is None else counters
        self.answers: Answers[_Slot] = Answers(self.counters, link.config.max_frame_size)
        #: whether a thread holds the reading (read without the lock: a hint)
        self.reading = False
        #: why the connection ended (None while it lives)
        self.over: BaseException | None = None
        #: commands written so far (the keeper looks whether it moves)
        self.writes = 0
        self._last_read = time.monotonic()

    def publish(self, data: bytes, batch: int, timeout: float | None) -> None:
        """Write ``data`` (a publish of ``batch``, see :class:`PublishCore`) and
        return once nsqd acknowledged it; raises nsqd's error, a
        ConnectionClosedError (may have been published), NotPublishedError
        (certainly not), :class:`NotWrittenError` (not written: the caller may
        send it elsewhere) or TimeoutError."""
        slot = _Slot()
        lock = self._lock
        lead = False
        lock.acquire()
        try:
            if self.over is not None:
                raise NotWrittenError(f"{self.address}: the connection is over")
            lead = not self.reading
            if lead:
                self.reading = True
                if not self.answers.waiting and self._idle():
                    self._look()  # nothing read for a while: nsqd may have closed it
            else:
                slot.wake = wake = threading.Lock()
                wake.acquire()
            # The slot first: the reader may read the answer once it is written.
            self.answers.waiting.append((slot, batch))
            self._write(data, slot, reader=lead)
        except BaseException as exc:
            # Whatever cut this short (an error, an interrupt between two
            # steps) ends the connection, unless it ended already: no reading
            # left taken by nobody, nothing half-written for the next caller.
            if self.over is None:
                self._end_locked(NotWrittenError(f"{self.address}: {reason(exc)}"), exc, slot)
            if not isinstance(exc, Exception) or isinstance(exc, NotWrittenError):
                raise
            if slot.error is not None:
                raise slot.error from exc
            raise NotWrittenError(f"{self.address}: {reason(exc)}") from exc
        finally:
            lock.release()
        if lead:
            self._read_for(slot, timeout)
        else:
            self._follow(slot, timeout)
        if slot.error is not None:
            raise slot.error

    # --- writing (under the lock) ---

    def _write(self, data: bytes, slot: _Slot | None = None, reader: bool = False) -> None:
        """Write a command; cut short (an error, an interrupt), what reached
        the socket is part of a command at most, which nsqd never executes
        once the connection ends: it ends now, before anybody writes after
        it, ``slot`` failing with NotWrittenError, or with nsqd's refusal
        when the writer is the connection's ``reader`` and finds it (see
        :meth:`_answers_left`)."""
        try:
            self.link.send(data)
        except BaseException as exc:
            refusal = self._answers_left() if reader and isinstance(exc, OSError) else None
            self._end_locked(
                NotWrittenError(f"{self.address}: the write failed ({reason(exc)})"),
                refusal or exc,
                slot,
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
        return time.monotonic() - self._last_read > _IDLE_CHECK

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
            self._last_read = time.monotonic()
            for _ in range(heartbeats):
                self._write(_NOP)

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
            return  # somebody is writing: the connection is not idle
        try:
            self._look_if_idle()
            if self.over is None:
                self._write(_NOP)
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

    # --- reading (one thread at a time) ---

    def _read_for(self, slot: _Slot, timeout: float | None) -> None:
        """Read answers, for every publish in flight, until ``slot``'s has come;
        then hand the reading on."""
        link, answers = self.link, self.answers
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not slot.done:
                if deadline is not None and not _wait_readable(link, deadline):
                    raise _Deadline
                data = link.receive()
                if not data:
                    if link.transformed and not link.closed_by_peer:
                        continue  # a TLS record or compressed chunk not complete yet
                    raise ConnectionClosedError(f"{self.address}: nsqd closed the connection")
                heartbeats = answers.received(data)
                if heartbeats:
                    with self._lock:
                        for _ in range(heartbeats):
                            self._write(_NOP)
            self._last_read = time.monotonic()
        except _Deadline:
            slot.gone = True
            self._hand_on()
            raise TimeoutError(
                f"nsqd did not answer within {timeout} s (it may still publish)"
            ) from None
        except BaseException as exc:
            # The connection is over (nsqd's error frame failed its publish
            # and those after it already; the end of the stream, an error, an
            # interrupt fail the rest as not answered).
            with self._lock:
                self._end_locked(_closed(self.address, exc), exc)
            if not isinstance(exc, Exception):
                raise
            return
        self._hand_on()

    def _follow(self, slot: _Slot, timeout: float | None) -> None:
        """Sleep until the reader hands ``slot`` its answer, or the reading."""
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
                self._read_for(slot, left)
                return

    def _give_up(self, slot: _Slot) -> None:
        with self._lock:
            slot.gone = True
            promoted = slot.lead and not slot.done
        if promoted:
            self._hand_on()

    def _hand_on(self) -> None:
        """Give the reading to the oldest publish still waiting whose thread
        waits; with none, nobody reads until the next publish."""
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

    # --- the end ---

    def _end_locked(
        self, error: ConnectionClosedError, cause: BaseException, own: _Slot | None = None
    ) -> None:
        """End the connection (under the lock) for ``cause``: ``own`` (the
        publish being written) fails with ``error``, the others in flight
        with ``error`` as a ConnectionClosedError (written whole: they may
        have been published).  nsqd's refusal (``cause``) is kept as
        :attr:`over`: it says nothing against nsqd itself (failover)."""
        if self.over is not None:
            return
        self.over = cause if isinstance(cause, NSQErrorResponse) else error
        waiting = self.answers.waiting
        if own is not None and waiting and waiting[-1][0] is own:
            waiting.pop()
            own.set_exception(error)
        others = ConnectionClosedError(str(error)) if type(error) is NotWrittenError else error
        others.__cause__ = cause if cause is not error else None
        self.answers.end(others)
        self.reading = False
        self.link.shut()

    def close(self, error: ConnectionClosedError) -> None:
        with self._lock:
            self._end_locked(error, error)


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


class DirectPublisher:
    """A blocking producer's publishes done by the calling threads: the
    connections, failover and reconnects, the counters, the keeper of idle
    connections.  After a fork, the child calls :meth:`forget` and never uses
    it again.

    One connection serves every thread while its reading is free; a thread
    that finds it taken (another thread waits for an answer there) uses a
    spare connection to the same nsqd whose reading is free, opened on demand,
    up to ``max_connections`` in all: a thread then reads its own answer, as on
    a socket of its own, rather than waiting for a hand-over.
    """

    def __init__(
        self,
        config: Config,
        closed_error: Callable[[], Exception],
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.config = config
        self.core = PublishCore()
        self._rotation = Rotation(config.nsqd_tcp_addresses)
        self._greeting = commands.MAGIC_V2 + commands.identify(config.identify_body())
        self._closed_error = closed_error
        #: the first connection (failover moves it), and the spares beside it
        self.conn: DirectConnection | None = None
        self.spares: list[DirectConnection] = []
        self._max_spares = max_connections - 1
        self._retired = Counters()  # what ended connections counted
        self._connect_lock = threading.Lock()
        self._spare_lock = threading.Lock()
        self._closed = False
        self._stop = threading.Event()
        self._keeper: threading.Thread | None = None

    @property
    def address(self) -> str | None:
        """The nsqd connected to, if the connection lives (see :meth:`DirectConnection.alive`)."""
        conn = self.conn
        return conn.address if conn is not None and conn.alive() else None

    def publish(self, data: bytes, batch: int, timeout: float | None) -> None:
        """Publish an encoded command (from :attr:`core`); see the module's
        description for what the errors mean."""
        conn = self.conn
        if conn is None or conn.over is not None:
            conn = self.connect()
        elif conn.reading and self._max_spares:
            conn = self._spare(conn)
        try:
            conn.publish(data, batch, timeout)
        except NotWrittenError:
            # Certainly not published: once more, on a new connection.
            try:
                self.connect().publish(data, batch, timeout)
            except NotWrittenError:
                self.core.errors += 1
                raise

    def _spare(self, conn: DirectConnection) -> DirectConnection:
        """A connection whose reading is free (a spare, opened if there is
        room), else ``conn``."""
        for spare in self.spares:
            if not spare.reading and spare.over is None:
                return spare
        if len(self.spares) >= self._max_spares or not self._spare_lock.acquire(blocking=False):
            return conn  # (another thread opens one meanwhile)
        try:
            if self._closed or conn.over is not None:
                return conn
            for spare in list(self.spares):
                if spare.over is not None:
                    self._retire(spare)
            if len(self.spares) >= self._max_spares:
                return conn
            try:
                link = Link.open(conn.address, self.config, self._greeting)
            except Exception:
                return conn  # the first connection goes on; no spare for now
            spare = DirectConnection(link)
            self.spares.append(spare)
            return spare
        finally:
            self._spare_lock.release()

    def _retire(self, conn: DirectConnection) -> None:
        if conn in self.spares:
            self.spares.remove(conn)
        self._retired.add(conn.counters)

    def counters(self) -> Counters:
        """Everything counted so far: the encoder's errors, every connection's answers."""
        total = Counters()
        total.add(self.core)
        total.add(self._retired)
        for conn in self.connections():
            total.add(conn.counters)
        return total

    def connections(self) -> list[DirectConnection]:
        conn = self.conn
        return ([conn] if conn is not None else []) + list(self.spares)

    def connect(self) -> DirectConnection:
        """The connection to publish on, connected (failing over) if needed."""
        with self._connect_lock:
            if self._closed:
                raise self._closed_error()
            conn = self.conn
            if conn is not None:
                if conn.over is None:
                    return conn
                self._rotation.lost(conn.address, conn.over)
                self._retired.add(conn.counters)
                self.conn = None
                for spare in list(self.spares):  # (to the same nsqd: likely gone too)
                    spare.close(ConnectionClosedError(f"{spare.address}: failing over"))
                    self._retire(spare)
            attempt = self._rotation.attempt()
            for address in attempt:
                try:
                    link = Link.open(address, self.config, self._greeting)
                except Exception as exc:
                    attempt.failed(address, exc)
                    continue
                attempt.connected(address)
                conn = self.conn = DirectConnection(link)
                self._start_keeper()
                return conn
            self.core.errors += 1
            raise attempt.error()

    def _start_keeper(self) -> None:
        interval = self.config.heartbeat_interval
        if interval is None or self._keeper is not None:
            return
        keeper = threading.Thread(
            target=self._keep, args=(interval,), name="trionsq-direct-keeper", daemon=True
        )
        self._keeper = keeper
        keeper.start()

    def _keep(self, interval: float) -> None:
        """A NOP on each connection nothing was written on for ``interval``."""
        seen: dict[int, int] = {}
        while not self._stop.wait(interval):
            for conn in self.connections():
                if conn.over is not None:
                    continue
                if seen.get(id(conn)) == conn.writes:
                    conn.keep_alive()
                seen[id(conn)] = conn.writes

    def in_flight(self) -> int:
        return sum(len(conn.answers.waiting) for conn in self.connections())

    def close(self, timeout: float | None = None) -> None:
        """Wait for the publishes in flight (``timeout`` at most: their
        threads are reading their answers), then end the connections; later
        publishes raise the closed error."""
        with self._connect_lock:
            self._closed = True
        self._stop.set()
        deadline = None if timeout is None else time.monotonic() + timeout
        for conn in self.connections():
            while conn.answers.waiting and conn.over is None:
                if deadline is not None and time.monotonic() >= deadline:
                    break
                time.sleep(0.002)  # (rare: a close racing publishes of other threads)
            conn.close(ConnectionClosedError(f"{conn.address}: the producer closed"))
        keeper = self._keeper
        if keeper is not None and keeper is not threading.current_thread():
            keeper.join(timeout=1.0)

    def forget(self) -> None:
        """In a forked child: drop the parent's connections without touching
        them (their descriptors closed here, no shutdown: the connections
        stay the parent's)."""
        conns = self.connections()
        self.conn, self.spares = None, []
        self._closed = True
        for conn in conns:
            conn.over = ConnectionClosedError("forked")
            try:
                os.close(conn.link.sock.detach())
            except OSError:
                pass
