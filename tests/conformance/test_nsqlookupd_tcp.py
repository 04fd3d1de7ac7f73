"""nsqlookupd's TCP protocol V1, on fakensq and on nsqlookupd v1.3.0: each case
sends bytes as they are and records every answer (exact texts), whether the
connection closes, and what the HTTP API shows afterwards."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import Conformance, Target
from .lookupd import PEER, identify_body, lookupd_state, v1_connect
from .tcp import size

M = b"  V1"
ID = identify_body(PEER)


# (id, bytes sent after connecting, without the magic unless the case is about it)
CASES: list[tuple[str, bytes]] = [
    ("ping", M + b"PING\n"),
    ("ping with args", M + b"PING x y\n"),
    ("ping crlf", M + b"PING\r\n"),
    ("ping padded", M + b"  PING  \n"),
    ("ping tab", M + b"PING\tx\n"),
    ("lowercase", M + b"ping\n"),
    ("nul inside", M + b"PI\x00NG\n"),
    ("trailing 0x1c", M + b"PING\x1c\n"),
    ("empty line", M + b"\n"),
    ("unknown command", M + b"BOGUS\n"),
    ("utf-8 command", M + "PÏNG\n".encode()),
    ("invalid utf-8", M + b"\xff\xfe\n"),
    ("no magic", b"PING\n"),
    ("bad magic", b"  V2PING\n"),
    ("magic only", M),
    ("magic in two", b"  "),
    ("many pings", M + b"PING\n" * 20),
    ("long line", M + b"PING " + b"x" * 100_000 + b"\n"),
    ("register before identify", M + b"REGISTER t\n"),
    ("unregister before identify", M + b"UNREGISTER t c\n"),
    ("identify", M + ID),
    ("identify twice", M + ID + ID),
    ("identify missing fields", M + identify_body({"broadcast_address": "x"})),
    ("identify no version", M + identify_body({**PEER, "version": ""})),
    ("identify no tcp port", M + identify_body({**PEER, "tcp_port": 0})),
    ("identify no http port", M + identify_body({**PEER, "http_port": 0})),
    ("identify bad json", M + identify_body(b"{x}")),
    ("identify array", M + identify_body(b"[]")),
    ("identify null", M + identify_body(b"null")),
    ("identify string port", M + identify_body({**PEER, "tcp_port": "1"})),
    ("identify float port", M + identify_body({**PEER, "tcp_port": 1.5})),
    ("identify whole float port", M + identify_body({**PEER, "tcp_port": 4150.0})),
    ("identify bool port", M + identify_body({**PEER, "tcp_port": True})),
    ("identify keys any case", M + identify_body({k.upper(): v for k, v in PEER.items()})),
    ("identify unknown keys", M + identify_body({**PEER, "extra": [1, {"a": None}]})),
    ("identify null field", M + identify_body({**PEER, "hostname": None})),
    ("identify zero size", M + b"IDENTIFY\n" + size(0)),
    ("identify trailing data", M + identify_body(b'{"a":1} x')),
    ("identify then bogus", M + ID + b"FOO\n"),
    ("identify with args", M + b"IDENTIFY x\n" + size(2) + b"{}"),
    ("register topic", M + ID + b"REGISTER t\n"),
    ("register topic and channel", M + ID + b"REGISTER t c\n"),
    ("register twice", M + ID + b"REGISTER t c\nREGISTER t c\n"),
    ("register no params", M + ID + b"REGISTER\n"),
    ("register bad topic", M + ID + b"REGISTER a!\n"),
    ("register bad channel", M + ID + b"REGISTER t a!\n"),
    ("register empty topic", M + ID + b"REGISTER  t\n"),
    ("register three params", M + ID + b"REGISTER t c d\n"),
    ("register trailing space", M + ID + b"REGISTER t \n"),
    ("register long topic", M + ID + b"REGISTER " + b"x" * 65 + b"\n"),
    ("register ephemeral", M + ID + b"REGISTER t#ephemeral c#ephemeral\n"),
    ("unregister unknown", M + ID + b"UNREGISTER t\n"),
    ("unregister channel", M + ID + b"REGISTER t c\nUNREGISTER t c\n"),
    ("unregister topic keeps channels", M + ID + b"REGISTER t c\nUNREGISTER t\n"),
    ("unregister no params", M + ID + b"UNREGISTER\n"),
    ("unregister bad topic", M + ID + b"UNREGISTER a!\n"),
    ("unregister bad channel", M + ID + b"UNREGISTER t a!\n"),
    (
        "unregister ephemeral channel",
        M + ID + b"REGISTER t c#ephemeral\nUNREGISTER t c#ephemeral\n",
    ),
    ("unregister ephemeral topic", M + ID + b"REGISTER t#ephemeral\nUNREGISTER t#ephemeral\n"),
    (
        "unregister ephemeral topic with channel",
        M + ID + b"REGISTER t#ephemeral c\nUNREGISTER t#ephemeral\n",
    ),
]


async def _drive(t: Target, data: bytes) -> Any:
    """Send ``data`` and a ``PING``; read until the server closes or every line
    sent has its answer (nsqlookupd answers each command line once)."""
    c = await v1_connect(t, magic=False)
    await c.send(data, b"PING\n")
    answers = data.count(b"\n") + 1
    await c.read(answers)
    return await lookupd_state(t, "t")


@pytest.mark.parametrize("data", [c[1] for c in CASES], ids=[c[0] for c in CASES])
async def test_tcp(conformance: Conformance, data: bytes) -> None:
    await conformance.nsqlookupd(lambda t: _drive(t, data))


async def test_negative_identify_size(conformance: Conformance) -> None:
    """A negative body size: nsqlookupd v1.3.0 panics (makeslice) and its whole
    process dies.  fakensq cannot copy that; what the connection shows is the
    same: closed, no answer.  (Compared on fakensq alone: the real daemon would
    not survive the scenario.)"""

    async def scenario(t: Target) -> Any:
        c = await v1_connect(t)
        await c.send(b"IDENTIFY\n" + size(-1))
        await c.read_until_closed()

    got = await conformance.fakensq_only("nsqlookupd", scenario)
    assert got == [("l", "closed")]


async def test_connection_close_removes_its_producer(conformance: Conformance) -> None:
    """A producer goes from every registration when its connection closes; the
    registrations stay (ephemeral ones too: only UNREGISTER removes those)."""

    async def scenario(t: Target) -> Any:
        a = await v1_connect(t, "a")
        await a.identify(hostname="a", tcp_port=1, http_port=2)
        for line in (b"REGISTER t c", b"REGISTER t c#ephemeral", b"REGISTER e#ephemeral"):
            await a.command(line)
        b = await v1_connect(t, "b")
        await b.identify(hostname="b", tcp_port=3, http_port=4)
        await b.command(b"REGISTER t c")
        before = await lookupd_state(t, "t", "e#ephemeral")
        await a.close()
        await t.until("/lookup?topic=t", lambda r: len(r.json().get("producers", [])) == 1)
        return before, await lookupd_state(t, "t", "e#ephemeral")

    await conformance.nsqlookupd(scenario)


async def test_two_producers_same_address(conformance: Conformance) -> None:
    """Two connections identifying the same broadcast address and ports are
    two producers (nsqlookupd keys them by connection)."""

    async def scenario(t: Target) -> Any:
        a = await v1_connect(t, "a")
        await a.identify()
        await a.command(b"REGISTER t")
        b = await v1_connect(t, "b")
        await b.identify()
        await b.command(b"REGISTER t")
        return await lookupd_state(t, "t")

    await conformance.nsqlookupd(scenario)


async def test_identify_answer_under_flags(conformance: Conformance) -> None:
    async def scenario(t: Target) -> Any:
        c = await v1_connect(t)
        await c.identify()

    await conformance.nsqlookupd(scenario, "--broadcast-address=lookupd.example")
