"""The consumer's shared I/O (trionsq.multiplex) over real TCP sockets: one
flusher writing for many connections, what a socket does not take going to the
connection's own writer, backpressure; one reader for many connections, one
connection's end (EOF, fatal error, garbage, a failing callback) ending that
connection only, with the error it ends with reading alone; a socket number
reused at once; missed heartbeats; the connections' fallback when the
multiplexer ends; a consumer served by it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

import trionsq
from trionsq.config import Config
from trionsq.connection import Connection, Writer
from trionsq.multiplex import Multiplexer
from trionsq.protocol import commands
from trionsq.protocol.errors import InvalidError, ProtocolError
from trionsq.protocol.frames import MessageFrame, encode_error, encode_message, encode_response
from trionsq.writing import HIGH_WATER as _HIGH_WATER

from ..support.waiting import wait_until
from .minisrv import MiniNSQD, tcp_stream_pair
from .test_fuzz import frames as fuzz_frames


async def read_exactly(stream: trio.SocketStream, size: int) -> bytes:
    data = bytearray()
    with trio.fail_after(30):
        while len(data) < size:
            chunk = await stream.receive_some(65536)
            assert chunk, f"EOF after {len(data)} of {size} bytes"
            data += chunk
    return bytes(data)


def pubs(tag: str, count: int, size: int = 20) -> list[bytes]:
    """Distinct commands valid in any state, so their order on the wire shows."""
    return [commands.pub("t", f"{tag}-{i}".encode().ljust(size, b".")) for i in range(count)]


def start_cancellable(nursery: trio.Nursery) -> tuple[Multiplexer, trio.CancelScope]:
    """A multiplexer running in ``nursery`` and the scope that ends it."""
    mux = Multiplexer()
    scope = trio.CancelScope()

    async def run_mux() -> None:
        with scope:
            await mux.run()

    nursery.start_soon(run_mux)
    return mux, scope


@pytest.fixture
async def mux(nursery: trio.Nursery) -> AsyncIterator[Multiplexer]:
    mux = Multiplexer()
    nursery.start_soon(mux.run)
    yield mux


async def start(
    nursery: trio.Nursery,
    stream: trio.SocketStream,
    mux: Multiplexer,
    on_messages: Callable[[list[MessageFrame]], Awaitable[None] | None] = lambda m: None,
    config: Config | None = None,
) -> Connection:
    """A connection (no handshake) run by ``mux``, its reads shared."""
    conn = Connection.over(stream, "peer", config or Config())
    nursery.start_soon(conn.run, on_messages, None, mux)
    await wait_until(lambda: conn.writer.state is Writer.IDLE and conn._fd in mux._readings)
    assert conn._mux is mux
    return conn


async def test_one_flusher_writes_for_many_connections(
    nursery: trio.Nursery, mux: Multiplexer
) -> None:
    pairs = [await tcp_stream_pair() for _ in range(20)]
    conns = [await start(nursery, client, mux) for client, _ in pairs]
    expected: list[list[bytes]] = [[] for _ in conns]
    for round_ in range(5):
        for index, conn in enumerate(conns):
            for command in pubs(f"{index}/{round_}", 7):
                conn.send_nowait(command)
                expected[index].append(command)
        if round_ % 2:
            await trio.lowlevel.checkpoint()  # a pass between rounds, or not
    for conn in conns:
        with trio.fail_after(30):
            await conn.flush()
        assert not conn._out
    for (_, server), sent in zip(pairs, expected, strict=True):
        wanted = b"".join(sent)
        assert await read_exactly(server, len(wanted)) == wanted
    for conn in conns:
        await conn.aclose()


async def test_what_a_full_socket_does_not_take_goes_to_the_writer(
    nursery: trio.Nursery, mux: Multiplexer
) -> None:
    client, server = await tcp_stream_pair(small_buffers=True)
    conn = await start(nursery, client, mux)
    sent = pubs("big", 20_000, size=100)  # ~2.3 MB: far more than the buffers
    for command in sent:
        conn.send_nowait(command)
    # The flusher wrote what the socket took; the writer task waits to send the rest.
    await wait_until(lambda: conn.writer.state is Writer.WRITING)
    conn.send_nowait(commands.nop())  # queued behind, for the writer
    flushed = trio.Event()

    async def flush() -> None:
        await conn.flush()
        flushed.set()

    nursery.start_soon(flush)
    wanted = b"".join(sent) + commands.nop()
    assert await read_exactly(server, len(wanted)) == wanted
    with trio.fail_after(30):
        await flushed.wait()
    # Idle again: the next command goes through the flusher once more.
    await wait_until(lambda: conn.writer.state is Writer.IDLE)
    conn.send_nowait(commands.nop())
    assert await read_exactly(server, 4) == commands.nop()
    await conn.aclose()


async def test_send_waits_for_room_when_the_peer_does_not_read(
    nursery: trio.Nursery, mux: Multiplexer
) -> None:
    client, server = await tcp_stream_pair(small_buffers=True)
    conn = await start(nursery, client, mux)
    sent = pubs("bp", 30_000, size=100)  # ~3.4 MB: beyond the high-water mark
    done = 0

    async def sender() -> None:
        nonlocal done
        for command in sent:
            await conn.send(command)
            done += 1

    nursery.start_soon(sender)
    await wait_until(lambda: len(conn._out) >= _HIGH_WATER)
    stuck_at = done
    assert stuck_at < len(sent)
    await trio.testing.wait_all_tasks_blocked()
    assert done == stuck_at  # send() waits while the buffer is over the mark
    wanted = b"".join(sent)
    assert await read_exactly(server, len(wanted)) == wanted
    assert done == len(sent)
    await conn.aclose()


async def test_connections_write_on_their_own_once_the_multiplexer_ends(
    nursery: trio.Nursery,
) -> None:
    mux, scope = start_cancellable(nursery)
    client, server = await tcp_stream_pair()
    conn = await start(nursery, client, mux)
    conn.send_nowait(commands.nop())  # on the flusher's list ...
    scope.cancel()  # ... and the flusher cancelled
    await wait_until(lambda: not mux.running)
    conn.send_nowait(commands.nop())  # its own writer writes it
    assert await read_exactly(server, 8) == commands.nop() * 2
    await conn.aclose()


def message(n: int) -> bytes:
    return encode_message(1_700_000_000_000_000_000, 1, b"%016x" % n, b"body-%d" % n)


class Got:
    """A connection's callback: the ids it was handed, in order."""

    def __init__(self) -> None:
        self.ids: list[bytes] = []

    def __call__(self, messages: list[MessageFrame]) -> None:
        self.ids.extend(m.id for m in messages)


async def test_one_reader_serves_many_connections(nursery: trio.Nursery, mux: Multiplexer) -> None:
    pairs = [await tcp_stream_pair() for _ in range(30)]
    gots = [Got() for _ in pairs]
    conns = [await start(nursery, c, mux, got) for (c, _), got in zip(pairs, gots, strict=True)]
    assert len(mux._readings) == 30
    for index, (_, server) in enumerate(pairs):
        # Messages, a heartbeat (answered with NOP) and a non-fatal error between them.
        await server.send_all(
            b"".join(message(index * 1000 + n) for n in range(50))
            + encode_response(b"_heartbeat_")
            + encode_error(b"E_FIN_FAILED FIN failed")
            + message(index * 1000 + 50)
        )
    for index, got in enumerate(gots):
        await wait_until(lambda got=got: len(got.ids) == 51)
        assert got.ids == [b"%016x" % (index * 1000 + n) for n in range(51)]
    for _, server in pairs:
        assert await read_exactly(server, 4) == commands.nop()
    assert not any(conn.closed for conn in conns)
    for conn in conns:
        await conn.aclose()
    assert not mux._readings


@pytest.mark.parametrize(
    ("end", "reason"),
    [
        ("eof", trionsq.NSQConnectionError),
        ("fatal", InvalidError),
        ("garbage", ProtocolError),
        ("unexpected response", ProtocolError),
    ],
)
async def test_one_connections_end_ends_only_it(
    nursery: trio.Nursery, mux: Multiplexer, end: str, reason: type[Exception]
) -> None:
    pairs = [await tcp_stream_pair() for _ in range(5)]
    gots = [Got() for _ in pairs]
    conns = [await start(nursery, c, mux, got) for (c, _), got in zip(pairs, gots, strict=True)]
    victim, victim_server = conns[2], pairs[2][1]
    if end == "eof":
        await victim_server.aclose()
    elif end == "fatal":
        await victim_server.send_all(message(1) + encode_error(b"E_INVALID cannot SUB"))
    elif end == "garbage":
        await victim_server.send_all(message(1) + b"\x00\x00\x00\x08\x00\x00\x00\x09garbage!")
    else:
        await victim_server.send_all(encode_response(b"OK"))
    with trio.fail_after(30):
        await victim.wait_closed()
    assert isinstance(victim.close_reason, reason)
    assert victim._fd not in mux._readings
    # The others go on being read.
    for index, (_, server) in enumerate(pairs):
        if index != 2:
            await server.send_all(message(index))
    for index, got in enumerate(gots):
        if index != 2:
            await wait_until(lambda got=got, index=index: got.ids == [b"%016x" % index])
    assert [conn.closed for conn in conns] == [False, False, True, False, False]
    assert len(mux._readings) == 4


async def test_a_failing_callback_is_raised_in_its_connections_task(mux: Multiplexer) -> None:
    class Bug(Exception):
        pass

    def buggy(messages: list[MessageFrame]) -> None:
        raise Bug("in on_messages")

    async with trio.open_nursery() as others:
        (client, server), (client2, server2) = [await tcp_stream_pair() for _ in range(2)]
        got = Got()
        other = await start(others, client2, mux, got)
        # Out of the connection's run(), as when it reads alone.
        with pytest.raises(BaseExceptionGroup) as raised:
            async with trio.open_nursery() as nursery:
                await start(nursery, client, mux, buggy)
                await server.send_all(message(1))
        assert raised.group_contains(Bug, match="in on_messages", depth=None)
        await server2.send_all(message(2))
        await wait_until(lambda: got.ids == [b"%016x" % 2])
        await other.aclose()


async def test_an_awaitable_from_the_callback_holds_only_its_connection(
    nursery: trio.Nursery, mux: Multiplexer
) -> None:
    release = trio.Event()
    held: list[bytes] = []

    def holding(messages: list[MessageFrame]) -> Awaitable[None] | None:
        held.extend(m.id for m in messages)
        return release.wait() if len(held) == 1 else None

    (client, server), (client2, server2) = [await tcp_stream_pair() for _ in range(2)]
    got = Got()
    conn = await start(nursery, client, mux, holding)
    other = await start(nursery, client2, mux, got)
    # Two messages in one read, then more: the second waits behind the first's awaitable.
    await server.send_all(message(1) + encode_response(b"_heartbeat_") + message(2))
    await wait_until(lambda: held == [b"%016x" % 1])
    await server2.send_all(message(3))
    await wait_until(lambda: got.ids == [b"%016x" % 3])  # the other is read meanwhile
    await trio.testing.wait_all_tasks_blocked()
    assert held == [b"%016x" % 1]
    release.set()
    await wait_until(lambda: held == [b"%016x" % 1, b"%016x" % 2])
    assert await read_exactly(server, 4) == commands.nop()
    await server.send_all(message(4))  # read by the shared reader again
    await wait_until(lambda: held[-1] == b"%016x" % 4)
    assert conn._fd in mux._readings
    await conn.aclose()
    await other.aclose()


async def test_a_closed_connections_socket_number_reused_at_once(
    nursery: trio.Nursery, mux: Multiplexer
) -> None:
    client, server = await tcp_stream_pair()
    first = Got()
    conn = await start(nursery, client, mux, first)
    fd = conn._fd
    listener = trio.socket.socket()  # opened first: the closed number goes to the next socket
    await listener.bind(("127.0.0.1", 0))
    listener.listen()
    await conn.aclose()  # out of the reader before its socket closes
    # The next socket takes the lowest free number: fd, unless a lower one was
    # freed meanwhile (by another test's thread on this worker): fill those.
    fillers = []
    client2 = trio.socket.socket()
    while client2.fileno() < fd:
        fillers.append(client2)
        client2 = trio.socket.socket()
    for filler in fillers:
        filler.close()
    assert client2.fileno() == fd
    await client2.connect(listener.getsockname())
    server2, _ = await listener.accept()
    listener.close()
    second = Got()
    conn2 = await start(nursery, trio.SocketStream(client2), mux, second)
    assert mux._readings[fd].conn is conn2
    await trio.SocketStream(server2).send_all(message(7))
    await wait_until(lambda: second.ids == [b"%016x" % 7])
    assert first.ids == [] and not conn2.closed
    await conn2.aclose()
    await server.aclose()


async def test_missed_heartbeats_end_a_shared_connection(
    nursery: trio.Nursery, mux: Multiplexer
) -> None:
    config = Config(heartbeat_interval=1.0, read_timeout=1.2)
    (client, server), (client2, server2) = [await tcp_stream_pair() for _ in range(2)]
    conn = await start(nursery, client, mux, config=config)
    lively = await start(nursery, client2, mux, config=config)

    async def heartbeats() -> None:
        while True:  # the lively one hears from its nsqd every half interval
            await server2.send_all(encode_response(b"_heartbeat_"))
            await trio.sleep(0.5)

    nursery.start_soon(heartbeats)
    with trio.fail_after(30):
        await conn.wait_closed()
    assert isinstance(conn.close_reason, trionsq.NSQConnectionError)
    assert "nothing received" in str(conn.close_reason)
    assert not lively.closed
    await lively.aclose()
    await server.aclose()


async def test_connections_read_on_their_own_once_the_multiplexer_ends(
    nursery: trio.Nursery,
) -> None:
    mux, scope = start_cancellable(nursery)
    client, server = await tcp_stream_pair()
    got = Got()
    conn = await start(nursery, client, mux, got)
    scope.cancel()
    await wait_until(lambda: not mux.running)
    await server.send_all(message(5))
    await wait_until(lambda: got.ids == [b"%016x" % 5])
    await conn.aclose()


async def test_a_consumer_over_tcp_shares_its_reads_and_writes(nursery: trio.Nursery) -> None:
    nodes = [MiniNSQD(nursery, tcp=True) for _ in range(8)]

    async def connector(host: str, port: int) -> trio.abc.Stream:
        return await nodes[port - 4150].connector(host, port)

    handled: list[bytes] = []
    async with trionsq.Consumer(
        "topic",
        "chan",
        nsqd_tcp_addresses=[f"nsqd:{4150 + i}" for i in range(8)],
        connector=connector,
        handler=lambda m: handled.append(m.body),
        max_in_flight=80,
    ) as consumer:
        await wait_until(lambda: len(consumer.connections) == 8)
        assert len(consumer._mux._readings) == 8
        for index, node in enumerate(nodes):
            node.put(*(b"%d-%d" % (index, n) for n in range(100)))
        await wait_until(lambda: len(handled) == 800)
        await wait_until(lambda: sum(len(node.fins) for node in nodes) == 800)
    assert sorted(handled) == sorted(b"%d-%d" % (i, n) for i in range(8) for n in range(100))
    assert not consumer._mux._readings and not consumer._mux.running


@st.composite
def feeds(draw: st.DrawFn) -> tuple[bool, list[bytes]]:
    """What one nsqd sends: whole messages cut anywhere (valid), or followed
    by the fuzz test's almost-right frames and byte soup."""
    valid = draw(st.booleans())
    chunks = [] if valid else draw(st.lists(fuzz_frames(), min_size=1, max_size=4))
    count = draw(st.integers(0, 30))
    stream = b"".join(message(n) for n in range(count))
    cuts = sorted(draw(st.lists(st.integers(0, len(stream)), max_size=4)))
    pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    return valid, [p for p in pieces if p] + chunks


@settings(max_examples=30, deadline=None)
@given(st.lists(feeds(), min_size=2, max_size=5))
def test_connections_sharing_a_reader_survive_each_others_garbage(
    sent: list[tuple[bool, list[bytes]]],
) -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            mux = Multiplexer()
            nursery.start_soon(mux.run)
            pairs = [await tcp_stream_pair() for _ in sent]
            gots = [Got() for _ in sent]
            conns = [
                await start(nursery, client, mux, got)
                for (client, _), got in zip(pairs, gots, strict=True)
            ]
            for (_, server), (_, chunks) in zip(pairs, sent, strict=True):
                for chunk in chunks:
                    try:
                        await server.send_all(chunk)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        break  # the client hung up on the garbage so far
                # A message that ends every stream: read, or the connection ended.
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await server.send_all(message(999))
            for conn, got, (valid, _) in zip(conns, gots, sent, strict=True):
                if valid:  # whole frames only, however cut: every message, in order
                    await wait_until(lambda got=got: got.ids[-1:] == [b"%016x" % 999])
                    assert not conn.closed
                    count = len(got.ids) - 1
                    assert got.ids[:-1] == [b"%016x" % n for n in range(count)]
            for conn in conns:  # the others: open, or ended with nsqd's error
                assert not conn.closed or isinstance(conn.close_reason, trionsq.NSQError)
            for conn in conns:
                await conn.aclose()
            assert not mux._readings
            nursery.cancel_scope.cancel()

    trio.run(main)
