"""The ``trionsq`` command: NSQ's utilities, on trionsq.

::

    trionsq tail     --topic T --nsqd-tcp-address H:P      # nsq_tail
    trionsq to-file  --topic T --lookupd-http-address H:P  # nsq_to_file
    trionsq pub      --topic T --nsqd-tcp-address H:P      # to_nsq (stdin)
    trionsq stat     --topic T --channel C --nsqd-http-address H:P  # nsq_stat
    trionsq to-nsq   --topic T ... --destination-nsqd-tcp-address H:P  # nsq_to_nsq
    trionsq to-http  --topic T ... --post URL               # nsq_to_http

Flag names are those of the Go tools.  Exit status: 0 on success (and after a
clean SIGINT/SIGTERM shutdown), 1 when a node is unreachable or the work fails,
2 on a usage error.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

import trio

from . import __version__
from .tools import TOOLS
from .tools.common import ToolError

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser, with one subcommand per tool."""
    parser = argparse.ArgumentParser(
        prog="trionsq",
        description="NSQ's command-line utilities on the trionsq client.",
    )
    parser.add_argument("--version", action="version", version=f"trionsq {__version__}")
    parser.add_argument(
        "--log-level",
        default="warning",
        choices=["debug", "info", "warning", "error"],
        help="client log verbosity, on stderr (default: warning)",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module in TOOLS.items():
        sub = subparsers.add_parser(
            name, help=module.HELP, description=module.__doc__, formatter_class=_Formatter
        )
        sub.add_argument(
            "--log-level",
            default=argparse.SUPPRESS,
            choices=["debug", "info", "warning", "error"],
            help="client log verbosity, on stderr (default: warning)",
        )
        module.configure(sub)
        sub.set_defaults(_tool=module, _parser=sub)
    return parser


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Keep the module docstrings' layout in ``--help``."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``trionsq COMMAND [flags]``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    tool = args._tool
    prepared = tool.prepare(args._parser, args)
    try:
        status: int = trio.run(tool.run, args, prepared)
    except (ToolError, BaseExceptionGroup) as exc:
        error = _tool_error(exc)
        if error is None:
            raise
        print(f"trionsq {args.command}: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return status


def _tool_error(exc: BaseException) -> ToolError | None:
    """The ToolError in ``exc``, however deep in nurseries' exception groups."""
    if isinstance(exc, ToolError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _tool_error(inner)
            if found is not None:
                return found
    return None


if __name__ == "__main__":
    sys.exit(main())
