"""Go's command-line flag syntax, as NSQ's tools parse it (Go's ``flag`` package).

The tools take their flags exactly as ``nsq_tail``, ``nsq_to_file``... do, so a
command line written for one runs the other:

- ``-flag=value``, ``-flag value``, ``--flag=value`` and ``--flag value`` alike;
- boolean flags as ``-flag`` (true), ``-flag=true`` or ``-flag=false`` (also
  ``1``, ``0``, ``t``, ``f``, ``T``, ``F``, ``TRUE``, ``FALSE``, ``True``,
  ``False``), never with a separate value;
- repeatable flags (``--topic``, ``--nsqd-tcp-address``, ...) by repetition;
- integers in Go's notation (``0x1f``, ``0o17``, ``017``, ``0b101``, ``1_000``);
  durations as Go writes them (``300ms``, ``1h30m``, ``-1.5s``; ``0``), or, an
  addition, as plain seconds (``2.5``);
- parsing stops at the first argument that is not a flag, or after ``--``;
  what follows is ignored (with a warning here);
- the same errors on stderr, each followed by the usage, and exit status 2:
  ``flag provided but not defined: -bogus``, ``flag needs an argument: -topic``,
  ``invalid value "x" for flag -n: parse error``, ``invalid boolean value "x"
  for -print-topic: parse error``; ``-h``/``-help``/``--help`` print the usage
  and exit 0.

argparse cannot express this grammar (bool flags with ``=false``, values that
start with a dash, Go's integer forms, stopping at the first non-flag), so this
module parses it, and prints the usage as Go's ``flag.PrintDefaults`` does.
"""

from __future__ import annotations

import argparse
import builtins
import math
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, TextIO

__all__ = [
    "FlagSet",
    "FlagError",
    "go_bool",
    "go_duration",
    "go_int",
    "format_duration",
    "plain_text",
]

_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}

_DURATION_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


class FlagError(Exception):
    """A command line Go's flag package would refuse (exit status 2)."""


def go_bool(text: str) -> bool:
    """Go's ``strconv.ParseBool``."""
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(text)


def go_int(text: str) -> int:
    """Go's ``strconv.ParseInt(text, 0, 64)``: decimal, ``0x``, ``0o``, ``0b``,
    a leading ``0`` for octal, ``_`` between digits."""
    if not text or text.strip() != text:
        raise ValueError(text)
    sign, body = ("", text) if text[0] not in "+-" else (text[0], text[1:])
    if len(body) > 1 and body[0] == "0" and body[1] not in "xXoObB":
        body = "0o" + body[1:]  # Go's legacy octal
    value = int(sign + body, 0)
    if not -(2**63) <= value < 2**63:
        raise ValueError(text)
    return value


def go_duration(text: str) -> float:
    """Go's ``time.ParseDuration``, in seconds; plain numbers are seconds too."""
    value = text.strip()
    if value != text or not value:
        raise ValueError(text)
    try:
        seconds = float(value)
    except ValueError:
        sign = -1.0 if value.startswith("-") else 1.0
        rest = value.lstrip("+-")
        if len(value) - len(rest) > 1 or not rest:
            raise ValueError(text) from None
        pos, seconds = 0, 0.0
        while pos < len(rest):
            match = _DURATION_PART.match(rest, pos)
            if match is None:
                raise ValueError(text) from None
            seconds += float(match.group(1)) * _UNITS[match.group(2)]
            pos = match.end()
        seconds *= sign
    if not math.isfinite(seconds):
        raise ValueError(text)
    return seconds


def format_duration(seconds: float) -> str:
    """Go's ``Duration.String`` (``30s``, ``1m0s``, ``1h0m0s``, ``250ms``)."""
    if seconds == 0:
        return "0s"
    sign = "-" if seconds < 0 else ""
    seconds = abs(seconds)
    if seconds < 1:
        for unit, size in (("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9)):
            if seconds >= size:
                return f"{sign}{_trim(seconds / size)}{unit}"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{sign}{int(hours)}h{int(minutes)}m{_trim(secs)}s"
    if minutes:
        return f"{sign}{int(minutes)}m{_trim(secs)}s"
    return f"{sign}{_trim(secs)}s"


def _trim(value: float) -> str:
    text = f"{value:.9f}".rstrip("0").rstrip(".")
    return text or "0"


@dataclass
class _Flag:
    name: str
    kind: str  # the type word Go shows: "string", "int", "duration", "value", "float", ""
    convert: Callable[[str], Any]
    default: Any
    help: str
    dest: str
    repeat: bool = False
    shown_default: str | None = None
    hidden: bool = False
    aliases: tuple[str, ...] = ()
    set_count: int = 0


@dataclass
class FlagSet:
    """One tool's flags: declare them, then :meth:`parse` a command line.

    ``parse`` returns an :class:`argparse.Namespace` with one attribute per flag
    (``-max-in-flight`` becomes ``max_in_flight``; repeatable flags are lists)
    and ``_given``, the set of flags that appeared (Go's ``flag.Visit``).
    """

    prog: str
    description: str = ""
    out: TextIO | None = None  # for tests; default stderr
    _flags: dict[str, _Flag] = field(default_factory=dict)
    _order: list[_Flag] = field(default_factory=list)

    # --- declaring ---

    def _add(self, flag: _Flag) -> None:
        for name in (flag.name, *flag.aliases):
            if name in self._flags:
                raise ValueError(f"flag redefined: {name}")
            self._flags[name] = flag
        self._order.append(flag)

    # Each declaration takes the flag's name, default and help text (the Go
    # tools' own words); ``dest`` renames the attribute, ``hidden`` keeps it out
    # of the usage, ``aliases`` adds other names, ``shown_default`` replaces the
    # default the usage shows.

    def string(self, name: str, default: str = "", help: str = "", **kw: Any) -> None:
        self.custom(name, str, default, help, kind="string", **kw)

    def strings(self, name: str, help: str = "", **kw: Any) -> None:
        """A repeatable flag (Go's ``flag.Var`` of a string list)."""
        self.custom(name, str, [], help, repeat=True, **kw)

    def int(self, name: str, default: int = 0, help: str = "", **kw: Any) -> None:
        self.custom(name, go_int, default, help, **{"kind": "int", **kw})

    def float(self, name: str, default: builtins.float = 0.0, help: str = "", **kw: Any) -> None:
        self.custom(name, _go_float, default, help, kind="float", **kw)

    def duration(self, name: str, default: builtins.float = 0.0, help: str = "", **kw: Any) -> None:
        self.custom(name, go_duration, default, help, kind="duration", **kw)

    def bool(self, name: str, help: str = "", default: builtins.bool = False, **kw: Any) -> None:
        self.custom(name, go_bool, default, help, kind="", **kw)

    def custom(
        self,
        name: str,
        convert: Callable[[str], Any],
        default: Any,
        help: str = "",
        *,
        kind: str = "value",
        repeat: builtins.bool = False,
        dest: str | None = None,
        **kw: Any,
    ) -> None:
        """A flag with its own conversion (a ValueError: ``invalid value``)."""
        self._add(
            _Flag(name, kind, convert, default, help, dest or _dest(name), repeat=repeat, **kw)
        )

    def has(self, name: str) -> builtins.bool:
        return name in self._flags

    def names(self) -> list[str]:
        """Every flag's name (aliases and hidden ones included), sorted."""
        return sorted(self._flags)

    # --- parsing ---

    def parse(self, argv: Sequence[str]) -> argparse.Namespace:
        """Parse ``argv``; on an error print it and the usage, and exit 2."""
        try:
            return self.parse_or_raise(argv)
        except FlagError as exc:
            self._fail(str(exc))

    def parse_or_raise(self, argv: Sequence[str]) -> argparse.Namespace:
        values: dict[str, Any] = {}
        given: set[str] = set()
        for flag in self._order:
            values[flag.dest] = list(flag.default) if flag.repeat else flag.default
        args = list(argv)
        i = 0
        rest: list[str] = []
        while i < len(args):
            arg = args[i]
            if arg == "--":
                rest = args[i + 1 :]
                break
            if len(arg) < 2 or arg[0] != "-":
                rest = args[i:]
                break
            name = arg[2:] if arg[1] == "-" else arg[1:]
            if not name or name[0] in "-=":
                raise FlagError(f"bad flag syntax: {arg}")
            name, has_value, value = name.partition("=")
            if name in ("h", "help") and name not in self._flags:
                self.print_usage(sys.stdout if self.out is None else self.out)
                raise SystemExit(0)
            found = self._flags.get(name)
            if found is None:
                raise FlagError(f"flag provided but not defined: -{name}")
            flag = found
            if flag.kind == "" and not flag.repeat:  # a bool flag
                if has_value:
                    try:
                        converted = go_bool(value)
                    except ValueError:
                        raise FlagError(
                            f'invalid boolean value "{value}" for -{name}: parse error'
                        ) from None
                else:
                    converted = True
            else:
                if not has_value:
                    if i + 1 >= len(args):
                        raise FlagError(f"flag needs an argument: -{name}")
                    i += 1
                    value = args[i]
                try:
                    converted = flag.convert(value)
                except (ValueError, TypeError) as exc:
                    detail = str(exc) if isinstance(exc, _Explained) else "parse error"
                    raise FlagError(f'invalid value "{value}" for flag -{name}: {detail}') from None
            if flag.repeat:
                values[flag.dest].append(converted)
            else:
                values[flag.dest] = converted
            given.add(flag.name)
            i += 1
        namespace = argparse.Namespace(**values)
        namespace._given = given
        namespace._ignored = rest
        return namespace

    # --- usage ---

    def _fail(self, message: str) -> NoReturn:
        out = sys.stderr if self.out is None else self.out
        print(message, file=out)
        self.print_usage(out)
        raise SystemExit(2)

    def usage(self) -> str:
        """The flags as Go's ``flag.PrintDefaults`` lists them (sorted by name)."""
        lines = [f"Usage of {self.prog}:"]
        for flag in sorted(self._order, key=lambda f: f.name):
            if flag.hidden:
                continue
            head = f"  -{flag.name}" + (f" {flag.kind}" if flag.kind else "")
            head += "\t" if len(head) <= 4 else "\n    \t"
            text = flag.help.replace("\n", "\n    \t")
            shown = flag.shown_default
            if shown is None:
                shown = _shown_default(flag)
            if shown:
                text += f" (default {shown})"
            lines.append(head + text)
        return "\n".join(lines)

    def print_usage(self, out: TextIO) -> None:
        if self.description:
            print(self.description.rstrip() + "\n", file=out)
        print(self.usage(), file=out)


class _Explained(ValueError):
    """A ValueError whose text replaces Go's ``parse error``."""


def explained(message: str) -> ValueError:
    """An error for a custom converter, shown instead of ``parse error``."""
    return _Explained(message)


def _go_float(text: str) -> float:
    if text.strip() != text or "_" in text.strip("_"):
        raise ValueError(text)
    return float(text)


def _dest(name: str) -> str:
    return name.replace("-", "_")


def _shown_default(flag: _Flag) -> str:
    default = flag.default
    if flag.repeat or default in (None, "", 0, 0.0, False):
        return ""
    if flag.kind == "string":
        return (
            '"' + str(default).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
        )
    if flag.kind == "duration":
        return format_duration(float(default))
    if flag.kind == "":
        return "true"
    if isinstance(default, float) and default.is_integer():
        return str(int(default))
    return str(default)


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
