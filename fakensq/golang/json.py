"""JSON bytes as Go's ``encoding/json`` writes them.

nsqd and nsqlookupd answer with ``json.Marshal`` output, and a client (or a test
comparing bytes) sees its quirks, which Python's :func:`json.dumps` does not share:

- ``<``, ``>`` and ``&`` are escaped as ``\\u003c``, ``\\u003e``, ``\\u0026``, and
  U+2028/U+2029 as ``\\u2028``/``\\u2029``; other non-ASCII text is raw UTF-8;
- a float that is a whole number has no fraction (``1``, not ``1.0``); others use
  the shortest form that round-trips, in positional notation from 1e-6 to 1e21
  and ``1e-07``-free exponents (``1e-7``) outside it;
- no spaces between items.

Key order is the dict's: callers build dicts in the Go struct's field order (or
sorted, for a Go map).
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from typing import Any

__all__ = ["dumps", "format_float", "value_kind"]

_ESCAPES = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}
_NEEDS_ESCAPE = frozenset(_ESCAPES)
_SURROGATES = re.compile("[\ud800-\udfff]")


def format_float(value: float) -> str:
    """Go's ``encoding/json`` float64 encoding (``strconv.AppendFloat`` and its
    exponent clean-up).  NaN and infinities are not JSON: ValueError."""
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"json: unsupported value: {value!r}")
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    shortest = repr(value)
    magnitude = abs(value)
    if 1e-6 <= magnitude < 1e21:
        text = format(Decimal(shortest), "f")
        if "." in text:
            text = text.rstrip("0").rstrip(".")
        return text
    # The shortest digits, in Go's e-form: 1e-07 -> 1e-7, 1.5e+22 stays.
    digits = Decimal(shortest).normalize()
    sign, coeff, exp = digits.as_tuple()
    assert isinstance(exp, int)
    text_digits = "".join(map(str, coeff))
    exp10 = exp + len(text_digits) - 1
    body = text_digits[0] + ("." + text_digits[1:] if len(text_digits) > 1 else "")
    esign = "-" if exp10 < 0 else "+"
    out = f"{'-' if sign else ''}{body}e{esign}{abs(exp10):02d}"
    if esign == "-" and abs(exp10) < 10:
        out = out[:-2] + str(abs(exp10))  # Go trims e-07 to e-7
    return out


def _encode(obj: Any, out: list[str]) -> None:
    if obj is None:
        out.append("null")
    elif obj is True:
        out.append("true")
    elif obj is False:
        out.append("false")
    elif isinstance(obj, str):
        out.append(json.dumps(obj, ensure_ascii=False))
    elif isinstance(obj, int):
        out.append(str(int(obj)))
    elif isinstance(obj, float):
        out.append(format_float(obj))
    elif isinstance(obj, dict):
        out.append("{")
        for i, (key, value) in enumerate(obj.items()):
            if i:
                out.append(",")
            out.append(json.dumps(str(key), ensure_ascii=False))
            out.append(":")
            _encode(value, out)
        out.append("}")
    elif isinstance(obj, (list, tuple)):
        out.append("[")
        for i, value in enumerate(obj):
            if i:
                out.append(",")
            _encode(value, out)
        out.append("]")
    else:
        raise TypeError(f"json: unsupported type: {type(obj).__name__}")


def dumps(obj: Any) -> bytes:
    """``json.Marshal(obj)``: compact UTF-8 bytes with Go's escapes and floats."""
    parts: list[str] = []
    _encode(obj, parts)
    text = "".join(parts)
    if not _NEEDS_ESCAPE.isdisjoint(text):
        # These characters only ever occur inside JSON strings.
        text = "".join(_ESCAPES.get(ch, ch) for ch in text)
    # Lone surrogates (from undecodable input) become U+FFFD, as Go's invalid
    # UTF-8 does.
    return _SURROGATES.sub("\ufffd", text).encode("utf-8")


def value_kind(value: Any) -> str:
    """The name Go's ``encoding/json`` gives the JSON type of a decoded value in
    an ``UnmarshalTypeError`` (``json: cannot unmarshal number into ...``):
    ``bool``, ``number``, ``string``, ``array`` or ``object``."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"
