"""Names, the error hierarchy, and the compression codecs."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trionsq.protocol import codecs, errors, names

NSQD_NAME = re.compile(r"^[\.a-zA-Z0-9_-]+(#ephemeral)?$")


@given(st.text(max_size=80))
def test_name_validation_matches_nsqds_rule(name: str) -> None:
    expected = 1 <= len(name) <= 64 and NSQD_NAME.match(name) is not None and "\n" not in name
    assert names.is_valid_name(name) == expected


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("test", True),
        ("a" * 64, True),
        ("a" * 65, False),
        ("", False),
        ("t#ephemeral", True),
        ("a" * 54 + "#ephemeral", True),
        ("a" * 55 + "#ephemeral", False),
        ("#ephemeral", False),
        ("t#eph", False),
        ("with space", False),
        ("ünïcode", False),
        ("a.b-c_d", True),
    ],
)
def test_name_examples(name: str, ok: bool) -> None:
    assert names.is_valid_topic_name(name) is ok
    assert names.is_valid_channel_name(name) is ok


def test_ephemeral() -> None:
    assert names.is_ephemeral("x#ephemeral")
    assert not names.is_ephemeral("x")


@pytest.mark.parametrize(
    ("raw", "quoted"),
    [
        (b"abc", '"abc"'),
        (b'a"b', '"a\\"b"'),
        (b"a\tb\n", '"a\\tb\\n"'),
        (b"\x00\x7f", '"\\x00\\x7f"'),
        (b"\xff", '"\\xff"'),
        ("é".encode(), '"é"'),
        (b"a\\b", '"a\\\\b"'),
    ],
)
def test_go_quote(raw: bytes, quoted: str) -> None:
    assert names.go_quote(raw) == quoted


def test_error_hierarchy_knows_what_is_fatal() -> None:
    non_fatal = {"E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"}
    for code in [
        "E_INVALID", "E_BAD_TOPIC", "E_BAD_CHANNEL", "E_BAD_BODY", "E_BAD_MESSAGE",
        "E_PUB_FAILED", "E_MPUB_FAILED", "E_DPUB_FAILED", "E_FIN_FAILED", "E_REQ_FAILED",
        "E_TOUCH_FAILED", "E_AUTH_FAILED", "E_UNAUTHORIZED",
    ]:  # fmt: skip
        err = errors.error_for_code(code, "why")
        assert err.code == code
        assert type(err) is not errors.NSQErrorResponse
        assert err.fatal is (code not in non_fatal)
        assert err.to_bytes() == code.encode() + b" why"
        assert isinstance(err, errors.NSQError)


def test_unknown_codes_parse_to_the_fatal_base_class() -> None:
    err = errors.parse_error_frame(b"E_SOMETHING_NEW details here")
    assert type(err) is errors.NSQErrorResponse
    assert err.code == "E_SOMETHING_NEW"
    assert err.description == "details here"
    assert err.fatal


def test_error_frame_without_description() -> None:
    err = errors.parse_error_frame(b"E_BAD_PROTOCOL")
    assert isinstance(err, errors.BadProtocolError)
    assert err.to_bytes() == b"E_BAD_PROTOCOL"


@pytest.mark.parametrize(
    ("encoder", "decoder"),
    [
        (codecs.SnappyEncoder, codecs.SnappyDecoder),
        (lambda: codecs.DeflateEncoder(6), codecs.DeflateDecoder),
        (lambda: codecs.DeflateEncoder(1), codecs.DeflateDecoder),
        (codecs.IdentityCodec, codecs.IdentityCodec),
    ],
)
@given(
    writes=st.lists(st.binary(max_size=70_000), max_size=5),
    cuts=st.lists(st.integers(min_value=0), max_size=10),
)
def test_codecs_round_trip_any_chunking(encoder, decoder, writes, cuts) -> None:  # type: ignore[no-untyped-def]
    from .test_frames import split_at

    enc, dec = encoder(), decoder()
    stream = b"".join(enc.encode(w) for w in writes)
    out = b"".join(dec.decode(piece) for piece in split_at(stream, cuts))
    assert out == b"".join(writes)


@given(st.binary(max_size=300))
def test_snappy_garbage_is_a_typed_error(data: bytes) -> None:
    try:
        codecs.SnappyDecoder().decode(b"\xff\x06\x00\x00sNaPpY" + data)
    except errors.CompressionError:
        pass


@given(st.binary(max_size=300))
def test_deflate_garbage_is_a_typed_error(data: bytes) -> None:
    try:
        codecs.DeflateDecoder().decode(data)
    except errors.CompressionError:
        pass


def test_snappy_refuses_a_stream_without_identifier() -> None:
    with pytest.raises(errors.CompressionError, match="identifier"):
        codecs.SnappyDecoder().decode(b"\x01\x05\x00\x00abcde")


@pytest.mark.parametrize(
    ("encoder", "decoder"),
    [
        (codecs.SnappyEncoder, codecs.SnappyDecoder),
        (lambda: codecs.DeflateEncoder(6), codecs.DeflateDecoder),
        (codecs.IdentityCodec, codecs.IdentityCodec),
    ],
)
@given(
    writes=st.lists(st.binary(max_size=70_000), max_size=5),
    cuts=st.lists(st.integers(min_value=0), max_size=10),
    limit=st.integers(1, 100_000),
)
def test_decode_some_gives_the_same_bytes_a_limit_at_a_time(  # type: ignore[no-untyped-def]
    encoder, decoder, writes, cuts, limit
) -> None:
    from .test_frames import split_at

    enc, dec = encoder(), decoder()
    stream = b"".join(enc.encode(w) for w in writes)
    out = []
    for piece in split_at(stream, cuts):
        chunk = dec.decode_some(piece, limit)
        while True:
            # A snappy chunk decodes whole (64 KiB at most): a limit is met
            # within one chunk's worth.
            assert len(chunk) <= max(limit, 65536)
            out.append(chunk)
            if not dec.pending:
                break
            chunk = dec.decode_some(b"", limit)
    assert b"".join(out) == b"".join(writes)


def test_a_deflate_bomb_inflates_a_limit_at_a_time() -> None:
    import zlib

    z = zlib.compressobj(9, zlib.DEFLATED, -15)
    bomb = z.compress(b"\0" * (256 * 1024 * 1024)) + z.flush(zlib.Z_SYNC_FLUSH)
    assert len(bomb) < 300_000
    dec = codecs.DeflateDecoder()
    first = dec.decode_some(bomb, 65536)
    assert len(first) == 65536 and dec.pending
    total = len(first)
    while dec.pending:
        total += len(dec.decode_some(b"", 1024 * 1024))
    assert total == 256 * 1024 * 1024


def test_a_snappy_chunk_claiming_too_much_is_refused_at_its_header() -> None:
    dec = codecs.SnappyDecoder()
    dec.decode_some(b"\xff\x06\x00\x00sNaPpY", 65536)
    with pytest.raises(errors.CompressionError, match="longer than the framing format allows"):
        dec.decode_some(b"\x00\xff\xff\xff", 65536)  # 16 MiB announced: nothing buffered
    skippable = codecs.SnappyDecoder()
    skippable.decode_some(b"\xff\x06\x00\x00sNaPpY\x80\xff\xff\xff", 65536)  # 16 MiB to skip
    for _ in range(15):
        assert skippable.decode_some(b"\0" * 1_048_576, 65536) == b""
        assert len(skippable._buffer) == 0
