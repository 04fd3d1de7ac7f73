"""What the commands share: logging set-up, fatal exits, config files (TOML,
nsqd's cfg names) and ``options.Resolve``, waiting for a signal.

fakensq.cli's internal API: its commands' modules use these; nothing outside
the package does.
"""

from __future__ import annotations

import logging
import sys
import tomllib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, TextIO, TypeVar

import trio

from trionsq.tools.flags import FlagSet, FlagValueError, go_duration

from ..golang.lg import GoLogFormatter, parse_log_level, python_level, version_string
from ..lookupd.options import LookupdOptions
from ..nsqd.flags import parse_tls_min_version, parse_tls_required
from ..nsqd.listeners import listen_error
from ..nsqd.options import NSQDOptions

__all__ = [
    "FAKENSQ_CONFIG_KEYS",
    "ConfigError",
    "check_listeners",
    "config_fields",
    "config_values",
    "daemon_options",
    "fatal",
    "first_error",
    "go_os_error",
    "resolve",
    "serve",
    "setup_logging",
    "wait_for_signal",
]


_Options = TypeVar("_Options", NSQDOptions, LookupdOptions)


def setup_logging(prefix: str, level: str, stream: TextIO) -> logging.Handler:
    """fakensq's log lines as nsq's ``lg`` writes them, on ``stream``."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(GoLogFormatter(prefix))
    root = logging.getLogger("fakensq")
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(python_level(level))
    root.propagate = False
    return handler


def fatal(prefix: str, message: str) -> int:
    """``lg.LogFatal``: one FATAL line on stderr; the exit status (1)."""
    record = logging.LogRecord("fakensq", logging.CRITICAL, "", 0, message, None, None)
    print(GoLogFormatter(prefix).format(record), file=sys.stderr, flush=True)
    return 1


def _coerce_duration(value: Any) -> float:
    # options.Resolve: strings are Go durations, integers are milliseconds.
    if isinstance(value, str):
        return go_duration(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value / 1000.0
    if isinstance(value, float):
        return value / 1000.0
    raise FlagValueError("invalid value type")


def _load_config(
    path: str, fields: set[str], durations: set[str], aliases: dict[str, str]
) -> dict[str, Any]:
    with open(path, "rb") as f:
        raw = tomllib.load(f)
    values: dict[str, Any] = {}
    for key, value in raw.items():
        name = aliases.get(key, key)
        if name not in fields:
            continue  # nsqd ignores keys it has no option for
        if name in durations:
            value = _coerce_duration(value)
        elif name == "tls_required":
            value = parse_tls_required(str(value))
        elif name == "tls_min_version":
            value = parse_tls_min_version(str(value))
        elif name == "log_level":
            value = parse_log_level(str(value))
        values[name] = value
    return values


class ConfigError(Exception):
    """The ``--config`` file cannot be read (nsqd exits 1 with this text)."""


#: Options a ``--config`` file may set that have no flag: fakensq's own
#: (documented in docs/testing.md; the real daemons ignore these keys).
FAKENSQ_CONFIG_KEYS: Final = frozenset({"legacy_http_aliases", "seed"})


def config_fields(fs: FlagSet) -> set[str]:
    """The options a ``--config`` file sets: those with a flag, as go-options'
    ``Resolve`` (nsqd's options without one, such as ``client_timeout`` or
    ``queue_scan_interval``, keep their defaults whatever the file says), and
    fakensq's own (:data:`FAKENSQ_CONFIG_KEYS`)."""
    return {f.dest for f in fs.flags.values() if f.dest} | FAKENSQ_CONFIG_KEYS


def config_values(
    values: dict[str, Any], fields: set[str], durations: set[str], aliases: dict[str, str]
) -> dict[str, Any]:
    """The ``--config`` file's values (given in ``values``), by option name:
    ``fields`` the options, ``durations`` those that are durations, ``aliases``
    the file's names that are not the options'; ConfigError as nsqd's."""
    path = values.get("config")
    if not path:
        return {}
    try:
        return _load_config(path, fields, durations, aliases)
    except (OSError, tomllib.TOMLDecodeError, FlagValueError) as exc:
        reason = go_os_error(exc) if isinstance(exc, OSError) else str(exc)
        raise ConfigError(f"failed to load config file {path} - {reason}") from None


def resolve(fs: FlagSet, values: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """``options.Resolve``: a flag given on the command line, else the config
    file (the flag's default is the options' own); by option name."""
    resolved = dict(config)
    for name, value in values.items():
        dest = fs.flags[name].dest
        if dest is not None:
            resolved[dest] = value
    return resolved


def serve(name: str, run: Callable[[_Options], Awaitable[None]], options: _Options) -> int:
    """Run daemon ``name`` (``run(options)``, until its signal); the exit
    status: 0, or 1 after nsq's FATAL line ``failed to start NAME - error``."""
    try:
        trio.run(run, options)
    except (OSError, ValueError, BaseExceptionGroup) as exc:
        return fatal(options.log_prefix, f"failed to start {name} - {first_error(exc)}")
    return 0


async def wait_for_signal(receiver: Any) -> None:
    """Return at the first signal ``receiver`` (trio's signal receiver) gets."""
    async for _ in receiver:
        return


def daemon_options(
    name: str,
    fs: FlagSet,
    options_from_flags: Callable[[dict[str, Any]], _Options],
    argv: Sequence[str] | None,
) -> _Options | int:
    """A daemon's options from its flags, or the exit status when there is
    nothing to run (a flag error, ``--help``, ``--version``, a bad config)."""
    args = list(sys.argv[1:] if argv is None else argv)
    parsed = fs.parse_or_exit(args)
    if isinstance(parsed, int):
        return parsed
    values = parsed[0]
    if values.get("version"):
        print(version_string(name), flush=True)
        return 0
    prefix = values.get("log-prefix", f"[{name}] ")
    try:
        return options_from_flags(values)
    except ConfigError as exc:
        return fatal(prefix, str(exc))


def go_os_error(exc: OSError, op: str = "open") -> str:
    """An OSError as Go's os.PathError prints: ``open /x: no such file or directory``."""
    reason = exc.strerror or str(exc)
    reason = reason[:1].lower() + reason[1:]
    return f"{op} {exc.filename}: {reason}" if exc.filename else reason


def check_listeners(*addresses: str, unix: bool = True) -> None:
    """nsqd.New's and nsqlookupd.New's listens, in order: ValueError with
    ``listen (ADDRESS) failed - ...`` for the first that would fail."""
    for address in addresses:
        if address:
            error = listen_error(address, unix=unix)
            if error is not None:
                raise ValueError(f"listen ({address}) failed - {error}")


def first_error(exc: BaseException) -> BaseException:
    """The first error of an exception group (nested ones too), or ``exc``."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc
