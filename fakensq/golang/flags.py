"""Command-line parsing with the semantics of Go's ``flag`` package.

nsqd and nsqlookupd parse their command lines with Go's ``flag.FlagSet`` (with
``flag.ExitOnError``); scripts that start the real binaries rely on its rules, so
``fakensq`` follows them exactly:

- ``-f v``, ``-f=v``, ``--f v`` and ``--f=v`` are the same; one or two dashes alike;
- a boolean flag never consumes the next argument: ``--snappy`` sets it true,
  ``--snappy=false`` clears it (``strconv.ParseBool`` spellings);
- parsing stops at the first non-flag argument, at a lone ``-``, or after ``--``;
- list flags (``--lookupd-tcp-address``) are given once per value;
- ``-h``/``-help`` print the usage on stderr and exit 0; an unknown flag prints
  ``flag provided but not defined: -x`` and the usage, and exits 2; so does a bad
  value (``invalid value "x" for flag -f: parse error``) or a missing one
  (``flag needs an argument: -f``);
- durations use Go's syntax (``60s``, ``1m30s``, ``250ms``, ``1h``).

The usage text is Go's ``PrintDefaults`` layout.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trionsq.protocol.names import go_quote

__all__ = [
    "FlagError",
    "FlagFatal",
    "HelpRequested",
    "FlagValueError",
    "Flag",
    "FlagSet",
    "parse_go_bool",
    "parse_go_int",
    "parse_go_float",
    "parse_go_duration",
    "format_go_duration",
]


class FlagError(Exception):
    """A command line Go's flag package rejects; ``str()`` is Go's message."""


class FlagFatal(Exception):
    """A flag value whose parser calls Go's ``log.Fatalf`` (exit status 1, the
    message on stderr after the date and time)."""


class HelpRequested(Exception):
    """``-h`` or ``-help`` was given (Go's ``flag.ErrHelp``)."""


# Go's flag package reports every strconv failure as one of these two.
_PARSE_ERROR = "parse error"
_RANGE_ERROR = "value out of range"


class FlagValueError(Exception):
    """A value a flag rejects; ``str()`` goes after ``invalid value ... :``."""


_BOOL_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_BOOL_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


def parse_go_bool(text: str) -> bool:
    """``strconv.ParseBool``."""
    if text in _BOOL_TRUE:
        return True
    if text in _BOOL_FALSE:
        return False
    raise FlagValueError(_PARSE_ERROR)


_INT_RE = re.compile(r"[+-]?(0[xX][0-9a-fA-F_]+|0[bB][01_]+|0[oO][0-7_]+|0[0-7_]*|[1-9][0-9_]*)")


def parse_go_int(text: str, bits: int = 64) -> int:
    """``strconv.ParseInt(text, 0, bits)``: base prefixes, ``_`` separators."""
    if not _INT_RE.fullmatch(text):
        raise FlagValueError(_PARSE_ERROR)
    sign = -1 if text[0] == "-" else 1
    body = text.lstrip("+-")
    # Go allows '_' only between digits (and after a base prefix), never doubled.
    if "_" in body and (body.endswith("_") or "__" in body):
        raise FlagValueError(_PARSE_ERROR)
    lower = body.lower()
    if lower.startswith(("0x", "0b", "0o")):
        base = {"x": 16, "b": 2, "o": 8}[lower[1]]
        digits = body[2:].replace("_", "")
    elif len(body) > 1 and body[0] == "0":
        base, digits = 8, body[1:].replace("_", "")
    else:
        if "_" in body and body.startswith("_"):
            raise FlagValueError(_PARSE_ERROR)
        base, digits = 10, body.replace("_", "")
    if not digits:
        raise FlagValueError(_PARSE_ERROR)
    value = sign * int(digits, base)
    if not -(1 << (bits - 1)) <= value < (1 << (bits - 1)):
        raise FlagValueError(_RANGE_ERROR)
    return value


_FLOAT_RE = re.compile(
    r"[+-]?((\d+(_\d+)*)?\.?\d*([eE][+-]?\d+)?|inf(inity)?|nan|0[xX][0-9a-fA-F.]+[pP][+-]?\d+)",
    re.IGNORECASE,
)


def parse_go_float(text: str) -> float:
    """``strconv.ParseFloat(text, 64)`` (decimal, ``inf``/``nan`` and hex forms)."""
    if not text or not _FLOAT_RE.fullmatch(text) or text in ("+", "-", ".", "+.", "-."):
        raise FlagValueError(_PARSE_ERROR)
    try:
        if "x" in text.lower() and "p" in text.lower():
            sign = -1.0 if text.startswith("-") else 1.0
            value = sign * float.fromhex(text.lstrip("+-"))
        else:
            value = float(text.replace("_", ""))
    except ValueError:
        raise FlagValueError(_PARSE_ERROR) from None
    if math.isinf(value) and "inf" not in text.lower():
        raise FlagValueError(_RANGE_ERROR)
    return value


_DURATION_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,  # U+00B5 MICRO SIGN
    "μs": 1e-6,  # U+03BC GREEK SMALL LETTER MU
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_DURATION_PART = re.compile(r"(\d*)(\.\d*)?([^\d.]+)")


def parse_go_duration(text: str) -> float:
    """``time.ParseDuration``, in seconds: ``"1m30s"`` → 90.0, ``"250ms"`` → 0.25."""
    rest = text
    sign = 1.0
    if rest[:1] in ("+", "-"):
        sign = -1.0 if rest[0] == "-" else 1.0
        rest = rest[1:]
    if rest == "0":
        return 0.0
    if not rest:
        raise FlagValueError(_PARSE_ERROR)
    total = 0.0
    pos = 0
    while pos < len(rest):
        m = _DURATION_PART.match(rest, pos)
        if m is None:
            raise FlagValueError(_PARSE_ERROR)
        whole, frac, unit = m.group(1), m.group(2), m.group(3)
        if not whole and (not frac or frac == "."):
            raise FlagValueError(_PARSE_ERROR)
        if unit not in _DURATION_UNITS:
            raise FlagValueError(_PARSE_ERROR)
        number = float((whole or "0") + (frac if frac and frac != "." else ""))
        total += number * _DURATION_UNITS[unit]
        pos = m.end()
    if total * 1e9 > (1 << 63):
        raise FlagValueError(_PARSE_ERROR)
    return sign * total


def format_go_duration(seconds: float) -> str:
    """``time.Duration.String``: 60.0 → ``"1m0s"``, 0.25 → ``"250ms"``, 0 → ``"0s"``."""
    ns = round(seconds * 1e9)
    if ns == 0:
        return "0s"
    neg = ns < 0
    ns = abs(ns)
    if ns < 1_000_000_000:
        # Sub-second: the largest unit that keeps a non-zero integer part.
        for unit, size in (("ms", 1_000_000), ("µs", 1_000), ("ns", 1)):
            if ns >= size:
                text = _trim_fraction(ns, size) + unit
                break
    else:
        hours, rem = divmod(ns, 3_600_000_000_000)
        minutes, rem = divmod(rem, 60_000_000_000)
        secs = _trim_fraction(rem, 1_000_000_000) + "s"
        if hours:
            text = f"{hours}h{minutes}m{secs}"
        elif minutes:
            text = f"{minutes}m{secs}"
        else:
            text = secs
    return ("-" if neg else "") + text


def _trim_fraction(value: int, unit: int) -> str:
    whole, frac = divmod(value, unit)
    if not frac:
        return str(whole)
    width = len(str(unit)) - 1
    return f"{whole}.{str(frac).rjust(width, '0').rstrip('0')}"


@dataclass
class Flag:
    """One flag: its Go name, kind, default, usage text and destination.

    ``kind`` is one of ``string``, ``bool``, ``int``, ``int64``, ``float``,
    ``duration``, ``list`` (repeatable string), ``floatlist`` (repeatable,
    comma-separated floats) or ``custom`` (``parse`` converts; ``is_bool`` makes
    it a boolean-style flag like nsqd's ``--tls-required``).  ``dest`` names the
    option field the value goes to; None means the flag is accepted and ignored.
    """

    name: str
    kind: str
    default: Any
    usage: str
    dest: str | None
    parse: Callable[[str], Any] | None = None
    is_bool: bool = False
    type_name: str = "value"
    default_text: str | None = None

    def convert(self, text: str) -> Any:
        if self.kind == "string" or self.kind == "list":
            return text
        if self.kind == "bool":
            return parse_go_bool(text)
        if self.kind == "int":
            return parse_go_int(text, 64)
        if self.kind == "int64":
            return parse_go_int(text, 64)
        if self.kind == "float":
            return parse_go_float(text)
        if self.kind == "duration":
            return parse_go_duration(text)
        if self.kind == "floatlist":
            # nsqd's FloatArray.Set: log.Fatalf on a part it cannot parse.
            values = []
            for part in text.split(","):
                try:
                    values.append(parse_go_float(part))
                except FlagValueError:
                    raise FlagFatal(f"Could not parse: {part}") from None
            return values
        assert self.parse is not None
        return self.parse(text)


@dataclass
class FlagSet:
    """A Go ``flag.FlagSet`` named ``name`` (the program name in the usage)."""

    name: str
    flags: dict[str, Flag] = field(default_factory=dict)

    def add(self, flag: Flag) -> None:
        self.flags[flag.name] = flag

    def add_string(self, name: str, default: str, usage: str, dest: str | None = None) -> None:
        self.add(Flag(name, "string", default, usage, dest, type_name="string"))

    def add_bool(self, name: str, default: bool, usage: str, dest: str | None = None) -> None:
        self.add(Flag(name, "bool", default, usage, dest, is_bool=True, type_name=""))

    def add_int(self, name: str, default: int, usage: str, dest: str | None = None) -> None:
        self.add(Flag(name, "int", default, usage, dest, type_name="int"))

    def add_float(self, name: str, default: float, usage: str, dest: str | None = None) -> None:
        self.add(Flag(name, "float", default, usage, dest, type_name="float"))

    def add_duration(self, name: str, default: float, usage: str, dest: str | None = None) -> None:
        self.add(Flag(name, "duration", default, usage, dest, type_name="duration"))

    def add_list(self, name: str, usage: str, dest: str | None = None) -> None:
        self.add(Flag(name, "list", [], usage, dest))

    def parse(self, args: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
        """Parse ``args`` (without the program name).

        Returns the explicitly given values by flag name (list flags accumulate)
        and the remaining non-flag arguments.  Raises :class:`HelpRequested` or
        :class:`FlagError` (whose text is Go's message).
        """
        values: dict[str, Any] = {}
        rest = list(args)
        while rest:
            arg = rest[0]
            if len(arg) < 2 or arg[0] != "-":
                break
            dashes = 1
            if arg[1] == "-":
                dashes = 2
                if len(arg) == 2:  # "--" ends the flags
                    rest.pop(0)
                    break
            name = arg[dashes:]
            if not name or name[0] in "-=":
                raise FlagError(f"bad flag syntax: {arg}")
            rest.pop(0)
            value: str | None = None
            if "=" in name[1:]:
                idx = name.index("=", 1)
                name, value = name[:idx], name[idx + 1 :]
            flag = self.flags.get(name)
            if flag is None:
                if name in ("help", "h"):
                    raise HelpRequested()
                raise FlagError(f"flag provided but not defined: -{name}")
            if flag.is_bool:
                text = "true" if value is None else value
                try:
                    converted = flag.convert(text)
                except FlagValueError as exc:
                    if value is None:
                        raise FlagError(f"invalid boolean flag {name}: {exc}") from None
                    raise FlagError(
                        f"invalid boolean value {go_quote(value)} for -{name}: {exc}"
                    ) from None
            else:
                if value is None:
                    if not rest:
                        raise FlagError(f"flag needs an argument: -{name}")
                    value = rest.pop(0)
                try:
                    converted = flag.convert(value)
                except FlagValueError as exc:
                    raise FlagError(
                        f"invalid value {go_quote(value)} for flag -{name}: {exc}"
                    ) from None
            if flag.kind in ("list", "floatlist"):
                previous = values.setdefault(name, [])
                if flag.kind == "list":
                    previous.append(converted)
                else:
                    previous.extend(converted)
                    # nsqd's FloatArray keeps its values sorted, largest first
                    previous.sort(reverse=True)
            else:
                values[name] = converted
        return values, rest

    def usage(self) -> str:
        """``Usage of NAME:`` and Go's ``PrintDefaults`` text."""
        lines = [f"Usage of {self.name}:"]
        for name in sorted(self.flags):
            flag = self.flags[name]
            head = f"  -{name}"
            type_name, usage = _unquote_usage(flag)
            if type_name:
                head += " " + type_name
            if len(head) <= 4:  # one-letter flags keep the usage on their line
                head += "\t"
            else:
                head += "\n    \t"
            head += usage.replace("\n", "\n    \t")
            default = _default_text(flag)
            if default is not None:
                head += f" (default {default})"
            lines.append(head)
        return "\n".join(lines) + "\n"


def _unquote_usage(flag: Flag) -> tuple[str, str]:
    # Go: a `back-quoted` word in the usage names the value; else the type name.
    m = re.search(r"`([^`]*)`", flag.usage)
    if m:
        return m.group(1), flag.usage[: m.start()] + m.group(1) + flag.usage[m.end() :]
    return flag.type_name, flag.usage


def _default_text(flag: Flag) -> str | None:
    if flag.default_text is not None:
        return flag.default_text or None
    default = flag.default
    if flag.kind == "string":
        return go_quote(default) if default else None
    if flag.kind == "bool":
        return "true" if default else None
    if flag.kind in ("int", "int64"):
        return str(default) if default else None
    if flag.kind == "float":
        return _go_float_text(default) if default else None
    if flag.kind == "duration":
        return format_go_duration(default) if default else None
    return None


def _go_float_text(value: float) -> str:
    # strconv.FormatFloat(v, 'g', -1, 64): shortest repr, Go exponent style.
    text = repr(float(value))
    if text.endswith(".0"):
        text = text[:-2]
    return text
