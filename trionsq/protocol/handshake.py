"""The client's side of a connection's handshake, sans-IO: what nsqd's answers
mean and what the client does next.

A client opens with the magic and IDENTIFY (``commands.MAGIC_V2`` and
``commands.identify``); nsqd answers ``OK`` (it negotiates nothing) or its
:class:`~trionsq.protocol.identify.IdentifyResponse`.  :func:`negotiate` reads
that answer into a :class:`Negotiated`: the limits nsqd gave and the steps
that follow, in their order (nsqd's): the TLS upgrade, then the compression
upgrade (each answered ``OK`` on the upgraded stream), then AUTH when nsqd
requires it.  Every driver (the Trio connection, the blocking publisher) does
the I/O of those steps its own way and reads their answers here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from . import codecs
from .errors import ProtocolError
from .frames import OK, SIZE, Error, FrameParser, Response

__all__ = [
    "DEFAULT_MAX_RDY_COUNT",
    "HTTP_ANSWER",
    "NO_ANSWER",
    "TLS_ANSWER",
    "Negotiated",
    "answer",
    "answer_size",
    "expect_ok",
    "foreign_answer",
    "negotiate",
    "parse_auth",
]

#: What the guide says to assume when nsqd does not negotiate features (nsqd's
#: default --max-rdy-count).
DEFAULT_MAX_RDY_COUNT = 2500

#: What a client says when an HTTP server answers the magic (nsqd's HTTP port
#: says "HTTP/1.1 400 Bad Request"): as go-nsq says it, not as a frame of
#: 1213486160 bytes.
HTTP_ANSWER = (
    "unexpected HTTP response, a nsqd TCP endpoint is required (is this nsqd's HTTP port?)"
)


#: What a client says when a TLS server answers the magic with a record (an
#: alert, a handshake): the port speaks TLS from its first byte, as no nsqd TCP
#: port does (nsqd upgrades to TLS after IDENTIFY).
TLS_ANSWER = (
    "unexpected TLS record, a nsqd TCP endpoint is required "
    "(nsqd's TCP port speaks TLS only after IDENTIFY)"
)
#: What a client says when the peer closes before any answer: nsqd always
#: answers IDENTIFY (even to refuse it), while nsqd's HTTPS port, given the
#: magic, closes without a byte.
NO_ANSWER = (
    "closed without answering the protocol's greeting "
    "(is this a nsqd TCP endpoint? nsqd's HTTPS port closes so)"
)


def foreign_answer(header: bytes) -> str | None:
    """What a handshake answer's first 4 bytes say when they are no NSQ frame
    but another protocol's answer (:data:`HTTP_ANSWER`, :data:`TLS_ANSWER`),
    else None.  A TLS record's head read as a size is above 350 MB: no answer
    to a handshake is that large."""
    if header == b"HTTP":
        return HTTP_ANSWER
    if header[0] in (0x15, 0x16) and header[1] == 0x03 and header[2] <= 0x04:
        return TLS_ANSWER
    return None


def answer_size(header: bytes, max_frame_size: int) -> int | None:
    """The size after a handshake answer's first 4 bytes (``header``): how
    many bytes to read next; None when they are another protocol's answer
    (the driver says :func:`foreign_answer`'s text).  Raises the frame
    parser's typed error for a size above ``max_frame_size`` or below a
    frame's smallest."""
    if foreign_answer(header) is not None:
        return None
    (size,) = SIZE.unpack(header)
    if size > max_frame_size or size < 4:
        FrameParser(max_frame_size).feed(header)  # raises the typed error
    return int(size)


def answer(frame: bytes, max_frame_size: int, heartbeats: bool = False) -> bytes | None:
    """A whole handshake frame (its size, then as many bytes as
    :func:`answer_size` said): a response's data; nsqd's error raised for an
    error frame; None for a heartbeat with ``heartbeats`` (else an error: a
    heartbeat cannot answer a handshake's step)."""
    (parsed,) = FrameParser(max_frame_size).feed(frame)
    if isinstance(parsed, Error):
        raise parsed.error
    if isinstance(parsed, Response):
        if not parsed.is_heartbeat:
            return parsed.data
        if heartbeats:
            return None
    raise ProtocolError(f"unexpected frame during handshake: {parsed!r}"[:200])


@dataclass(frozen=True, slots=True)
class Negotiated:
    """What nsqd's answer to IDENTIFY settled, and the handshake's next steps."""

    #: nsqd's answer (empty when it answered ``OK``: no feature negotiation)
    response: dict[str, Any] = field(default_factory=dict)
    max_rdy_count: int = DEFAULT_MAX_RDY_COUNT
    #: nsqd's message timeout for this connection, in seconds (if it said)
    msg_timeout: float | None = None
    #: upgrade to TLS next (the client asked and nsqd agreed)
    tls: bool = False
    #: then compress the stream: ``"snappy"``, ``"deflate"`` or None
    compression: str | None = None
    #: deflate's level, as nsqd settled it
    deflate_level: int = 6
    #: send AUTH last (nsqd requires it)
    auth: bool = False
    #: why the handshake cannot go on (the client requires what nsqd does not
    #: offer), or None: the driver raises its negotiation error with it
    refusal: str | None = None

    def codec(self) -> tuple[codecs.Encoder, codecs.Decoder] | None:
        """A fresh encoder and decoder for the compression settled, if any."""
        if self.compression == "snappy":
            return codecs.SnappyEncoder(), codecs.SnappyDecoder()
        if self.compression == "deflate":
            return codecs.DeflateEncoder(self.deflate_level), codecs.DeflateDecoder()
        return None


def negotiate(
    data: bytes,
    *,
    tls: bool,
    snappy: bool,
    deflate: bool,
    deflate_level: int,
    has_auth_secret: bool,
) -> Negotiated:
    """nsqd's answer to IDENTIFY (``data``, a response frame's data), for a
    client that asked for ``tls``, ``snappy``, ``deflate``; raises
    :class:`ProtocolError` for an answer that is not a JSON object."""
    response: dict[str, Any] = {}
    if data != OK:
        try:
            parsed = json.loads(data)
        except ValueError:
            raise ProtocolError(f"IDENTIFY response is not JSON: {data[:100]!r}") from None
        if not isinstance(parsed, dict):
            raise ProtocolError("IDENTIFY response is not a JSON object")
        response = parsed
    max_rdy = response.get("max_rdy_count", DEFAULT_MAX_RDY_COUNT)
    if not (isinstance(max_rdy, int) and not isinstance(max_rdy, bool) and max_rdy >= 0):
        max_rdy = DEFAULT_MAX_RDY_COUNT
    timeout = response.get("msg_timeout")
    msg_timeout = (
        timeout / 1000
        if isinstance(timeout, int | float) and not isinstance(timeout, bool)
        else None
    )
    refusal = None
    if tls and not response.get("tls_v1"):
        refusal = "TLS requested but nsqd does not offer it"
    compression = None
    level = deflate_level
    if snappy and response.get("snappy"):
        compression = "snappy"
    elif deflate and response.get("deflate"):
        compression = "deflate"
        settled = response.get("deflate_level", deflate_level)
        level = settled if isinstance(settled, int) else 6
    auth = bool(response.get("auth_required"))
    if auth and not has_auth_secret and refusal is None:
        refusal = "nsqd requires AUTH; set auth_secret"
    return Negotiated(
        response=response,
        max_rdy_count=max_rdy,
        msg_timeout=msg_timeout,
        tls=tls,
        compression=compression,
        deflate_level=level,
        auth=auth,
        refusal=refusal,
    )


def expect_ok(data: bytes, step: str) -> None:
    """The answer after an upgrade (``step``: ``TLS``, ``snappy``, ``deflate``)
    must be ``OK``; raises :class:`ProtocolError` otherwise."""
    if data != OK:
        raise ProtocolError(f"expected OK after the {step} upgrade, got {data[:100]!r}")


def parse_auth(data: bytes) -> dict[str, Any]:
    """nsqd's answer to AUTH (:class:`~trionsq.protocol.identify.AuthResponse`),
    ``{}`` when it is not a JSON object."""
    try:
        parsed = json.loads(data)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}
