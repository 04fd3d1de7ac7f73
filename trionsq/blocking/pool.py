"""The blocking producer's pool of connections: which connection a publishing
thread writes on (see :mod:`trionsq.blocking.direct` for how a publish goes on
one, and what a caller may assume when a connection dies during its call)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from ..config import Config
from ..connection import ConnectionClosedError, NSQConnectionError
from ..link import Link
from ..protocol import commands
from ..protocol.errors import NSQErrorResponse
from ..publishing import Counters, PublishCore, Rotation
from .direct import DirectConnection, NotWrittenError

__all__ = ["DirectPublisher"]


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(deadline - time.monotonic(), 0.0)


class DirectPublisher:
    """A blocking producer's publishes done by the calling threads: a small
    pool of connections, failover and reconnects, the counters, the keeper
    of idle connections.  After a fork, the child calls :meth:`forget` and
    never uses it again.

    A publishing thread takes a connection nobody publishes on (or opens
    one, up to ``max_connections``), writes its command and reads its
    answer there itself (the lean path of :class:`DirectConnection`), then
    puts the connection back: threads publishing at once each wait in their
    own ``recv``, the GIL released, woken by the kernel as their answer
    arrives, as raw sockets a thread are.  Past the cap, a thread shares a
    busy connection: its command is pipelined behind the publishes there.
    ``max_connections=1`` is one connection shared by every thread.

    Why a connection a thread: on 2 cores the client's CPU a message
    decides, and the pipelined connection's wake-ups (a follower woken by
    its leader through a lock, then waiting for the GIL) cost more than the
    system calls they save.  8 threads against nsqd v1.3.0, this process's
    CPU a message, six interleaved runs at load 7: one shared connection
    9.5-13.4 us (median 11.1), a connection a thread 8.7-10.9 (median 9.5),
    the raw sockets 7.0-9.0 (see docs/performance.md).  Threads sharing
    past the cap cost most (32 threads on 8 connections: 17-32 us a
    message): hence a cap of 32 by default; the connections opened stay
    open, idle ones kept alive by the keeper's NOPs.
    """

    def __init__(
        self,
        config: Config,
        closed_error: Callable[[], Exception],
        max_connections: int = 32,
    ) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections!r}")
        self.config = config
        self.max_connections = max_connections
        self.core = PublishCore()
        self._rotation = Rotation(config.nsqd_tcp_addresses)
        self._greeting = commands.MAGIC_V2 + commands.identify(config.identify_body())
        self._closed_error = closed_error
        #: every connection not discarded yet (replaced, never changed in
        #: place, under the connect lock: read without it)
        self._conns: tuple[DirectConnection, ...] = ()
        #: the connections nobody took: a publishing thread pops one (a
        #: list's pop and append are atomic) and appends it back when done
        self._idle: list[DirectConnection] = []
        self._turn = 0  # past the cap: which busy connection a thread shares
        self._retired = Counters()  # what discarded connections counted
        self._connect_lock = threading.Lock()
        self._closed = False
        self._stop = threading.Event()
        self._keeper: threading.Thread | None = None

    @property
    def conn(self) -> DirectConnection | None:
        """A connection (the oldest kept), if any."""
        conns = self._conns
        return conns[0] if conns else None

    @property
    def address(self) -> str | None:
        """The nsqd connected to, if a connection lives (see :meth:`DirectConnection.alive`)."""
        for conn in self._conns:
            if conn.alive():
                return conn.address
        return None

    def publish(self, data: bytes, batch: int, timeout: float | None) -> None:
        """Publish an encoded command (from :attr:`core`); see the module's
        description for what the errors mean."""
        try:
            conn = self._idle.pop()
        except IndexError:
            conn, own = self._take()
        else:
            own = True
            if conn.over is not None:
                self._discard(conn)
                conn, own = self._take()
        try:
            conn.publish(data, batch, timeout)
        except NotWrittenError:
            # Certainly not published: once more, on a new connection (the
            # idle ones may have died with this one).
            if own:
                own = False
                self._put_back(conn)
            conn, own = self._take(fresh=True)
            try:
                conn.publish(data, batch, timeout)
            except NotWrittenError:
                self.core.errors += 1
                raise
        finally:
            if own:
                self._put_back(conn)

    def _put_back(self, conn: DirectConnection) -> None:
        if conn.over is None and not self._closed:
            self._idle.append(conn)
        else:
            self._discard(conn)

    def _take(self, fresh: bool = False) -> tuple[DirectConnection, bool]:
        """A connection to publish on and whether this thread took it for
        itself (it puts it back): an idle one (unless ``fresh``), else a new
        one below the cap, else a busy one to share."""
        idle = self._idle
        while idle and not fresh:
            try:
                conn = idle.pop()
            except IndexError:
                break
            if conn.over is None:
                return conn, True
            self._discard(conn)
        with self._connect_lock:
            if self._closed:
                raise self._closed_error()
            live = [conn for conn in self._conns if conn.over is None]
            if len(live) >= self.max_connections:
                self._turn += 1
                return live[self._turn % len(live)], False
            for conn in self._conns:
                if conn.over is not None:
                    self._discard_locked(conn)
            try:
                link = self._rotation.first(self._open)
            except (NSQConnectionError, NSQErrorResponse):
                self.core.errors += 1
                raise
            conn = DirectConnection(link)
            self._conns = (*self._conns, conn)
            self._start_keeper()
            return conn, True

    def _discard(self, conn: DirectConnection) -> None:
        with self._connect_lock:
            self._discard_locked(conn)

    def _discard_locked(self, conn: DirectConnection) -> None:
        """Forget an ended connection (its counts kept; failover noted)."""
        if conn not in self._conns:
            return
        self._conns = tuple(other for other in self._conns if other is not conn)
        self._rotation.lost(conn.address, conn.over)
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
        return list(self._conns)

    def _open(self, address: str) -> Link:
        return Link.open(address, self.config, self._greeting)

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
        """A NOP on each connection nothing was read from for half of
        ``interval``, looked at every half interval: nsqd closes a connection
        it read nothing from for two intervals, and hears from each idle one
        every interval at least (a keeper that waited a whole interval
        without a write, at whole-interval ticks, could stay silent for two)."""
        half = interval / 2
        while not self._stop.wait(half):
            now = time.monotonic()
            for conn in self._conns:
                if conn.over is None and now - conn.last_read >= half:
                    conn.keep_alive()
                if conn.over is not None:
                    self._prune(conn)

    def _prune(self, conn: DirectConnection) -> None:
        """Discard ``conn``, ended, if it waits among the idle ones (one a
        thread took is discarded by that thread)."""
        try:
            self._idle.remove(conn)
        except ValueError:
            return
        self._discard(conn)

    def in_flight(self) -> int:
        return sum(conn.in_flight() for conn in self.connections())

    def close(self, timeout: float | None = None) -> None:
        """Wait for the publishes in flight (``timeout`` at most: their
        threads are reading their answers), then end the connections; later
        publishes raise the closed error."""
        with self._connect_lock:
            self._closed = True
        self._idle.clear()
        self._stop.set()
        deadline = None if timeout is None else time.monotonic() + timeout
        for conn in self.connections():
            # (Publishes that passed the closed check before it may still
            # queue: each wait covers those queued when it began.)
            mark = -1
            while conn.queued != mark and conn.over is None:
                mark = conn.queued
                if not conn.wait_settled(mark, _left(deadline)):
                    break
            conn.close(ConnectionClosedError(f"{conn.address}: the producer closed"))
        keeper = self._keeper
        if keeper is not None and keeper is not threading.current_thread():
            keeper.join(timeout=1.0)

    def marks(self) -> list[tuple[DirectConnection, int]]:
        """Where each connection's queue stands now (for :meth:`flush`)."""
        return [(conn, conn.queued) for conn in self.connections()]

    def flush(self, marks: list[tuple[DirectConnection, int]], timeout: float | None) -> bool:
        """Wait until the publishes queued before ``marks`` (from :meth:`marks`)
        have their outcome (any thread's); False if ``timeout`` passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        return all(conn.wait_settled(mark, _left(deadline)) for conn, mark in marks)

    def forget(self) -> None:
        """In a forked child: drop the parent's connections without touching
        them (their descriptors closed here, no shutdown: the connections
        stay the parent's)."""
        conns = self.connections()
        self._conns = ()
        self._idle = []
        self._closed = True
        for conn in conns:
            conn.over = ConnectionClosedError("forked")
            try:
                os.close(conn.link.sock.detach())
            except OSError:
                pass
