"""NSQ's command-line utilities, one module per tool (see :mod:`trionsq.cli`).

Each module has ``HELP`` (one line), ``configure(parser)`` (its flags),
``prepare(parser, args)`` (checks the flags; usage errors exit 2) and
``async run(args, prepared) -> int``.
"""

from __future__ import annotations

from types import ModuleType

from . import pub, tail

__all__ = ["TOOLS"]

#: Subcommand name -> tool module.
TOOLS: dict[str, ModuleType] = {
    "tail": tail,
    "pub": pub,
}
