"""Hypothesis against a live server: hostile bytes and command sequences.

The server must stay up, answer only well-formed frames with nsqd's error codes
(a fatal one last), never log an internal error, and never lose a message.
"""

from __future__ import annotations

import logging

import trio
import trio.lowlevel
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fakensq
from trionsq.protocol import commands as cmds
from trionsq.protocol.frames import Error, FrameParser, MessageFrame, Response

from .helpers import RawClient, memory_client

KNOWN_CODES = {
    "E_BAD_PROTOCOL",
    "E_INVALID",
    "E_BAD_TOPIC",
    "E_BAD_CHANNEL",
    "E_BAD_BODY",
    "E_BAD_MESSAGE",
    "E_IDENTIFY_FAILED",
    "E_SUB_FAILED",
    "E_FIN_FAILED",
    "E_REQ_FAILED",
    "E_TOUCH_FAILED",
    "E_AUTH_DISABLED",
}

names = st.sampled_from(["t", "t#ephemeral", "c", "", "a b", "x" * 65, "é"])
ids = st.one_of(st.binary(min_size=0, max_size=20), st.just(b"0" * 16))
numbers = st.one_of(st.integers(-5, 3_000_000), st.just(2**63))


@st.composite
def command(draw: st.DrawFn) -> bytes:
    kind = draw(st.integers(0, 14))
    if kind == 0:
        fields = draw(
            st.dictionaries(
                st.sampled_from(
                    [
                        "feature_negotiation",
                        "heartbeat_interval",
                        "output_buffer_size",
                        "output_buffer_timeout",
                        "sample_rate",
                        "msg_timeout",
                        "client_id",
                        "snappy",
                        "deflate",
                    ]
                ),
                st.one_of(st.integers(-2, 100_000), st.booleans(), st.text(max_size=3)),
                max_size=4,
            )
        )
        return cmds.identify(fields)
    if kind == 1:
        return b"SUB " + draw(names).encode() + b" " + draw(names).encode() + b"\n"
    if kind == 2:
        return b"PUB " + draw(names).encode() + b"\n" + _body(draw(st.binary(max_size=40)))
    if kind == 3:
        bodies = draw(st.lists(st.binary(min_size=0, max_size=10), max_size=4))
        return cmds.mpub(draw(names) or "t", bodies)
    if kind == 4:
        return b"DPUB t " + str(draw(numbers)).encode() + b"\n" + _body(b"d")
    if kind == 5:
        return b"RDY " + str(draw(numbers)).encode() + b"\n"
    if kind == 6:
        return b"FIN " + draw(ids) + b"\n"
    if kind == 7:
        return b"REQ " + draw(ids) + b" " + str(draw(numbers)).encode() + b"\n"
    if kind == 8:
        return b"TOUCH " + draw(ids) + b"\n"
    if kind == 9:
        return b"CLS\n"
    if kind == 10:
        return b"NOP\n"
    if kind == 11:
        return cmds.auth(draw(st.binary(min_size=1, max_size=5)))
    if kind == 12:
        return draw(st.binary(max_size=30))
    if kind == 13:
        return b"IDENTIFY\n" + draw(st.binary(max_size=12))
    return draw(
        st.sampled_from(
            [b"\n", b"\r\n", b"  \n", b"PUB\n", b"MPUB t\n\x00\x00\x00\x04\x00\x00\x00\x00"]
        )
    )


def _body(data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + data


class _Fail(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def _run_session(nsqd: fakensq.NSQD, data: list[bytes], chunk: int) -> list[object]:
    """Send everything (in chunks), half-close, and collect every frame until EOF."""
    server_side, client_side = trio.testing.memory_stream_pair()
    frames: list[object] = []
    parser = FrameParser()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(nsqd.handle_stream, server_side)
        stream = b"".join(data)

        async def send() -> None:
            try:
                for i in range(0, len(stream), chunk):
                    await client_side.send_all(stream[i : i + chunk])
                    await trio.lowlevel.checkpoint()
                await client_side.send_stream.aclose()  # EOF: the server closes
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

        nursery.start_soon(send)
        with trio.move_on_after(5):
            while True:
                try:
                    got = await client_side.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    break
                if not got:
                    break
                frames.extend(parser.feed(got))
        nursery.cancel_scope.cancel()
    await trio.aclose_forcefully(client_side)
    return frames


def _check_frames(frames: list[object]) -> None:
    for i, frame in enumerate(frames):
        if isinstance(frame, Error):
            err = frame.error
            assert err.code in KNOWN_CODES, frame
            if err.fatal:
                assert all(isinstance(f, Response) and f.is_heartbeat for f in frames[i + 1 :]), (
                    frames[i:]
                )
        else:
            assert isinstance(frame, (Response, MessageFrame))


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    magic=st.sampled_from([cmds.MAGIC_V2, cmds.MAGIC_V2, b"  V1", b""]),
    body=st.lists(command(), max_size=12),
    chunk=st.integers(1, 64),
)
async def test_hostile_sessions_leave_server_healthy(
    magic: bytes, body: list[bytes], chunk: int
) -> None:
    handler = _Fail()
    logging.getLogger("fakensq").addHandler(handler)
    try:
        async with fakensq.NSQD(tcp_address="", http_address="", max_rdy_count=100) as nsqd:
            with trio.fail_after(20):
                frames = await _run_session(nsqd, [magic, *body], chunk)
                _check_frames(frames)
                # the node still works for a well-behaved client
                async with trio.open_nursery() as nursery:
                    c = await memory_client(nsqd, nursery)
                    await c.identify()
                    await c.sub("ok", "c", rdy=1)
                    p = await memory_client(nsqd, nursery)
                    await p.pub("ok", b"alive")
                    assert (await c.read_message()).body == b"alive"
                    nursery.cancel_scope.cancel()
        assert not handler.records, [r.getMessage() for r in handler.records]
    finally:
        logging.getLogger("fakensq").removeHandler(handler)


actions = st.lists(
    st.tuples(
        st.sampled_from(["fin", "req", "req_later", "touch", "rdy", "drop", "cls"]),
        st.integers(0, 20),
    ),
    max_size=40,
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(n=st.integers(1, 30), script=actions, seed=st.integers(0, 1000))
async def test_no_message_is_lost(
    autojump_clock: trio.abc.Clock, n: int, script: list[tuple[str, int]], seed: int
) -> None:
    async with fakensq.NSQD(tcp_address="", http_address="", seed=seed, msg_timeout=1.0) as nsqd:
        topic = nsqd.get_topic("t")
        channel = topic.get_channel("c")
        topic.put_many(topic.new_messages([b"%d" % i for i in range(n)]))
        async with trio.open_nursery() as nursery:
            clients: list[RawClient] = []
            for _ in range(2):
                c = await memory_client(nsqd, nursery)
                await c.identify(output_buffer_size=-1)
                await c.sub("t", "c", rdy=3)
                clients.append(c)
            for action, k in script:
                c = clients[k % len(clients)]
                if c.closed:
                    continue
                if action == "rdy":
                    await c.send(cmds.rdy(k % 5))
                elif action == "drop":
                    await c.aclose()
                    c.closed = True
                    new = await memory_client(nsqd, nursery)
                    await new.sub("t", "c", rdy=2)
                    clients.append(new)
                elif action == "cls":
                    await c.send(cmds.cls())
                else:
                    with trio.move_on_after(0.05):
                        frame = await c.read_frame()
                        if isinstance(frame, MessageFrame):
                            await c.send(
                                {
                                    "fin": cmds.fin(frame.id),
                                    "req": cmds.req(frame.id, 0),
                                    "req_later": cmds.req(frame.id, 30),
                                    "touch": cmds.touch(frame.id),
                                }[action]
                            )
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
        # every client is gone: each message is finished, waiting, or (as nsqd
        # leaves a gone client's messages) in flight until its timeout
        held = channel.depth() + len(channel.deferred) + len(channel.in_flight)
        assert held + channel.finished_count == n
        # past msg_timeout (1 s) and nsqd's first queue scan of the channel (5 s)
        await trio.sleep(6.0)
        assert not channel.in_flight
        held = channel.depth() + len(channel.deferred)
        assert held + channel.finished_count == n
