"""A client that does not follow the upgrade it asked for.

After IDENTIFY negotiated TLS, snappy or deflate, nsqd reads the connection
through the new stream: plain commands where a TLS handshake should be, or
bytes that are not snappy's framing or deflate, end the connection.  What the
client reads back until nsqd closes (raw bytes, after IDENTIFY's answer) is
compared.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from trionsq.protocol import commands as cmds
from trionsq.protocol.codecs import DeflateDecoder

from ..support.tls import Pki
from .conftest import Conformance, Target
from .session import READ_TIMEOUT


async def read_to_eof(stream: trio.abc.Stream) -> bytes:
    data = b""
    with trio.fail_after(READ_TIMEOUT):
        while True:
            try:
                chunk = await stream.receive_some(65536)
            except trio.BrokenResourceError:  # (a reset)
                return data + b"<reset>"
            if not chunk:
                return data
            data += chunk


CASES = {
    "tls, then commands": ({"tls_v1": True}, cmds.nop() + cmds.nop()),
    "tls, then an http request": ({"tls_v1": True}, b"GET / HTTP/1.0\r\n\r\n"),
    "snappy, then a plain command": ({"snappy": True}, cmds.sub("t", "c")),
    "snappy, then a chunk of an unknown type": (
        {"snappy": True},
        b"\xff\x06\x00\x00sNaPpY" + b"\x05\x04\x00\x00abcd",
    ),
    "snappy, then a bad checksum": (
        {"snappy": True},
        b"\xff\x06\x00\x00sNaPpY" + b"\x01\x0d\x00\x00\x00\x00\x00\x00NOP\n\x00\x00\x00\x00\x00",
    ),
    "deflate, then a plain command": ({"deflate": True}, cmds.sub("t", "c")),
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_bad_upgrade(
    conformance: Conformance, pki: Pki, case: str
) -> None:
    fields, garbage = CASES[case]

    async def scenario(t: Target) -> Any:
        c = await t.connect()
        await c.stream.send_all(cmds.identify({"feature_negotiation": True, **fields}))
        answer = b""
        with trio.fail_after(READ_TIMEOUT):
            while len(answer) < 4 or len(answer) < 4 + int.from_bytes(answer[:4], "big"):
                answer += await c.stream.receive_some(65536)
        await c.stream.send_all(garbage)
        # What came after IDENTIFY's answer: the upgrade's OK, nsqd's last word.
        rest = answer[4 + int.from_bytes(answer[:4], "big") :] + await read_to_eof(c.stream)
        if fields.get("deflate"):
            # (decoded: zlib's bytes are not Go's encoder's)
            return DeflateDecoder().decode(rest)
        # (nsqd's snappy reader reads a chunk's header, then fails, and closes
        # with the rest unread: a reset; fakensq has read it all)
        return rest.removesuffix(b"<reset>") if fields.get("snappy") else rest

    await conformance.nsqd(
        scenario, *pki.nsqd_flags()
    )
