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
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from types import ModuleType
from typing import Any

import trio

from . import __version__
from .tools import GO_NAMES, TOOLS
from .tools.common import ToolError
from .tools.flags import FlagSet

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
    flags = FlagSet(prog=f"trionsq {name}", description=module.__doc__ or "")
    module.configure(flags)
    flags.bool("version", "print version string")
    if not flags.has("log-level"):
        flags.string("log-level", "", "log verbosity: debug, info, warn, error, fatal (trionsq)")
    return flags


def _top_usage() -> str:
    lines = []
    for name in TOOLS:
        lines.append(f"  {name:<8} {GO_NAMES[name]}")
    return _USAGE.format(commands="\n".join(lines))


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``trionsq COMMAND [flags]``; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
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
    parsed = flags.parse(args)
    if parsed.version:
        print(f"trionsq {name} v{__version__} (after {GO_NAMES[name]} v1.3.0)")
        return 0
    if parsed._ignored:
        print(
            f"trionsq {name}: ignoring arguments after the flags: {' '.join(parsed._ignored)}",
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
        status: int = trio.run(_run, module.run, parsed, prepared)
    except (ToolError, BaseExceptionGroup) as exc:
        error = _tool_error(exc)
        if error is None:
            raise
        print(f"trionsq {name}: error: {error}", file=sys.stderr)
        return 1
    except _Aborted:
        return 130
    return status


class _Aborted(Exception):
    """A second SIGINT/SIGTERM: stop without waiting for anything."""


async def _run(
    run: Callable[[Any, Any, trio.Event], Awaitable[int]], args: Any, prepared: Any
) -> int:
    """Run a tool with a ``stop`` event set on the first SIGINT/SIGTERM; a second
    signal cancels it all (what it held is still requeued: the consumers
    requeue on cancellation)."""
    stop = trio.Event()
    aborted = False
    status = 130
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                nonlocal aborted
                async for signum in signals:
                    if stop.is_set():
                        logging.getLogger("trionsq.tools").info("second signal: aborting")
                        aborted = True
                        nursery.cancel_scope.cancel()
                        return
                    logging.getLogger("trionsq.tools").info(
                        "received %s: stopping", signal.Signals(signum).name
                    )
                    stop.set()

            nursery.start_soon(watch)
            status = await run(args, prepared, stop)
            nursery.cancel_scope.cancel()
    if aborted:
        raise _Aborted
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
