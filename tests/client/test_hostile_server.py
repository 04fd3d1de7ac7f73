"""The consumer against an nsqd that lies: it ignores RDY and floods, announces
lengths of 2**31-1, negative ones or garbage, sends decompression bombs under
snappy and deflate, never reads what the client writes, or stops half way
through a frame.  Over lockstep in-memory streams (a write waits for the
client's read, as a full socket does), real TCP sockets (the consumer's shared
reader) and TLS.

Each test checks that the client lives on, that its memory stays bounded
(tracemalloc's peak over the hostile part, against what the server tried to
send), that another nsqd of the same consumer keeps working meanwhile, and that
nothing is handed to the handler beyond RDY, nor lost: what the handler got is
finished, what the consumer held is requeued or left to nsqd's timeout.
"""

from __future__ import annotations

import logging
import ssl
import struct
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import pytest
import trio
import trio.testing
import trustme
from hypothesis import given, settings
from hypothesis import strategies as st

import trionsq
import trionsq.writing
from trionsq.connection import Connection
from trionsq.protocol.errors import FrameTooLarge, InvalidFrame, ProtocolError
from trionsq.protocol.frames import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    HEARTBEAT,
    encode_frame,
    encode_response,
)
from trionsq.session import Session as _Session

from ..support.waiting import wait_until
from .hostile import HostileConn, HostileNSQD, deflate_block, message, snappy_bomb_chunk
from .minisrv import MiniNSQD

#: what a flooding nsqd tries to send (the client must take a bounded part of it)
FLOOD = 24 * 1024 * 1024
BODY = b"x" * 100
#: what the client may allocate while a hostile nsqd does its worst (the
#: consumer, its connections, one read, the frames held: well under a MiB;
#: the margin is for the test's own bookkeeping)
BOUND = 3 * 1024 * 1024


@contextmanager
def traced() -> Iterator[Callable[[], int]]:
    """tracemalloc on; yields a function giving the peak since the start,
    above what was allocated then."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        yield lambda: tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def flood(
    total: int = FLOOD, body: bytes = BODY, start: trio.Event | None = None
) -> Callable[[HostileConn], Awaitable[None]]:
    """A script: messages without end (to ``total`` bytes), RDY ignored
    (from when ``start`` is set, if given)."""

    async def script(conn: HostileConn) -> None:
        if start is not None:
            await start.wait()
        index = 0
        while conn.sent_bytes < total:
            frames = b"".join(message(index + i, body) for i in range(100))
            index += 100
            await conn.send_messages(frames, 100)
        await trio.sleep_forever()

    return script


def hostile_session(consumer: trionsq.Consumer) -> _Session:
    (session,) = [s for s in consumer._sessions if s.address == "hostile:4150"]
    return session


class Pair:
    """A consumer over a hostile nsqd (``hostile:4150``) and a well-behaved
    one (``good:4150``, a MiniNSQD); the handler records what it gets, holds
    the hostile node's messages until :attr:`release` and checks, for each,
    that the consumer holds no more than RDY allows."""

    def __init__(self, nursery: trio.Nursery, hostile: HostileNSQD) -> None:
        self.hostile = hostile
        self.good = MiniNSQD(nursery, tls_context=hostile.tls_context)
        script = hostile.script

        async def once_both_subscribed(conn: HostileConn) -> None:
            # RDY spread over both nsqds (the hostile one's share is 2), not
            # all of max_in_flight to the first one that came.
            await wait_until(
                lambda: self.consumer is not None and len(self.consumer._sessions) == 2
            )
            await script(conn)

        hostile.script = once_both_subscribed
        self.release = trio.Event()
        self.handed: list[bytes] = []  # hostile messages the handler got (the first 2000)
        self.handed_count = 0
        self.good_bodies: list[bytes] = []
        self.beyond_rdy: list[str] = []
        self.consumer: trionsq.Consumer | None = None
        #: the highest RDY the consumer queued for each nsqd
        self.told: dict[str, int] = {}
        #: the client's log lines, as text (see consuming)
        self.logs: list[str] = []

    async def connector(self, host: str, port: int) -> trio.abc.Stream:
        node = self.hostile if host == "hostile" else self.good
        return await node.connector(host, port)

    async def handler(self, message: trionsq.Message) -> None:
        if message.address == "good:4150":
            self.good_bodies.append(message.body)
            return
        self.handed_count += 1
        if len(self.handed) < 2000:  # what is kept counts in the memory measured
            self.handed.append(message.id)
        assert self.consumer is not None
        state = hostile_session(self.consumer).rdy_state
        assert state is not None
        # Never more in flight than the highest RDY nsqd was told (what it
        # may still have in effect: it reads a lowered one when it does).
        told = self.told.get("hostile:4150", 0)
        if state.in_flight > told:
            self.beyond_rdy.append(f"{state.in_flight} in flight, RDY at most {told}")
        await self.release.wait()

    @asynccontextmanager
    async def consuming(self, **options: Any) -> AsyncIterator[trionsq.Consumer]:
        options = {
            "max_in_flight": 4,
            "heartbeat_interval": 5.0,
            "read_timeout": 11.0,
            "reconnect_backoff": trionsq.BackoffPolicy(base=1.0, max=30.0),
            "close_timeout": 0.5,
            **options,
        }
        flush_rdy = _Session.flush_rdy

        def told(session: _Session) -> None:
            flush_rdy(session)
            highest = self.told.get(session.address, 0)
            self.told[session.address] = max(highest, session.wire_rdy)

        async with (
            _patched(_Session, "flush_rdy", told),
            _logs_as_text(self.logs),
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(self.heartbeats)
            try:
                async with trionsq.Consumer(
                    "topic",
                    "chan",
                    nsqd_tcp_addresses=["hostile:4150", "good:4150"],
                    connector=self.connector,
                    handler=self.handler,
                    **options,
                ) as consumer:
                    self.consumer = consumer
                    try:
                        yield consumer
                    finally:
                        await self.hostile.close_all()  # leaving waits for no CLOSE_WAIT
            finally:
                # Only once the consumer is left: cancelled around it, its
                # exit would raise Cancelled in place of the block's error.
                nursery.cancel_scope.cancel()

    async def good_still_works(self) -> None:
        count = len(self.good_bodies)
        self.good.put(b"good 1", b"good 2", b"good 3")
        await wait_until(lambda: len(self.good_bodies) >= count + 3)

    async def heartbeats(self) -> None:
        """What MiniNSQD does not send: nsqd's heartbeats, every second."""
        while True:
            await trio.sleep(1)
            for conn in self.good.live:
                try:
                    await conn.send(encode_response(HEARTBEAT))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass


@asynccontextmanager
async def _patched(owner: object, name: str, value: object) -> AsyncIterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(owner, name, value)
        yield


class _TextHandler(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.DEBUG)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.getMessage()}")


@asynccontextmanager
async def _logs_as_text(lines: list[str]) -> AsyncIterator[None]:
    """The client's log records kept as text only: pytest's capture keeps
    each record, and a record of a lost connection keeps its exception, its
    frames and the connection (a compressor's state: 300 KB), which the
    memory measured would count."""
    logger = logging.getLogger("trionsq")
    handler = _TextHandler(lines)
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.propagate = True
        logger.removeHandler(handler)
        if any(line.startswith(("ERROR", "CRITICAL")) for line in lines):
            print("\n".join(lines))  # shown with a failure


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def tls_contexts(ca: trustme.CA) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("hostile", "good").configure_cert(server)
    client = ssl.create_default_context()
    ca.configure_trust(client)
    return server, client


# --- floods beyond RDY -------------------------------------------------------------

PATHS = [
    pytest.param("lockstep", None, id="memory"),
    pytest.param("lockstep", "deflate", id="memory-deflate"),
    pytest.param("tcp", None, id="tcp-shared-reader"),
    pytest.param("tcp", "snappy", id="tcp-snappy"),
    pytest.param("tls", None, id="tls"),
]


@pytest.mark.parametrize(("transport", "compression"), PATHS)
async def test_a_flood_beyond_rdy_is_read_no_further_than_rdy(
    nursery: trio.Nursery, ca: trustme.CA, transport: str, compression: str | None
) -> None:
    """An nsqd that ignores RDY: the handler gets what RDY allows, the
    consumer holds at most one read beyond it and reads on only as messages
    are answered; the flood stalls in the server, not in the client (before:
    everything read and queued, 30 MiB -> 2.1 GiB in 8 s)."""
    server_tls, client_tls = tls_contexts(ca)
    hostile = HostileNSQD(
        nursery,
        flood(),
        transport=transport,
        compression=compression,
        tls_context=server_tls if transport == "tls" else None,
    )
    pair = Pair(nursery, hostile)
    options: dict[str, Any] = {"tls": client_tls} if transport == "tls" else {}
    if compression:
        options[compression] = True
    with traced() as peak:
        async with pair.consuming(**options) as consumer:
            await wait_until(lambda: len(pair.handed) >= 2)
            await trio.testing.wait_all_tasks_blocked(0.05)  # the flood is stuck
            session = hostile_session(consumer)
            # What RDY allowed: its share of max_in_flight 4.
            assert len(pair.handed) == 2
            (conn,) = hostile.conns
            assert conn.sent_bytes < FLOOD // 4, conn.sent_bytes
            assert len(session.held) * len(message(0, BODY)) <= 64 * 1024 + 4096
            assert peak() < BOUND, peak()
            # Answered, the next ones come, still within RDY; the other
            # nsqd gets its share of max_in_flight and its messages flow.
            pair.release.set()
            await wait_until(lambda: pair.handed_count >= 1000)
            await pair.good_still_works()
            assert peak() < BOUND, peak()
            # Nothing lost: what the handler got is finished, nothing else.
            await wait_until(lambda: len(conn.fins) >= 1000)
            assert set(conn.fins) <= set(pair.handed)
        assert not pair.beyond_rdy


async def test_the_shared_reader_holds_only_the_flooding_connection(
    nursery: trio.Nursery,
) -> None:
    """Several connections on the consumer's shared reader (real sockets):
    the one that floods waits, a well-behaved one on the same reader goes on
    (with its share of max_in_flight: the flood starts once both have it)."""
    start = trio.Event()
    hostile = HostileNSQD(nursery, flood(start=start), transport="tcp")
    good = MiniNSQD(nursery, tcp=True)
    handed: list[bytes] = []
    got: list[bytes] = []
    release = trio.Event()

    async def handler(message: trionsq.Message) -> None:
        if message.address == "good:4150":
            got.append(message.body)
            return
        handed.append(message.id)
        await release.wait()

    async def connector(host: str, port: int) -> trio.abc.Stream:
        return await (hostile if host == "hostile" else good).connector(host, port)

    with traced() as peak:
        async with trionsq.Consumer(
            "topic",
            "chan",
            nsqd_tcp_addresses=["hostile:4150", "good:4150"],
            connector=connector,
            handler=handler,
            max_in_flight=4,
        ) as consumer:
            await wait_until(lambda: [s.wire_rdy for s in consumer._sessions] == [1, 1])
            start.set()
            await wait_until(lambda: len(handed) >= 1)
            await wait_until(lambda: hostile_session(consumer).wire_rdy == 2)
            await wait_until(lambda: len(handed) == 2)
            await trio.testing.wait_all_tasks_blocked(0.05)
            assert consumer._mux.reads  # both sockets on the shared reader
            good.put(*[b"on the shared reader %d" % i for i in range(50)])
            await wait_until(lambda: len(got) == 50)
            assert len(handed) == 2
            assert peak() < BOUND, peak()
            await hostile.close_all()


async def test_iteration_gets_no_more_than_rdy_from_a_flood(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    """``async for`` without answering: the loop gets RDY's worth, then
    waits (before: it got every message of the flood)."""
    hostile = HostileNSQD(nursery, flood(), transport="lockstep")
    async with trionsq.Consumer(
        "topic",
        "chan",
        nsqd_tcp_addresses=["hostile:4150"],
        connector=hostile.connector,
        max_in_flight=3,
        close_timeout=0.5,
    ) as consumer:
        got = []
        with trio.move_on_after(50):  # less than nsqd's msg_timeout (60 s)
            async for message in consumer:
                got.append(message)
        assert len(got) == 3
        await got[0].finish()
        with trio.move_on_after(5):
            async for message in consumer:
                got.append(message)
        assert len(got) == 4  # one answered, one more
        # Once nsqd's msg_timeout is over, it has timed out those still
        # unanswered, and may send others in their place: so many more.
        with trio.move_on_after(60):
            async for message in consumer:
                got.append(message)
        assert len(got) == 7
        await hostile.close_all()


async def test_what_is_held_beyond_rdy_is_requeued_at_leaving(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    """Nothing lost: the messages iterated and left unanswered, and those
    held beyond RDY, all go back to nsqd (REQ 0) when the consumer leaves."""

    async def burst(conn: HostileConn) -> None:
        await conn.send_messages(b"".join(message(i, BODY) for i in range(10)), 10)
        await trio.sleep_forever()

    hostile = HostileNSQD(nursery, burst, transport="lockstep")
    hostile.answer_cls = True
    async with trionsq.Consumer(
        "topic",
        "chan",
        nsqd_tcp_addresses=["hostile:4150"],
        connector=hostile.connector,
        max_in_flight=2,
    ) as consumer:
        got = []
        with trio.move_on_after(10):
            async for m in consumer:
                got.append(m.id)
        assert len(got) == 2  # RDY (1, then 2 once the first came): the rest held
        assert len(hostile_session(consumer).held) == 8
    (conn,) = hostile.conns
    assert sorted(msg_id for msg_id, delay in conn.reqs) == [b"%016x" % i for i in range(10)]
    assert {delay for _, delay in conn.reqs} == {0}
    assert not conn.fins


async def test_a_server_that_never_reads_cannot_pile_up_our_writes(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flood from an nsqd that reads nothing: each message answered is a
    FIN to write, which nobody takes; the consumer reads no more once its
    writes are backlogged (before: FINs queued without end)."""
    # The mark above which writes count as backlogged, smaller: the same
    # code, a flood of fewer messages.
    monkeypatch.setattr(trionsq.writing, "HIGH_WATER", 64 * 1024)
    hostile = HostileNSQD(nursery, flood(), transport="lockstep", reads=False)
    pair = Pair(nursery, hostile)
    pair.release.set()  # a quick handler: a FIN for each
    with traced() as peak:
        async with pair.consuming() as consumer:
            await wait_until(lambda: pair.handed_count > 100)
            await trio.sleep(60)
            session = hostile_session(consumer)
            assert session.conn.backlogged
            queued = len(session.conn._out)
            assert queued < 2 * 64 * 1024, queued
            (conn,) = hostile.conns
            assert conn.sent_bytes < FLOOD // 8, conn.sent_bytes
            assert peak() < BOUND, peak()
            await pair.good_still_works()
    assert not pair.beyond_rdy


async def test_heartbeats_from_a_server_that_never_reads_queue_one_nop(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    async def heartbeats(conn: HostileConn) -> None:
        frame = encode_response(HEARTBEAT) * 1000
        while conn.sent_bytes < FLOOD // 12:
            await conn.send(frame)
        await trio.sleep_forever()

    hostile = HostileNSQD(nursery, heartbeats, transport="lockstep", reads=False)
    pair = Pair(nursery, hostile)
    with traced() as peak:
        async with pair.consuming() as consumer:
            await wait_until(lambda: hostile.conns and hostile.conns[0].sent_bytes >= FLOOD // 12)
            session = hostile_session(consumer)
            assert len(session.conn._out) < 1024
            assert peak() < BOUND, peak()
            await pair.good_still_works()


# --- lengths, garbage, half frames ---------------------------------------------------


def frame_head(size: int, frame_type: int) -> bytes:
    return struct.pack(">lL", size, frame_type)


BAD_STARTS = [
    pytest.param(frame_head(2**31 - 1, FRAME_TYPE_RESPONSE), FrameTooLarge, id="2**31-1-response"),
    pytest.param(frame_head(2**31 - 1, FRAME_TYPE_ERROR), FrameTooLarge, id="2**31-1-error"),
    pytest.param(struct.pack(">l", -1), InvalidFrame, id="-1"),
    pytest.param(struct.pack(">l", -(2**31)), InvalidFrame, id="-2**31"),
    pytest.param(struct.pack(">l", 0), InvalidFrame, id="0"),
    pytest.param(struct.pack(">l", 3), InvalidFrame, id="3"),
    pytest.param(frame_head(12, 7) + b"garbage!", InvalidFrame, id="unknown-type"),
    pytest.param(b"HTTP/1.1 400 Bad Request\r\n\r\n", ProtocolError, id="garbage"),
]


@pytest.mark.parametrize(("start", "error"), BAD_STARTS)
async def test_a_bad_length_or_garbage_ends_only_that_connection(
    nursery: trio.Nursery,
    autojump_clock: trio.testing.MockClock,
    start: bytes,
    error: type[Exception],
) -> None:
    """The connection ends with a typed error at once, nothing is allocated
    for what the length claims, the consumer reconnects with growing delays
    (never a tight loop), and the other nsqd goes on."""
    closed: list[BaseException | None] = []

    async def script(conn: HostileConn) -> None:
        await conn.send(start)
        await trio.sleep_forever()

    hostile = HostileNSQD(nursery, script, transport="lockstep")
    pair = Pair(nursery, hostile)
    original = Connection._finish

    def finish(self: Connection, reason: BaseException | None) -> None:
        if self.address == "hostile:4150" and not self.closed:
            closed.append(reason)
        original(self, reason)

    with pytest.MonkeyPatch.context() as patch, traced() as peak:
        patch.setattr(Connection, "_finish", finish)
        async with pair.consuming():
            await trio.sleep(60)
            assert peak() < BOUND, peak()
            await pair.good_still_works()
    # 1, 2, 4, 8, 16 s and so on between attempts: about 6 in a minute.
    assert 3 <= len(hostile.conns) <= 8, len(hostile.conns)
    assert all(isinstance(reason, error) for reason in closed[:3]), closed
    assert not pair.handed


async def test_a_huge_message_length_is_read_past_and_answered(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    """A message frame announcing 2**31-1 bytes: its header is read, it is
    requeued (nsqd's to give to someone else, or give up later), and its
    body read past as it comes, never held; the server then sending nothing
    more, the connection ends after read_timeout."""
    header = frame_head(2**31 - 1, FRAME_TYPE_MESSAGE) + message(7, b"")[8:34]

    async def script(conn: HostileConn) -> None:
        await conn.send(header)
        for _ in range(200):
            await conn.send(b"\0" * 65536)  # 12.5 MiB of its body
        await trio.sleep_forever()

    hostile = HostileNSQD(nursery, script, transport="lockstep")
    pair = Pair(nursery, hostile)
    with traced() as peak:
        async with pair.consuming():
            await wait_until(lambda: hostile.conns and hostile.conns[0].reqs)
            await wait_until(lambda: hostile.conns[0].sent_bytes > 200 * 65536)
            assert peak() < BOUND, peak()
            await pair.good_still_works()
            (conn,) = hostile.conns[:1]
            assert conn.reqs[0][0] == b"%016x" % 7
    assert not pair.handed
    assert any("more than max_frame_size" in line for line in pair.logs)


@pytest.mark.parametrize("cut", [1, 4, 8, 20, 34, 100])
async def test_a_frame_cut_short_ends_the_connection_after_read_timeout(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock, cut: int
) -> None:
    frame = message(1, b"y" * 1000)

    async def script(conn: HostileConn) -> None:
        await conn.send(frame[:cut])
        await trio.sleep_forever()  # and no heartbeat

    hostile = HostileNSQD(nursery, script, transport="lockstep")
    pair = Pair(nursery, hostile)
    with traced() as peak:
        async with pair.consuming(heartbeat_interval=1.0, read_timeout=2.0):
            await wait_until(lambda: len(hostile.conns) >= 2)  # dropped, reconnected
            assert peak() < BOUND, peak()
            await pair.good_still_works()
    assert not pair.handed


# --- decompression bombs ---------------------------------------------------------------


def deflate_bomb(plain: bytes, copies: int) -> Callable[[HostileConn], Awaitable[None]]:
    block = deflate_block(plain)
    # As many blocks a write as fit a read of the client's (64 KiB).
    batch = max(1, 60_000 // len(block))

    async def script(conn: HostileConn) -> None:
        for _ in range(copies // batch):
            await conn.send_raw(block * batch)
        await trio.sleep_forever()

    return script


def snappy_bomb(plain: bytes, copies: int) -> Callable[[HostileConn], Awaitable[None]]:
    chunk = snappy_bomb_chunk(plain)
    batch = max(1, 60_000 // len(chunk))

    async def script(conn: HostileConn) -> None:
        for _ in range(copies // batch):
            await conn.send_raw(chunk * batch)
        await trio.sleep_forever()

    return script


#: about 1 GiB once inflated: zeros (a frame of size 0), messages (as many
#: whole ones as a snappy chunk holds), and a message frame far above the
#: consumer's limit, its body zeros
ZEROS = b"\0" * (1024 * 1024)
MESSAGES = b"".join(message(i, BODY) for i in range(65536 // len(message(0, BODY))))
HUGE_MESSAGE_HEAD = frame_head(2**30, FRAME_TYPE_MESSAGE) + message(9, b"")[8:34]


@pytest.mark.parametrize("compression", ["deflate", "snappy"])
@pytest.mark.parametrize("kind", ["zeros", "messages", "huge-message"])
async def test_a_decompression_bomb_inflates_one_read_at_a_time(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock, compression: str, kind: str
) -> None:
    """A few MB that inflate to a GiB: never more than a read's worth
    inflated at once (before: up to 64 MiB a read under deflate); zeros end
    the connection at once, a flood of messages is held to RDY like any
    flood, a huge message is read past."""
    plain = ZEROS if kind != "messages" else MESSAGES
    # A GiB, but a huge message's body is read past to its end: 64 MiB of it.
    copies = 64 if kind == "huge-message" else 1024
    if compression == "deflate":
        bomb = deflate_bomb(plain if kind != "messages" else MESSAGES * 16, copies)
    else:
        bomb = snappy_bomb(plain[:65536], 16 * copies)

    async def script(conn: HostileConn) -> None:
        if kind == "huge-message":
            await conn.send(HUGE_MESSAGE_HEAD)
        await bomb(conn)

    hostile = HostileNSQD(nursery, script, transport="lockstep", compression=compression)
    pair = Pair(nursery, hostile)
    # zlib's own state counts too: some 300 KB a compressor (the client's and
    # the server's, on both nsqds), a little for an inflater.
    bound = BOUND + (2 * 1024 * 1024 if compression == "deflate" else 0)
    with traced() as peak:
        async with pair.consuming(**{compression: True, "max_frame_size": 1024 * 1024}):
            await trio.sleep(60)
            assert peak() < bound, peak()
            if kind == "messages":
                assert pair.handed_count == 2  # RDY
            if kind == "huge-message":
                assert hostile.conns[0].reqs  # answered, its body read past
            await pair.good_still_works()
    assert not pair.beyond_rdy
    if kind != "messages":
        assert not pair.handed


# --- garbage anywhere ----------------------------------------------------------------

VALID = (
    encode_response(HEARTBEAT)
    + message(1, b"one")
    + encode_frame(FRAME_TYPE_ERROR, b"E_FIN_FAILED FIN 0000000000000009 failed")
    + message(2, b"two" * 100)
    + encode_response(HEARTBEAT)
    + message(3, b"three")
)


@settings(max_examples=80)
@given(
    st.integers(0, len(VALID)),
    st.binary(min_size=1, max_size=12),
    st.lists(st.integers(1, 64), max_size=6),
)
def test_garbage_at_any_offset_ends_only_that_connection(
    offset: int, garbage: bytes, pieces: list[int]
) -> None:
    """Garbage put anywhere into a valid stream (cut into pieces): the
    client lives on, never hands more than RDY to the handler, and its other
    nsqd goes on."""
    stream = VALID[:offset] + garbage + VALID[offset:]

    async def script(conn: HostileConn) -> None:
        await conn.wait_rdy()
        rest = stream
        for size in pieces:
            await conn.send(rest[:size])
            rest = rest[size:]
        if rest:
            await conn.send(rest)
        await trio.sleep_forever()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            hostile = HostileNSQD(nursery, script, transport="lockstep")
            pair = Pair(nursery, hostile)
            pair.release.set()
            async with pair.consuming(heartbeat_interval=1.0, read_timeout=2.0):
                await trio.sleep(5)
                await pair.good_still_works()
            assert not pair.beyond_rdy
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


async def test_a_message_sent_again_is_taken_whatever_the_clock_says(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    """nsqd has a message in flight once at a time: one that comes again was
    timed out there (a channel emptied, a clock that ran faster): it is
    taken at once, the unanswered copy no longer counting; a queued copy is
    replaced, not kept twice."""

    async def twice(conn: HostileConn) -> None:
        await conn.wait_rdy()
        await conn.send_messages(message(1, b"one"), 1)
        await wait_until(lambda: len(conn.rdys) >= 2, step=0.01)
        await conn.send_messages(message(2, b"two"), 1)
        await trio.sleep(5)  # both unanswered: nsqd "times them out" now
        await conn.send_messages(message(1, b"one") + message(2, b"two"), 2)
        await trio.sleep_forever()

    hostile = HostileNSQD(nursery, twice, transport="lockstep")
    hostile.answer_cls = True
    async with trionsq.Consumer(
        "topic",
        "chan",
        nsqd_tcp_addresses=["hostile:4150"],
        connector=hostile.connector,
        max_in_flight=2,
    ) as consumer:
        first = await consumer.__anext__()
        await consumer.__anext__()
        with trio.fail_after(10):  # well within msg_timeout (60 s)
            again = [await consumer.__anext__(), await consumer.__anext__()]
        assert sorted(m.body for m in again) == [b"one", b"two"]
        assert not hostile_session(consumer).held
        for m in [*again, first]:
            await m.finish()
