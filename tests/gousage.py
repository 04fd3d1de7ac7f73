"""Go's ``flag.PrintDefaults`` text, parsed: to compare a fake's flags with a
real binary's ``--help`` (names, type words, shown defaults)."""

from __future__ import annotations

import re

__all__ = ["parse_usage"]

_FLAG_LINE = re.compile(r"^  -(\S+)(?: (\S+))?$")
_DEFAULT = re.compile(r"\(default (.*)\)$")


def parse_usage(text: str) -> dict[str, tuple[str, str]]:
    """Go's PrintDefaults text → {flag: (type word, shown default)}."""
    flags: dict[str, tuple[str, str]] = {}
    name = ""
    for line in text.splitlines():
        match = _FLAG_LINE.match(line)
        if match:
            name = match.group(1)
            flags[name] = (match.group(2) or "", "")
        elif name and line.startswith("    \t"):
            default = _DEFAULT.search(line)
            if default:
                flags[name] = (flags[name][0], default.group(1))
    return flags
