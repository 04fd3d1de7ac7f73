"""nsqlookupd's TCP protocol, as both ends know it: nsqd's registration
(:mod:`fakensq.nsqd.lookup_peer`) and nsqlookupd (:mod:`fakensq.lookupd.daemon`)."""

from __future__ import annotations

from typing import Final

from trionsq.protocol.frames import sized

__all__ = ["MAGIC_V1", "encode_response"]

#: What a client sends first: protocol version 1.
MAGIC_V1: Final = b"  V1"


def encode_response(data: bytes) -> bytes:
    """One answer as nsqlookupd (and nsqd's ``SendResponse``) frames it: size, data."""
    return sized(data)
