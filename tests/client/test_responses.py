"""How responses reach their requests: in order, however the bytes are cut
into reads, whichever waiters gave up, with runs of OKs on their fast path."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

import trionsq
from trionsq.config import Config
from trionsq.connection import Connection, Loan, PendingResponse, Writer
from trionsq.lifecycle import CLOSING
from trionsq.protocol import commands
from trionsq.protocol.errors import BadMessageError
from trionsq.protocol.frames import encode_error, encode_response

OK_FRAME = encode_response(b"OK")
HEARTBEAT = encode_response(b"_heartbeat_")
FIN_FAILED = encode_error(b"E_FIN_FAILED FIN 0123456789abcdef failed")


class Wire:
    """A Connection (no handshake) on an in-memory stream whose server side
    this test writes, one read at a time."""

    def __init__(self, nursery: trio.Nursery) -> None:
        client, self.server = trio.testing.memory_stream_pair()
        self.conn = Connection.over(client, "nsqd:4150", Config(heartbeat_interval=None))
        nursery.start_soon(self.conn.run)

    async def read(self, data: bytes) -> None:
        """``data`` is what the connection's next read gets, whole."""
        await trio.testing.wait_all_tasks_blocked()
        await self.server.send_all(data)
        await trio.testing.wait_all_tasks_blocked()

    async def written(self) -> bytes:
        await trio.testing.wait_all_tasks_blocked()
        return bytes(await self.server.receive_some())


def pub(i: int) -> bytes:
    return commands.pub("t", b"%d" % i)


async def test_a_read_of_oks_answers_each_request_in_order(nursery: trio.Nursery) -> None:
    wire = Wire(nursery)
    pendings = [wire.conn.request_nowait(pub(i)) for i in range(5)]
    # Three OKs and half of the fourth, then the rest of it, a JSON answer.
    await wire.read(OK_FRAME * 3 + OK_FRAME[:4])
    assert [p.done for p in pendings] == [True, True, True, False, False]
    await wire.read(OK_FRAME[4:] + encode_response(b'{"x":1}'))
    assert [await p.result() for p in pendings] == [b"OK"] * 4 + [b'{"x":1}']


async def test_oks_then_other_frames_in_one_read(nursery: trio.Nursery) -> None:
    wire = Wire(nursery)
    pendings = [wire.conn.request_nowait(pub(i)) for i in range(4)]
    await wire.read(
        OK_FRAME * 2 + HEARTBEAT + FIN_FAILED + encode_response(b"CLOSE_WAIT") + OK_FRAME
    )
    assert [await p.result() for p in pendings] == [b"OK", b"OK", b"CLOSE_WAIT", b"OK"]
    assert b"NOP\n" in await wire.written()  # the heartbeat was answered
    assert not wire.conn.closed


async def test_more_oks_than_requests_is_a_protocol_error(nursery: trio.Nursery) -> None:
    wire = Wire(nursery)
    pendings = [wire.conn.request_nowait(pub(i)) for i in range(2)]
    await wire.read(OK_FRAME * 3)
    await wire.conn.wait_closed()
    assert isinstance(wire.conn.close_reason, trionsq.ProtocolError)
    # The two that were asked for got theirs before the surplus was found.
    assert [await p.result() for p in pendings] == [b"OK", b"OK"]


async def test_an_error_fails_its_own_request_and_the_rest(nursery: trio.Nursery) -> None:
    wire = Wire(nursery)
    pendings = [wire.conn.request_nowait(pub(i)) for i in range(3)]
    await wire.read(OK_FRAME + encode_error(b"E_PUB_FAILED nope"))
    await wire.conn.wait_closed()
    assert await pendings[0].result() == b"OK"
    with pytest.raises(trionsq.PubFailedError):
        await pendings[1].result()
    with pytest.raises(trionsq.ConnectionClosedError):
        await pendings[2].result()


async def test_a_cancelled_request_leaves_its_response_to_be_dropped(
    nursery: trio.Nursery,
) -> None:
    wire = Wire(nursery)
    got: dict[int, bytes] = {}
    scopes: dict[int, trio.CancelScope] = {}

    async def request(i: int) -> None:
        with trio.CancelScope() as scopes[i]:
            got[i] = await wire.conn.request(pub(i))

    for i in range(4):
        nursery.start_soon(request, i)
        await trio.testing.wait_all_tasks_blocked()  # queued in this order
    scopes[1].cancel()
    scopes[2].cancel()
    await wire.read(OK_FRAME + encode_response(b"one") + encode_response(b"two") + OK_FRAME)
    assert got == {0: b"OK", 3: b"OK"}
    assert not wire.conn.closed
    # A request cancelled before it is queued sends nothing.
    before = await wire.written()
    with trio.CancelScope() as scope:
        scope.cancel()
        await wire.conn.request(pub(9))
    assert b"9" not in before
    with trio.move_on_after(0.05):
        assert b"9" not in await wire.written()


async def test_pending_response_with_several_waiters() -> None:
    pending = PendingResponse()
    results: list[bytes] = []

    async def wait() -> None:
        results.append(await pending.result())

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(pending.event.wait)
        await trio.testing.wait_all_tasks_blocked()
        assert not pending.done and not pending.event.is_set()
        pending.set(b"OK")
    assert results == [b"OK"] * 3
    assert pending.event.is_set()
    with trio.testing.assert_checkpoints():
        assert await pending.result() == b"OK"
    failed = PendingResponse()
    failed.fail(trionsq.ConnectionClosedError("gone"))
    assert failed.done and failed.event.is_set()
    with pytest.raises(trionsq.ConnectionClosedError):
        await failed.result()


async def test_a_cancelled_waiter_can_wait_again() -> None:
    pending = PendingResponse()
    with trio.move_on_after(0.01):
        await pending.result()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pending.wait)
        await trio.testing.wait_all_tasks_blocked()
        pending.set(b"late")
    assert await pending.result() == b"late"


answers = st.lists(
    st.tuples(
        st.sampled_from(["OK", "OK", "OK", "json", "heartbeat", "fin_failed"]),
        st.booleans(),  # whether the request's waiter gives up first
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=80, deadline=None)
@given(answers, st.lists(st.integers(1, 64), max_size=12))
def test_responses_match_requests_however_the_reads_are_cut(
    script: list[tuple[str, bool]], cuts: list[int]
) -> None:
    """Each request gets its own response, in order, whatever the reads and
    whichever waiters were cancelled; heartbeats and non-fatal errors in
    between change nothing."""

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            wire = Wire(nursery)
            expected: dict[int, bytes] = {}
            got: dict[int, bytes] = {}
            scopes: dict[int, trio.CancelScope] = {}
            stream = b""

            async def request(i: int) -> None:
                with trio.CancelScope() as scopes[i]:
                    got[i] = await wire.conn.request(pub(i))

            index = 0
            for kind, gives_up in script:
                if kind == "heartbeat":
                    stream += HEARTBEAT
                    continue
                if kind == "fin_failed":
                    stream += FIN_FAILED
                    continue
                answer = b"OK" if kind == "OK" else b'{"n":%d}' % index
                stream += encode_response(answer)
                nursery.start_soon(request, index)
                await trio.testing.wait_all_tasks_blocked()  # queued in this order
                if not gives_up:
                    expected[index] = answer
                index += 1
            for i, (_, gives_up) in enumerate(s for s in script if s[0] in ("OK", "json")):
                if gives_up:
                    scopes[i].cancel()
            position = 0
            for cut in cuts:
                if position >= len(stream):
                    break
                await wire.read(stream[position : position + cut])
                position += cut
            if position < len(stream):
                await wire.read(stream[position:])
            assert got == expected
            assert not wire.conn.closed
            await wire.conn.aclose()

    trio.run(main)


class SocketWire:
    """A Connection (no handshake) on a real socket pair: a lone request is
    written by its own task (no switch to the writer)."""

    def __init__(self, nursery: trio.Nursery, send_buffer: int | None = None) -> None:
        import socket

        ours, theirs = socket.socketpair()
        if send_buffer is not None:
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
            theirs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, send_buffer)
        self.server = trio.SocketStream(trio.socket.from_stdlib_socket(theirs))
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
        self.conn = Connection.over(stream, "nsqd:4150", Config(heartbeat_interval=None))
        #: set when the connection's run() has returned
        self.ran = trio.Event()
        nursery.start_soon(self._run)

    async def _run(self) -> None:
        await self.conn.run()
        self.ran.set()

    async def receive_exactly(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = await self.server.receive_some()
            assert chunk, "closed early"
            data += chunk
        return data


async def test_a_lone_request_is_written_by_its_caller(nursery: trio.Nursery) -> None:
    wire = SocketWire(nursery)
    await trio.testing.wait_all_tasks_blocked()
    got: list[bytes] = []

    async def request() -> None:
        got.append(await wire.conn.request(pub(1)))

    with trio.fail_after(10):
        async with trio.open_nursery() as requests:
            requests.start_soon(request)
            await trio.testing.wait_all_tasks_blocked()
            assert not wire.conn._wake_writer.is_set()  # the writer was not needed
            assert await wire.receive_exactly(len(pub(1))) == pub(1)
            await wire.server.send_all(OK_FRAME)
    assert got == [b"OK"]


async def test_what_the_socket_does_not_take_goes_to_the_writer_in_order(
    nursery: trio.Nursery,
) -> None:
    wire = SocketWire(nursery, send_buffer=4096)
    await trio.testing.wait_all_tasks_blocked()
    big = commands.mpub("t", [bytes([65 + i % 26]) * 1000 for i in range(300)])
    answers: dict[bytes, bytes] = {}

    async def request(data: bytes) -> None:
        answers[data] = await wire.conn.request(data)

    with trio.fail_after(10):
        async with trio.open_nursery() as requests:
            requests.start_soon(request, big)  # far more than the socket takes at once
            await trio.testing.wait_all_tasks_blocked()
            requests.start_soon(request, pub(2))  # queued behind the rest of it
            await trio.testing.wait_all_tasks_blocked()
            assert await wire.receive_exactly(len(big) + len(pub(2))) == big + pub(2)
            await wire.server.send_all(OK_FRAME + encode_response(b"second"))
    assert answers == {big: b"OK", pub(2): b"second"}


async def test_a_lone_request_on_a_broken_socket_fails_with_the_connection(
    nursery: trio.Nursery,
) -> None:
    wire = SocketWire(nursery)
    await trio.testing.wait_all_tasks_blocked()
    wire.server.socket.shutdown(trio.socket.SHUT_RD)  # the peer reads no more
    await wire.server.aclose()
    with trio.fail_after(10), pytest.raises(trionsq.ConnectionClosedError):
        await wire.conn.request(pub(1))
    await wire.conn.wait_closed()
    assert wire.conn.close_reason is not None


async def test_a_drained_socket_is_waited_for_then_read(nursery: trio.Nursery) -> None:
    # Reads that come short (the socket read dry) wait for the socket before
    # reading it again; a read that fills the buffer is followed by a plain
    # receive.  Either way every response meets its request, in order, however
    # the frames are cut.
    wire = SocketWire(nursery)
    await trio.testing.wait_all_tasks_blocked()
    many = 8000  # 80,000 bytes of OK frames: more than one read's buffer
    pendings = [wire.conn.request_nowait(pub(i)) for i in range(many)]
    with trio.fail_after(10):
        await wire.receive_exactly(sum(len(pub(i)) for i in range(many)))
        await wire.server.send_all(OK_FRAME * (many - 1) + OK_FRAME[:3])
        await trio.testing.wait_all_tasks_blocked()
        assert [p.done for p in pendings].count(True) == many - 1
        await wire.server.send_all(OK_FRAME[3:])
        assert await pendings[-1].result() == b"OK"
        assert all(p.value == b"OK" for p in pendings)
        await wire.server.aclose()  # nsqd closes: the reader sees the end
        await wire.conn.wait_closed()
    assert isinstance(wire.conn.close_reason, trionsq.NSQConnectionError)
    assert "closed by nsqd" in str(wire.conn.close_reason)


async def test_reading_a_socket_directly(nursery: trio.Nursery) -> None:
    import socket

    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.setblocking(False)
        conn = Connection.over(
            trio.SocketStream(trio.socket.from_stdlib_socket(ours)), "nsqd:4150", Config()
        )
        fd = conn._fd = ours.fileno()
        assert conn._read_now(fd) is None  # nothing there yet (woken early)
        theirs.sendall(OK_FRAME)
        assert conn._read_now(fd + 1) is None  # not the connection's socket (any more)
        assert conn._read_now(fd) == OK_FRAME
        theirs.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
        ours.sendall(b"unread")  # closing with unread data and linger 0 resets
        theirs.close()
        with pytest.raises(trio.BrokenResourceError):
            conn._read_now(fd)


async def test_the_writer_finishes_what_the_socket_does_not_take_at_once(
    nursery: trio.Nursery,
) -> None:
    # The writer writes a plain socket directly; what it does not take goes
    # out by send_all, waiting for room, before anything queued later.
    wire = SocketWire(nursery, send_buffer=4096)
    await trio.testing.wait_all_tasks_blocked()
    bigs = [commands.mpub("t", [bytes([65 + i]) * 1000] * 100) for i in range(3)]
    pendings = [wire.conn.request_nowait(big) for big in bigs]
    with trio.fail_after(10):
        await trio.testing.wait_all_tasks_blocked()
        assert wire.conn.writer.state is Writer.WRITING  # blocked with the rest of the first batch
        later = wire.conn.request_nowait(pub(1))
        expected = b"".join(bigs) + pub(1)
        assert await wire.receive_exactly(len(expected)) == expected
        await wire.server.send_all(OK_FRAME * 4)
        assert [await p.result() for p in [*pendings, later]] == [b"OK"] * 4


# --- a producer's reader lends its socket to a lone requester ---------------


async def lent_wire(nursery: trio.Nursery) -> SocketWire:
    """A SocketWire whose reader answered one lone request, and so lent the
    socket: the next lone request reads its own response."""
    wire = SocketWire(nursery)
    first = nursery_result(nursery, wire.conn.request(pub(0)))
    await wire.receive_exactly(len(pub(0)))
    await wire.server.send_all(OK_FRAME)
    assert await first() == b"OK"
    await trio.testing.wait_all_tasks_blocked()
    assert wire.conn.loan.state is Loan.LENT
    return wire


def nursery_result(nursery: trio.Nursery, awaitable: Any) -> Any:
    """Run ``awaitable`` in ``nursery``; returns an async function giving its
    result (or raising its exception) once it is done."""
    done = trio.Event()
    outcome: list[Any] = []

    async def run() -> None:
        try:
            outcome.append(("value", await awaitable))
        except Exception as exc:
            outcome.append(("error", exc))
        finally:
            done.set()

    nursery.start_soon(run)

    async def result() -> Any:
        with trio.fail_after(10):
            await done.wait()
        kind, value = outcome[0]
        if kind == "error":
            raise value
        return value

    return result


async def test_a_lone_requester_reads_its_own_response(nursery: trio.Nursery) -> None:
    wire = await lent_wire(nursery)
    for i in range(1, 4):
        result = nursery_result(nursery, wire.conn.request(pub(i)))
        assert await wire.receive_exactly(len(pub(i))) == pub(i)
        await trio.testing.wait_all_tasks_blocked()
        assert wire.conn.loan.state is Loan.BORROWED  # the reader is not woken
        await wire.server.send_all(OK_FRAME)
        assert await result() == b"OK"
        assert wire.conn.loan.state is Loan.LENT
    assert not wire.conn._pending


@pytest.mark.parametrize(
    "cut",
    [
        [HEARTBEAT + OK_FRAME],  # a heartbeat first: answered with NOP
        [OK_FRAME[:4], OK_FRAME[4:]],  # the answer in pieces
        [encode_response(b"not OK")],  # another answer: the caller's to judge
    ],
)
async def test_what_a_borrower_reads_besides_one_ok_goes_to_the_reader(
    nursery: trio.Nursery, cut: list[bytes]
) -> None:
    wire = await lent_wire(nursery)
    result = nursery_result(nursery, wire.conn.request(pub(1)))
    await wire.receive_exactly(len(pub(1)))
    for piece in cut:
        await wire.server.send_all(piece)
        await trio.testing.wait_all_tasks_blocked()
    expected = b"not OK" if b"not OK" in b"".join(cut) else b"OK"
    assert await result() == expected
    if HEARTBEAT in b"".join(cut):
        assert await wire.receive_exactly(4) == b"NOP\n"
    # The reader read the rest, and lends the socket again after a lone OK.
    again = nursery_result(nursery, wire.conn.request(pub(2)))
    await wire.receive_exactly(len(pub(2)))
    await wire.server.send_all(OK_FRAME)
    assert await again() == b"OK"


async def test_an_error_read_by_a_borrower_raises_its_typed_error(
    nursery: trio.Nursery,
) -> None:
    wire = await lent_wire(nursery)
    result = nursery_result(nursery, wire.conn.request(pub(1)))
    await wire.receive_exactly(len(pub(1)))
    await wire.server.send_all(encode_error(b"E_BAD_MESSAGE PUB invalid message"))
    with pytest.raises(BadMessageError):
        await result()
    with trio.fail_after(10):
        await wire.conn.wait_closed()  # a fatal error: nsqd closes, so do we


async def test_a_cancelled_borrower_leaves_its_response_to_be_dropped(
    nursery: trio.Nursery,
) -> None:
    wire = await lent_wire(nursery)
    answered: list[bytes] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as inner:

            async def cancelled() -> None:
                with trio.CancelScope() as own:
                    cancel_scopes.append(own)
                    answered.append(await wire.conn.request(pub(1)))

            cancel_scopes: list[trio.CancelScope] = []
            inner.start_soon(cancelled)
            await wire.receive_exactly(len(pub(1)))
            assert wire.conn.loan.state is Loan.BORROWED
            cancel_scopes[0].cancel()
    assert answered == [] and wire.conn.loan.state is not Loan.BORROWED
    second = nursery_result(nursery, wire.conn.request(pub(2)))
    await wire.receive_exactly(len(pub(2)))
    await wire.server.send_all(OK_FRAME)  # the cancelled request's: dropped
    await trio.testing.wait_all_tasks_blocked()
    await wire.server.send_all(encode_response(b"second"))
    assert await second() == b"second"


async def test_nsqd_closing_under_a_borrower_fails_its_request(
    nursery: trio.Nursery,
) -> None:
    wire = await lent_wire(nursery)
    result = nursery_result(nursery, wire.conn.request(pub(1)))
    await wire.receive_exactly(len(pub(1)))
    await wire.server.aclose()
    with pytest.raises(trionsq.ConnectionClosedError):
        await result()
    with trio.fail_after(10):
        await wire.conn.wait_closed()
    assert "closed by nsqd" in str(wire.conn.close_reason)


async def test_closing_under_a_borrower_fails_its_request(nursery: trio.Nursery) -> None:
    wire = await lent_wire(nursery)
    result = nursery_result(nursery, wire.conn.request(pub(1)))
    await wire.receive_exactly(len(pub(1)))
    await wire.conn.aclose()
    with pytest.raises(trionsq.ConnectionClosedError):
        await result()
    assert wire.conn.close_reason is None  # our own close


async def test_closing_a_lent_socket_ends_the_reader(nursery: trio.Nursery) -> None:
    wire = await lent_wire(nursery)
    with trio.fail_after(10):
        await wire.conn.aclose()
        await wire.ran.wait()  # run() returned: the lent reader was woken


async def test_an_idle_lent_socket_is_watched_again(nursery: trio.Nursery) -> None:
    # Nobody borrows it: within a lending period the reader reads the socket
    # itself again (a heartbeat is answered, nsqd closing is seen).
    wire = await lent_wire(nursery)
    await wire.server.send_all(HEARTBEAT)
    with trio.fail_after(10):
        assert await wire.receive_exactly(4) == b"NOP\n"
        await wire.server.aclose()
        await wire.conn.wait_closed()
    assert "closed by nsqd" in str(wire.conn.close_reason)


async def test_requests_of_other_tasks_meanwhile_are_answered(nursery: trio.Nursery) -> None:
    wire = await lent_wire(nursery)
    first = nursery_result(nursery, wire.conn.request(pub(1)))
    await wire.receive_exactly(len(pub(1)))
    assert wire.conn.loan.state is Loan.BORROWED
    second = nursery_result(nursery, wire.conn.request(pub(2)))
    await trio.testing.wait_all_tasks_blocked()  # its request queued first
    third = wire.conn.request_nowait(pub(3))
    await wire.receive_exactly(len(pub(2)) + len(pub(3)))
    await wire.server.send_all(OK_FRAME)  # the borrower's, alone
    assert await first() == b"OK"
    await wire.server.send_all(encode_response(b"second") + encode_response(b"third"))
    assert await second() == b"second"
    assert await third.result() == b"third"


async def test_a_borrower_woken_as_its_connection_ends_fails_its_request(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The connection ends between the socket waking the borrower and the
    # borrower running on: its request has failed already, and it must not
    # wait for an answer nobody will give.
    wire = await lent_wire(nursery)
    real = trio.lowlevel.wait_readable

    async def wait_then_end(fd: int) -> None:
        await real(fd)
        conn = wire.conn
        conn.life.move(CLOSING)  # aclose's first steps, the stream left open
        conn._fd = -1
        conn._finish(None)

    monkeypatch.setattr(trio.lowlevel, "wait_readable", wait_then_end)
    result = nursery_result(nursery, wire.conn.request(pub(1)))
    await wire.receive_exactly(len(pub(1)))
    await wire.server.send_all(OK_FRAME)
    with pytest.raises(trionsq.ConnectionClosedError):
        await result()


@pytest.mark.parametrize("attempt", range(16))
async def test_a_lending_period_ending_as_the_borrower_is_answered(
    nursery: trio.Nursery, mock_clock: trio.testing.MockClock, attempt: int
) -> None:
    # The reader's lending period ends (its wait is cancelled: it is runnable
    # but has not run) in the same scheduler batch that wakes the borrower
    # with its answer. Trio runs a batch in either order, at random: when the
    # borrower goes first it gives the socket back to a reader that is no
    # longer parked, which must not be rescheduled a second time. Repeated so
    # that both orders are met (each attempt misses one with probability 1/2).
    from trionsq import writing

    wire = await lent_wire(nursery)
    result = nursery_result(nursery, wire.conn.request(pub(1)))
    await wire.receive_exactly(len(pub(1)))
    await trio.testing.wait_all_tasks_blocked()
    assert wire.conn.loan.state is Loan.BORROWED
    # Another request is queued meanwhile: the borrower, answered, gives the
    # socket back to the reader to read its answer.
    second = wire.conn.request_nowait(pub(2))
    await wire.receive_exactly(len(pub(2)))
    # Both wake-ups are due at the scheduler's next pass: the deadline now,
    # the answer as send_all writes it (before its own checkpoint).
    mock_clock.jump(writing._LEND_PERIOD)
    await wire.server.send_all(OK_FRAME)
    assert await result() == b"OK"
    await wire.server.send_all(encode_response(b"second"))
    with trio.fail_after(10):
        assert await second.result() == b"second"
    # The connection goes on: the next lone request is answered too.
    again = nursery_result(nursery, wire.conn.request(pub(3)))
    await wire.receive_exactly(len(pub(3)))
    await wire.server.send_all(OK_FRAME)
    assert await again() == b"OK"
    assert wire.conn.life.state is trionsq.lifecycle.OPEN
