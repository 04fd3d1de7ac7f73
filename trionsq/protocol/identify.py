"""IDENTIFY's JSON: the body a client sends (nsqd's ``identifyDataV2``) and
nsqd's answer with feature negotiation; AUTH's answer.

The fields are declared here once, for the client that sends and reads them,
fakensq's nsqd that reads and answers them, and the fault proxy that looks at
them on the way.  Times are milliseconds; ``heartbeat_interval``,
``output_buffer_size`` and ``output_buffer_timeout`` take -1 for "disabled".

:func:`decode_identify` reads a body as nsqd does (Go's ``encoding/json``
into ``identifyDataV2``), with nsqd's error for what it refuses.
"""

from __future__ import annotations

import json
from typing import Any, Final, TypedDict, get_type_hints

from .errors import BadBodyError

__all__ = [
    "IdentifyBody",
    "IdentifyResponse",
    "AuthResponse",
    "UPGRADES",
    "decode_identify",
]


class IdentifyBody(TypedDict, total=False):
    """What a client says about itself and the features it asks for."""

    client_id: str
    hostname: str
    user_agent: str
    feature_negotiation: bool
    heartbeat_interval: int
    output_buffer_size: int
    output_buffer_timeout: int
    tls_v1: bool
    snappy: bool
    deflate: bool
    deflate_level: int
    sample_rate: int
    msg_timeout: int


class IdentifyResponse(TypedDict, total=False):
    """nsqd's answer to an IDENTIFY with ``feature_negotiation``: its limits
    and what it turned on (``tls_v1``, ``snappy``, ``deflate``: the stream
    changes after this answer)."""

    max_rdy_count: int
    version: str
    max_msg_timeout: int
    msg_timeout: int
    tls_v1: bool
    deflate: bool
    deflate_level: int
    max_deflate_level: int
    snappy: bool
    sample_rate: int
    auth_required: bool
    output_buffer_size: int
    output_buffer_timeout: int


class AuthResponse(TypedDict, total=False):
    """nsqd's answer to AUTH (what its auth server said)."""

    identity: str
    identity_url: str
    permission_count: int


#: The answer's fields that upgrade the connection (TLS, then compression).
UPGRADES: Final = ("tls_v1", "snappy", "deflate")

#: IdentifyBody's fields and their types, as Go's decoder checks them.
_BODY_TYPES: Final[dict[str, type]] = get_type_hints(IdentifyBody)
#: The Go integer sizes of identifyDataV2's int fields (int64 but sample_rate).
_INT_BITS: Final = {name: 32 if name == "sample_rate" else 64 for name in _BODY_TYPES}


def _reject_constant(name: str) -> Any:
    raise ValueError(f"invalid JSON constant {name}")


def decode_identify(body: bytes) -> IdentifyBody:
    """IDENTIFY's body as nsqd decodes it; raises the E_BAD_BODY nsqd sends for
    bad JSON.

    Go decodes object keys case-insensitively, ignores unknown keys, leaves
    fields alone on ``null``, and refuses wrongly typed values (a float for an
    int, a number for a string...).
    """
    error = BadBodyError("IDENTIFY failed to decode JSON body")
    try:
        doc = json.loads(
            body.decode("utf-8", "replace"),
            parse_constant=_reject_constant,
            parse_float=lambda s: float("nan"),
        )
    except ValueError:
        raise error from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise error
    data: dict[str, Any] = {}
    for key, value in doc.items():
        name = key.lower()
        kind = _BODY_TYPES.get(name)
        if value is None or kind is None:
            continue
        if kind is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise error
            bits = _INT_BITS[name]
            if not -(1 << (bits - 1)) <= value < (1 << (bits - 1)):
                raise error
        elif not isinstance(value, kind):
            raise error
        data[name] = value
    return data  # type: ignore[return-value]
