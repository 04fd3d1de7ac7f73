"""trionsq.protocol.handshake: what nsqd's answers to IDENTIFY and AUTH mean."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trionsq.protocol import codecs, handshake
from trionsq.protocol.errors import ProtocolError

PLAIN = {"tls": False, "snappy": False, "deflate": False, "deflate_level": 6}


def test_ok_means_no_negotiation() -> None:
    n = handshake.negotiate(b"OK", **PLAIN, has_auth_secret=False)
    assert n == handshake.Negotiated()
    assert n.codec() is None and n.refusal is None


def test_limits_and_the_steps_in_nsqds_order() -> None:
    answer = {
        "max_rdy_count": 100,
        "msg_timeout": 60000,
        "tls_v1": True,
        "snappy": True,
        "deflate": True,
        "auth_required": True,
    }
    n = handshake.negotiate(
        json.dumps(answer).encode(),
        tls=True,
        snappy=True,
        deflate=True,
        deflate_level=3,
        has_auth_secret=True,
    )
    assert (n.max_rdy_count, n.msg_timeout, n.tls, n.compression, n.auth) == (
        100,
        60.0,
        True,
        "snappy",  # snappy first when both are granted, as the Trio connection did
        True,
    )
    assert isinstance(n.codec()[0], codecs.SnappyEncoder)  # type: ignore[index]
    assert n.refusal is None


def test_deflate_at_the_level_nsqd_settled() -> None:
    n = handshake.negotiate(
        b'{"deflate": true, "deflate_level": 2}',
        tls=False,
        snappy=False,
        deflate=True,
        deflate_level=6,
        has_auth_secret=False,
    )
    assert n.compression == "deflate" and n.deflate_level == 2
    encoder, decoder = n.codec()  # type: ignore[misc]
    assert decoder.decode(encoder.encode(b"hello")) == b"hello"


@pytest.mark.parametrize(
    ("answer", "options", "refusal"),
    [
        (b"OK", {**PLAIN, "tls": True}, "TLS requested but nsqd does not offer it"),
        (b'{"auth_required": true}', PLAIN, "nsqd requires AUTH; set auth_secret"),
    ],
)
def test_what_the_client_requires_and_nsqd_lacks(
    answer: bytes, options: dict[str, object], refusal: str
) -> None:
    assert handshake.negotiate(answer, **options, has_auth_secret=False).refusal == refusal  # type: ignore[arg-type]


@pytest.mark.parametrize("answer", [b"not json", b"[1, 2]", b'"text"'])
def test_an_answer_that_is_no_json_object(answer: bytes) -> None:
    with pytest.raises(ProtocolError, match="IDENTIFY response"):
        handshake.negotiate(answer, **PLAIN, has_auth_secret=False)


def test_nonsense_limits_fall_back_to_the_defaults() -> None:
    n = handshake.negotiate(
        b'{"max_rdy_count": -1, "msg_timeout": true}', **PLAIN, has_auth_secret=False
    )
    assert n.max_rdy_count == handshake.DEFAULT_MAX_RDY_COUNT and n.msg_timeout is None


def test_upgrades_must_be_answered_ok() -> None:
    handshake.expect_ok(b"OK", "TLS")
    with pytest.raises(ProtocolError, match="after the snappy upgrade"):
        handshake.expect_ok(b"E_NOPE", "snappy")


@given(st.binary(max_size=64))
def test_any_answer_is_read_or_refused_cleanly(data: bytes) -> None:
    try:
        n = handshake.negotiate(data, **PLAIN, has_auth_secret=False)
    except ProtocolError:
        return
    assert isinstance(n.response, dict)
    assert isinstance(handshake.parse_auth(data), dict)
