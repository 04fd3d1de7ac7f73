"""NSQ's command-line utilities, one module per tool (see :mod:`trionsq.cli`).

Each module has ``HELP`` (one line), ``configure(parser)`` (its flags),
``prepare(parser, args)`` (checks the flags; usage errors exit 2) and
``async run(args, prepared) -> int``.
"""

from __future__ import annotations

from types import ModuleType

from . import pub, stat, tail, to_file, to_http, to_nsq

__all__ = ["TOOLS"]

#: Subcommand name -> tool module.
TOOLS: dict[str, ModuleType] = {
    "tail": tail,
    "to-file": to_file,
    "pub": pub,
    "stat": stat,
    "to-nsq": to_nsq,
    "to-http": to_http,
}
