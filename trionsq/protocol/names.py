"""Topic and channel names, validated exactly as nsqd validates them.

A name is 1 to 64 characters of ``[.a-zA-Z0-9_-]``, optionally ending in
``#ephemeral`` (the suffix counts towards the 64).  nsqd applies the same rule to
topics and channels.
"""

from __future__ import annotations

import re
import unicodedata

from .errors import BadTopicError

__all__ = [
    "EPHEMERAL_SUFFIX",
    "MAX_NAME_LENGTH",
    "is_valid_name",
    "is_valid_topic_name",
    "is_valid_channel_name",
    "is_ephemeral",
    "go_quote",
    "check_topic",
]

EPHEMERAL_SUFFIX = "#ephemeral"
MAX_NAME_LENGTH = 64

_NAME_RE = re.compile(r"[.a-zA-Z0-9_-]+(?:#ephemeral)?")


def is_valid_name(name: str) -> bool:
    """True when ``name`` is a valid NSQ topic or channel name."""
    return 1 <= len(name) <= MAX_NAME_LENGTH and _NAME_RE.fullmatch(name) is not None


is_valid_topic_name = is_valid_name
is_valid_channel_name = is_valid_name


def is_ephemeral(name: str) -> bool:
    """True for ``#ephemeral`` topics and channels (never written to disk)."""
    return name.endswith(EPHEMERAL_SUFFIX)


_GO_ESCAPES = {
    "\a": r"\a",
    "\b": r"\b",
    "\f": r"\f",
    "\n": r"\n",
    "\r": r"\r",
    "\t": r"\t",
    "\v": r"\v",
    "\\": r"\\",
    '"': r"\"",
}


def go_quote(raw: bytes | str) -> str:
    """Quote like Go's ``%q`` / ``strconv.Quote``, so error texts match nsqd's.

    nsqd builds texts such as ``SUB topic name "a b" is not valid`` with ``%q``;
    bytes that are not valid UTF-8 come out as ``\\xNN``.
    """
    data = raw.encode("utf-8", "surrogateescape") if isinstance(raw, str) else raw
    out: list[str] = ['"']
    text = data.decode("utf-8", "surrogateescape")
    for ch in text:
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:  # an undecodable byte, kept by surrogateescape
            out.append(f"\\x{code - 0xDC00:02x}")
        elif ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif _go_printable(ch):
            out.append(ch)
        elif code < 0x80:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def _go_printable(ch: str) -> bool:
    # Go's unicode.IsPrint: letters, marks, numbers, punctuation, symbols and the
    # ASCII space; other spaces and control/format characters are escaped.
    if ch == " ":
        return True
    return unicodedata.category(ch)[0] in "LMNPS"


def check_topic(verb: str, topic: object) -> None:
    """Raise what a ``verb`` (``PUB``, ``MPUB``, ``DPUB``) of ``topic`` would
    meet: ``TypeError`` for a name that is not a str, nsqd's own error for an
    invalid one (raised before it costs a connection)."""
    if not isinstance(topic, str):
        raise TypeError(f"topic must be a str, not {type(topic).__name__}")
    if not is_valid_topic_name(topic):
        raise BadTopicError(f"{verb} topic name {go_quote(topic)} is not valid")
