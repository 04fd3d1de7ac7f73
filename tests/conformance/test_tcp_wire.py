"""The wire itself: the protocol magic, line lengths and spacing, number and
name syntax, body bounds set by flags, bytes pipelined behind IDENTIFY;
compared between fakensq and the real nsqd."""

from __future__ import annotations

from typing import Any

import pytest

from trionsq.protocol import commands as cmds
from trionsq.protocol.codecs import DeflateDecoder, DeflateEncoder, SnappyDecoder, SnappyEncoder

from .conftest import Conformance, Target
from .tcp import body, mpub_body, node_state, probe


@pytest.mark.parametrize(
    "magic",
    [b"  V1", b"  V3", b"V2  ", b"xxxx", b"\x00\x00\x00\x00", b"  v2", b"IDEN"],
)
async def test_a_wrong_magic(conformance: Conformance, magic: bytes) -> None:
    async def scenario(t: Target) -> None:
        c = await t.connect(magic=False)
        await c.send(magic)
        await c.read_until_closed()

    await conformance.nsqd(scenario)


async def test_a_short_magic_then_nothing(conformance: Conformance) -> None:
    # Two bytes of magic and the client closes: nothing to answer, nothing kept.
    async def scenario(t: Target) -> Any:
        c = await t.connect(magic=False)
        await c.send(b"  ")
        await c.close()
        return await node_state(t)

    await conformance.nsqd(scenario)


@pytest.mark.parametrize("length", [1000, 16 * 1024 - 2, 16 * 1024 - 1, 16 * 1024, 20000])
async def test_long_command_lines(conformance: Conformance, length: int) -> None:
    # nsqd reads lines through a 16 KiB buffer: longer ones drop the client.
    async def scenario(t: Target) -> None:
        c = await t.connect()
        await c.send(b"NOP " + b"x" * (length - 5) + b"\n")
        await c.sync()

    await conformance.nsqd(scenario)


SPACING = {
    "nop_trailing_space": b"NOP \n",
    "sub_trailing_space": b"SUB t ch \n",
    "sub_double_space": b"SUB  t ch\n",
    "sub_tab": b"SUB\tt ch\n",
    "pub_trailing_space": b"PUB t \n" + body(b"x"),
    "rdy_leading_zero": b"RDY 01\n",
    "rdy_plus": b"RDY +1\n",
    "rdy_hex": b"RDY 0x10\n",
    "rdy_space_before": b"RDY  1\n",
    "req_leading_zeros": b"REQ {id} 000\n",
    "req_plus": b"REQ {id} +5\n",
    "fin_non_hex_id": b"FIN zzzzzzzzzzzzzzzz\n",
    "fin_id_with_space": b"FIN 0123456 89abcdef\n",
    "cr_only": b"NOP\r\r\n",
    "nul_in_name": b"PUB t\x00\n" + body(b"x"),
    "utf8_topic": "PUB t\u00e9\n".encode() + body(b"x"),
    "dpub_leading_zero": b"DPUB t 0010\n" + body(b"x"),
    "dpub_plus": b"DPUB t +10\n" + body(b"x"),
}


@pytest.mark.parametrize("command", list(SPACING))
async def test_spacing_and_number_syntax(conformance: Conformance, command: str) -> None:
    async def scenario(t: Target) -> Any:
        return await probe(t, "in_flight", SPACING[command])

    await conformance.nsqd(scenario)


NAMES = [
    "a",
    "a.b-c_d",
    "t" * 64,
    "t#ephemeral",
    "#ephemeral",
    "t#ephemeral#ephemeral",
    "t#Ephemeral",
    "t.#ephemeral",
    "-dash",
    ".dot",
    "t#",
    "a:b",
    "a/b",
    "UPPER",
    "0123",
]


@pytest.mark.parametrize("name", NAMES)
async def test_topic_and_channel_names(conformance: Conformance, name: str) -> None:
    async def scenario(t: Target) -> Any:
        p = await t.connect("p")
        await p.send(cmds.pub(name, b"x"))
        await p.read(1)
        c = await t.connect()
        await c.send(f"SUB t {name}\n".encode())
        await c.read(1)
        await c.sync()
        return await node_state(t)

    await conformance.nsqd(scenario)


@pytest.mark.parametrize(
    ("flags", "command"),
    [
        (["--max-body-size=100"], b"IDENTIFY\n" + body(b"{" + b" " * 99 + b"}")),
        (["--max-body-size=100"], b"IDENTIFY\n" + body(b"{" + b" " * 98 + b"}")),
        (["--max-body-size=100"], b"AUTH\n" + body(b"s" * 101)),
        (["--max-body-size=100"], b"MPUB t\n" + mpub_body(*[b"m" * 10] * 6)),
        (["--max-body-size=100"], b"MPUB t\n" + mpub_body(*[b"m" * 10] * 7)),
        (["--max-body-size=100"], b"MPUB t\n" + mpub_body(b"m", count=20)),
        (["--max-msg-size=10"], b"PUB t\n" + body(b"m" * 10)),
        (["--max-msg-size=10"], b"PUB t\n" + body(b"m" * 11)),
        (["--max-msg-size=10"], b"DPUB t 5\n" + body(b"m" * 11)),
        (["--max-msg-size=10"], b"MPUB t\n" + mpub_body(b"m" * 10, b"m" * 11)),
        (["--max-rdy-count=0"], cmds.rdy(1)),
        (["--max-rdy-count=0"], cmds.rdy(0)),
        (["--max-req-timeout=0"], cmds.dpub("t", 1, b"x")),
        (["--max-req-timeout=0"], cmds.dpub("t", 0, b"x")),
    ],
    ids=lambda v: "-".join(v) if isinstance(v, list) else v.split(b"\n")[0].decode(),
)
async def test_bounds_from_flags(
    conformance: Conformance, flags: list[str], command: bytes
) -> None:
    async def scenario(t: Target) -> Any:
        c = await t.connect()
        await c.send(cmds.sub("t", "ch") if command.startswith(b"RDY") else b"")
        if command.startswith(b"RDY"):
            await c.read(1)
        await c.send(command)
        if not command.startswith(b"RDY"):
            await c.read(1)
        await c.sync()
        return await node_state(t)

    await conformance.nsqd(scenario, *flags)


@pytest.mark.parametrize("codec", ["snappy", "deflate"])
async def test_bytes_pipelined_behind_identify(conformance: Conformance, codec: str) -> None:
    # A client that sends compressed commands right behind IDENTIFY, before
    # reading its answer (in one write): nsqd loses them (it reads the
    # compressed stream through a new reader).
    async def scenario(t: Target) -> Any:
        c = await t.connect()
        encoder = SnappyEncoder() if codec == "snappy" else DeflateEncoder(6)
        await c.send(
            cmds.identify({"feature_negotiation": True, codec: True})
            + encoder.encode(cmds.pub("t", b"pipelined"))
        )
        await c.read(1)  # the answer to IDENTIFY
        decoder = SnappyDecoder() if codec == "snappy" else DeflateDecoder()
        c._switch_codec(encoder, decoder)
        await c.read(1)  # the compressed OK
        # Then a command that ends the connection: what came before it shows.
        await c.send(cmds.rdy(1))
        await c.read_until_closed()
        return await node_state(t)

    await conformance.nsqd(scenario)
