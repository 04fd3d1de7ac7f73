"""trionsq.blocking.direct: the pool of connections of the blocking publisher.

A publishing thread takes a connection nobody publishes on (or opens one, up
to ``max_connections``), writes its command and reads its own answer there,
then puts the connection back; past the cap, threads share busy connections
(pipelined).  Against a scripted nsqd (answers held, connections cut), fakensq
and the real nsqd (the ``daemon`` fixture: both).
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trionsq import ConnectionClosedError, blocking
from trionsq.blocking.direct import DirectConnection
from trionsq.blocking.pool import DirectPublisher
from trionsq.link import Link
from trionsq.protocol.errors import NSQErrorResponse
from trionsq.protocol.frames import FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE, HEARTBEAT, encode_frame
from trionsq.publishing import PublishCore

from ..support.nodes import BlockingNode
from ..support.waiting import wait_until_blocking
from .test_direct import CONFIG, LIMIT, OK_FRAME, Script, parse, run_threads, scripted_nsqd


def direct_of(producer: blocking.Producer) -> DirectPublisher:
    direct = producer._direct
    assert direct is not None
    return direct


def executed(servers: list) -> int:  # type: ignore[type-arg]
    return sum(len(server.executed) for server in servers)


@pytest.mark.parametrize("cap", [1, 2, 4])
def test_threads_publishing_at_once_take_a_connection_each_up_to_the_cap(cap: int) -> None:
    """Four threads publish at once, every answer held: each takes a
    connection of its own while the cap allows, the others share busy ones
    (a lean publish holds its connection for its round trip: they wait for
    it, nothing of theirs written); all are answered, on ``cap`` connections."""
    gate = threading.Event()
    with scripted_nsqd(Script(gate=gate)) as (address, servers):
        with blocking.Producer([address], heartbeat_interval=None, max_connections=cap) as producer:
            run = [
                threading.Thread(target=producer.publish, args=("t", b"%d" % i)) for i in range(4)
            ]
            for thread in run:
                thread.start()
            # One publish written on each connection, awaiting its answer; the
            # rest wait for those.
            wait_until_blocking(lambda: producer.stats.in_flight == cap == executed(servers))
            assert len(direct_of(producer).connections()) == cap == len(servers)
            gate.set()
            for thread in run:
                thread.join(LIMIT)
                assert not thread.is_alive()
            stats = producer.stats
            assert (stats.published, stats.errors, stats.in_flight) == (4, 0, 0)
            assert sorted(body for server in servers for body in server.executed) == [
                b"%d" % i for i in range(4)
            ]


def test_close_ends_a_lean_publish_whose_answer_never_comes() -> None:
    """A lean publish holds its connection for its round trip; nsqd never
    answers: close(timeout) waits that long, then shuts the socket under it
    (the publish fails: it was written, it may have been published)."""
    gate = threading.Event()
    with scripted_nsqd(Script(gate=gate)) as (address, servers):
        producer = blocking.Producer([address], heartbeat_interval=None).start()
        failed: list[BaseException] = []

        def publish() -> None:
            try:
                producer.publish("t", b"held")
            except BaseException as exc:
                failed.append(exc)

        thread = threading.Thread(target=publish)
        thread.start()
        wait_until_blocking(lambda: executed(servers) == 1)
        assert not producer.flush(timeout=0.05)
        producer.close(timeout=0.1)
        thread.join(LIMIT)
        assert not thread.is_alive()
        assert [type(exc) for exc in failed] == [ConnectionClosedError]
        gate.set()


def test_a_timed_publish_behind_a_lean_one_times_out_unwritten() -> None:
    """One connection (``max_connections=1``), its lean publish awaiting a
    held answer: a publish with a timeout waits for the connection that
    long, then raises TimeoutError, nothing of it written."""
    gate = threading.Event()
    with scripted_nsqd(Script(gate=gate)) as (address, servers):
        with blocking.Producer([address], heartbeat_interval=None, max_connections=1) as producer:
            first = threading.Thread(target=producer.publish, args=("t", b"first"))
            first.start()
            wait_until_blocking(lambda: executed(servers) == 1)
            with pytest.raises(TimeoutError, match="not published"):
                producer.publish("t", b"second", timeout=0.05)
            gate.set()
            first.join(LIMIT)
            producer.publish("t", b"third")
            assert [body for server in servers for body in server.executed] == [
                b"first",
                b"third",
            ]
            assert producer.stats.published == 2


def test_max_connections_is_checked() -> None:
    with pytest.raises(ValueError, match="max_connections"):
        blocking.Producer(["127.0.0.1:4150"], max_connections=0)
    with pytest.raises(TypeError, match="max_connections"):
        blocking.Producer(["127.0.0.1:4150"], max_connections=2.5)  # type: ignore[arg-type]


def two_connections(producer: blocking.Producer) -> list[DirectConnection]:
    """Two connections in the producer's pool (taken at once, put back)."""
    direct = direct_of(producer)
    first, own_first = direct._take()
    second, own_second = direct._take()
    assert own_first and own_second and first is not second
    direct._put_back(first)
    direct._put_back(second)
    return [first, second]


def test_flush_and_close_wait_for_publishes_on_every_connection() -> None:
    gate = threading.Event()
    with scripted_nsqd(Script(gate=gate)) as (address, servers):
        producer = blocking.Producer([address], heartbeat_interval=None).start()
        run = [threading.Thread(target=producer.publish, args=("t", b"%d" % i)) for i in range(3)]
        for thread in run:
            thread.start()
        wait_until_blocking(lambda: executed(servers) == 3)
        conns = direct_of(producer).connections()
        assert len(conns) == 3
        assert not producer.flush(timeout=0.05)  # every answer is held
        direct = direct_of(producer)
        closer = threading.Thread(target=producer.close, kwargs={"timeout": LIMIT})
        closer.start()
        wait_until_blocking(lambda: direct._closed)  # close began: it waits
        assert closer.is_alive() and direct.in_flight() == 3
        gate.set()
        closer.join(LIMIT)
        for thread in run:
            thread.join(LIMIT)
            assert not thread.is_alive()
        assert not closer.is_alive()
        assert producer.stats.published == 0  # (closed: the counts went with it)
        assert all(conn.over is not None for conn in conns)
        assert sum(conn.counters.published for conn in conns) == 3


def test_a_heartbeat_waiting_on_an_idle_pooled_connection_is_answered_by_the_next_publish() -> None:
    """nsqd's heartbeat sits on a connection idle in the pool; the publish
    that takes it (the lean path) reads it before its answer, answers it
    with NOP and returns its own answer."""
    client, server_side = socket.socketpair()
    conn = DirectConnection(Link(client, "scripted:4150", CONFIG))
    core = PublishCore()
    server_side.sendall(encode_frame(FRAME_TYPE_RESPONSE, HEARTBEAT))
    got: list[bytes] = []

    def serve() -> None:
        buffer = b""
        nops = 0
        while nops < 1 or not got:
            buffer += server_side.recv(4096)
            while True:
                command, buffer, complete = parse(buffer)
                if not complete:
                    break
                if command is None:
                    nops += 1
                else:
                    got.append(command)
                    server_side.sendall(OK_FRAME)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    conn.publish(core.pub("t", b"after a heartbeat"), 0, None)
    server.join(LIMIT)
    assert not server.is_alive()  # it read the NOP and the publish
    assert got == [b"after a heartbeat"]
    assert conn.counters.published == 1 and conn.over is None
    conn.close(blocking.ClientClosedError("over"))
    server_side.close()


@settings(max_examples=80, deadline=None)
@given(
    heartbeat=st.booleans(),
    refused=st.booleans(),
    detail=st.integers(0, 300),
    cuts=st.lists(st.integers(1, 400), max_size=4),
)
def test_the_lean_path_reads_its_answer_in_any_pieces(
    heartbeat: bool, refused: bool, detail: int, cuts: list[int]
) -> None:
    """The lean path's answer, in any pieces: a heartbeat before it, an
    error frame of any length: the heartbeat gets its NOP, the publish its
    whole answer (nsqd's error with its whole text), and nothing is left
    unread."""
    client, server_side = socket.socketpair()
    conn = DirectConnection(Link(client, "scripted:4150", CONFIG))
    text = b"E_BAD_MESSAGE PUB message too big " + b"x" * detail
    answer = encode_frame(FRAME_TYPE_ERROR, text) if refused else OK_FRAME
    stream = (encode_frame(FRAME_TYPE_RESPONSE, HEARTBEAT) if heartbeat else b"") + answer

    def serve() -> None:
        server_side.recv(4096)  # the PUB (one small write)
        start = 0
        for cut in sorted(cuts):
            if start < cut < len(stream):
                server_side.sendall(stream[start:cut])
                start = cut
        server_side.sendall(stream[start:])

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        if refused:
            with pytest.raises(NSQErrorResponse) as raised:
                conn.publish(PublishCore().pub("t", b"body"), 0, None)
            assert str(raised.value).encode().endswith(text[len(b"E_BAD_MESSAGE ") :])
        else:
            conn.publish(PublishCore().pub("t", b"body"), 0, None)
            assert conn.counters.published == 1 and conn.over is None
            assert not conn.link.readable_now()  # every byte of the answer read
        server.join(LIMIT)
        assert not server.is_alive()
        if not refused:  # (the heartbeat's NOP went out before the publish returned)
            server_side.setblocking(False)
            try:
                after = server_side.recv(4096)
            except BlockingIOError:
                after = b""
            assert after == b"NOP\n" * heartbeat
    finally:
        conn.close(blocking.ClientClosedError("over"))
        server_side.close()


def test_pooled_connections_nsqd_closed_while_idle_are_left_for_new_ones() -> None:
    """nsqd closes both pooled connections while they are idle; each publish
    that takes one finds it closed before writing (idle long enough to be
    looked at) and publishes on a new connection, unseen by the caller."""
    with scripted_nsqd(Script()) as (address, servers):
        with blocking.Producer([address], heartbeat_interval=None) as producer:
            conns = two_connections(producer)
            direct = direct_of(producer)
            wait_until_blocking(lambda: len(servers) == 2)
            for server in servers:
                server.sock.shutdown(socket.SHUT_RDWR)  # nsqd ends both
            wait_until_blocking(lambda: all(conn.link.readable_now() for conn in conns))
            for conn in conns:  # idle past the check: looked at before a write
                conn.last_read -= 60
            producer.publish("t", b"first", timeout=LIMIT)
            assert conns[1].over is not None  # the one taken first (the last put back)
            direct._idle.remove(conns[0])  # (the next one taken: the last put back)
            direct._idle.append(conns[0])
            producer.publish("t", b"second")  # found closed too, once looked at
            assert conns[0].over is not None
            assert not set(conns) & set(direct.connections())
            assert [server.executed for server in servers[:2]] == [[], []]
            assert sorted(body for server in servers[2:] for body in server.executed) == [
                b"first",
                b"second",
            ]
            assert producer.stats.errors == 0


def test_a_pooled_connection_idle_past_heartbeats_stays_alive(daemon: BlockingNode) -> None:
    """Connections idle in the pool get the keeper's NOP each heartbeat
    interval (nsqd closes one silent for two): after several intervals
    every one still publishes."""
    with blocking.Producer([daemon.tcp_address], heartbeat_interval=1.0) as producer:
        producer.publish("pooled", b"warm")
        conns = two_connections(producer)
        writes = [conn.writes for conn in conns]
        wait_until_blocking(
            lambda: all(c.writes >= w + 3 for c, w in zip(conns, writes, strict=True)),
            limit=LIMIT,
        )
        assert all(conn.over is None for conn in conns)
        core = direct_of(producer).core
        for conn in conns:  # on each (not through the pool: both for sure)
            conn.publish(core.pub("pooled", b"on each"), 0, LIMIT)
        producer.publish("pooled", b"and through the pool")
        stats = producer.stats
        assert (stats.published, stats.errors) == (4, 0)


def test_a_pooled_connection_of_a_restarted_nsqd_is_replaced(daemon: BlockingNode) -> None:
    with blocking.Producer([daemon.tcp_address]) as producer:
        producer.publish("pooled", b"first")
        conns = two_connections(producer)
        daemon.kill()
        daemon.start()
        wait_until_blocking(lambda: producer.address is None)  # each looked at
        run_threads([lambda: producer.publish("pooled", b"again", timeout=LIMIT)] * 2)
        direct = direct_of(producer)
        assert not set(conns) & set(direct.connections())
        assert producer.stats.errors == 0


def _local_ports(producer: blocking.Producer) -> set[int]:
    return {conn.link.sock.getsockname()[1] for conn in direct_of(producer).connections()}


@pytest.fixture
def pooled(daemon: BlockingNode) -> Iterator[blocking.Producer]:
    with blocking.Producer([daemon.tcp_address]) as producer:
        yield producer


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_uses_none_of_the_parents_pooled_connections(
    pooled: blocking.Producer,
) -> None:
    from .test_fork import in_child

    pooled.publish("pooled", b"parent")
    parent = two_connections(pooled)
    ports = _local_ports(pooled)
    assert len(ports) == 2

    def child() -> str:
        pooled.publish("pooled", b"child")  # (the first call starts it afresh)
        run_threads([lambda: pooled.publish("pooled", b"child")] * 2)
        mine = _local_ports(pooled)
        return "ok" if mine and not mine & ports else f"shared {mine & ports}"

    assert in_child(child) == "ok"
    # The parent's connections, intact.
    core = direct_of(pooled).core
    for conn in parent:
        conn.publish(core.pub("pooled", b"parent-after"), 0, LIMIT)
    assert pooled.stats.errors == 0
