"""Hostile peers of nsqlookupd's TCP listener (protocol V1): fakensq's and,
where nsqlookupd v1.3.0 has a behaviour for the case, the real one's.

nsqlookupd itself bounds nothing: it reads a line however long it is, and
allocates an IDENTIFY body of whatever size is announced (a negative one kills
the process).  fakensq keeps its answers and bounds its memory instead: a line
over 8 MiB closes the connection, a body over 16 MiB is read and dropped and
answered as undecodable.  Those cases run on fakensq alone.
"""

from __future__ import annotations

import logging
import struct
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fakensq.lookupd.daemon import NSQLookupd
from fakensq.lookupd.options import LookupdOptions

from ..conformance.conftest import Conformance, Target
from ..conformance.lookupd import PEER, identify_body, lookupd_state, v1_connect
from ..conformance.tcp import size
from ..fakensq.test_fuzz import _Fail
from .peers import TIMEOUT, MiB, closed_by_peer, connect, flood, traced_peak

GiB = 1024 * MiB


CUT_SHORT = [
    (b"PING", "line"),
    (b"IDENTIFY\n\x00\x00", "identify_size"),
    (b"IDENTIFY\n" + size(100) + b'{"a', "identify_body"),
]


@pytest.mark.parametrize("data", [c[0] for c in CUT_SHORT], ids=[c[1] for c in CUT_SHORT])
async def test_cut_short(conformance: Conformance, data: bytes) -> None:
    """A half-closed peer inside a line or an IDENTIFY body: nsqlookupd's
    answer (none inside a line), then the close; a registered peer stays."""

    async def scenario(t: Target) -> Any:
        other = await v1_connect(t, "other")
        await other.identify()
        await other.command(b"REGISTER t c")
        c = await v1_connect(t)
        await c.send(b"PING\n", data)
        await c.stream.send_eof()
        await c.read_until_closed()
        await other.sync()
        return await lookupd_state(t, "t")

    await conformance.nsqlookupd(scenario)


async def test_slow_line_while_others_are_served(conformance: Conformance) -> None:
    """A line trickled in a byte at a time, each after another peer's
    command was answered: nsqlookupd has no read deadline; the slow line is
    answered once whole, and the others were served meanwhile."""

    async def scenario(t: Target) -> Any:
        slow = await v1_connect(t, "slow")
        other = await v1_connect(t, "other")
        await other.identify()
        for i, byte in enumerate(b"PING\n"):
            await slow.send(bytes([byte]))
            await other.command(b"REGISTER t c%d" % i)
        await slow.read(1)
        return await lookupd_state(t, "t")

    await conformance.nsqlookupd(scenario)


async def test_peer_that_never_reads(conformance: Conformance) -> None:
    """100,000 pipelined PINGs and never a read: the connection's writes
    block (nsqlookupd has no write deadline) and it stops reading; other
    peers are served, and it ends when the peer goes."""

    async def scenario(t: Target) -> Any:
        with traced_peak() as peak:
            deaf = await connect(t.tcp_address)
            try:
                with trio.move_on_after(2):  # (until the socket takes no more)
                    await deaf.send_all(b"  V1" + b"PING\n" * 100_000)
                other = await v1_connect(t, "other")
                await other.identify()
                await other.command(b"REGISTER t c")
            finally:
                await trio.aclose_forcefully(deaf)
            await other.sync()
        if t.fake is not None:
            print(f"PEAK lookupd tcp deaf peer with 100,000 PINGs: {peak.mib:.2f} MiB")
            assert peak.bytes < 4 * MiB
        return await lookupd_state(t, "t")

    await conformance.nsqlookupd(scenario)


# --- fakensq's bounds (nsqlookupd has none) --------------------------------------------


@pytest.mark.parametrize(
    ("head", "chunk"),
    [
        (b"  V1PING", b"A"),
        (b"  V1" + identify_body(PEER)[:9] + size(64 * MiB), b"{"),
    ],
    ids=["1GiB_line", "identify_64MiB_body"],
)
async def test_floods(conformance: Conformance, head: bytes, chunk: bytes) -> None:
    """1 GiB without a newline, or an IDENTIFY body of 64 MiB: fakensq closes
    after 8 MiB of line (nsqlookupd would hold it all), and reads and drops a
    body over 16 MiB, answering E_BAD_BODY (nsqlookupd would allocate it);
    memory stays bounded and a registered peer stays served."""

    async def scenario(t: Target) -> Any:
        with traced_peak() as peak:
            other = await v1_connect(t, "other")
            await other.identify()
            stream = await connect(t.tcp_address)
            try:
                await stream.send_all(head)
                with trio.fail_after(TIMEOUT):
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(closed_by_peer, stream)
                        sent = await flood(stream, GiB, chunk * (256 * 1024))
                        nursery.cancel_scope.cancel()
            finally:
                await trio.aclose_forcefully(stream)
            await other.command(b"REGISTER t c")
        print(f"PEAK lookupd tcp {head[4:12]!r}: {peak.mib:.2f} MiB (sent {sent / MiB:.0f} MiB)")
        assert peak.bytes < 24 * MiB
        return await lookupd_state(t, "t")

    await conformance.fakensq_only("nsqlookupd", scenario)


# --- garbage at every byte offset ----------------------------------------------------------

VALID_SESSION = (
    b"  V1PING\n"
    + identify_body(PEER)
    + b"REGISTER t c\nREGISTER t2\nUNREGISTER t c\nPING\nUNREGISTER t2\n"
)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    offset=st.integers(0, len(VALID_SESSION)),
    how=st.sampled_from(["replace", "insert", "truncate", "garbage_tail"]),
    garbage=st.binary(min_size=1, max_size=64),
)
async def test_garbage_at_every_offset(offset: int, how: str, garbage: bytes) -> None:
    """A valid session spoiled at one offset, then EOF: each answer is a
    framed response, the connection ends alone, nothing fails inside fakensq,
    and a peer registered on the same lookupd stays listed."""
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
        options = LookupdOptions(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0")
        async with NSQLookupd(options) as lookupd:
            with trio.fail_after(TIMEOUT):
                good = await connect(lookupd.tcp_address)
                await good.send_all(b"  V1" + identify_body(PEER) + b"REGISTER kept\n")
                stream = await connect(lookupd.tcp_address)
                await stream.send_all(data)
                await stream.send_eof()
                answers = bytearray()
                while chunk := await _receive(stream):
                    answers += chunk
                await stream.aclose()
                while answers:
                    (n,) = struct.unpack(">l", answers[:4])
                    assert 0 < n <= len(answers) - 4, answers
                    del answers[: 4 + n]
                assert lookupd.db.find_producers("topic", "kept", "")
                await good.aclose()
        # (nsqlookupd logs a client's errors: only a failure of its own has a traceback)
        failures = [r.getMessage() for r in handler.records if r.exc_info]
        assert not failures, failures
    finally:
        logging.getLogger("fakensq").removeHandler(handler)


async def _receive(stream: trio.SocketStream) -> bytes:
    try:
        return bytes(await stream.receive_some(65536))
    except trio.BrokenResourceError:
        return b""
