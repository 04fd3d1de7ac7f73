"""trionsq.aio.direct: the asyncio Producer's publishes done by the loop itself.

The scripted nsqd of test_direct (a socket pair: it executes the whole
commands, answers them, and may end the connection after any byte, refuse a
publish, send heartbeats) on the other end of an :class:`AioConnection`;
hypothesis picks the tasks, their publishes, where the connection dies:

- a publish whose future says OK was executed by the server, exactly once;
- one that raised NotPublishedError was not executed;
- one that raised a plain ConnectionClosedError may have been, or not;
- nothing hangs, and the server never reads a command cut short followed by
  more bytes.

Then peers that lie (garbage, a huge frame length, silence) and, against
fakensq and the real nsqd, heartbeats, an nsqd restarted under an idle
connection, a fork.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trionsq import aio
from trionsq.aio import direct
from trionsq.aio.direct import AioConnection
from trionsq.config import Config
from trionsq.connection import ConnectionClosedError
from trionsq.link import Link
from trionsq.protocol.errors import BadMessageError
from trionsq.publishing import NotPublishedError, PublishCore

from ..support.nodes import BlockingNode
from ..support.waiting import wait_until_asyncio, wait_until_blocking
from .conftest import stats
from .test_direct import CONFIG, LIMIT, OK_FRAME, Outcome, Script, Server, check, scripted_nsqd

pytestmark = pytest.mark.usefixtures("no_threads_left")


class Reply:
    """A publish's answer into an asyncio future (as the Producer's)."""

    def __init__(self, future: asyncio.Future[None]) -> None:
        self.future = future

    def set_result(self, value: None) -> None:
        if not self.future.done():
            self.future.set_result(value)

    def set_exception(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)


def connection(sock: socket.socket, config: Config = CONFIG) -> tuple[AioConnection, list[str]]:
    """An AioConnection on ``sock`` (no handshake); the list says when it
    ended.  Its publishes never written fail with NotPublishedError when it
    ends (the publisher, not here, would send them once more)."""
    events: list[str] = []

    def over() -> None:
        events.append("over")
        for _, _, waiter in conn.unwritten:
            waiter.set_exception(NotPublishedError("never written"))

    conn = AioConnection(
        asyncio.get_running_loop(),
        Link(sock, "scripted:4150", config),
        on_answers=lambda: None,
        on_over=over,
    )
    return conn, events


def publish(conn: AioConnection, body: bytes) -> asyncio.Future[None]:
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    conn.send(PublishCore().pub("t", body), Reply(future), 0)
    return future


async def outcome_of(future: asyncio.Future[None]) -> Outcome:
    try:
        await future
    except NotPublishedError:
        return "not"
    except ConnectionClosedError:
        return "maybe"
    except BadMessageError:
        return "refused"
    return "ok"


@settings(max_examples=60, deadline=None)
@given(
    tasks=st.integers(1, 6),
    per_task=st.integers(1, 8),
    gathered=st.booleans(),
    cut_after=st.one_of(st.none(), st.integers(0, 1500)),
    refuse=st.one_of(st.none(), st.integers(0, 30)),
    heartbeats=st.frozensets(st.integers(0, 30), max_size=4),
)
def test_interleaved_tasks_and_a_connection_that_dies_anywhere(
    tasks: int,
    per_task: int,
    gathered: bool,
    cut_after: int | None,
    refuse: int | None,
    heartbeats: frozenset[int],
) -> None:
    client, server_side = socket.socketpair()
    server = Server(server_side, Script(cut_after, refuse, heartbeats))
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    outcomes: dict[bytes, Outcome] = {}

    async def main() -> None:
        conn, _ = connection(client)

        async def task(t: int) -> None:
            bodies = [b"%d-%d" % (t, i) for i in range(per_task)]
            if gathered:  # all at once: one write at the end of the iteration
                futures = [publish(conn, body) for body in bodies]
                for body, future in zip(bodies, futures, strict=True):
                    outcomes[body] = await outcome_of(future)
                return
            for body in bodies:  # in turn
                outcomes[body] = await outcome_of(publish(conn, body))

        async with asyncio.timeout(LIMIT):  # a hang fails, never blocks the suite
            await asyncio.gather(*(task(t) for t in range(tasks)))
        conn.end(ConnectionClosedError("test over"))

    asyncio.run(main())
    thread.join(LIMIT)
    check(server, outcomes)
    assert len(outcomes) == tasks * per_task
    if cut_after is None and refuse is None:
        assert set(outcomes.values()) == {"ok"}
        assert server.nops == len([h for h in heartbeats if h < tasks * per_task])


def peer(answer: bytes | None) -> tuple[socket.socket, socket.socket]:
    """A socket pair whose far end reads what comes and answers the first
    read with ``answer`` (None: never answers), then reads on."""
    client, far = socket.socketpair()

    def serve() -> None:
        try:
            data = far.recv(65536)
            if answer is not None and data:
                far.sendall(answer)
            while far.recv(65536):
                pass
        except OSError:
            pass
        finally:
            far.close()

    threading.Thread(target=serve, daemon=True).start()
    return client, far


@pytest.mark.parametrize(
    "answer",
    [
        b"\x7f\xff\xff\xff\x00\x00\x00\x00",  # a frame of 2 GiB announced
        b"HTTP/1.1 400 Bad Request\r\n\r\n",  # garbage
        b"\x00\x00\x00\x06\x00\x00\x00\x02OK",  # a message frame to a producer
        b"\x00\x00\x00\x06\x00\x00\x00\x00NO",  # a response that is not OK
    ],
    ids=["huge", "http", "message", "not-ok"],
)
def test_a_peer_that_lies_ends_its_connection_and_fails_its_publishes(answer: bytes) -> None:
    async def main() -> list[Any]:
        client, _ = peer(answer)
        conn, events = connection(client)
        futures = [publish(conn, b"a"), publish(conn, b"b")]
        async with asyncio.timeout(LIMIT):
            results = await asyncio.gather(*futures, return_exceptions=True)
        assert events == ["over"] and conn.over is not None
        after = await asyncio.gather(publish(conn, b"c"), return_exceptions=True)
        assert isinstance(after[0], NotPublishedError)  # an ended connection writes nothing
        return results

    results = asyncio.run(main())
    assert all(isinstance(r, Exception) for r in results), results


def test_a_silent_peer_ends_the_connection_after_read_timeout() -> None:
    config = Config(
        nsqd_tcp_addresses=("127.0.0.1:4150",), read_timeout=0.3, heartbeat_interval=None
    )

    async def main() -> None:
        client, _ = peer(None)
        conn, events = connection(client, config)
        future = publish(conn, b"never answered")
        async with asyncio.timeout(LIMIT):
            with pytest.raises(ConnectionClosedError, match=r"nothing received for 0\.3s"):
                await future
        assert events == ["over"]

    asyncio.run(main())


def test_heartbeats_are_answered_and_keep_the_connection(daemon: BlockingNode) -> None:
    async def main() -> None:
        async with aio.Producer([daemon.tcp_address], heartbeat_interval=1.0) as producer:
            await producer.publish("beats", b"first")
            publisher = producer._publisher
            assert publisher is not None and publisher.conn is not None
            conn = publisher.conn
            await wait_until_asyncio(lambda: conn.heartbeats >= 2, limit=LIMIT)
            await producer.publish("beats", b"second")
            assert publisher.conn is conn and conn.over is None

    asyncio.run(main())
    wait_until_blocking(lambda: stats(daemon, "beats").get("message_count") == 2)


def test_an_idle_connection_closed_by_nsqd_is_replaced_before_the_next_publish(
    daemon: BlockingNode,
) -> None:
    async def main() -> None:
        async with aio.Producer([daemon.tcp_address]) as producer:
            await producer.publish("direct", b"first")
            # nsqd goes away and comes back while the connection is idle.
            await asyncio.to_thread(daemon.kill)
            await asyncio.to_thread(daemon.start)
            await wait_until_asyncio(lambda: producer.address is None, limit=LIMIT)
            await producer.publish("direct", b"second")  # a new connection, at once
            assert producer.stats.errors == 0

    asyncio.run(main())
    wait_until_blocking(lambda: stats(daemon, "direct").get("message_count") == 1)


def note(seen: list[int], i: int, _: object) -> None:
    seen.append(i)


def test_publishes_beyond_the_window_wait_their_turn_in_order(daemon: BlockingNode) -> None:
    async def main() -> list[int]:
        async with aio.Producer([daemon.tcp_address], publish_window=4) as producer:
            await producer.publish("window", b"warm")
            publisher = producer._publisher
            assert publisher is not None and publisher.conn is not None
            seen: list[int] = []
            futures = [producer.publish("window", b"%d" % i) for i in range(50)]
            assert publisher.conn.in_flight == 4 and len(publisher.backlog) == 46
            assert producer.stats.in_flight == 50
            for i, future in enumerate(futures):
                future.add_done_callback(functools.partial(note, seen, i))
            await asyncio.gather(*futures)
            assert producer.stats.published == 51 and producer.stats.in_flight == 0
            return seen

    assert asyncio.run(main()) == list(range(50))
    wait_until_blocking(lambda: stats(daemon, "window").get("message_count") == 51)


def test_a_peer_that_never_reads_holds_a_window_and_the_close_is_bounded() -> None:
    """nsqd never reading: at most ``publish_window`` commands go to the socket
    (the rest wait, each once, as handed over), the bytes held for the socket
    are bounded by the window, and leaving gives up after ``close_timeout``:
    every publish fails, nothing hangs."""
    body = b"x" * 10_000
    window = 16

    async def main() -> tuple[list[Any], int, int]:
        deaf, far = socket.socketpair()
        far.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        loop = asyncio.get_running_loop()
        publisher = direct.AioPublisher(
            loop,
            Config(nsqd_tcp_addresses=("127.0.0.1:4150",), publish_window=window),
            lambda: aio.ClientClosedError("closed"),
        )
        conn = AioConnection(
            loop,
            Link(deaf, "deaf:4150", publisher.config),
            publisher._drain,
            publisher._connection_over,
        )
        publisher.conn = conn
        futures = []
        for i in range(400):
            future: asyncio.Future[None] = loop.create_future()
            publisher.publish(publisher.core.pub("t", body + b"%d" % i), 0, Reply(future))
            futures.append(future)
        await asyncio.sleep(0)  # the corked ones written (as far as the socket takes)
        # bytes held for the socket: the write under way, the commands behind it
        held = len(conn._unsent) + sum(len(d) for datas, _ in conn._held for d in datas)
        in_flight = conn.in_flight
        async with asyncio.timeout(LIMIT):
            await publisher.close(0.2)
            results = await asyncio.gather(*futures, return_exceptions=True)
        far.close()
        return results, held, in_flight

    results, held, in_flight = asyncio.run(main())
    assert in_flight == window
    assert held <= window * (len(body) + 20)
    assert all(isinstance(r, ConnectionClosedError) for r in results), results[:3]


# --- a connection that dies mid-call: what is never written is sent once more ---


@settings(max_examples=40, deadline=None)
@given(
    tasks=st.integers(1, 6),
    per_task=st.integers(1, 8),
    gathered=st.booleans(),
    cut_after=st.one_of(st.none(), st.integers(0, 1500)),
    refuse=st.one_of(st.none(), st.integers(0, 30)),
)
def test_a_publish_never_written_goes_once_more_on_the_next_connection(
    tasks: int, per_task: int, gathered: bool, cut_after: int | None, refuse: int | None
) -> None:
    """The Producer on a scripted nsqd whose first connection dies after any
    byte (or refuses a publish): a publish the dead connection never wrote is
    sent on the next one (once: never published twice), so it succeeds; one
    written raises ConnectionClosedError (maybe published); one written
    behind a refused publish raises NotPublishedError (not published)."""
    outcomes: dict[bytes, Outcome] = {}
    with scripted_nsqd(Script(cut_after, refuse), then=Script()) as (address, servers):

        async def main() -> None:
            async with aio.Producer([address], heartbeat_interval=None) as producer:

                async def task(t: int) -> None:
                    bodies = [b"%d-%d" % (t, i) for i in range(per_task)]
                    if gathered:
                        futures = [producer.publish("t", body) for body in bodies]
                        for body, future in zip(bodies, futures, strict=True):
                            outcomes[body] = await outcome_of(future)
                        return
                    for body in bodies:
                        outcomes[body] = await outcome_of(producer.publish("t", body))

                async with asyncio.timeout(LIMIT):
                    await asyncio.gather(*(task(t) for t in range(tasks)))

        asyncio.run(main())
    executed = [body for server in servers for body in server.executed]
    assert len(executed) == len(set(executed)), "published twice"
    for body, outcome in outcomes.items():
        if outcome == "ok":
            assert body in executed, body
        elif outcome in ("not", "refused"):
            assert body not in executed, body
    assert len(outcomes) == tasks * per_task
    if refuse is None:
        # Nothing refused: whatever the first connection never wrote was
        # published on the second; what it wrote is OK or "maybe".
        assert set(outcomes.values()) <= {"ok", "maybe"}, outcomes
    if cut_after is None and refuse is None:
        assert set(outcomes.values()) == {"ok"}


def test_publishes_queued_when_the_connection_dies_go_on_the_next(daemon: BlockingNode) -> None:
    """Five publishes handed over at once: the first written at once, the
    others queued for the end of the loop's iteration; the connection ends
    before it.  The first may or may not have been published (nsqd read it or
    not): ConnectionClosedError; the four others were never written: they go
    on a new connection and succeed."""

    async def main() -> list[Any]:
        async with aio.Producer([daemon.tcp_address]) as producer:
            await producer.publish("again", b"warm")
            publisher = producer._publisher
            assert publisher is not None and publisher.conn is not None
            first = publisher.conn
            futures = [producer.publish("again", b"%d" % i) for i in range(5)]
            assert len(first.answers.waiting) == 1 and first.queued == 4
            first.end(ConnectionResetError("reset under the call"))
            async with asyncio.timeout(LIMIT):
                results = await asyncio.gather(*futures, return_exceptions=True)
            assert publisher.conn is not None and publisher.conn is not first
            assert producer.stats.errors == 1 and producer.stats.published == 5
            return results

    results = asyncio.run(main())
    assert isinstance(results[0], ConnectionClosedError)
    assert not isinstance(results[0], NotPublishedError)
    assert results[1:] == [None] * 4
    # "warm", the four sent again, and the first if nsqd read it before the end
    wait_until_blocking(lambda: stats(daemon, "again").get("message_count") in (5, 6))


def test_a_publish_never_written_twice_raises_not_published() -> None:
    """Its second connection ends before writing it too: NotPublishedError
    (not published), no third try.  (Connections made by hand: each has a
    publish written ahead, so the one under test waits for the end of the
    loop's iteration, and ends before it.)"""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        publisher = direct.AioPublisher(loop, CONFIG, lambda: aio.ClientClosedError("closed"))
        publisher._connect_soon = lambda: None  # type: ignore[method-assign]
        ahead: list[asyncio.Future[None]] = []

        def connect() -> AioConnection:
            mine, _ = peer(None)
            link = Link(mine, "scripted:4150", CONFIG)
            conn = AioConnection(loop, link, publisher._drain, publisher._connection_over)
            publisher.conn = conn
            ahead.append(loop.create_future())
            conn.send(publisher.core.pub("t", b"ahead"), Reply(ahead[-1]), 0)
            return conn

        first = connect()
        future: asyncio.Future[None] = loop.create_future()
        publisher.publish(publisher.core.pub("t", b"tested"), 0, Reply(future))
        assert first.queued == 1
        first.end(ConnectionResetError("first"))
        assert not future.done() and len(publisher.backlog) == 1  # to go once more
        second = connect()
        publisher._drain()
        assert second.queued == 1 and not publisher.backlog
        second.end(ConnectionResetError("second"))
        with pytest.raises(NotPublishedError, match="before it was written"):
            await future
        for written in await asyncio.gather(*ahead, return_exceptions=True):
            assert isinstance(written, ConnectionClosedError)
            assert not isinstance(written, NotPublishedError)
        assert publisher.stats().errors == 3

    asyncio.run(main())


def test_a_read_of_few_answers_with_many_awaited_pauses_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """20 publishes in flight; the peer answers one: a read that answered one
    with 19 awaited pauses the loop (the next read takes many), then the
    peer answers the 19 at once: no pause (nothing awaited)."""
    pauses: list[float] = []
    monkeypatch.setattr(direct, "_pause", pauses.append)

    async def main() -> None:
        client, far = socket.socketpair()
        conn, _ = connection(client)
        futures = [publish(conn, b"%d" % i) for i in range(20)]
        await asyncio.sleep(0)  # the iteration's write
        assert len(conn.answers.waiting) == 20
        far.sendall(OK_FRAME)
        await wait_until_asyncio(futures[0].done, limit=LIMIT)
        assert pauses == [direct.GATHER_PAUSE]
        far.sendall(OK_FRAME * 19)
        async with asyncio.timeout(LIMIT):
            await asyncio.gather(*futures)
        assert pauses == [direct.GATHER_PAUSE]
        conn.end(ConnectionClosedError("test over"))
        far.close()

    asyncio.run(main())
