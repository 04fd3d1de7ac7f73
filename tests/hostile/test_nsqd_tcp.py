"""Hostile peers of nsqd's TCP listener (protocol V2), fakensq's and the real
nsqd's side by side where nsqd has a behaviour for the case.

What each case checks: the hostile connection ends alone (nsqd's answer, then
the close), the node goes on serving another peer meanwhile, no message is
lost or half-published, and fakensq's memory stays bounded (tracemalloc peak
while the case runs, printed for the report).
"""

from __future__ import annotations

import logging
import zlib
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fakensq
from trionsq.protocol import commands as cmds
from trionsq.protocol.codecs import SnappyEncoder

from ..conformance.conftest import Conformance, Target
from ..conformance.tcp import body, node_state, size
from ..fakensq.helpers import memory_client
from ..fakensq.test_fuzz import _check_frames, _Fail, _run_session
from ..support.authserver import AuthServer
from ..support.waiting import poll_until
from .peers import TIMEOUT, MiB, drain, flood, traced_peak

# --- a command cut short: EOF inside its body ---------------------------------

#: (command bytes sent before the client half-closes, id)
CUT_SHORT = [
    (b"PUB t", "pub_line"),
    (b"PUB t\n\x00\x00", "pub_size"),
    (b"PUB t\n" + size(10) + b"abc", "pub_body"),
    (b"DPUB t 10\n\x00", "dpub_size"),
    (b"DPUB t 10\n" + size(100), "dpub_body"),
    (b"MPUB t\n\x00", "mpub_body_size"),
    (b"MPUB t\n" + size(100), "mpub_count"),
    (b"MPUB t\n" + size(100) + size(2), "mpub_message_size"),
    (b"MPUB t\n" + size(100) + size(2) + size(3) + b"abc" + size(5), "mpub_second_size"),
    (b"MPUB t\n" + size(100) + size(2) + size(3) + b"ab", "mpub_message_body"),
    (b"IDENTIFY\n\x00\x00\x00", "identify_size"),
    (b"IDENTIFY\n" + size(10) + b"{}", "identify_body"),
    (b"AUTH\n\x00", "auth_size"),
    (b"AUTH\n" + size(100), "auth_body"),
]


@pytest.mark.parametrize("data", [c[0] for c in CUT_SHORT], ids=[c[1] for c in CUT_SHORT])
async def test_cut_short(conformance: Conformance, data: bytes) -> None:
    """A half-closed peer in the middle of a command: nsqd's reader of that part
    fails and nsqd says so as it closes (nothing but a close inside a line);
    the message published before it stays, the half one is nowhere.
    (fakensq before: closed without a word.)"""

    async def scenario(t: Target) -> Any:
        c = await t.connect()
        await c.call(cmds.pub("t", b"before"))
        await c.send(data)
        await c.stream.send_eof()  # type: ignore[attr-defined]
        await c.read_until_closed()
        return await node_state(t)

    await conformance.nsqd(scenario)


# --- slowloris: a command trickled in -------------------------------------------


async def _trickle(t: Target, head: bytes, byte: bytes) -> Any:
    """IDENTIFY with 1 s heartbeats, then ``head`` and ``byte`` after ``byte``,
    four a heartbeat interval, until nsqd closes; meanwhile another peer
    publishes and subscribes."""
    c = await t.connect()
    await c.identify(heartbeat_interval=1000)
    await c.send(head)
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:

            async def trickle() -> None:
                while True:
                    await c.send(byte)
                    await trio.sleep(0.25)  # the slow peer's pace, not a wait for a condition

            nursery.start_soon(trickle)
            p = await t.connect("p")
            await p.call(cmds.pub("served", b"meanwhile"))
            await p.sub("served", "ch", rdy=1)
            await p.read_messages(1)
            await c.read_until_closed(heartbeats=False)
            nursery.cancel_scope.cancel()
    return await node_state(t)


@pytest.mark.parametrize(
    ("head", "byte"),
    [(b"PUB t\n" + size(1000), b"x"), (b"NOP", b"P"), (b"MPUB t\n" + size(100) + size(1), b"\0")],
    ids=["pub_body", "line", "mpub_body"],
)
async def test_slowloris(conformance: Conformance, head: bytes, byte: bytes) -> None:
    """nsqd's read deadline (two heartbeat intervals) covers a whole command,
    set before its line is read: a peer that trickles one byte every quarter
    interval is closed at it (with the body reader's error inside a body).
    (fakensq before: each read had a deadline of its own, and such a peer
    stayed forever.)"""

    async def scenario(t: Target) -> Any:
        return await _trickle(t, head, byte)

    await conformance.nsqd(scenario)


# --- a line that never ends ----------------------------------------------------------

GiB = 1024 * MiB


async def test_line_without_newline(conformance: Conformance) -> None:
    """1 GiB with no newline: nsqd reads lines into a 16 KiB buffer and closes
    without a word once it is full; fakensq too, its memory bounded, another
    peer served meanwhile."""

    async def scenario(t: Target) -> Any:
        with traced_peak() as peak:
            c = await t.connect()
            with trio.fail_after(TIMEOUT):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(c.read_until_closed)
                    sent = await flood(c.stream, GiB, b"A" * (64 * 1024))
            p = await t.connect("p")
            await p.call(cmds.pub("t", b"served"))
        assert sent < GiB  # (the close came long before)
        if t.fake is not None:
            print(f"PEAK nsqd tcp 1 GiB line: {peak.mib:.2f} MiB (sent {sent / MiB:.1f} MiB)")
            assert peak.bytes < 4 * MiB
        return await node_state(t)

    await conformance.nsqd(scenario)


# --- lengths that lie ---------------------------------------------------------------

HUGE = [
    (b"PUB t\n" + size(2**31 - 1), "pub_max_int32"),
    (b"PUB t\n" + size(-1), "pub_negative"),
    (b"PUB t\n" + size(1024 * 1024 + 1), "pub_over_max_msg_size"),
    (b"DPUB t 0\n" + size(2**31 - 1), "dpub_max_int32"),
    (b"MPUB t\n" + size(2**31 - 1), "mpub_max_int32"),
    (b"MPUB t\n" + size(-5), "mpub_negative"),
    (b"MPUB t\n" + size(5 * 1024 * 1024) + size(2**31 - 1), "mpub_count_max_int32"),
    (b"MPUB t\n" + size(5 * 1024 * 1024) + size(2) + size(2**31 - 1), "mpub_message_max_int32"),
    (b"MPUB t\n" + size(5 * 1024 * 1024) + size(2) + size(-1), "mpub_message_negative"),
    (b"IDENTIFY\n" + size(2**31 - 1), "identify_max_int32"),
    (b"IDENTIFY\n" + size(-(2**31)), "identify_min_int32"),
    (b"AUTH\n" + size(2**31 - 1), "auth_max_int32"),
]


@pytest.mark.parametrize("head", [h[0] for h in HUGE], ids=[h[1] for h in HUGE])
async def test_huge_length_then_a_flood(conformance: Conformance, head: bytes) -> None:
    """A length past nsqd's limit (or below zero), then 64 MiB of payload
    anyway: nsqd's error at once and the close; fakensq allocates nothing
    of the claimed size."""

    async def scenario(t: Target) -> Any:
        with traced_peak() as peak:
            c = await t.connect()
            await c.send(head)
            with trio.fail_after(TIMEOUT):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(c.read_until_closed)
                    await flood(c.stream, 64 * MiB, b"\0" * (64 * 1024))
        if t.fake is not None:
            print(f"PEAK nsqd tcp {head[:12]!r}...: {peak.mib:.2f} MiB")
            assert peak.bytes < 4 * MiB
        return await node_state(t)

    await conformance.nsqd(scenario)


# --- before AUTH --------------------------------------------------------------------


async def test_payload_before_auth(conformance: Conformance, auth_server: AuthServer) -> None:
    """With --auth-http-address, before AUTH: nsqd refuses an MPUB on its line,
    before reading a byte of its body (so a 5 MiB body is never taken in), but
    reads a PUB's or DPUB's body (up to --max-msg-size) before it refuses it;
    a wrong secret ends the connection at AUTH."""

    async def scenario(t: Target) -> Any:
        mpub = await t.connect("mpub")
        await mpub.send(b"MPUB t\n" + size(5 * 1024 * 1024))
        await mpub.read_until_closed()  # E_AUTH_FIRST without the body
        pub = await t.connect("pub")
        await pub.send(b"PUB t\n" + size(1024 * 1024))
        await pub.send(b"x" * (1024 * 1024))  # read in full, then refused
        await pub.read_until_closed()
        dpub = await t.connect("dpub")
        await dpub.send(b"DPUB t 5\n" + body(b"x"))
        await dpub.read_until_closed()
        wrong = await t.connect("wrong")
        await wrong.call(cmds.auth("not-a-secret"))
        await wrong.read_until_closed()
        return await node_state(t)

    await conformance.nsqd(scenario, f"--auth-http-address={auth_server.address}")


# --- a consumer that never reads -----------------------------------------------------


async def test_consumer_that_never_reads(conformance: Conformance) -> None:
    """SUB with RDY 200 and never a read, while 200 messages of 64 KiB go out:
    nsqd's write deadline (the heartbeat interval) ends that connection, its
    messages time out of flight and go to the next consumer; none is lost."""
    count, payload = 200, 64 * 1024

    async def scenario(t: Target) -> Any:
        def message(i: int) -> bytes:
            return b"%04d" % i + b"." * (payload - 4)

        with traced_peak() as peak:
            deaf = await t.connect("deaf")
            # (its messages time out of flight 1 s after it is gone, not 60)
            await deaf.identify(heartbeat_interval=1000, msg_timeout=1000)
            await deaf.sub("t", "ch", rdy=count)
            p = await t.connect("p")
            for start in range(0, count, 20):
                await p.call(cmds.mpub("t", [message(i) for i in range(start, start + 20)]))
            await poll_until(
                t.stats,
                lambda doc: not doc["topics"][0]["channels"][0]["clients"],
                "nsqd to drop the consumer that never reads",
            )
            got = [b[:4] for b in await drain(t.tcp_address, "t", "ch", count)]
        if t.fake is not None:
            print(f"PEAK nsqd tcp never-reading consumer: {peak.mib:.2f} MiB")
            # 12.5 MiB of messages; the deaf connection's share of them (what
            # its socket took) is held twice, as frames and as messages
            assert peak.bytes < 24 * MiB
        return sorted(got) == [b"%04d" % i for i in range(count)]

    _, complete = await conformance.nsqd(scenario)
    assert complete


# --- garbage at every byte offset ----------------------------------------------------

#: A valid session of every kind of command; hypothesis spoils it at one offset.
VALID_SESSION = b"".join(
    [
        cmds.MAGIC_V2,
        cmds.identify({"feature_negotiation": True, "heartbeat_interval": 1000}),
        cmds.pub("t", b"one"),
        cmds.mpub("t", [b"two", b"three"]),
        cmds.dpub("t", 10, b"four"),
        cmds.sub("t", "c"),
        cmds.rdy(3),
        cmds.nop(),
        cmds.fin(b"0" * 16),
        cmds.touch(b"1" * 16),
        cmds.req(b"2" * 16, 0),
        cmds.cls(),
    ]
)


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    offset=st.integers(0, len(VALID_SESSION)),
    how=st.sampled_from(["replace", "insert", "truncate", "garbage_tail"]),
    garbage=st.binary(min_size=1, max_size=64),
    chunk=st.integers(1, 512),
)
async def test_garbage_at_every_offset(offset: int, how: str, garbage: bytes, chunk: int) -> None:
    """The valid session spoiled at one offset (a byte replaced, bytes
    inserted, cut there, or garbage from there on), sent in chunks, then EOF:
    only well-formed frames come back, a fatal error last; nothing logs an
    internal error; a well-behaved producer and consumer on the same node
    meanwhile lose nothing."""
    if how == "replace":
        data = VALID_SESSION[:offset] + garbage[:1] + VALID_SESSION[offset + 1 :]
    elif how == "insert":
        data = VALID_SESSION[:offset] + garbage + VALID_SESSION[offset:]
    elif how == "truncate":
        data = VALID_SESSION[:offset]
    else:
        data = VALID_SESSION[:offset] + garbage
    handler = _Fail()
    logging.getLogger("fakensq").addHandler(handler)
    try:
        async with fakensq.NSQD(tcp_address="", http_address="") as nsqd:
            with trio.fail_after(TIMEOUT):
                async with trio.open_nursery() as nursery:
                    consumer = await memory_client(nsqd, nursery)
                    await consumer.sub("good", "c", rdy=5)
                    producer = await memory_client(nsqd, nursery)
                    frames = await _run_session(nsqd, [data], chunk)
                    for i in range(5):
                        await producer.pub("good", b"%d" % i)
                    got = [(await consumer.read_message()).body for _ in range(5)]
                    nursery.cancel_scope.cancel()
            _check_frames(frames)
            assert sorted(got) == [b"0", b"1", b"2", b"3", b"4"]
        assert not handler.records, [r.getMessage() for r in handler.records]
    finally:
        logging.getLogger("fakensq").removeHandler(handler)


# --- compression bombs ------------------------------------------------------------------


def _compressed_line(codec: str) -> bytes:
    """64 MiB of "A" as the first bytes of a compressed stream."""
    if codec == "deflate":
        z = zlib.compressobj(6, zlib.DEFLATED, -15)
        return b"".join(z.compress(b"A" * MiB) for _ in range(64)) + z.flush(zlib.Z_SYNC_FLUSH)
    encoder = SnappyEncoder()
    return b"".join(encoder.encode(b"A" * MiB) for _ in range(64))


@pytest.mark.parametrize("codec", ["deflate", "snappy"])
async def test_compressed_line_without_newline(conformance: Conformance, codec: str) -> None:
    """64 MiB of one byte, no newline, compressed (deflate: 64 KiB on the
    wire): nsqd reads the decompressed stream into its 16 KiB line buffer and
    closes without a word once it is full, never decompressing the rest;
    fakensq's memory stays as bounded as for the plain line."""

    async def scenario(t: Target) -> Any:
        with traced_peak() as peak:
            c = await t.connect()
            await c.identify(feature_negotiation=True, **{codec: True})
            with trio.fail_after(TIMEOUT):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(c.read_until_closed)
                    # (sent raw, in one piece: the server reads 64 KiB of it at once)
                    await flood(c.stream, 64 * MiB, _compressed_line(codec))
            p = await t.connect("p")
            await p.call(cmds.pub("t", b"served"))
        if t.fake is not None:
            print(f"PEAK nsqd tcp {codec} 64 MiB line: {peak.mib:.2f} MiB")
            assert peak.bytes < 8 * MiB
        return await node_state(t)

    await conformance.nsqd(scenario)


# --- before the magic ------------------------------------------------------------------


async def test_silent_connection_before_the_magic(conformance: Conformance, tmp_path: Any) -> None:
    """A connection that never sends the protocol's magic: nsqd reads the magic
    with no deadline and starts a client's heartbeats and read deadline only
    once it has it, so the connection gets nothing and stays open, while one
    that sent its magic and IDENTIFY (1 s heartbeats) is closed at its read
    deadline; the silent one then speaks and is answered.  (fakensq before:
    its heartbeats and deadline ran from the connection's start; with
    fakensq's client_timeout of 2 s the silent one got a heartbeat, then was
    closed.  nsqd v1.3.0 ignores that key of its config file: its own runs at
    its 60 s default, which changes nothing here.)"""
    config = tmp_path / "nsqd.cfg"
    config.write_text('client_timeout = "2s"\n')

    async def scenario(t: Target) -> Any:
        silent = await t.connect("silent", magic=False)
        idle = await t.connect("idle")
        await idle.identify(heartbeat_interval=1000)
        await idle.read_until_closed(heartbeats=False)  # its read deadline: 2 s
        await silent.send(cmds.MAGIC_V2 + cmds.pub("t", b"late"))
        await silent.read(1)
        return await node_state(t)

    await conformance.nsqd(scenario, f"--config={config}")
