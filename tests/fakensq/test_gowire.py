"""fakensq's model of nsqd's writer stack: bufio, golang/snappy, compress/flate
and crypto/tls record sizes (fakensq.golang.*, fakensq.nsqd.wire).

The same cuts are compared with the real nsqd's in
tests/conformance/test_tcp_records.py; these run without it.
"""

from __future__ import annotations

import random
import zlib
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

import fakensq
import trionsq
from fakensq.golang.bufio import BufferedWriter, frame_pieces
from fakensq.golang.flate import PIECE, FlateWriter
from fakensq.golang.snappy import SnappyWriter
from fakensq.golang.tlsrecords import RecordSizer
from fakensq.nsqd.wire import ClientWire
from trionsq.protocol.codecs import SnappyDecoder
from trionsq.protocol.frames import encode_response

from ..support.tls import Pki

IDENTIFIER = b"\xff\x06\x00\x00sNaPpY"


def test_bufio_cuts_as_go() -> None:
    below: list[bytes] = []
    w = BufferedWriter(10)
    w.write(b"abcd", below)
    w.write(b"efghij", below)  # fits exactly: nothing written yet
    assert below == [] and w.buffered == 10
    w.write(b"k", below)  # the full buffer goes, "k" waits
    assert below == [b"abcdefghij"] and w.buffered == 1
    w.write(b"0123456789abc", below)  # fills the buffer, then 4 bytes wait
    assert below[1:] == [b"k012345678"] and w.buffered == 4
    w.flush(below)
    assert below[2:] == [b"9abc"]
    w.write(b"x" * 25, below)  # larger than an empty buffer: as it is
    assert below[3:] == [b"x" * 25] and w.buffered == 0


@given(st.integers(1, 300), st.lists(st.binary(max_size=700), max_size=30))
def test_bufio_loses_nothing(size: int, writes: list[bytes]) -> None:
    below: list[bytes] = []
    w = BufferedWriter(size)
    for data in writes:
        w.write(data, below)
    w.flush(below)
    assert b"".join(below) == b"".join(writes)
    assert all(below)


def test_frame_pieces_are_nsqd_s_three_writes() -> None:
    frames = encode_response(b"OK") + encode_response(b"") + b"\x00\x00"
    pieces = [bytes(p) for p in frame_pieces(frames)]
    assert pieces == [
        b"\x00\x00\x00\x06",
        b"\x00\x00\x00\x00",
        b"OK",
        b"\x00\x00\x00\x04",
        b"\x00\x00\x00\x00",
        b"\x00\x00",  # (a torn frame: one write)
    ]


def test_snappy_writes_an_uncompressed_chunk_in_two() -> None:
    w, below = SnappyWriter(), []
    w.write(encode_response(b"OK"), below)
    assert [len(b) for b in below] == [18, 10]
    assert below[0].startswith(IDENTIFIER) and below[0][10] == 0x01
    w.write(encode_response(b"OK"), below)  # no identifier again
    assert [len(b) for b in below[2:]] == [8, 10]
    w.write(b"a" * 5000, below)  # compressed: header and data in one write
    assert len(below) == 5 and below[4][0] == 0x00
    w.write(b"", below)
    assert len(below) == 5
    decoded = SnappyDecoder().decode(b"".join(below))
    assert decoded == encode_response(b"OK") * 2 + b"a" * 5000


def test_snappy_chunks_hold_64_kib() -> None:
    import random

    data = random.Random(1).randbytes(70_000)
    w, below = SnappyWriter(), []
    w.write(data, below)
    assert [len(b) for b in below] == [18, 65536, 8, 70_000 - 65536]
    assert SnappyDecoder().decode(b"".join(below)) == data


def test_flate_flush_ends_with_the_marker_alone() -> None:
    w, below = FlateWriter(6), []
    text = b"".join(b"line %d\n" % i for i in range(3000))
    w.write(text, below)
    w.flush(below)
    assert below[-1] == b"\x00\x00\xff\xff"
    assert all(0 < len(b) <= PIECE for b in below)
    w.flush(below)  # an empty flush: Go's two writes, 1 and 4 bytes
    assert below[-2:] == [b"\x00", b"\x00\x00\xff\xff"]
    assert zlib.decompressobj(-15).decompress(b"".join(below)) == text


def test_record_sizes_grow_as_go_s() -> None:
    r, out = RecordSizer("TLSv1.2", "ECDHE-ECDSA-AES128-GCM-SHA256"), []
    r.records(b"x" * 10, out)
    r.records(b"x" * 5000, out)
    assert [len(b) for b in out] == [10, 2358, 2642]
    r13, out = RecordSizer("TLSv1.3", "TLS_AES_128_GCM_SHA256"), []
    r13.records(b"x" * 4000, out)
    assert [len(b) for b in out] == [1186, 2372, 442]
    chacha, out = RecordSizer("TLSv1.2", "ECDHE-RSA-CHACHA20-POLY1305"), []
    chacha.records(b"x" * 2000, out)
    assert [len(b) for b in out] == [1187, 813]
    cbc, out = RecordSizer("TLSv1.2", "ECDHE-ECDSA-AES128-SHA"), []
    cbc.records(b"x" * 2000, out)
    assert [len(b) for b in out] == [1163, 837]
    tls10, out = RecordSizer("TLSv1", "ECDHE-ECDSA-AES128-SHA"), []
    tls10.records(b"abc", out)  # 1/n-1: the first byte alone
    assert out == [b"a", b"bc"]


def test_records_reach_16_kib() -> None:
    r, out = RecordSizer("TLSv1.3", "TLS_AES_128_GCM_SHA256"), []
    for _ in range(20):
        r.records(b"x" * 20_000, out)
    assert max(len(b) for b in out) == 16384
    assert [len(b) for b in out[-2:]] == [16384, 20_000 - 16384]


def test_client_wire_holds_what_does_not_fill_the_buffer() -> None:
    wire = ClientWire(64, SnappyWriter(), RecordSizer("TLSv1.3", "TLS_AES_128_GCM_SHA256"))
    frames = encode_response(b"a" * 50) * 2  # 116 bytes: one full buffer and 52
    records = wire.write(frames, flush=False)
    assert wire.buffered == 52
    records += wire.write(b"", flush=True)
    assert wire.buffered == 0
    assert SnappyDecoder().decode(b"".join(records)) == frames


def test_client_wire_takes_frames_in_pieces() -> None:
    # fakensq's writer sends a long output in pieces, which may end inside a
    # frame: the cuts are those of the whole.
    frames = encode_response(b"x" * 3000) + encode_response(b"y" * 5000)
    whole = ClientWire(4096, None, RecordSizer("TLSv1.3", "TLS_AES_128_GCM_SHA256"))
    pieces = ClientWire(4096, None, RecordSizer("TLSv1.3", "TLS_AES_128_GCM_SHA256"))
    expected = whole.write(frames, flush=True)
    got = pieces.write(frames[:3010], flush=False) + pieces.write(frames[3010:3020], flush=False)
    assert pieces.buffered == 3020
    got += pieces.write(frames[3020:], flush=True)
    assert got == expected


@pytest.mark.parametrize("codec", ["none", "snappy", "deflate"])
@pytest.mark.parametrize("buffer", [64, 4096, -1])
async def test_everything_arrives_over_tls(tmp_path: Path, codec: str, buffer: int) -> None:
    # Over real TCP, through nsqd's cuts (the buffer's rest waits for its
    # timeout): every message of random sizes arrives, RDY well above 1.
    pki = Pki(tmp_path)
    client_ctx = pki.client_context()
    rng = random.Random(5)
    sizes = [1, 100, 3000] if buffer == -1 else [1, 100, 3000, 20_000]
    bodies = [rng.randbytes(rng.choice(sizes)) for _ in range(200)]
    # (deflate without a buffer: what the flate writer holds waits for a flush,
    # the next heartbeat, as on nsqd, whose output buffer timer is then off)
    options: dict[str, Any] = {"tls": client_ctx, "output_buffer_size": buffer}
    # (also nsqd's write deadline: without a buffer every frame is three
    # records, a burst of small writes that a loaded machine takes time over)
    options["heartbeat_interval"] = 2.0
    if codec != "none":
        options[codec] = True
    async with fakensq.NSQD(
        tcp_address="127.0.0.1:0", http_address="", tls_cert=pki.cert, tls_key=pki.key
    ) as nsqd:
        topic = nsqd.get_topic("t")
        topic.get_channel("c")
        topic.put_many([topic.new_message(body) for body in bodies])
        got: list[bytes] = []
        all_in = trio.Event()

        def handler(message: trionsq.Message) -> None:
            got.append(message.body)
            if len(got) == len(bodies):
                all_in.set()

        with trio.fail_after(60):
            async with trionsq.Consumer(
                "t",
                "c",
                handler=handler,
                nsqd_tcp_addresses=[nsqd.tcp_address],
                max_in_flight=150,
                **options,
            ):
                await all_in.wait()
    assert sorted(got) == sorted(bodies)
