"""NSQ's command-line utilities, one module per tool (see :mod:`trionsq.cli`).

Each module has ``HELP`` (one line), ``configure(flags)`` (declares its flags
on a :class:`~trionsq.tools.flags.FlagSet`), ``prepare(args)`` (checks them;
raises :class:`~trionsq.tools.common.ToolError` as the Go tool exits 1) and
``async run(args, prepared, stop) -> int`` (``stop`` is set on the first
SIGINT/SIGTERM).  The modules are imported on demand, by name.
"""

from __future__ import annotations

__all__ = ["GO_NAMES", "TOOLS"]

#: Subcommand name -> module name (in this package).
TOOLS: dict[str, str] = {
    "tail": "tail",
    "to-file": "to_file",
    "pub": "pub",
    "stat": "stat",
    "to-nsq": "to_nsq",
    "to-http": "to_http",
}

#: Subcommand name -> the NSQ v1.3.0 tool it follows.
GO_NAMES: dict[str, str] = {
    "tail": "nsq_tail",
    "to-file": "nsq_to_file",
    "pub": "to_nsq",
    "stat": "nsq_stat",
    "to-nsq": "nsq_to_nsq",
    "to-http": "nsq_to_http",
}
