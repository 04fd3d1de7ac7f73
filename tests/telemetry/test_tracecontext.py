"""The trace context envelope (trionsq.tracecontext): its layout, and what
unwrap makes of anything at all (never an exception, never a lost byte)."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from trionsq import tracecontext
from trionsq.tracecontext import MAGIC, Problem, is_valid_traceparent, unwrap, wrap

HEX = "0123456789abcdef"


@st.composite
def traceparents(draw: st.DrawFn) -> str:
    trace_id = draw(st.text(HEX, min_size=32, max_size=32).filter(lambda s: s != "0" * 32))
    span_id = draw(st.text(HEX, min_size=16, max_size=16).filter(lambda s: s != "0" * 16))
    flags = draw(st.sampled_from(["00", "01"]))
    return f"00-{trace_id}-{span_id}-{flags}"


tracestates = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=600)
bodies = st.binary(min_size=1, max_size=300)


def test_the_layout_is_the_documented_one() -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    data = wrap(b"body", parent, "congo=t61rcWkgMzE")
    assert data == (
        b"\x9dTC\x01" + bytes([55]) + parent.encode() + b"\x00\x11congo=t61rcWkgMzE" + b"body"
    )
    assert wrap(b"body") == b"\x9dTC\x01\x00\x00\x00body"
    assert unwrap(data) == tracecontext.Unwrapped(b"body", parent, "congo=t61rcWkgMzE")


@given(bodies, st.one_of(st.just(""), traceparents()), tracestates)
def test_what_is_wrapped_unwraps_to_itself(body: bytes, parent: str, state: str) -> None:
    found = unwrap(wrap(body, parent, state))
    assert found == tracecontext.Unwrapped(body, parent, state)


@given(bodies, traceparents(), tracestates, st.data())
def test_a_truncated_envelope_is_delivered_whole(
    body: bytes, parent: str, state: str, data: st.DataObject
) -> None:
    whole = wrap(body, parent, state)
    header = len(whole) - len(body)
    cut = data.draw(st.integers(0, header - 1))
    found = unwrap(whole[:cut])
    assert found.body == whole[:cut]
    assert found.problem is (Problem.NOT_ENVELOPED if cut < len(MAGIC) else Problem.TRUNCATED)


@given(st.integers(0, 255).filter(lambda v: v != 1), st.binary(max_size=100))
def test_an_unknown_version_is_delivered_whole(version: int, rest: bytes) -> None:
    data = MAGIC + bytes([version]) + rest
    assert unwrap(data) == tracecontext.Unwrapped(data, problem=Problem.UNKNOWN_VERSION)


@given(st.binary(min_size=1, max_size=80).filter(lambda b: not is_valid_traceparent(b)), bodies)
@example(b"00-" + b"0" * 32 + b"-b7ad6b7169203331-01", b"x")  # a zero trace id
@example(b"ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", b"x")  # version ff
@example(b"00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01", b"x")  # upper case
@example(b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x", b"x")  # 00 with more
def test_a_malformed_traceparent_is_delivered_whole(parent: bytes, body: bytes) -> None:
    data = MAGIC + b"\x01" + bytes([len(parent)]) + parent + b"\x00\x00" + body
    assert unwrap(data) == tracecontext.Unwrapped(data, problem=Problem.MALFORMED_CONTEXT)


def test_a_malformed_tracestate_is_delivered_whole() -> None:
    data = MAGIC + b"\x01\x00" + b"\x00\x02a\n" + b"body"
    assert unwrap(data) == tracecontext.Unwrapped(data, problem=Problem.MALFORMED_CONTEXT)


@settings(max_examples=500)
@given(st.one_of(st.binary(max_size=200), st.binary(max_size=200).map(lambda b: MAGIC + b)))
def test_unwrap_takes_anything(data: bytes) -> None:
    found = unwrap(data)
    if found.problem is not None:
        assert found.body == data and not found.traceparent and not found.tracestate
    else:
        # a valid envelope: exactly what wrap makes of its parts
        assert wrap(found.body, found.traceparent, found.tracestate) == data


@given(st.text(min_size=1))
def test_text_is_never_taken_for_an_envelope(text: str) -> None:
    assert unwrap(text.encode()).problem is Problem.NOT_ENVELOPED


@pytest.mark.parametrize(
    ("parent", "state"),
    [("00-nothex", ""), ("", "a\n"), ("", "x" * 65536), ("00-ü", "")],
)
def test_wrap_refuses_what_unwrap_would(parent: str, state: str) -> None:
    with pytest.raises(ValueError):
        wrap(b"body", parent, state)


def test_later_traceparent_versions_may_carry_more() -> None:
    assert is_valid_traceparent(b"01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-more")
    assert not is_valid_traceparent(b"01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01x")
