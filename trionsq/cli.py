"""The ``trionsq`` command: NSQ's utilities, on trionsq.

::

    trionsq tail     --topic=T --nsqd-tcp-address=H:P       # nsq_tail
    trionsq to-file  --topic=T --lookupd-http-address=H:P   # nsq_to_file
    trionsq pub      --topic=T --nsqd-tcp-address=H:P       # to_nsq (stdin)
    trionsq stat     --topic=T --channel=C --nsqd-http-address=H:P  # nsq_stat
    trionsq to-nsq   --topic=T ... --destination-nsqd-tcp-address=H:P  # nsq_to_nsq
    trionsq to-http  --topic=T ... --post=URL               # nsq_to_http

Each command takes the flags of its Go tool, in Go's flag syntax
(:mod:`trionsq.tools.flags`), plus ``--version``.  Exit status: 0 on success
(and after a clean SIGINT/SIGTERM shutdown), 1 when the Go tool would stop
with a message (a missing or invalid flag value, an unreachable node, a
failure), 2 for a command line Go's flag parser refuses (an unknown flag, a
value that does not parse), 130 after a second SIGINT/SIGTERM.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Awaitable, Callable, Sequence
from types import ModuleType
from typing import Any

import trio

from . import __version__
from .stopping import EXIT_ABORTED, TrioStopSignals
from .tools import GO_NAMES, TOOLS
from .tools.common import ToolError, tune_gc
from .tools.flags import FlagSet, plain_text

__all__ = ["main", "tool_flags"]

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "fatal": logging.CRITICAL,
}

_USAGE = """usage: trionsq [--version] [--log-level=LEVEL] COMMAND [flags]

NSQ's command-line utilities on the trionsq client; each COMMAND takes the
flags of its Go tool (see 'trionsq COMMAND --help').

commands:
{commands}

--log-level: debug, info, warn, error or fatal (default warn), on stderr.
"""


def _module(name: str) -> ModuleType:
    # Only the command run is imported: start-up time counts for short runs.
    return importlib.import_module(f".tools.{TOOLS[name]}", __package__)


def tool_flags(name: str) -> FlagSet:
    """The flags of ``trionsq NAME`` (``--version`` and ``--log-level`` included)."""
    module = _module(name)
    flags = FlagSet(
        f"trionsq {name}", description=plain_text(module.__doc__ or ""), help_to_stdout=True
    )
    module.configure(flags)
    flags.bool("version", False, "print version string")
    if not flags.has("log-level"):
        flags.string("log-level", "", "log verbosity: debug, info, warn, error, fatal (trionsq)")
    return flags


def _top_usage() -> str:
    lines = []
    for name in TOOLS:
        lines.append(f"  {name:<8} {GO_NAMES[name]}")
    return _USAGE.format(commands="\n".join(lines))


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``trionsq COMMAND [flags]``; returns the exit status.

    Without ``argv`` (the command line is the process's own) the process is
    the command's: its garbage collection is tuned for it
    (:func:`trionsq.tools.common.tune_gc`); called with ``argv`` from a program,
    the program's collector is left as it is.
    """
    # From the start: a SIGTERM while the command is still starting makes it
    # stop as soon as it runs (exit 0), rather than kill it half-started.
    signals = TrioStopSignals()
    with signals.installed():
        if argv is None:
            return _main(sys.argv[1:], signals, own_process=True)
        return _main(list(argv), signals)


def _main(args: list[str], signals: TrioStopSignals, own_process: bool = False) -> int:
    level = "warn"
    while args and args[0].startswith("-"):
        option, _, value = args.pop(0).lstrip("-").partition("=")
        if option in ("h", "help"):
            print(_top_usage())
            return 0
        if option == "version":
            print(f"trionsq {__version__}")
            return 0
        if option == "log-level":
            level = value or (args.pop(0) if args else "")
            if level not in _LEVELS:
                print(f"trionsq: invalid --log-level {level!r}", file=sys.stderr)
                return 2
            continue
        print(f"trionsq: unknown option -{option}\n\n{_top_usage()}", file=sys.stderr)
        return 2
    if not args or args[0] not in TOOLS:
        given = f"unknown command {args[0]!r}\n\n" if args else ""
        print(f"trionsq: {given}{_top_usage()}", file=sys.stderr)
        return 2
    name = args.pop(0)
    module = _module(name)
    flags = tool_flags(name)
    outcome = flags.parse_or_exit(args)
    if isinstance(outcome, int):
        return outcome
    values, ignored = outcome
    parsed = flags.namespace(values)
    if parsed.version:
        print(f"trionsq {name} v{__version__} (after {GO_NAMES[name]} v1.3.0)")
        return 0
    if ignored:
        print(
            f"trionsq {name}: ignoring arguments after the flags: {' '.join(ignored)}",
            file=sys.stderr,
        )
    level = parsed.log_level or level
    if level not in _LEVELS:
        print(f"trionsq {name}: error: --log-level is invalid", file=sys.stderr)
        return 1
    logging.basicConfig(
        level=_LEVELS[level],
        format=getattr(parsed, "log_prefix", "").replace("%", "%%")
        + "%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        prepared = module.prepare(parsed)
        if own_process:
            tune_gc()
        status: int = trio.run(_run, module.run, parsed, prepared, signals)
    except (ToolError, BaseExceptionGroup) as exc:
        error = _tool_error(exc)
        if error is None:
            raise
        print(f"trionsq {name}: error: {error}", file=sys.stderr)
        return 1
    if signals.aborted:
        return EXIT_ABORTED
    return status


async def _run(
    run: Callable[[Any, Any, trio.Event], Awaitable[int]],
    args: Any,
    prepared: Any,
    signals: TrioStopSignals,
) -> int:
    """Run a tool with a ``stop`` event set on the first SIGINT/SIGTERM; a second
    signal cancels it all (what it held is still requeued: the consumers
    requeue on cancellation)."""
    stop = trio.Event()
    status = EXIT_ABORTED
    with trio.CancelScope() as scope:
        signals.attach(stop, scope)
        status = await run(args, prepared, stop)
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
