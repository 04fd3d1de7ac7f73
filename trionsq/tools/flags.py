"""Go's command-line flag package, as NSQ's programs parse their command lines.

One :class:`FlagSet` for every NSQ command line in this repository: the trionsq
tools (``nsq_tail``, ``nsq_to_file``... flags, :mod:`trionsq.cli`) and fakensq's
daemons (nsqd, nsqlookupd, nsqadmin, :mod:`fakensq.cli`), which both follow the
Go programs' ``flag.FlagSet``, so a command line written for one runs the other:

- ``-flag=value``, ``-flag value``, ``--flag=value`` and ``--flag value`` alike;
- boolean flags as ``-flag`` (true), ``-flag=true`` or ``-flag=false`` (also
  ``1``, ``0``, ``t``, ``f``, ``T``, ``F``, ``TRUE``, ``FALSE``, ``True``,
  ``False``: ``strconv.ParseBool``), never with a separate value;
- repeatable flags (``--topic``, ``--lookupd-tcp-address``, ...) by repetition;
- integers in Go's notation (``0x1f``, ``0o17``, ``017``, ``0b101``, ``1_000``),
  floats as ``strconv.ParseFloat`` reads them, durations as Go writes them
  (``300ms``, ``1h30m``, ``-1.5s``; ``0``); the tools add plain seconds
  (``2.5``, :func:`seconds_or_duration`);
- parsing stops at the first argument that is not a flag, at a lone ``-``, or
  after ``--``;
- Go's errors: ``flag provided but not defined: -bogus``, ``flag needs an
  argument: -topic``, ``invalid value "x" for flag -n: parse error``, ``invalid
  boolean value "x" for -print-topic: parse error``, ``bad flag syntax: ---x``;
  with ``ExitOnError`` (:meth:`FlagSet.parse_or_exit`) each is followed by the
  usage, exit status 2; ``-h``/``-help`` print the usage and exit 0;
- the usage is ``flag.PrintDefaults``'s layout.

argparse cannot express this grammar (bool flags with ``=false``, values that
start with a dash, Go's integer forms, stopping at the first non-flag), so this
module parses it.
"""

from __future__ import annotations

import argparse
import builtins
import math
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from ..protocol.names import go_quote

__all__ = [
    "Flag",
    "FlagSet",
    "FlagError",
    "FlagFatal",
    "FlagValueError",
    "HelpRequested",
    "explained",
    "go_bool",
    "go_int",
    "go_float",
    "go_duration",
    "seconds_or_duration",
    "format_duration",
    "plain_text",
]


class FlagError(Exception):
    """A command line Go's flag package refuses; ``str()`` is Go's message."""


class FlagFatal(Exception):
    """A flag value whose ``Set`` calls Go's ``log.Fatalf`` (nsqd's float lists):
    the message after the date and time on stderr, exit status 1."""


class HelpRequested(Exception):
    """``-h`` or ``-help`` was given and no such flag is defined (``flag.ErrHelp``)."""


class FlagValueError(ValueError):
    """A value a flag refuses; ``str()`` goes after ``invalid value ... :``.

    A converter's plain ``ValueError`` or ``TypeError`` reads ``parse error``."""


def explained(message: str) -> FlagValueError:
    """An error for a converter to raise: ``message`` instead of ``parse error``."""
    return FlagValueError(message)


# Go's flag package reports every strconv failure as one of these two.
_PARSE_ERROR: Final = "parse error"
_RANGE_ERROR: Final = "value out of range"

# --- Go's value syntaxes ------------------------------------------------------

_TRUE: Final = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE: Final = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def go_bool(text: str) -> bool:
    """``strconv.ParseBool``."""
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise FlagValueError(_PARSE_ERROR)


_INT: Final = re.compile(
    r"[+-]?(0[xX][0-9a-fA-F_]+|0[bB][01_]+|0[oO][0-7_]+|0[0-7_]*|[1-9][0-9_]*)"
)


def go_int(text: str, bits: int = 64) -> int:
    """``strconv.ParseInt(text, 0, bits)``: decimal, ``0x``, ``0o``, ``0b``, a
    leading ``0`` for octal, ``_`` between digits."""
    if not _INT.fullmatch(text):
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
        base, digits = 10, body.replace("_", "")
    if not digits:
        raise FlagValueError(_PARSE_ERROR)
    value = sign * int(digits, base)
    if not -(1 << (bits - 1)) <= value < (1 << (bits - 1)):
        raise FlagValueError(_RANGE_ERROR)
    return value


_FLOAT: Final = re.compile(
    r"[+-]?(([0-9]+(_[0-9]+)*)?\.?[0-9]*([eE][+-]?[0-9]+)?|inf(inity)?|nan"
    r"|0[xX][0-9a-fA-F.]+[pP][+-]?[0-9]+)",
    re.IGNORECASE,
)


def go_float(text: str) -> float:
    """``strconv.ParseFloat(text, 64)`` (decimal, ``inf``/``nan`` and hex forms)."""
    if not text or not _FLOAT.fullmatch(text) or text in ("+", "-", ".", "+.", "-."):
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


_DURATION_UNITS: Final = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,  # U+00B5 MICRO SIGN
    "μs": 1e-6,  # U+03BC GREEK SMALL LETTER MU
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_DURATION_PART: Final = re.compile(r"([0-9]*)(\.[0-9]*)?([^0-9.]+)")


def go_duration(text: str) -> float:
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


def seconds_or_duration(text: str) -> float:
    """A Go duration, or (the tools' addition) a plain number of seconds."""
    if text.strip() != text or not text:
        raise FlagValueError(_PARSE_ERROR)
    try:
        seconds = float(text)
    except ValueError:
        return go_duration(text)
    if not math.isfinite(seconds):
        raise FlagValueError(_PARSE_ERROR)
    return seconds


def format_duration(seconds: float) -> str:
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


def _format_float(value: float) -> str:
    # strconv.FormatFloat(v, 'g', -1, 64): the shortest repr, Go's exponent style.
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


# --- flags ----------------------------------------------------------------------

#: How the values of a repeated flag join: ``append`` (a list, one value each
#: time), ``extend_sorted`` (nsqd's FloatArray: each value a comma-separated list,
#: all kept sorted, largest first).
JOINS: Final = ("append", "extend_sorted")


@dataclass
class Flag:
    """One flag.

    ``kind`` is the type word the usage shows (``string``, ``int``, ``float``,
    ``duration``, ``value``; ``""`` for a boolean); ``convert`` turns a value's
    text into the value; ``dest`` is the name the value goes by (an option's
    field, a namespace's attribute), None for a flag that is accepted and
    sets nothing; ``join``, for a repeatable flag, is one of :data:`JOINS`;
    ``is_bool`` makes it take no separate value; ``default_text`` replaces the
    default the usage shows ("": none); a ``hidden`` flag is not in the usage.
    """

    name: str
    kind: str
    convert: Callable[[str], Any]
    default: Any
    usage: str
    dest: str | None
    join: str | None = None
    is_bool: bool = False
    hidden: bool = False
    aliases: tuple[str, ...] = ()
    default_text: str | None = None


@dataclass
class FlagSet:
    """A Go ``flag.FlagSet`` named ``name`` (the program name in the usage).

    Declare flags (:meth:`string`, :meth:`int`, :meth:`bool`, ... as Go's
    ``fs.String``...), then :meth:`parse` a command line (Go's
    ``ContinueOnError``) or :meth:`parse_or_exit` it (``ExitOnError``).
    ``description`` heads the usage the tools print; ``help_to_stdout``: ``-h``
    prints it on stdout (the tools) rather than on stderr (Go's default).
    """

    name: str
    description: str = ""
    help_to_stdout: bool = False
    #: every flag by each of its names (aliases included)
    flags: dict[str, Flag] = field(default_factory=dict)

    # --- declaring ---
    # Each declaration takes the flag's name, default and usage text (the Go
    # program's own words); ``dest`` (keyword) names what the value goes to:
    # by default the name with ``_`` for ``-``, None for nothing.

    def add(self, flag: Flag) -> None:
        for name in (flag.name, *flag.aliases):
            if name in self.flags:
                raise ValueError(f"flag redefined: {name}")
            self.flags[name] = flag

    def var(
        self,
        name: str,
        convert: Callable[[str], Any],
        default: Any,
        usage: str,
        *,
        kind: str = "value",
        dest: str | None = "",
        join: str | None = None,
        is_bool: builtins.bool = False,
        hidden: builtins.bool = False,
        aliases: tuple[str, ...] = (),
        default_text: str | None = None,
    ) -> None:
        """A flag with its own conversion (Go's ``fs.Var``): ``convert`` raises
        :class:`FlagValueError` (its text shown) or ValueError (``parse error``)."""
        if join is not None and join not in JOINS:
            raise ValueError(f"unknown join {join!r}")
        self.add(
            Flag(
                name,
                kind,
                convert,
                default,
                usage,
                name.replace("-", "_") if dest == "" else dest,
                join=join,
                is_bool=is_bool,
                hidden=hidden,
                aliases=aliases,
                default_text=default_text,
            )
        )

    def string(self, name: str, default: str, usage: str, **kw: Any) -> None:
        self.var(name, str, default, usage, kind="string", **kw)

    def strings(self, name: str, usage: str, **kw: Any) -> None:
        """A repeatable string flag (Go's ``fs.Var`` of a string list)."""
        self.var(name, str, [], usage, join="append", **kw)

    def bool(self, name: str, default: builtins.bool, usage: str, **kw: Any) -> None:
        self.var(name, go_bool, default, usage, kind="", is_bool=True, **kw)

    def int(self, name: str, default: builtins.int, usage: str, **kw: Any) -> None:
        self.var(name, go_int, default, usage, **{"kind": "int", **kw})

    def float(self, name: str, default: builtins.float, usage: str, **kw: Any) -> None:
        self.var(name, go_float, default, usage, kind="float", **kw)

    def duration(
        self,
        name: str,
        default: builtins.float,
        usage: str,
        *,
        plain_seconds: builtins.bool = False,
        **kw: Any,
    ) -> None:
        """A ``time.Duration`` flag, in seconds (``plain_seconds``: a plain
        number is seconds too, as the tools take it)."""
        convert = seconds_or_duration if plain_seconds else go_duration
        self.var(name, convert, default, usage, kind="duration", **kw)

    def has(self, name: str) -> builtins.bool:
        return name in self.flags

    def names(self) -> list[str]:
        """Every flag's name (aliases and hidden ones included), sorted."""
        return sorted(self.flags)

    # --- parsing ---

    def parse(self, args: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
        """Parse ``args`` (without the program name), as Go's ``ContinueOnError``.

        Returns the values given, by flag name (repeatable flags joined), and
        the arguments after the flags.  Raises :class:`HelpRequested`,
        :class:`FlagError` (whose text is Go's message) or :class:`FlagFatal`.
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
            if "=" in name:
                name, _, value = name.partition("=")
            flag = self.flags.get(name)
            if flag is None:
                if name in ("help", "h"):
                    raise HelpRequested()
                raise FlagError(f"flag provided but not defined: -{name}")
            if flag.is_bool:
                try:
                    converted = _convert(flag, "true" if value is None else value)
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
                    converted = _convert(flag, value)
                except FlagValueError as exc:
                    raise FlagError(
                        f"invalid value {go_quote(value)} for flag -{name}: {exc}"
                    ) from None
            if flag.join is None:
                values[flag.name] = converted
            elif flag.join == "append":
                values.setdefault(flag.name, []).append(converted)
            else:
                joined = values.setdefault(flag.name, [])
                joined.extend(converted)
                joined.sort(reverse=True)
        return values, rest

    def parse_or_exit(self, args: Sequence[str]) -> tuple[dict[str, Any], list[str]] | builtins.int:
        """:meth:`parse` as Go's ``ExitOnError``: the values and the rest, or
        the exit status once the usage (0, ``-h``), the error and the usage (2)
        or a fatal line (1) is printed."""
        try:
            return self.parse(args)
        except HelpRequested:
            (sys.stdout if self.help_to_stdout else sys.stderr).write(self.full_usage())
            return 0
        except FlagError as exc:
            sys.stderr.write(f"{exc}\n{self.full_usage()}")
            return 2
        except FlagFatal as exc:
            # Go's log.Fatalf: "2006/01/02 15:04:05 message".
            sys.stderr.write(f"{datetime.now().strftime('%Y/%m/%d %H:%M:%S')} {exc}\n")
            return 1

    def namespace(self, values: dict[str, Any]) -> argparse.Namespace:
        """Every flag's value by its ``dest``: those in ``values`` (as
        :meth:`parse` returns them), the defaults for the others."""
        found: dict[str, Any] = {}
        for flag in self.flags.values():
            if flag.dest is None:
                continue
            if flag.name in values:
                found[flag.dest] = values[flag.name]
            else:
                found[flag.dest] = list(flag.default) if flag.join else flag.default
        return argparse.Namespace(**found)

    def parse_args(self, args: Sequence[str]) -> argparse.Namespace:
        """:meth:`namespace` of what :meth:`parse` finds (the rest is dropped)."""
        return self.namespace(self.parse(args)[0])

    # --- usage ---

    def usage(self) -> str:
        """``Usage of NAME:`` and Go's ``PrintDefaults`` text (sorted by name)."""
        lines = [f"Usage of {self.name}:"]
        for name in sorted(self.flags):
            flag = self.flags[name]
            if flag.hidden or name != flag.name:
                continue
            kind, usage = _unquote_usage(flag)
            head = f"  -{name}" + (f" {kind}" if kind else "")
            # one-letter flags keep the usage on their line
            head += "\t" if len(head) <= 4 else "\n    \t"
            head += usage.replace("\n", "\n    \t")
            default = _default_text(flag)
            if default:
                head += f" (default {default})"
            lines.append(head)
        return "\n".join(lines) + "\n"

    def full_usage(self) -> str:
        """The description (if any), a blank line, and :meth:`usage`."""
        if self.description:
            return self.description.rstrip() + "\n\n" + self.usage()
        return self.usage()


def _convert(flag: Flag, text: str) -> Any:
    try:
        return flag.convert(text)
    except FlagValueError:
        raise
    except (ValueError, TypeError):
        raise FlagValueError(_PARSE_ERROR) from None


def _unquote_usage(flag: Flag) -> tuple[str, str]:
    # Go: a `back-quoted` word in the usage names the value; else the type word.
    m = re.search(r"`([^`]*)`", flag.usage)
    if m:
        return m.group(1), flag.usage[: m.start()] + m.group(1) + flag.usage[m.end() :]
    return flag.kind, flag.usage


def _default_text(flag: Flag) -> str:
    """The default the usage shows ("" for none: Go leaves out zero values)."""
    if flag.default_text is not None:
        return flag.default_text
    default = flag.default
    if flag.join or default is None or default in ("", 0, False):
        return ""
    if flag.kind == "string":
        return go_quote(str(default))
    if flag.is_bool:
        return "true"
    if flag.kind == "duration":
        return format_duration(default)
    if isinstance(default, builtins.float):
        return _format_float(default)
    return str(default)


# --- --help's heading -------------------------------------------------------------

#: ``:role:`text``` (a Sphinx cross-reference) and ````literal````: their text.
_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")
_LITERAL = re.compile(r"``(.+?)``", re.DOTALL)
_STRONG = re.compile(r"\*\*(.+?)\*\*", re.DOTALL)


def _role_text(match: re.Match[str]) -> str:
    # ``:mod:`~a.b``` shows ``b``, as Sphinx does.
    target = match.group(1)
    return target.rsplit(".", 1)[-1] if "~" in match.group(0) else target


def plain_text(doc: str) -> str:
    """A module docstring (reStructuredText, for the API reference) as the plain
    text a terminal shows: no markup left, the words kept.

    ``--help`` prints the tool's docstring above the flags; the markup that makes
    the rendered docs read well (````--gzip````, ``:mod:`x```, ``**bold**``,
    ``text::`` before a literal block) is noise on a terminal.
    """
    text = _ROLE.sub(_role_text, doc)
    text = _LITERAL.sub(r"\1", text)
    text = _STRONG.sub(r"\1", text)
    lines = []
    for line in text.splitlines():
        stripped = line.rstrip()
        if stripped.strip() == "::":
            continue  # a literal block's lone marker
        if stripped.endswith("::"):
            stripped = stripped[:-1]  # "text::" reads "text:"
        lines.append(stripped)
    return "\n".join(lines)
