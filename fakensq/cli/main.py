"""The ``fakensq`` command: one sub-command per module of this package."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Final

from .cluster import cluster_main
from .nsqadmin import admin_main
from .nsqd import nsqd_main
from .nsqlookupd import nsqlookupd_main
from .proxy import proxy_main
from .shims import write_shims

__all__ = ["main"]


_USAGE: Final = """\
usage: fakensq COMMAND [flags]

commands:
  nsqd [flags]         run an nsqd (nsqd v1.3's flags; -h lists them)
  nsqlookupd [flags]   run an nsqlookupd (nsqlookupd v1.3's flags)
  cluster [flags]      run nsqds wired to nsqlookupds and print their addresses
  admin [flags]        serve a web view of a cluster (nsqadmin's flags)
  shims DIR            write executable nsqd and nsqlookupd stand-ins into DIR
  proxy [flags]        relay clients to a real nsqd with faults (--upstream HOST:PORT)
"""


def main(argv: Sequence[str] | None = None) -> int:
    """The ``fakensq`` console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "-help", "--help", "help"):
        sys.stderr.write(_USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    commands: dict[str, Callable[[Sequence[str]], int]] = {
        "nsqd": nsqd_main,
        "nsqlookupd": nsqlookupd_main,
        "cluster": cluster_main,
        "shims": _shims_main,
        "admin": admin_main,
        "proxy": proxy_main,
    }
    run = commands.get(command)
    if run is None:
        sys.stderr.write(f"fakensq: unknown command {command!r}\n{_USAGE}")
        return 2
    return run(rest)


_SHIMS_USAGE: Final = """\
usage: fakensq shims DIR

Writes executable nsqd and nsqlookupd into DIR (created if needed), bound to
this Python: fakensq's daemons under the real binaries' names, for test suites
that start them by name.  Put DIR first on PATH where the fakes are wanted.
"""


def _shims_main(argv: Sequence[str]) -> int:
    # A lone DIR and nothing else: "--help" or a mistyped flag must not become
    # a folder of that name.
    if len(argv) == 1 and argv[0] in ("-h", "-help", "--help"):
        sys.stderr.write(_SHIMS_USAGE)
        return 0
    if len(argv) != 1 or argv[0].startswith("-"):
        sys.stderr.write(_SHIMS_USAGE)
        return 2
    for path in write_shims(argv[0]):
        print(path)
    return 0
