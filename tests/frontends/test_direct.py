"""trionsq.blocking.direct: blocking publishes done by the calling threads.

A scripted nsqd on the other end of a socket pair reads the commands, executes
the whole ones (records their bodies), answers them, and may end the connection
after any byte, refuse a publish (an error frame, then close, as nsqd does) or
send heartbeats.  hypothesis picks the threads, their publishes, where the
connection dies and where a write is cut short; whatever the interleaving:

- a publish that returned was executed by the server, exactly once;
- one that raised NotPublishedError (or NotWrittenError) was not executed;
- one that raised a plain ConnectionClosedError may have been, or not;
- nothing hangs, and the server never reads a command cut short followed by
  more bytes (no half command is left for the next caller).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from trionsq import blocking
from trionsq.blocking.direct import DirectConnection, NotWrittenError
from trionsq.config import Config
from trionsq.connection import ConnectionClosedError
from trionsq.link import Link, sent_whole
from trionsq.protocol.errors import BadMessageError, BadTopicError
from trionsq.protocol.frames import FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE, HEARTBEAT, encode_frame
from trionsq.publishing import NotPublishedError, PublishCore

from ..support.nodes import BlockingDaemons, BlockingNode
from ..support.tls import Pki
from ..support.waiting import wait_until_blocking
from .conftest import AuthServer

CONFIG = Config(nsqd_tcp_addresses=("127.0.0.1:4150",))
OK_FRAME = encode_frame(FRAME_TYPE_RESPONSE, b"OK")
LIMIT = 20.0  # seconds: a generous bound, reached only by a hang


@dataclass
class Script:
    """What the scripted nsqd does."""

    #: end the connection once this many bytes were read (None: never)
    cut_after: int | None = None
    #: answer this publish (by its order) with E_BAD_MESSAGE and close
    refuse: int | None = None
    #: send a heartbeat before answering these publishes
    heartbeats_before: frozenset[int] = frozenset()
    #: hold every answer until this is set (the commands are read and executed)
    gate: threading.Event | None = None


@dataclass
class Server:
    sock: socket.socket
    script: Script
    executed: list[bytes] = field(default_factory=list)
    garbage: list[bytes] = field(default_factory=list)
    nops: int = 0

    def serve(self) -> None:
        buffer = b""
        read = 0
        count = 0
        try:
            while True:
                limit = 65536
                if self.script.cut_after is not None:
                    limit = self.script.cut_after - read
                    if limit <= 0:
                        return
                data = self.sock.recv(limit)
                if not data:
                    return
                read += len(data)
                buffer += data
                while True:
                    command, buffer, complete = parse(buffer)
                    if not complete:
                        break
                    if command is None:
                        self.nops += 1
                        continue
                    if command == b"garbage":
                        self.garbage.append(buffer)
                        return
                    if count == self.script.refuse:
                        self.sock.sendall(
                            encode_frame(FRAME_TYPE_ERROR, b"E_BAD_MESSAGE PUB message too big")
                        )
                        return
                    if count in self.script.heartbeats_before:
                        self.sock.sendall(encode_frame(FRAME_TYPE_RESPONSE, HEARTBEAT))
                    self.executed.append(command)
                    count += 1
                    if self.script.gate is not None:
                        self.script.gate.wait(LIMIT)
                    self.sock.sendall(OK_FRAME)
        except OSError:
            return
        finally:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.sock.close()


def parse(buffer: bytes) -> tuple[bytes | None, bytes, bool]:
    """The first command in ``buffer``: (its body, or None for NOP; the rest;
    whether it was complete)."""
    line, sep, rest = buffer.partition(b"\n")
    if not sep:
        return None, buffer, False
    if line == b"NOP":
        return None, rest, True
    if not line.startswith(b"PUB "):
        return b"garbage", buffer, True
    if len(rest) < 4:
        return None, buffer, False
    size = int.from_bytes(rest[:4], "big")
    if len(rest) < 4 + size:
        return None, buffer, False
    return rest[4 : 4 + size], rest[4 + size :], True


def connected(script: Script) -> tuple[DirectConnection, Server, threading.Thread]:
    client, server_side = socket.socketpair()
    server = Server(server_side, script)
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    conn = DirectConnection(Link(client, "scripted:4150", CONFIG), PublishCore())
    return conn, server, thread


def run_threads(work: list[Callable[[], None]]) -> None:
    threads = [threading.Thread(target=fn, daemon=True) for fn in work]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(LIMIT)
        assert not thread.is_alive(), "a publish hung"


Outcome = str  # "ok", "not", "maybe"


def publish_all(
    conn: DirectConnection,
    bodies: list[bytes],
    outcomes: dict[bytes, Outcome],
    timeout: float | None = LIMIT,
) -> Callable[[], None]:
    """A thread's publishes, one after the other (``timeout=None``: a
    publish alone on the connection takes the lean path)."""
    core = PublishCore()

    def work() -> None:
        for body in bodies:
            try:
                conn.publish(core.pub("t", body), 0, timeout)
            except NotPublishedError:  # NotWrittenError among them
                outcomes[body] = "not"
            except ConnectionClosedError:
                outcomes[body] = "maybe"
            except BadMessageError:
                outcomes[body] = "refused"
            else:
                outcomes[body] = "ok"

    return work


def check(server: Server, outcomes: dict[bytes, Outcome]) -> None:
    assert server.garbage == []
    assert len(server.executed) == len(set(server.executed)), "published twice"
    executed = set(server.executed)
    for body, outcome in outcomes.items():
        if outcome == "ok":
            assert body in executed, body
        elif outcome in ("not", "refused"):
            assert body not in executed, body


@settings(max_examples=60, deadline=None)
@given(
    threads=st.integers(1, 6),
    per_thread=st.integers(1, 8),
    cut_after=st.one_of(st.none(), st.integers(0, 1500)),
    refuse=st.one_of(st.none(), st.integers(0, 30)),
    heartbeats=st.frozensets(st.integers(0, 30), max_size=4),
    timeout=st.sampled_from([LIMIT, None]),
)
def test_interleaved_threads_and_a_connection_that_dies_anywhere(
    threads: int,
    per_thread: int,
    cut_after: int | None,
    refuse: int | None,
    heartbeats: frozenset[int],
    timeout: float | None,
) -> None:
    conn, server, server_thread = connected(Script(cut_after, refuse, heartbeats))
    outcomes: dict[bytes, Outcome] = {}
    work = [
        publish_all(conn, [b"%d-%d" % (t, i) for i in range(per_thread)], outcomes, timeout)
        for t in range(threads)
    ]
    run_threads(work)
    conn.close(ConnectionClosedError("test over"))
    server_thread.join(LIMIT)
    check(server, outcomes)
    assert len(outcomes) == threads * per_thread
    if cut_after is None and refuse is None:
        assert set(outcomes.values()) == {"ok"}
        assert server.nops == len([h for h in heartbeats if h < threads * per_thread])


class CutLink:
    """A link whose n-th write (of one command or many) sends part of its
    bytes, then fails with ``error`` (an OSError, or an interrupt such as
    KeyboardInterrupt).  Given the connection, its lean path's writes (the
    socket's ``sendall``, one command) are counted and cut alike."""

    def __init__(
        self,
        link: Link,
        at: int,
        part: int,
        error: BaseException,
        conn: DirectConnection | None = None,
    ) -> None:
        self.link, self.at, self.part, self.error = link, at, part, error
        self.writes = 0
        self.send_whole = link.send
        link.send = self.send  # type: ignore[method-assign]
        if conn is not None and conn._plain is not None:
            conn._plain = CutSocket(self, conn._plain)  # type: ignore[assignment]

    def send(self, commands: list[bytes]) -> None:
        self.writes += 1
        if self.writes == self.at:
            # An error of the socket leaves bytes unsent; an interrupt may come
            # after the last (a signal is looked at once a send returned).
            data = b"".join(commands)
            whole = isinstance(self.error, Exception)
            cut = min(self.part, len(data) - 1) if whole else self.part
            self.send_whole([data[:cut]])
            self.link.sent_whole = sent_whole(commands, cut)
            raise self.error
        self.send_whole(commands)


class CutSocket:
    """The lean path's socket, its writes counted and cut by a :class:`CutLink`."""

    def __init__(self, cut: CutLink, sock: socket.socket) -> None:
        self.cut, self.sock = cut, sock

    def sendall(self, data: bytes) -> None:
        cut = self.cut
        cut.writes += 1
        if cut.writes == cut.at:
            whole = isinstance(cut.error, Exception)
            self.sock.sendall(data[: min(cut.part, len(data) - 1) if whole else cut.part])
            raise cut.error
        self.sock.sendall(data)


@settings(max_examples=60, deadline=None)
@given(
    threads=st.integers(1, 5),
    per_thread=st.integers(1, 6),
    at=st.integers(1, 20),
    part=st.integers(0, 30),
    interrupt=st.booleans(),
    timeout=st.sampled_from([LIMIT, None]),
)
def test_a_write_cut_short_ends_the_connection_before_anybody_writes_after_it(
    threads: int, per_thread: int, at: int, part: int, interrupt: bool, timeout: float | None
) -> None:
    conn, server, server_thread = connected(Script())
    error: BaseException = KeyboardInterrupt() if interrupt else OSError("cut")
    cut_link = CutLink(conn.link, at, part, error, conn)
    outcomes: dict[bytes, Outcome] = {}
    interrupted: list[bytes] = []

    def worker(bodies: list[bytes]) -> Callable[[], None]:
        def work() -> None:
            for body in bodies:
                try:
                    publish_all(conn, [body], outcomes, timeout)()
                except KeyboardInterrupt:
                    interrupted.append(body)

        return work

    run_threads([worker([b"%d-%d" % (t, i) for i in range(per_thread)]) for t in range(threads)])
    conn.close(ConnectionClosedError("test over"))
    server_thread.join(LIMIT)
    check(server, outcomes)
    # An interrupted publish may have been written whole before the interrupt
    # (then nsqd may execute it): no claim on it, but it is never retried.
    assert len(interrupted) <= 1
    if cut_link.writes >= at:  # (publishes queued at once share a write: fewer writes)
        assert conn.over is not None
        # The publish cut short and every later one on this connection: not written.
        cut = [body for body, outcome in outcomes.items() if outcome == "not"]
        assert len(cut) + len(interrupted) >= 1


def test_a_publish_on_an_ended_connection_raises_not_written_at_once() -> None:
    conn, _server, thread = connected(Script(cut_after=0))
    thread.join(LIMIT)
    core = PublishCore()
    started = time.monotonic()
    with pytest.raises(ConnectionClosedError):
        conn.publish(core.pub("t", b"x"), 0, LIMIT)  # found closed, or lost on the way
    with pytest.raises(NotWrittenError):
        conn.publish(core.pub("t", b"y"), 0, LIMIT)
    assert time.monotonic() - started < LIMIT / 2


def test_a_timeout_hands_the_reading_on() -> None:
    """A reader that gives up (its timeout) hands the reading to the next
    publish in line, which gets its answer."""
    client, server_side = socket.socketpair()
    conn = DirectConnection(Link(client, "slow:4150", CONFIG), PublishCore())
    core = PublishCore()
    first_out: list[BaseException] = []

    def first() -> None:
        try:
            conn.publish(core.pub("t", b"first"), 0, 0.2)
        except BaseException as exc:
            first_out.append(exc)

    reader = threading.Thread(target=first)
    reader.start()
    # Read the first command; answer nothing until it gives up.
    assert server_side.recv(100).startswith(b"PUB t\n")
    reader.join(LIMIT)
    assert isinstance(first_out[0], TimeoutError)
    second_done = threading.Event()

    def second() -> None:
        conn.publish(core.pub("t", b"second"), 0, LIMIT)
        second_done.set()

    follower = threading.Thread(target=second)
    follower.start()
    assert server_side.recv(100).startswith(b"PUB t\n")
    server_side.sendall(OK_FRAME + OK_FRAME)  # the first's answer, then the second's
    follower.join(LIMIT)
    assert second_done.is_set()
    assert conn.answers.counters.published == 2  # the first's answer came, late
    conn.close(ConnectionClosedError("over"))
    server_side.close()


# --- against fakensq and the real nsqd (the `daemon` fixture: both) -----------


@pytest.fixture
def producer(daemon: BlockingNode) -> Iterator[blocking.Producer]:
    with blocking.Producer([daemon.tcp_address]) as producer:
        yield producer


def test_blocking_publishes_go_on_the_calling_thread(producer: blocking.Producer) -> None:
    producer.publish("direct", b"one")
    producer.multi_publish("direct", [b"two", b"three"])
    producer.deferred_publish("direct", b"four", 0.01)
    stats = producer.stats
    assert (stats.published, stats.batches, stats.errors) == (4, 1, 0)
    assert producer._direct is not None and producer._direct.conn is not None


def test_a_body_over_max_msg_size_is_nsqds_error_and_the_next_publish_goes_on(
    producer: blocking.Producer,
) -> None:
    with pytest.raises(BadMessageError):
        producer.publish("direct", b"x" * (1024 * 1024 + 1), timeout=LIMIT)
    producer.publish("direct", b"after", timeout=LIMIT)


def test_an_invalid_topic_is_refused_at_once(producer: blocking.Producer) -> None:
    with pytest.raises(BadTopicError):
        producer.publish("bad topic!", b"x")
    producer.publish("direct", b"after", timeout=LIMIT)


def test_many_threads_publish_while_the_producer_closes(daemon: BlockingNode) -> None:
    producer = blocking.Producer([daemon.tcp_address]).start()
    producer.publish("closing", b"warm")
    results: list[str] = []
    started = threading.Barrier(5)

    def work() -> None:
        started.wait(LIMIT)
        for _ in range(200):
            try:
                producer.publish("closing", b"x", timeout=LIMIT)
            except blocking.ClientClosedError:
                results.append("closed")
                return
            except ConnectionClosedError:
                results.append("lost")
                return
        results.append("done")

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    started.wait(LIMIT)
    producer.close()
    for thread in threads:
        thread.join(LIMIT)
        assert not thread.is_alive()
    assert len(results) == 4
    with pytest.raises(blocking.ClientClosedError):
        producer.publish("closing", b"late")


async def test_a_blocking_publish_inside_a_trio_run_raises_at_once(
    producer: blocking.Producer,
) -> None:
    with pytest.raises(blocking.BlockingInTrioError):
        producer.publish("direct", b"x")
    await trio.lowlevel.checkpoint()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_never_writes_on_the_parents_connection(
    producer: blocking.Producer,
) -> None:
    from .test_fork import in_child

    producer.publish("direct", b"parent")
    parent_conn = producer._direct.conn if producer._direct else None

    def child() -> str:
        producer.publish("direct", b"child")
        direct = producer._direct
        assert direct is not None and direct.conn is not parent_conn
        return "ok"

    assert in_child(child) == "ok"
    producer.publish("direct", b"parent-after")  # the parent's connection, intact
    assert producer._direct is not None and producer._direct.conn is parent_conn


def test_an_idle_connection_closed_by_nsqd_is_replaced_before_the_next_publish(
    daemon: BlockingNode,
) -> None:
    with blocking.Producer([daemon.tcp_address]) as producer:
        producer.publish("direct", b"first")
        direct = producer._direct
        assert direct is not None and direct.conn is not None
        # nsqd goes away and comes back while the connection is idle.
        daemon.kill()
        daemon.start()
        wait_until_blocking(lambda: producer.address is None)
        producer.publish("direct", b"second", timeout=LIMIT)  # a new connection, at once
        assert producer.stats.errors == 0


def test_threads_publishing_at_once_share_one_connection(daemon: BlockingNode) -> None:
    with blocking.Producer([daemon.tcp_address], max_connections=1) as producer:
        producer.publish("spread", b"warm")
        direct = producer._direct
        assert direct is not None
        conn = direct.conn
        start = threading.Barrier(8)

        def work() -> None:
            start.wait(LIMIT)
            for i in range(50):
                producer.publish("spread", b"%d" % i, timeout=LIMIT)

        run_threads([work] * 8)
        assert direct.connections() == [conn]
        assert conn is not None and conn.writes <= 401
        stats = producer.stats
        assert (stats.published, stats.errors, stats.in_flight) == (401, 0, 0)


# --- commands queued while the leader reads go out together ---------------------


class CountingLink:
    """Records how many commands each write of a link carried."""

    def __init__(self, link: Link) -> None:
        self.writes: list[int] = []
        self.send = link.send
        link.send = self.record  # type: ignore[method-assign]

    def record(self, commands: list[bytes]) -> None:
        self.writes.append(len(commands))
        self.send(commands)


def queue_behind_a_held_answer(
    conn: DirectConnection, server: Server, followers: int, outcomes: dict[bytes, Outcome]
) -> list[threading.Thread]:
    """A leader's publish written and its answer held; then ``followers``
    threads' publishes queued behind it (not written: the leader reads)."""
    threads = [threading.Thread(target=publish_all(conn, [b"lead"], outcomes))]
    threads[0].start()
    wait_until_blocking(lambda: server.executed == [b"lead"], limit=LIMIT)
    for i in range(followers):
        thread = threading.Thread(target=publish_all(conn, [b"follower-%d" % i], outcomes))
        thread.start()
        threads.append(thread)
    wait_until_blocking(lambda: len(conn.answers.waiting) == 1 + followers, limit=LIMIT)
    return threads


def test_commands_queued_while_the_leader_reads_go_out_in_one_write() -> None:
    gate = threading.Event()
    conn, server, server_thread = connected(Script(gate=gate))
    writes = CountingLink(conn.link)
    outcomes: dict[bytes, Outcome] = {}
    threads = queue_behind_a_held_answer(conn, server, 5, outcomes)
    assert writes.writes == [1]  # the leader's own; the others wait for its next
    gate.set()
    for thread in threads:
        thread.join(LIMIT)
        assert not thread.is_alive()
    assert writes.writes == [1, 5]
    assert set(outcomes.values()) == {"ok"} and len(outcomes) == 6
    assert conn.answers.counters.published == 6
    conn.close(ConnectionClosedError("test over"))
    server_thread.join(LIMIT)
    check(server, outcomes)


@pytest.mark.parametrize("cut_into", [0, 1, 2])
def test_a_write_of_several_commands_failing_part_way(cut_into: int) -> None:
    """The write of three followers' commands fails inside the ``cut_into``-th:
    those before it were written (answered, or may have been published), it
    and those after it were not (NotWrittenError: the publisher sends them
    again elsewhere), and the server never executes a command cut short."""
    gate = threading.Event()
    conn, server, server_thread = connected(Script(gate=gate))
    outcomes: dict[bytes, Outcome] = {}
    command = len(PublishCore().pub("t", b"follower-0"))
    CutLink(conn.link, 2, cut_into * command + 5, OSError("cut"))
    threads = queue_behind_a_held_answer(conn, server, 3, outcomes)
    gate.set()
    for thread in threads:
        thread.join(LIMIT)
        assert not thread.is_alive()
    assert outcomes[b"lead"] == "ok"
    for i in range(3):
        expected = {"ok", "maybe"} if i < cut_into else {"not"}
        assert outcomes[b"follower-%d" % i] in expected, (i, outcomes)
    assert conn.over is not None
    server_thread.join(LIMIT)
    check(server, outcomes)
    # (The server may stop before executing the whole ones: the client ended it.)
    written = [b"lead"] + [b"follower-%d" % i for i in range(cut_into)]
    assert server.executed == written[: len(server.executed)]


def test_a_connection_ended_while_commands_are_queued_fails_them_not_written() -> None:
    gate = threading.Event()
    conn, server, server_thread = connected(Script(gate=gate))
    outcomes: dict[bytes, Outcome] = {}
    threads = queue_behind_a_held_answer(conn, server, 3, outcomes)
    conn.close(ConnectionClosedError("closed while queued"))
    gate.set()
    for thread in threads:
        thread.join(LIMIT)
        assert not thread.is_alive()
    # The leader's was written (may have been published); the queued ones not.
    assert outcomes == {
        b"lead": "maybe",
        **{b"follower-%d" % i: "not" for i in range(3)},
    }
    server_thread.join(LIMIT)
    check(server, outcomes)


# --- flush and close wait for the blocking publishes of other threads ------------


@contextmanager
def scripted_nsqd(script: Script, then: Script | None = None) -> Iterator[tuple[str, list[Server]]]:
    """A TCP server answering the handshake (IDENTIFY: OK), then a
    :class:`Server` for each connection: following ``script``, or only the
    first does and the others ``then`` (the next connection, where a publish
    never written on the first goes)."""
    listener = socket.create_server(("127.0.0.1", 0))
    servers: list[Server] = []

    def accept() -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:
                return
            buffer = b""
            while True:  # the magic, IDENTIFY's line, its body's size and body
                head = buffer[4:].partition(b"\n")
                if head[1] and len(head[2]) >= 4:
                    size = int.from_bytes(head[2][:4], "big")
                    if len(head[2]) >= 4 + size:
                        break
                chunk = sock.recv(4096)
                if not chunk:
                    break
                buffer += chunk
            sock.sendall(OK_FRAME)
            server = Server(sock, script if then is None or not servers else then)
            servers.append(server)
            threading.Thread(target=server.serve, daemon=True).start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}", servers
    finally:
        try:  # (wakes the accept: closing alone does not, on Linux)
            listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        listener.close()
        if script.gate is not None:
            script.gate.set()
        acceptor.join(LIMIT)


def test_flush_waits_for_blocking_publishes_of_other_threads() -> None:
    gate = threading.Event()
    with scripted_nsqd(Script(gate=gate)) as (address, servers):
        with blocking.Producer([address], heartbeat_interval=None) as producer:
            assert producer.flush(timeout=0)  # nothing in flight
            done = threading.Event()

            def held() -> None:
                producer.publish("t", b"held", timeout=LIMIT)
                done.set()

            thread = threading.Thread(target=held)
            thread.start()
            wait_until_blocking(lambda: servers and servers[0].executed == [b"held"])
            assert producer.stats.in_flight == 1
            assert not producer.flush(timeout=0.05)  # its answer is held
            gate.set()
            assert producer.flush(timeout=LIMIT)
            assert producer.stats.in_flight == 0
            thread.join(LIMIT)
            assert done.is_set()


def test_close_waits_for_a_blocking_publish_in_flight() -> None:
    gate = threading.Event()
    with scripted_nsqd(Script(gate=gate)) as (address, servers):
        producer = blocking.Producer([address], heartbeat_interval=None).start()
        outcome: list[str] = []

        def held() -> None:
            try:
                producer.publish("t", b"held", timeout=LIMIT)
                outcome.append("ok")
            except ConnectionClosedError as exc:
                outcome.append(str(exc))

        thread = threading.Thread(target=held)
        thread.start()
        wait_until_blocking(lambda: servers and servers[0].executed == [b"held"])
        direct = producer._direct
        assert direct is not None and direct.conn is not None
        conn = direct.conn
        closer = threading.Thread(target=producer.close, kwargs={"timeout": LIMIT})
        closer.start()
        wait_until_blocking(lambda: conn._watchers)  # close waits for the answer
        gate.set()
        closer.join(LIMIT)
        thread.join(LIMIT)
        assert not closer.is_alive() and outcome == ["ok"]
        assert conn.over is not None


@pytest.mark.parametrize("compression", ["snappy", "deflate"])
def test_a_write_of_several_commands_over_tls_and_compression(
    nodes: BlockingDaemons, pki: Pki, auth_server: AuthServer, compression: str
) -> None:
    """Commands queued while the leader reads go out in one write, each
    compressed and encrypted by itself: nsqd reads every one."""
    daemon = nodes.nsqd(*pki.nsqd_flags(f"--auth-http-address={auth_server.address}"))
    options: dict[str, Any] = {
        "tls": pki.client_context(),
        "auth_secret": "open-sesame",
        compression: True,
    }
    bodies = [b"lead"] + [b"follower-%d" % i + b"z" * 3000 * i for i in range(4)]
    with blocking.Producer([daemon.tcp_address], max_connections=1, **options) as producer:
        producer.publish("batched", b"warm")
        direct = producer._direct
        assert direct is not None and direct.conn is not None
        conn = direct.conn
        writes = CountingLink(conn.link)
        # The leader's first read waits until the followers queued behind it.
        receive = conn.link.receive
        queued = threading.Event()

        def slow_receive() -> bytes:
            queued.wait(LIMIT)
            conn.link.receive = receive
            return receive()

        conn.link.receive = slow_receive
        threads = [
            threading.Thread(target=producer.publish, args=("batched", body)) for body in bodies
        ]
        threads[0].start()
        wait_until_blocking(lambda: writes.writes == [1], limit=LIMIT)
        for thread in threads[1:]:
            thread.start()
        wait_until_blocking(lambda: len(conn.answers.waiting) == len(bodies), limit=LIMIT)
        queued.set()
        for thread in threads:
            thread.join(LIMIT)
            assert not thread.is_alive()
        assert writes.writes == [1, len(bodies) - 1]
        stats = producer.stats
        assert (stats.published, stats.errors) == (len(bodies) + 1, 0)
    with blocking.Consumer(
        "batched", "chan", nsqd_tcp_addresses=[daemon.tcp_address], **options
    ) as consumer:
        got = []
        for message in consumer:
            message.finish()
            got.append(message.body)
            if len(got) == len(bodies) + 1:
                break
    assert sorted(got) == sorted([b"warm", *bodies])
