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
deflate, AUTH) are the blocking driver's :class:`~trionsq.blocking.link.Link`,
opened on a short-lived thread of its own (joined once it is done) so that
the loop never blocks on a connect.

- :class:`AioConnection`: one handshaken connection driven by the loop.  The
  publishes of one iteration of the loop (an ``asyncio.gather``, the tasks
  woken by a run of answers) go out in one write at the end of it; a publish
  alone on an idle connection goes out at once.  A heartbeat is answered with
  ``NOP``; nothing read for ``read_timeout`` ends the connection.
- :class:`AioPublisher`: the producer's side: connecting (failing over),
  reconnecting after a connection ended, at most ``publish_window`` publishes
  awaiting answers (the others wait their turn, in order), the counters, and
  the close that lets the publishes in flight get their answers.

What a caller may assume when a connection dies: a publish whose connection
ends before its answer raises :class:`~trionsq.ConnectionClosedError` (nsqd
may or may not have published it: never retried, that could publish it
twice); one whose command was not written yet, and those behind a publish
nsqd refused, raise :class:`~trionsq.publishing.NotPublishedError` (nsqd
closes the connection after an error without executing what follows); the
next publish opens a new connection.  A connection nothing was read from for a second is looked at
before a publish is written on it (nsqd restarted meanwhile: the publish goes
to a new connection, certainly not published twice).
"""

from __future__ import annotations

import asyncio
import os
import ssl
import threading
from collections import deque
from collections.abc import Callable

from ..blocking.link import Link
from ..config import Config
from ..connection import ConnectionClosedError, NSQConnectionError
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


class AioConnection:
    """One handshaken nsqd connection, its bytes moved by the asyncio loop.

    ``on_answers()`` is called after each read that answered publishes (the
    publisher sends what waited for room in the window); ``on_over()`` once
    the connection has ended.
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
        #: why the connection ended (None while it lives)
        self.over: ConnectionClosedError | None = None
        self._loop = loop
        self._on_answers = on_answers
        self._on_over = on_over
        self._sock = link.sock
        self._sock.setblocking(False)
        self._fd = self._sock.fileno()
        self._corked: list[bytes] = []  # commands of this iteration, not written yet
        self._flush_scheduled = False
        # bytes the socket did not take yet, written when it can (a bytearray:
        # appending and taking from its front cost no copy of the rest)
        self._unsent = bytearray()
        self._plain = not link.transformed  # (no TLS, no compression: bytes as they are)
        self._read_timeout = link.config.read_timeout
        #: heartbeats nsqd sent (each answered with NOP)
        self.heartbeats = 0
        self.last_read = loop.time()
        loop.add_reader(self._fd, self._readable)
        self._timer = loop.call_later(self._read_timeout, self._check_silence)
        if link.readable_now():  # bytes read past the handshake's last answer
            loop.call_soon(self._readable)

    # --- out ---

    def send(self, data: bytes, waiter: Completion, batch: int) -> None:
        """Queue one publish's command; its answer goes to ``waiter``."""
        if self.over is not None:
            self.counters.errors += 1
            waiter.set_exception(NotPublishedError(f"{self.address}: {_NOT_WRITTEN}"))
            return
        answers = self.answers
        answers.waiting.append((waiter, batch))
        if len(answers.waiting) == 1 and not self._corked and not self._unsent:
            self._write(data)  # alone: no reason to wait for company
            return
        self._corked.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        corked = self._corked
        if not corked or self.over is not None:
            return
        data = corked[0] if len(corked) == 1 else b"".join(corked)
        corked.clear()
        self._write(data)

    def _write(self, data: bytes) -> None:
        if self._plain:
            wire = data
        else:
            try:
                wire = self.link.wire(data)
            except (OSError, ssl.SSLError) as exc:
                self.end(exc)
                return
        if self._unsent:
            self._unsent += wire
            return
        try:
            sent = self._sock.send(wire)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self.end(exc)
            return
        if sent < len(wire):
            self._unsent += memoryview(wire)[sent:]
            self._loop.add_writer(self._fd, self._writable)

    def _writable(self) -> None:
        try:
            sent = self._sock.send(self._unsent)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.end(exc)
            return
        del self._unsent[:sent]
        if not self._unsent:
            self._loop.remove_writer(self._fd)

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
        try:
            heartbeats = self.answers.received(data)
        except (NSQErrorResponse, ProtocolError) as exc:
            # nsqd closes the connection after an error (Answers failed the rest)
            self.end(exc)
            return
        if heartbeats:
            self.heartbeats += heartbeats
            for _ in range(heartbeats):
                self._write(_NOP)
        self._on_answers()

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
        if self.over is None and self._loop.time() - self.last_read > _IDLE_CHECK:
            if not self.answers.waiting and self.link.readable_now():
                self._readable()
            self.last_read = self._loop.time()
        return self.over is not None

    # --- the end ---

    def end(self, reason: BaseException | None) -> None:
        """End the connection (once): its publishes still waiting fail."""
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
        corked = len(self._corked)
        self._corked.clear()
        if corked:
            # The last ones waiting were never written: certainly not published.
            waiting, counters = self.answers.waiting, self.counters
            never = NotPublishedError(f"{self.address}: {_NOT_WRITTEN}")
            for _ in range(min(corked, len(waiting))):
                waiter, _ = waiting.pop()
                counters.errors += 1
                waiter.set_exception(never)
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
            and len(conn.answers.waiting) < self._window
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
            room = self._window - len(conn.answers.waiting)
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
        self._drain()

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
            in_flight += len(conn.answers.waiting)
        return total.stats(in_flight, self._window)

    def _busy(self) -> bool:
        conn = self.conn
        waiting = conn is not None and conn.over is None and bool(conn.answers.waiting)
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
