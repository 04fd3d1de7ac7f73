"""nsqd's writes over plain TCP once compression is on, seen as loopback segments.

Go's sockets send each write at once (TCP_NODELAY), and on loopback each one
is a segment of its own: which a client reading as the segments come may get
alone (pynsq breaks on such reads: tests/conformance/test_pynsq_codecs.py).
These scenarios capture the segments nsqd sends (an AF_PACKET socket on
``lo``, filtered to the daemon's port: root only, else they skip) and compare:

- snappy: the sizes, exactly (random bodies, which golang/snappy leaves
  uncompressed: each chunk two writes, its 8-byte header then its data, the
  stream identifier with the first header);
- deflate: the shape (zlib's bytes are not Go's: nsqd writes a small flush as
  a stored block, its header byte, length, data, the empty block's byte and
  the marker: 1, 4, 10, 1, 4 for an ``OK``; fakensq zlib's block then the
  marker): every answer ends with the sync marker ``00 00 ff ff`` as a segment
  of its own, no segment of Huffman-coded data over 246 bytes.

Before fakensq sent each of nsqd's writes by itself, each answer was one
segment (marker included): a client on fakensq never met the boundaries.
"""

from __future__ import annotations

import ctypes
import random
import socket
import struct
import zlib
from typing import Any

import pytest
import trio

from trionsq.protocol import commands as cmds
from trionsq.protocol.codecs import SnappyDecoder, SnappyEncoder
from trionsq.protocol.frames import FrameParser

from .conftest import Conformance, Target
from .session import READ_TIMEOUT

_MARKER = b"\x00\x00\xff\xff"
_ETH_P_ALL = 0x0003
_PACKET_OUTGOING = 4
_SO_ATTACH_FILTER = 26
_SO_RCVBUFFORCE = 33
_SOL_PACKET = 263
_PACKET_STATISTICS = 6


def _capture_supported() -> str:
    try:
        socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(_ETH_P_ALL)).close()
    except (OSError, AttributeError) as exc:
        return f"no packet capture on lo here ({exc!r}): needs root / CAP_NET_RAW"
    return ""


pytestmark = pytest.mark.skipif(bool(_capture_supported()), reason=_capture_supported() or "-")


class Capture:
    """The TCP payloads that leave loopback port ``port``, as segments."""

    def __init__(self, port: int) -> None:
        self.port = port
        # (protocol 0: nothing is queued before the filter and the bind)
        raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        # Kernel-side filter (IPv4, TCP, source port: loopback's IP header has
        # no options), so that the machine's other loopback traffic is not queued.
        program = [
            (0x28, 0, 0, 12),  # ldh [12]: ethertype
            (0x15, 0, 5, 0x0800),
            (0x30, 0, 0, 23),  # ldb [23]: IP protocol
            (0x15, 0, 3, 6),
            (0x28, 0, 0, 34),  # ldh [34]: TCP source port
            (0x15, 0, 1, port),
            (0x06, 0, 0, 0xFFFF),
            (0x06, 0, 0, 0),
        ]
        code = b"".join(struct.pack("HBBI", *insn) for insn in program)
        self._code = ctypes.create_string_buffer(code)
        fprog = struct.pack("HL", len(program), ctypes.addressof(self._code))
        raw.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, fprog)
        try:
            raw.setsockopt(socket.SOL_SOCKET, _SO_RCVBUFFORCE, 32 << 20)
        except OSError:
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 << 20)
        raw.bind(("lo", _ETH_P_ALL))  # (Python puts it in network order)
        raw.getsockopt(_SOL_PACKET, _PACKET_STATISTICS, 8)  # (read: counts from 0)
        self.sock = trio.socket.from_stdlib_socket(raw)
        self.next_seq: int | None = None
        #: Segments that repeated bytes already seen (only their new bytes taken).
        self.retransmitted = 0

    async def take(self, to_port: int, total: int) -> list[bytes]:
        """Segments to ``to_port`` until ``total`` payload bytes came."""
        got: list[bytes] = []
        with trio.fail_after(READ_TIMEOUT):
            while sum(map(len, got)) < total:
                packet, address = await self.sock.recvfrom(1 << 17)
                if address[2] != _PACKET_OUTGOING:  # (lo shows each one twice)
                    continue
                ihl = (packet[14] & 0x0F) * 4
                tcp = 14 + ihl
                src, dst = struct.unpack("!HH", packet[tcp : tcp + 4])
                total_length = struct.unpack("!H", packet[16:18])[0]
                payload = packet[tcp + (packet[tcp + 12] >> 4) * 4 : 14 + total_length]
                if src != self.port or dst != to_port or not payload:
                    continue
                # (a retransmission repeats bytes, maybe merged: the stream's
                # position tells them apart)
                seq = struct.unpack("!I", packet[tcp + 4 : tcp + 8])[0]
                if self.next_seq is None:
                    self.next_seq = seq
                ahead = (seq - self.next_seq) % (1 << 32)
                assert ahead == 0 or ahead > 1 << 31, "the capture missed bytes"
                skip = (self.next_seq - seq) % (1 << 32)
                if skip >= len(payload):
                    continue
                self.retransmitted += skip > 0
                got.append(payload[skip:])
                self.next_seq = (seq + len(payload)) % (1 << 32)
        stats = self.sock.getsockopt(_SOL_PACKET, _PACKET_STATISTICS, 8)
        assert struct.unpack("II", stats)[1] == 0, "the capture dropped packets"
        return got

    def close(self) -> None:
        self.sock.close()


async def _upgraded(t: Target, **fields: Any) -> tuple[trio.SocketStream, Capture, int]:
    """A connection IDENTIFYed with ``fields``, its IDENTIFY answer read (the
    capture starts before the connection: it holds everything the server sent)."""
    host, port = t.tcp_address.rsplit(":", 1)
    capture = Capture(int(port))
    stream = await trio.open_tcp_stream(host, int(port))
    own = stream.socket.getsockname()[1]
    body = cmds.identify({"feature_negotiation": True, **fields})
    await stream.send_all(cmds.MAGIC_V2 + body)
    segments = await capture.take(own, 4)
    size = 4 + int.from_bytes(segments[0][:4], "big")
    rest = b"".join(segments)
    while len(rest) < size:
        rest += b"".join(await capture.take(own, 1))
    # (what the stream holds is what the capture saw: read it past)
    with trio.fail_after(READ_TIMEOUT):
        seen = 0
        while seen < len(rest):
            seen += len(await stream.receive_some(len(rest) - seen))
    assert len(rest) == size, "IDENTIFY's answer came with compressed bytes"
    return stream, capture, own


async def _read_exactly(stream: trio.SocketStream, n: int) -> bytes:
    data = b""
    with trio.fail_after(READ_TIMEOUT):
        while len(data) < n:
            data += await stream.receive_some(n - len(data))
    return data


async def test_deflate_answers_end_with_the_marker_alone(conformance: Conformance) -> None:
    async def scenario(t: Target) -> Any:
        stream, capture, own = await _upgraded(t, deflate=True, deflate_level=4)
        encoder = zlib.compressobj(4, zlib.DEFLATED, -15)
        shapes = []
        try:
            for step in ("upgrade", "pub 1", "pub 2", "pub 3", "sub"):
                if step.startswith("pub"):
                    command = cmds.pub("w", b"body %s" % step.encode())
                elif step == "sub":
                    command = cmds.sub("w", "ch")
                else:
                    command = b""
                if command:
                    wire = encoder.compress(command) + encoder.flush(zlib.Z_SYNC_FLUSH)
                    await stream.send_all(wire)
                segments = [await capture.take(own, 1)]
                while segments[-1][-1][-4:] != _MARKER:
                    segments.append(await capture.take(own, 1))
                flat = [s for group in segments for s in group]
                await _read_exactly(stream, sum(map(len, flat)))
                shapes.append(
                    (
                        step,
                        flat[-1] == _MARKER,  # the marker a segment of its own
                        len(flat) >= 2,
                    )
                )
        finally:
            capture.close()
            await stream.aclose()
        return shapes

    await conformance.nsqd(
        scenario,
        expect=(
            [],
            [
                ("upgrade", True, True),
                ("pub 1", True, True),
                ("pub 2", True, True),
                ("pub 3", True, True),
                ("sub", True, True),
            ],
        ),
    )


async def test_snappy_segments(conformance: Conformance) -> None:
    rng = random.Random(7)
    bodies = [rng.randbytes(n) for n in (40, 300, 5000)]

    async def scenario(t: Target) -> Any:
        stream, capture, own = await _upgraded(t, snappy=True)
        encoder, decoder = SnappyEncoder(), SnappyDecoder()
        parser: FrameParser[Any] = FrameParser()
        sizes = []
        try:
            for step in ("upgrade", "pub", "sub", "messages"):
                if step == "pub":
                    await stream.send_all(encoder.encode(cmds.mpub("s", bodies)))
                elif step == "sub":
                    await stream.send_all(encoder.encode(cmds.sub("s", "ch")))
                elif step == "messages":
                    await stream.send_all(encoder.encode(cmds.rdy(3)))
                want = 3 if step == "messages" else 1
                got: list[bytes] = []
                frames = 0
                while frames < want:
                    segment = await capture.take(own, 1)
                    got += segment
                    data = await _read_exactly(stream, sum(map(len, segment)))
                    frames += len(parser.feed(decoder.decode(data)))
                sizes.append((step, [len(s) for s in got]))
        finally:
            capture.close()
            await stream.aclose()
        return sizes

    await conformance.nsqd(
        scenario,
        expect=(
            [],
            [
                ("upgrade", [18, 10]),  # stream identifier and header; OK
                ("pub", [8, 10]),
                ("sub", [8, 10]),
                ("messages", [8, 5442]),  # the three in one chunk
            ],
        ),
    )
