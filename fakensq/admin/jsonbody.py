"""Request bodies as nsqadmin's Go code reads them.

nsqadmin decodes request bodies with ``json.NewDecoder(body).Decode(&struct)``
and answers its errors verbatim (``{"message":"invalid character 'x' looking
for beginning of value"}``), so scripts see Go's texts.  :func:`decode_struct`
reads the first JSON value of a body as Go's Decoder does (trailing bytes
ignored, keys matched case-insensitively, ``null`` and unknown keys ignored)
into string fields, raising :class:`GoJSONError` with the message of the Go
that built nsqadmin v1.3.0 for a syntax error (``EOF``, ``unexpected EOF``,
``invalid character 'x' looking for beginning of value``, ``invalid escape
sequence `\\x` in string``) or a type mismatch (``json: cannot unmarshal
number into Go struct field .action of type string``).  (Answers are written
with :mod:`fakensq.golang.json`.)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..golang.json import value_kind

__all__ = ["GoJSONError", "decode_struct", "struct_type_name"]


class GoJSONError(ValueError):
    """A body Go's ``json.Decoder`` rejects; ``str()`` is Go's error text."""


_SPACE = b" \t\r\n"
_DIGITS = b"0123456789"
_HEX = b"0123456789abcdefABCDEF"


def _char_at(data: bytes, pos: int) -> bytes:
    """The UTF-8 character at ``pos`` (one byte when it is not valid UTF-8)."""
    for size in (1, 2, 3, 4):
        try:
            data[pos : pos + size].decode("utf-8")
        except UnicodeDecodeError:
            continue
        return data[pos : pos + size]
    return data[pos : pos + 1]


def _quote_char(char: bytes) -> str:
    # encoding/json's quoteChar: the character Go-quoted, in single quotes.
    if char == b"'":
        return "'\\''"
    if char == b'"':
        return "'\"'"
    from trionsq.protocol.names import go_quote

    return "'" + go_quote(char)[1:-1] + "'"


class _Scan:
    """Finds the end of the first JSON value, with Go's decoder's error texts."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def fail(self, context: str) -> GoJSONError:
        if self.pos >= len(self.data):
            return GoJSONError("unexpected EOF")
        char = _char_at(self.data, self.pos)
        return GoJSONError(f"invalid character {_quote_char(char)} {context}")

    def peek(self) -> int | None:
        return self.data[self.pos] if self.pos < len(self.data) else None

    def skip_space(self) -> None:
        while self.pos < len(self.data) and self.data[self.pos] in _SPACE:
            self.pos += 1

    def value(self, context: str = "looking for beginning of value") -> None:
        self.skip_space()
        c = self.peek()
        if c == ord("{"):
            self.pos += 1
            self.obj()
        elif c == ord("["):
            self.pos += 1
            self.array()
        elif c == ord('"'):
            self.pos += 1
            self.string()
        elif c is not None and (c == ord("-") or c in _DIGITS):
            self.number()
        elif c in (ord("t"), ord("f"), ord("n")):
            word = {ord("t"): b"true", ord("f"): b"false", ord("n"): b"null"}[c]
            self.pos += 1
            for expected in word[1:]:
                if self.peek() != expected:
                    want = _quote_char(bytes([expected]))
                    raise self.fail(f"in literal {word.decode()} (expecting {want})")
                self.pos += 1
        else:
            raise self.fail(context)

    def obj(self) -> None:
        if self._closes_at_once(ord("}")):
            return
        while True:
            self.skip_space()
            if self.peek() != ord('"'):
                raise self.fail("looking for beginning of object key string")
            self.pos += 1
            self.string()
            self.skip_space()
            if self.peek() != ord(":"):
                raise self.fail("after object key")
            self.pos += 1
            self.value()
            if not self._another_follows(ord("}"), "after object key:value pair"):
                return

    def array(self) -> None:
        if self._closes_at_once(ord("]")):
            return
        while True:
            self.value()
            if not self._another_follows(ord("]"), "after array element"):
                return

    def _closes_at_once(self, close: int) -> bool:
        """An empty object or array: its closing byte is taken."""
        self.skip_space()
        if self.peek() == close:
            self.pos += 1
            return True
        return False

    def _another_follows(self, close: int, context: str) -> bool:
        """After an element: True past a ``,``, False past ``close``, else Go's error."""
        self.skip_space()
        c = self.peek()
        if c == ord(","):
            self.pos += 1
            return True
        if c == close:
            self.pos += 1
            return False
        raise self.fail(context)

    def string(self) -> None:
        while True:
            c = self.peek()
            if c is None:
                raise self.fail("in string")
            if c == ord('"'):
                self.pos += 1
                return
            if c < 0x20:
                raise self.fail("in string")
            self.pos += 1
            if c == ord("\\"):
                e = self.peek()
                if e is None:
                    raise self.fail("in string")
                if e in b'"\\/bfnrt':
                    self.pos += 1
                elif e == ord("u"):
                    digits = self.data[self.pos + 1 : self.pos + 5]
                    bad = [i for i, h in enumerate(digits) if h not in _HEX]
                    if bad:
                        shown = _char_sequence(digits)
                        raise GoJSONError(f"invalid escape sequence `\\u{shown}` in string")
                    if len(digits) < 4:
                        self.pos = len(self.data)
                        raise self.fail("in string")
                    self.pos += 5
                else:
                    shown = _char_at(self.data, self.pos).decode("utf-8", "replace")
                    raise GoJSONError(f"invalid escape sequence `\\{shown}` in string")

    def digits(self) -> int:
        start = self.pos
        while self.peek() is not None and self.peek() in _DIGITS:  # type: ignore[operator]
            self.pos += 1
        return self.pos - start

    def number(self) -> None:
        # At a top-level number's end Go needs one more byte (or EOF) to know it
        # ended; either way the value is complete, so nothing more is checked.
        if self.peek() == ord("-"):
            self.pos += 1
            c = self.peek()
            if c is None or c not in _DIGITS:
                raise self.fail("in numeric literal")
        if self.peek() == ord("0"):
            self.pos += 1
        else:
            self.digits()
        if self.peek() == ord("."):
            self.pos += 1
            if self.digits() == 0:
                raise self.fail("in numeric literal")
        if self.peek() in (ord("e"), ord("E")):
            self.pos += 1
            if self.peek() in (ord("+"), ord("-")):
                self.pos += 1
            if self.digits() == 0:
                raise self.fail("in numeric literal")


def _char_sequence(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def _kind(value: Any) -> str:
    # An object keeps its key order as a list of pairs here: not an array.
    return "object" if isinstance(value, _Object) else value_kind(value)


def struct_type_name(fields: Sequence[str]) -> str:
    """Go's name of ``struct { Action string `json:"action"` }``-like types."""
    parts = [f'{f.capitalize()} string "json:\\"{f}\\""' for f in fields]
    return "struct { " + "; ".join(parts) + " }"


def decode_struct(body: bytes, fields: Sequence[str]) -> dict[str, str]:
    """``json.NewDecoder(body).Decode(&v)`` into a struct of string ``fields``
    (lower-case JSON names); the fields' values, "" where not given."""
    scan = _Scan(body)
    scan.skip_space()
    if scan.peek() is None:
        raise GoJSONError("EOF")
    scan.value()
    text = body[: scan.pos].decode("utf-8", "replace")
    doc = json.loads(text, object_pairs_hook=_Object)
    result = dict.fromkeys(fields, "")
    if doc is None:
        return result
    if not isinstance(doc, _Object):
        raise GoJSONError(
            f"json: cannot unmarshal {_kind(doc)} into Go value of type {struct_type_name(fields)}"
        )
    first_error = ""
    # Keys in order, as Go assigns them (the last of duplicate keys wins); an
    # exact field name first, else a case-insensitive match.
    for key, value in doc:
        name = key if key in fields else next((f for f in fields if f.lower() == key.lower()), "")
        if not name or value is None:
            continue
        if isinstance(value, str):
            result[name] = value
        elif not first_error:  # Go keeps decoding and reports the first mismatch
            first_error = (
                f"json: cannot unmarshal {_kind(value)} into Go struct field .{name} of type string"
            )
    if first_error:
        raise GoJSONError(first_error)
    return result


class _Object(list[tuple[str, Any]]):
    """A JSON object as its (key, value) pairs, in order, duplicates kept."""
