"""Where nsqd's output is cut, once TLS or compression is on.

The bytes are the same however they are cut, but a client reading a TLS
connection gets one record at a time, and nsqd (Go) makes one record or more
of each write: each ``Write`` of golang/snappy's ``Writer`` (an uncompressed
chunk is two: its header, then its data), each piece of compress/flate's bit
writer (at most 246 bytes, the sync marker ``00 00 ff ff`` alone), each
``bufio.Writer`` flush, the first records of a connection small and growing
(Go's dynamic record sizing).  These scenarios read record by record and
compare the sizes (the data is random, so that snappy leaves it as it is and
both sides' chunks are the same).  For deflate, whose bytes are zlib's in
fakensq and Go's encoder's in nsqd, what is compared is the shape: no record
over 246 bytes, every answer ending with the marker as a record of its own
(for compressible data: Go writes what it stores uncompressed in one piece).
"""

from __future__ import annotations

import random
import ssl
from typing import Any

import pytest
import trio

from trionsq.protocol import commands as cmds
from trionsq.protocol.codecs import (
    Decoder,
    DeflateDecoder,
    DeflateEncoder,
    Encoder,
    IdentityCodec,
    SnappyDecoder,
    SnappyEncoder,
)
from trionsq.protocol.frames import FrameParser, MessageFrame

from ..support.tls import Pki
from .conftest import Conformance, Target
from .session import READ_TIMEOUT

_MARKER = b"\x00\x00\xff\xff"


class RecordReader:
    """A TLS client that reads one record at a time and decodes frames."""

    def __init__(self, stream: trio.SSLStream[Any]) -> None:
        self.stream = stream
        self.decoder: Decoder = IdentityCodec()
        self.encoder: Encoder = IdentityCodec()
        self.parser: FrameParser[MessageFrame] = FrameParser()
        self.records: list[bytes] = []
        self.last_id = b""

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(self.encoder.encode(data))

    async def frames(self, n: int, *, then: bytes = b"") -> list[bytes]:
        """Read records until ``n`` frames are whole (then until a record is
        ``then``, if given); the records read."""
        start, got = len(self.records), 0
        with trio.fail_after(READ_TIMEOUT):
            while got < n or (then and self.records[-1] != then):
                record = await self.stream.receive_some(1 << 20)
                assert record, "closed"
                self.records.append(bytes(record))
                for frame in self.parser.feed(self.decoder.decode(bytes(record))):
                    got += 1
                    if isinstance(frame, MessageFrame):
                        self.last_id = frame.id
        return self.records[start:]


async def open_tls(t: Target, ctx: ssl.SSLContext, **fields: Any) -> RecordReader:
    c = await t.connect()
    answer = await c.call(cmds.identify({"feature_negotiation": True, "tls_v1": True, **fields}))
    assert answer[0][1] == "json", answer
    tls = trio.SSLStream(c.stream, ctx, server_hostname="127.0.0.1")
    with trio.fail_after(READ_TIMEOUT):
        await tls.do_handshake()
    return RecordReader(tls)


def client_context(version: ssl.TLSVersion, ciphers: str = "") -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.maximum_version = version
    if ciphers:
        ctx.set_ciphers(ciphers)
    return ctx


def bodies(seed: int, *sizes: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(size) for size in sizes]


async def publish(t: Target, topic: str, messages: list[bytes]) -> None:
    async with t.http() as http:
        for body in messages:
            (await http.post("/pub", params={"topic": topic}, content=body)).raise_for_status()


CONTEXTS = {
    "tls1.2-aes-gcm": (ssl.TLSVersion.TLSv1_2, ""),
    "tls1.2-chacha20": (ssl.TLSVersion.TLSv1_2, "ECDHE-ECDSA-CHACHA20-POLY1305"),
    "tls1.2-aes-cbc": (ssl.TLSVersion.TLSv1_2, "ECDHE-ECDSA-AES128-SHA"),
    "tls1.3": (ssl.TLSVersion.TLSv1_3, ""),
}


@pytest.mark.parametrize("context", sorted(CONTEXTS))
@pytest.mark.parametrize("compression", ["none", "snappy"])
async def test_record_sizes(
    conformance: Conformance, pki: Pki, context: str, compression: str
) -> None:
    # Messages of random bytes, one at a time (RDY 1: nsqd flushes each), one
    # over the output buffer, then two at once (RDY 3 with one in flight:
    # flushed together once RDY is used up): records as Go cuts them.
    sizes = (10, 3000, 70_000, 200, 5000, 1500)

    async def scenario(t: Target) -> Any:
        messages = bodies(7, *sizes)
        await publish(t, "r", messages)
        fields = {"snappy": True} if compression == "snappy" else {}
        r = await open_tls(t, client_context(*CONTEXTS[context]), **fields)
        seen = {"tls ok": [len(x) for x in await r.frames(1)]}
        if compression == "snappy":
            r.decoder, r.encoder = SnappyDecoder(), SnappyEncoder()
            seen["snappy ok"] = [len(x) for x in await r.frames(1)]
        await r.send(cmds.sub("r", "ch"))
        seen["sub"] = [len(x) for x in await r.frames(1)]
        for i in range(3):
            await r.send(cmds.rdy(1) if i == 0 else cmds.fin(r.last_id))
            seen[f"message {i}"] = [len(x) for x in await r.frames(1)]
        # (FIN, then the next message read, before RDY 3: with FIN and RDY in
        # one write, nsqd's message pump may send the next message between
        # the two, RDY 1 still, and flush it alone: a record of 234 bytes
        # before the rest, seen beside CPU burners, against one of 6802.)
        await r.send(cmds.fin(r.last_id))
        seen["message 3"] = [len(x) for x in await r.frames(1)]
        await r.send(cmds.rdy(3))
        seen["burst"] = [len(x) for x in await r.frames(2)]
        return seen

    # nsqd also flushes on its output buffer's ticker (250 ms by default),
    # which a busy machine lets tick during the burst: a ticker far longer
    # than the scenario leaves only the flushes under test (RDY used up, a
    # full buffer).
    await conformance.nsqd(scenario, *pki.nsqd_flags(), "--output-buffer-timeout=10s")


async def test_deflate_shape(conformance: Conformance, pki: Pki) -> None:
    async def scenario(t: Target) -> Any:
        # (compressible: Go writes random data as stored blocks, in one piece)
        await publish(t, "d", [b"".join(b"line %d\n" % i for i in range(n)) for n in (300, 6000)])
        r = await open_tls(t, client_context(ssl.TLSVersion.TLSv1_3), deflate=True, deflate_level=6)
        shape = {}  # step: no record over 246 bytes (each ends with the marker alone)
        await r.frames(1)  # TLS's OK
        del t.transcript[:]
        r.decoder, r.encoder = DeflateDecoder(), DeflateEncoder(6)
        for step, command, n in (
            ("deflate ok", b"", 1),
            ("sub", cmds.sub("d", "ch"), 1),
            ("messages", cmds.rdy(2), 2),
        ):
            if command:
                await r.send(command)
            records = await r.frames(n, then=_MARKER)
            shape[step] = max(len(x) for x in records) <= 246
        return shape

    await conformance.nsqd(
        scenario,
        *pki.nsqd_flags(),
        expect=([], {"deflate ok": True, "sub": True, "messages": True}),
    )


async def test_deflate_without_a_buffer_holds_messages_until_a_flush(
    conformance: Conformance, pki: Pki
) -> None:
    # output_buffer_size -1 turns nsqd's output buffer timer off; the flate
    # writer keeps what it was given until a flush: the messages come with
    # the next heartbeat.  Before them, the empty flush (1 and 4 bytes) of
    # nsqd's message pump, which flushes when SUB wakes it (RDY 0).
    async def scenario(t: Target) -> Any:
        await publish(t, "h", [b"hello %d" % i for i in range(3)])
        r = await open_tls(
            t,
            client_context(ssl.TLSVersion.TLSv1_3),
            deflate=True,
            output_buffer_size=-1,
            heartbeat_interval=1000,
        )
        await r.frames(1)  # TLS's OK
        del t.transcript[:]
        r.decoder, r.encoder = DeflateDecoder(), DeflateEncoder(6)
        await r.frames(1, then=_MARKER)  # deflate's OK
        await r.send(cmds.sub("h", "ch"))
        await r.frames(1, then=_MARKER)
        await r.send(cmds.rdy(10))
        records = await r.frames(4, then=_MARKER)  # 3 messages, a heartbeat
        return records.count(_MARKER), records[-1] == _MARKER

    await conformance.nsqd(scenario, *pki.nsqd_flags(), expect=([], (2, True)))
