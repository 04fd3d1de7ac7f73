"""The asyncio Producer's publishes done by the asyncio loop itself: the asyncio
driver of the publish core.

A publish handed to a Trio run costs asyncio code a hop: in guest mode Trio
waits for I/O on a worker thread, so each answer crosses two threads and
several turns of both schedulers (one task publishing in a loop reached a
quarter of the Trio Producer's rate), and with ``guest=False`` it crosses to
the Trio thread and back.  Here the loop that calls ``publish()`` writes the
command and reads the answers itself, on a non-blocking socket watched by the
loop (``add_reader``), on the sans-IO core that every producer shares:
:class:`~trionsq.publishing.PublishCore` (checks, encoding, counters),
:class:`~trionsq.publishing.Answers` (the answers, in order, heartbeats) and
:class:`~trionsq.publishing.Rotation` (which nsqd, failover).  The connection
and its handshake (TLS through an in-memory :class:`ssl.SSLObject`, snappy or
deflate, AUTH) are :class:`~trionsq.link.Link`,
opened on a short-lived thread of its own (joined once it is done) so that
the loop never blocks on a connect.

- :class:`AioConnection`: one handshaken connection driven by the loop.  The
  publishes of one iteration of the loop (an ``asyncio.gather``, the tasks
  woken by a run of answers) go out in one write at the end of it; a publish
  alone on an idle connection goes out at once.  A read that leaves many
  publishes awaiting answers (:data:`GATHER_FROM`) having answered few pauses
  the loop briefly (:data:`GATHER_PAUSE`), so that the next read takes many
  answers: one wake-up of the loop a batch, not one an answer.  A heartbeat
  is answered with ``NOP``; nothing read for ``read_timeout`` ends the
  connection.
- :class:`AioPublisher`: the producer's side: connecting (failing over),
  reconnecting after a connection ended, at most ``publish_window`` publishes
  awaiting answers (the others wait their turn, in order), the counters, and
  the close that lets the publishes in flight get their answers.

What a caller may assume when a connection dies (the blocking driver's rule,
:mod:`trionsq.blocking.direct`): a publish never written (queued for the end
of the loop's iteration, or behind bytes the socket had not taken: no byte of
it reached the socket) was not published, and is sent once more on the next
connection, failing over (a second connection that ends before writing it
raises :class:`~trionsq.publishing.NotPublishedError`); a publish written
whose answer never came raises :class:`~trionsq.ConnectionClosedError` (nsqd
may or may not have published it: never sent again, that could publish it
twice); those written behind a publish nsqd refused raise
``NotPublishedError`` (nsqd closes the connection after an error without
executing what follows).  A connection nothing was read from for a second is
looked at before a publish is written on it (nsqd restarted meanwhile: the
publish goes to a new connection, certainly not published twice).
"""

from __future__ import annotations

import asyncio
import os
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable

from ..config import Config
from ..connection import ConnectionClosedError, NSQConnectionError
from ..link import Link
from ..protocol import commands
from ..protocol.errors import NSQErrorResponse, ProtocolError
from ..publishing import (
    Answers,
    Completion,
    Counters,
    NotPublishedError,
    ProducerStats,
    PublishCore,
    Rotation,
)

__all__ = ["AioConnection", "AioPublisher"]

_NOP = commands.nop()
_NOT_WRITTEN = "not published: the connection ended before it was written"
#: a connection nothing was read from for this long is looked at before a
#: publish is written on it (as the blocking driver does)
_IDLE_CHECK = 1.0
#: a read that leaves at least this many publishes awaiting answers, having
#: answered under a quarter as many, pauses the loop (see _readable)
GATHER_FROM = 16
#: the pause, in seconds (the kernel's timer slack adds some 50 us)
GATHER_PAUSE = 30e-6
_pause = time.sleep


#: what a publish waits in: its command, its MPUB's message count (0 for PUB
#: and DPUB), where its answer goes
Entry = tuple[bytes, int, Completion]


class AioConnection:
    """One handshaken nsqd connection, its bytes moved by the asyncio loop.

    A publish handed over (:meth:`send`) is *queued* until some byte of its
    command reached the socket, then *written* (in :attr:`answers`, awaiting
    its answer).  A connection that ends keeps its queued publishes in
    :attr:`unwritten`, in order: nsqd never saw them (the publisher sends them
    once more).  ``on_answers()`` is called after each read that answered
    publishes (the publisher sends what waited for room in the window);
    ``on_over()`` once the connection has ended.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        link: Link,
        on_answers: Callable[[], None],
        on_over: Callable[[], None],
    ) -> None:
        self.link = link
        self.address = link.address
        self.counters = Counters()
        self.answers: Answers[Completion] = Answers(self.counters, link.config.max_frame_size)
        #: publishes handed over and not written yet (corked or held)
        self.queued = 0
        #: why the connection ended (None while it lives)
        self.over: ConnectionClosedError | None = None
        #: once over: the publishes never written, oldest first
        self.unwritten: list[Entry] = []
        self._loop = loop
        self._on_answers = on_answers
        self._on_over = on_over
        self._sock = link.sock
        self._sock.setblocking(False)
        self._fd = self._sock.fileno()
        # this iteration's commands and their waiters, written by _flush
        self._corked: list[bytes] = []
        self._corked_waiters: list[tuple[Completion, int]] = []
        self._flush_scheduled = False
        # While the socket does not take everything: the wire bytes of the
        # write under way (a bytearray: appending and taking from its front
        # copy nothing), its publishes while none of its bytes went out, and
        # the writes waiting behind it (commands and waiters, not encoded yet).
        self._unsent = bytearray()
        self._unsent_fresh: tuple[list[bytes], list[tuple[Completion, int]]] | None = None
        self._held: deque[tuple[list[bytes], list[tuple[Completion, int]]]] = deque()
        self._plain = not link.transformed  # (no TLS, no compression: bytes as they are)
        self._read_timeout = link.config.read_timeout
        #: heartbeats nsqd sent (each answered with NOP)
        self.heartbeats = 0
        self.last_read = loop.time()
        loop.add_reader(self._fd, self._readable)
        self._timer = loop.call_later(self._read_timeout, self._check_silence)
        if link.readable_now():  # bytes read past the handshake's last answer
            loop.call_soon(self._readable)

    @property
    def in_flight(self) -> int:
        """Publishes handed over and not answered yet (queued or written)."""
        return len(self.answers.waiting) + self.queued

    # --- out ---

    def send(self, data: bytes, waiter: Completion, batch: int) -> None:
        """Queue one publish's command; its answer goes to ``waiter``.  (The
        publisher sends on a live connection only: one that ended fails the
        publish, not written.)"""
        if self.over is not None:
            self.counters.errors += 1
            waiter.set_exception(NotPublishedError(f"{self.address}: {_NOT_WRITTEN}"))
            return
        self.queued += 1
        if not self.answers.waiting and not self._corked and not self._unsent:
            self._write([data], [(waiter, batch)])  # alone: no reason to wait for company
            return
        self._corked.append(data)
        self._corked_waiters.append((waiter, batch))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self._corked or self.over is not None:
            return
        datas, self._corked = self._corked, []
        waiters, self._corked_waiters = self._corked_waiters, []
        self._write(datas, waiters)

    def _write(self, datas: list[bytes], waiters: list[tuple[Completion, int]]) -> None:
        """Write commands (``waiters``: their publishes, in order) in one write,
        or behind the write under way."""
        if self._unsent or self._held:
            self._held.append((datas, waiters))
            return
        data = datas[0] if len(datas) == 1 else b"".join(datas)
        if self._plain:
            wire = data
        else:
            try:
                wire = self.link.wire(data)
            except (OSError, ssl.SSLError) as exc:
                self._held.appendleft((datas, waiters))  # (not a byte of them went out)
                self.end(exc)
                return
        try:
            sent = self._sock.send(wire)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._held.appendleft((datas, waiters))
            self.end(exc)
            return
        if sent == len(wire):
            self._written(waiters)
            return
        self._wrote_part(datas, waiters, wire, sent)

    def _written(self, waiters: list[tuple[Completion, int]]) -> None:
        """These publishes had a byte of their command reach the socket: they
        await their answers now (no longer queued)."""
        self.answers.waiting.extend(waiters)
        self.queued -= len(waiters)

    def _wrote_part(
        self,
        datas: list[bytes],
        waiters: list[tuple[Completion, int]],
        wire: bytes,
        sent: int,
    ) -> None:
        """The socket took ``sent`` bytes of ``wire`` (``datas`` as they go on
        it): the rest waits for the socket (the loop watches it)."""
        fresh: tuple[list[bytes], list[tuple[Completion, int]]] | None = None
        if sent == 0:
            fresh = (datas, waiters)  # nothing of them out yet
        elif self._plain:
            # The commands with a byte out are written; the rest wait whole.
            out = 0
            touched = 0
            while touched < len(datas) and out < sent:
                out += len(datas[touched])
                touched += 1
            written = waiters[:touched]
            self._written(written)
            if touched < len(datas):
                self._held.appendleft((datas[touched:], waiters[touched:]))
            wire = wire[:out]  # the rest of the last command touched
        else:
            self._written(waiters)  # (encoded together: all maybe out)
        self._unsent += memoryview(wire)[sent:]
        self._unsent_fresh = fresh
        if self._unsent:
            self._loop.add_writer(self._fd, self._writable)
        else:
            self._writable()  # (nothing left of the write: on to what waits)

    def _writable(self) -> None:
        if self.over is not None:
            return
        unsent = self._unsent
        if unsent:
            try:
                sent = self._sock.send(unsent)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self.end(exc)
                return
            fresh = self._unsent_fresh
            if sent and fresh is not None:
                self._unsent_fresh = None
                self._written(fresh[1])
            del unsent[:sent]
            if unsent:
                return
        self._loop.remove_writer(self._fd)
        held = self._held
        if held:
            # What waited goes out in one write (or waits again).
            datas: list[bytes] = []
            waiters: list[tuple[Completion, int]] = []
            while held:
                more, theirs = held.popleft()
                datas += more
                waiters += theirs
            self._write(datas, waiters)

    # --- in ---

    def _readable(self) -> None:
        if self.over is not None:
            return
        link = self.link
        try:
            data = link.receive()
        except (BlockingIOError, InterruptedError):
            return
        except (OSError, ssl.SSLError) as exc:
            self.end(exc)
            return
        if not data:
            if link.transformed and not link.closed_by_peer:
                return  # (a TLS record or compressed block not whole yet)
            self.end(None)
            return
        self.last_read = self._loop.time()
        answers = self.answers
        awaited = len(answers.waiting)
        try:
            heartbeats = answers.received(data)
        except (NSQErrorResponse, ProtocolError) as exc:
            # nsqd closes the connection after an error (Answers failed the rest)
            self.end(exc)
            return
        if heartbeats:
            self.heartbeats += heartbeats
            if not self._unsent:
                # (Otherwise commands are on their way: nsqd, reading them,
                # sees the client alive, which is all a NOP says.)
                for _ in range(heartbeats):
                    self._write([_NOP], [])
        self._on_answers()
        left = len(answers.waiting)
        if left >= GATHER_FROM and (awaited - left) * 4 < left:
            # Many answers still to come, and this read took few of them.
            # nsqd writes each answer by itself, and a loop faster than nsqd
            # is woken for each, one or two answers a turn: each wake-up (the
            # loop's sleep in epoll, nsqd's write waking it) costs both
            # processes more than the answer.  A short pause, nsqd busy with
            # the publishes ahead meanwhile, lets the next read take many
            # (against nsqd v1.3.0 on a quiet machine, 256 tasks: 2.8 us of
            # the client's CPU a publish instead of 6.6, nsqd's 4.9 instead
            # of 7.0; see docs/performance.md).
            if self._corked:
                self._flush()  # (what the answers let out of the backlog, first)
            _pause(GATHER_PAUSE)

    def _check_silence(self) -> None:
        """Nothing read for ``read_timeout`` (nsqd sends heartbeats more often):
        the connection is dead."""
        if self.over is not None:
            return
        silent = self._loop.time() - self.last_read
        if silent >= self._read_timeout:
            silence = f"{self.address}: nothing received for {self._read_timeout}s"
            self.end(ConnectionClosedError(silence))
            return
        self._timer = self._loop.call_later(self._read_timeout - silent, self._check_silence)

    def stale(self) -> bool:
        """Whether the connection is over, looked at if it was idle a while
        (nsqd may have closed it since: its end is read now, before a
        publish is written on it)."""
        if (
            self.over is None
            and not self.answers.waiting  # (answers to come: not idle)
            and not self.queued
            and self._loop.time() - self.last_read > _IDLE_CHECK
        ):
            if self.link.readable_now():
                self._readable()
            self.last_read = self._loop.time()
        return self.over is not None

    # --- the end ---

    def end(self, reason: BaseException | None) -> None:
        """End the connection (once): the publishes written and not answered
        fail; those never written go to :attr:`unwritten`."""
        if self.over is not None:
            return
        if isinstance(reason, ConnectionClosedError):
            over = reason
        else:
            said = "connection closed" if reason is None else f"connection lost ({reason})"
            over = ConnectionClosedError(f"{self.address}: {said}")
            if reason is not None:
                over.__cause__ = reason
        self.over = over
        self._timer.cancel()
        unwritten = self.unwritten
        batches = list(self._held)
        if self._unsent_fresh is not None:
            batches.insert(0, self._unsent_fresh)
        batches.append((self._corked, self._corked_waiters))
        for datas, waiters in batches:
            if waiters:  # (not a NOP)
                unwritten += [
                    (data, batch, waiter)
                    for data, (waiter, batch) in zip(datas, waiters, strict=True)
                ]
        self._held.clear()
        self._unsent_fresh = None
        self._corked, self._corked_waiters = [], []
        self.queued = 0
        loop = self._loop
        try:
            loop.remove_reader(self._fd)
            if self._unsent:
                loop.remove_writer(self._fd)
        except (RuntimeError, ValueError):  # (the loop closed: nothing is watched)
            pass
        self.link.shut()
        self.answers.end(over)
        self._on_over()

    def forget(self) -> None:
        """In a forked child: the descriptor closed here, the connection left
        the parent's (no shutdown, no write)."""
        self.over = ConnectionClosedError("forked")
        try:
            os.close(self._sock.detach())
        except OSError:
            pass


class _Again:
    """The waiter of a publish sent once more (its first connection ended
    before writing it): the same waiter, marked."""

    __slots__ = ("waiter",)

    def __init__(self, waiter: Completion) -> None:
        self.waiter = waiter

    def set_result(self, value: None) -> None:
        self.waiter.set_result(value)

    def set_exception(self, error: BaseException) -> None:
        self.waiter.set_exception(error)


class AioPublisher:
    """An asyncio producer's publishes on the loop: the connection, failover,
    the window, the counters, the close.  ``closed_error()`` is what a publish
    gets once the producer closed."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        config: Config,
        closed_error: Callable[[], Exception],
    ) -> None:
        self.config = config
        self.core = PublishCore()
        self._loop = loop
        self._closed_error = closed_error
        self._rotation = Rotation(config.nsqd_tcp_addresses)
        self._greeting = commands.MAGIC_V2 + commands.identify(config.identify_body())
        self._window = config.publish_window
        self.conn: AioConnection | None = None
        #: publishes waiting for a connection or for room in the window, in order
        self.backlog: deque[tuple[bytes, int, Completion]] = deque()
        self._retired = Counters()  # what ended connections counted
        self._connecting: threading.Thread | None = None
        #: closed and its leftovers failed: nothing more is sent
        self._over = False
        self._settled: asyncio.Future[None] | None = None  # close() waits on it

    # --- publishing ---

    def publish(self, data: bytes, batch: int, waiter: Completion) -> None:
        """Send an encoded command (from :attr:`core`); its answer to ``waiter``."""
        conn = self.conn
        if (
            conn is not None
            and not self.backlog
            and len(conn.answers.waiting) + conn.queued < self._window
            and not conn.stale()
        ):
            conn.send(data, waiter, batch)
            return
        self.backlog.append((data, batch, waiter))
        self._drain()

    def _drain(self) -> None:
        """Send what waits, as the window allows; connect if need be."""
        conn = self.conn
        backlog = self.backlog
        if conn is not None and conn.over is None:
            room = self._window - conn.in_flight
            while backlog and room > 0:
                data, batch, waiter = backlog.popleft()
                conn.send(data, waiter, batch)
                room -= 1
        elif backlog and not self._over:
            self._connect_soon()
        self._check_settled()

    def _connection_over(self) -> None:
        conn = self.conn
        if conn is not None and conn.over is not None:
            self._rotation.lost(conn.address, conn.over)
            self._retired.add(conn.counters)
            self.conn = None
            self._send_again(conn)
        self._drain()

    def _send_again(self, conn: AioConnection) -> None:
        """The publishes ``conn`` never wrote go first in line for the next
        connection (nsqd never saw them: they cannot be published twice),
        once: a publish whose second connection ends before it was written too
        fails with :class:`NotPublishedError`."""
        backlog = self.backlog
        for data, batch, waiter in reversed(conn.unwritten):
            if type(waiter) is _Again:
                self.core.errors += 1
                waiter.set_exception(NotPublishedError(f"{conn.address}: {_NOT_WRITTEN}"))
            else:
                backlog.appendleft((data, batch, _Again(waiter)))
        conn.unwritten.clear()

    # --- connecting (on a thread of its own: the handshake blocks) ---

    def _connect_soon(self) -> None:
        if self._connecting is not None:
            return
        thread = threading.Thread(
            target=self._connect_in_thread, name="trionsq-aio-connect", daemon=True
        )
        self._connecting = thread
        thread.start()

    def _connect_in_thread(self) -> None:
        link: Link | None = None
        error: Exception | None = None
        try:
            link = self._rotation.first(self._open)
        except (NSQConnectionError, NSQErrorResponse) as exc:
            error = exc
        try:
            self._loop.call_soon_threadsafe(self._connected, link, error)
        except RuntimeError:  # the loop closed meanwhile: nobody wants it
            if link is not None:
                link.shut()

    def _open(self, address: str) -> Link:
        return Link.open(address, self.config, self._greeting)

    def _connected(self, link: Link | None, error: Exception | None) -> None:
        thread, self._connecting = self._connecting, None
        if thread is not None:
            thread.join()  # (it has nothing left to do)
        if link is not None and self._over:
            link.shut()
            link = None
            error = self._closed_error()
        if link is None:
            # Every publish waiting for this connection gets its error.
            backlog = self.backlog
            while backlog:
                _, _, waiter = backlog.popleft()
                self.core.errors += 1
                waiter.set_exception(error or self._closed_error())
            self._check_settled()
            return
        self.conn = AioConnection(self._loop, link, self._drain, self._connection_over)
        self._drain()

    # --- state ---

    @property
    def address(self) -> str | None:
        conn = self.conn
        return conn.address if conn is not None and conn.over is None else None

    def stats(self) -> ProducerStats:
        total = Counters()
        total.add(self.core)
        total.add(self._retired)
        conn = self.conn
        in_flight = len(self.backlog)
        if conn is not None:
            total.add(conn.counters)
            in_flight += conn.in_flight
        return total.stats(in_flight, self._window)

    def _busy(self) -> bool:
        conn = self.conn
        waiting = conn is not None and conn.over is None and conn.in_flight > 0
        return waiting or bool(self.backlog) or self._connecting is not None

    def _check_settled(self) -> None:
        settled = self._settled
        if settled is not None and not settled.done() and not self._busy():
            settled.set_result(None)

    # --- the end ---

    async def close(self, wait_for: float | None, wait: bool = True) -> None:
        """Let the publishes in flight get their answers (``wait_for`` seconds
        at most; not at all with ``wait`` false), then end the connection;
        what is left fails with the closed error.  (The producer takes no
        publish once closing: what was taken goes on, connecting if need be.)"""
        if wait and self._busy():
            self._settled = self._loop.create_future()
            try:
                async with asyncio.timeout(wait_for):
                    await asyncio.shield(self._settled)
            except TimeoutError:
                pass
            finally:
                self._settled = None
        self.fail_leftovers()
        if self._connecting is not None and wait:
            # A connect under way ends within connect_timeout; its thread is
            # joined when it reports (no thread outlives the close).
            self._settled = self._loop.create_future()
            try:
                await asyncio.shield(self._settled)
            finally:
                self._settled = None

    def fail_leftovers(self) -> None:
        self._over = True
        conn = self.conn
        if conn is not None:
            conn.end(ConnectionClosedError(f"{conn.address}: the producer closed"))
        backlog = self.backlog
        while backlog:
            _, _, waiter = backlog.popleft()
            self.core.errors += 1
            waiter.set_exception(self._closed_error())

    def forget(self) -> None:
        """In a forked child: drop the parent's connection untouched."""
        self._over = True
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.forget()
