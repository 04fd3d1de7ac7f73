"""IDENTIFY's JSON as nsqd decodes it (trionsq.protocol.identify), and the one
declaration of its fields that the client and fakensq's nsqd share."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trionsq.config import Config
from trionsq.protocol.errors import BadBodyError
from trionsq.protocol.identify import IdentifyBody, IdentifyResponse, decode_identify


def test_keys_fold_case_unknown_ones_and_nulls_are_left_out() -> None:
    body = b'{"CLIENT_ID":"a","Heartbeat_Interval":1000,"bogus":1,"hostname":null}'
    assert decode_identify(body) == {"client_id": "a", "heartbeat_interval": 1000}
    assert decode_identify(b"null") == {}


@pytest.mark.parametrize(
    "body",
    [
        b'{"client_id":1}',  # a number for a string
        b'{"tls_v1":1}',  # a number for a bool
        b'{"msg_timeout":1.5}',  # a float for an int
        b'{"msg_timeout":true}',
        b'{"sample_rate":2147483648}',  # past int32
        b'{"heartbeat_interval":9223372036854775808}',  # past int64
        b'{"msg_timeout":NaN}',
        b"[1]",
        b"{",
    ],
)
def test_what_go_refuses_is_e_bad_body(body: bytes) -> None:
    with pytest.raises(BadBodyError, match=r"^E_BAD_BODY IDENTIFY failed to decode JSON body$"):
        decode_identify(body)


def test_the_client_s_body_decodes_to_itself() -> None:
    sent = Config(output_buffer_size=128, output_buffer_timeout=0.25, msg_timeout=30.0)
    body = sent.identify_body()
    assert decode_identify(json.dumps(body).encode()) == body
    assert set(body) <= set(IdentifyBody.__annotations__)


def test_the_answer_names_what_upgrades_the_stream() -> None:
    from trionsq.protocol.identify import UPGRADES

    assert set(UPGRADES) <= set(IdentifyResponse.__annotations__)


@given(st.binary(max_size=200))
def test_any_body_decodes_or_is_refused(body: bytes) -> None:
    try:
        decoded = decode_identify(body)
    except BadBodyError:
        return
    assert set(decoded) <= set(IdentifyBody.__annotations__)
