"""The trace context envelope: W3C ``traceparent``/``tracestate`` around a body.

NSQ messages have no headers, so a producer with ``trace_context=True`` sends
each body inside this envelope, and a consumer with the option takes it off
again (the handler sees the body as it was published).  Sans-IO: bytes in,
bytes out, nothing imported from OpenTelemetry (a producer without it still
writes the envelope, with no context in it, so the wire format depends on the
option alone).

Layout (version 1), all lengths big-endian::

    offset  size  field
    0       3     magic: 0x9D 0x54 0x43 ("\\x9dTC")
    3       1     version: 0x01
    4       1     P: length of traceparent (0: no context)
    5       P     traceparent, ASCII (W3C Trace Context, e.g. 00-<32 hex>-<16 hex>-01)
    5+P     2     S: length of tracestate (0: none)
    7+P     S     tracestate, ASCII
    7+P+S   ...   the body as published (never empty: a producer refuses an
                  empty body before wrapping it, as nsqd would)

0x9D cannot begin a UTF-8 text (it is a continuation byte), so a JSON or text
body is never taken for an envelope.  A body that starts with the magic but
does not parse as version 1 with a valid traceparent is not unwrapped: the
consumer gets it whole (see :func:`unwrap`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

__all__ = [
    "MAGIC",
    "VERSION",
    "Problem",
    "Unwrapped",
    "is_valid_traceparent",
    "unwrap",
    "wrap",
]

MAGIC = b"\x9dTC"
VERSION = 1
_HEAD = MAGIC + bytes([VERSION])
_MAX_TRACEPARENT = 255
_MAX_TRACESTATE = 65535

# W3C Trace Context level 1: version-traceid-parentid-flags, lower-case hex;
# a later version may append fields after a '-' (the spec's forward rule).
_TRACEPARENT = re.compile(rb"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?", re.S)
# tracestate: printable ASCII, no control characters (its members are not
# parsed here: OpenTelemetry's TraceState does that, dropping what is invalid).
_TRACESTATE = re.compile(rb"[\x20-\x7e]*")


class Problem(Enum):
    """Why a body was not unwrapped (the consumer gets it whole)."""

    #: no magic: a plain body (published without the option)
    NOT_ENVELOPED = "not_enveloped"
    #: the magic, then a version this code does not know
    UNKNOWN_VERSION = "unknown_version"
    #: the magic and version, then fewer bytes than the lengths say
    TRUNCATED = "truncated"
    #: a traceparent (or tracestate) that is not W3C's
    MALFORMED_CONTEXT = "malformed_context"


@dataclass(frozen=True, slots=True)
class Unwrapped:
    """What :func:`unwrap` found: the body to deliver, the context (empty
    strings for none) and, if the data was not a valid envelope, why (the
    body is then the data, whole)."""

    body: bytes
    traceparent: str = ""
    tracestate: str = ""
    problem: Problem | None = None


def is_valid_traceparent(value: bytes) -> bool:
    """Whether ``value`` is a W3C traceparent: version ``00`` exactly 55
    characters; version ``ff`` is invalid; trace and parent ids not all zeros."""
    match = _TRACEPARENT.fullmatch(value)
    if match is None:
        return False
    version, trace_id, parent_id, _flags, rest = match.groups()
    if version == b"ff" or (version == b"00" and rest is not None):
        return False
    return trace_id != b"0" * 32 and parent_id != b"0" * 16


def wrap(body: bytes, traceparent: str = "", tracestate: str = "") -> bytes:
    """``body`` in a version 1 envelope.  Raises :class:`ValueError` for a
    context that :func:`unwrap` would refuse (a bug of the caller's, never
    sent)."""
    parent = traceparent.encode("ascii")
    state = tracestate.encode("ascii")
    if parent and not is_valid_traceparent(parent):
        raise ValueError(f"not a W3C traceparent: {traceparent!r}")
    if len(state) > _MAX_TRACESTATE or _TRACESTATE.fullmatch(state) is None:
        raise ValueError("tracestate must be printable ASCII, at most 65535 bytes")
    return b"".join(
        (_HEAD, bytes([len(parent)]), parent, len(state).to_bytes(2, "big"), state, body)
    )


def unwrap(data: bytes) -> Unwrapped:
    """The body and context in ``data``; never raises.  Data that is not a
    valid version 1 envelope comes back whole as the body, with the problem."""
    if not data.startswith(MAGIC):
        return Unwrapped(data, problem=Problem.NOT_ENVELOPED)
    if len(data) < 4:
        return Unwrapped(data, problem=Problem.TRUNCATED)
    if data[3] != VERSION:
        return Unwrapped(data, problem=Problem.UNKNOWN_VERSION)
    if len(data) < 5:
        return Unwrapped(data, problem=Problem.TRUNCATED)
    parent_end = 5 + data[4]
    if len(data) < parent_end + 2:
        return Unwrapped(data, problem=Problem.TRUNCATED)
    state_end = parent_end + 2 + int.from_bytes(data[parent_end : parent_end + 2], "big")
    if len(data) < state_end:
        return Unwrapped(data, problem=Problem.TRUNCATED)
    parent = data[5:parent_end]
    state = data[parent_end + 2 : state_end]
    if (parent and not is_valid_traceparent(parent)) or _TRACESTATE.fullmatch(state) is None:
        return Unwrapped(data, problem=Problem.MALFORMED_CONTEXT)
    return Unwrapped(data[state_end:], parent.decode("ascii"), state.decode("ascii"))
