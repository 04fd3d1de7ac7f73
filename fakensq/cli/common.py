"""What the commands share: logging set-up, fatal exits, flag parsing as Go's
``ExitOnError``, config files (TOML, nsqd's cfg names) and ``options.Resolve``,
waiting for a signal.
"""

from __future__ import annotations

import logging
import sys
import tomllib
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TextIO, TypeVar

from ..golang.flags import (
    FlagError,
    FlagFatal,
    FlagSet,
    FlagValueError,
    HelpRequested,
    parse_go_duration,
)
from ..golang.lg import _LEVELS, GoLogFormatter, _parse_log_level, version_string
from ..lookupd.options import LookupdOptions
from ..nsqd.flags import _parse_tls_min_version, _parse_tls_required
from ..nsqd.listeners import listen_error
from ..nsqd.options import NSQDOptions

__all__ = ["ConfigError"]


def _setup_logging(prefix: str, level: str, stream: TextIO) -> logging.Handler:
    handler = logging.StreamHandler(stream)
    handler.setFormatter(GoLogFormatter(prefix))
    root = logging.getLogger("fakensq")
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(_LEVELS.get(level.lower(), logging.INFO))
    root.propagate = False
    return handler


def _fatal(prefix: str, message: str) -> int:
    # lg.LogFatal: one FATAL line, exit 1.
    record = logging.LogRecord("fakensq", logging.CRITICAL, "", 0, message, None, None)
    print(GoLogFormatter(prefix).format(record), file=sys.stderr, flush=True)
    return 1


def _coerce_duration(value: Any) -> float:
    # options.Resolve: strings are Go durations, integers are milliseconds.
    if isinstance(value, str):
        return parse_go_duration(value)
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
            value = _parse_tls_required(str(value))
        elif name == "tls_min_version":
            value = _parse_tls_min_version(str(value))
        elif name == "log_level":
            value = _parse_log_level(str(value))
        values[name] = value
    return values


class ConfigError(Exception):
    """The ``--config`` file cannot be read (nsqd exits 1 with this text)."""


def _config_values(
    values: dict[str, Any], fields: set[str], durations: set[str], aliases: dict[str, str]
) -> dict[str, Any]:
    path = values.get("config")
    if not path:
        return {}
    try:
        return _load_config(path, fields, durations, aliases)
    except (OSError, tomllib.TOMLDecodeError, FlagValueError) as exc:
        reason = _go_os_error(exc) if isinstance(exc, OSError) else str(exc)
        raise ConfigError(f"failed to load config file {path} - {reason}") from None


def _parse_or_exit(fs: FlagSet, argv: Sequence[str]) -> dict[str, Any] | int:
    """Parsed flags, or the exit code after Go's ExitOnError output."""
    try:
        values, _rest = fs.parse(argv)
    except HelpRequested:
        sys.stderr.write(fs.usage())
        return 0
    except FlagError as exc:
        sys.stderr.write(f"{exc}\n{fs.usage()}")
        return 2
    except FlagFatal as exc:
        # Go's log.Fatalf: "2006/01/02 15:04:05 message", exit status 1.
        sys.stderr.write(f"{datetime.now().strftime('%Y/%m/%d %H:%M:%S')} {exc}\n")
        return 1
    return values


def _resolve(fs: FlagSet, values: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    # options.Resolve: a flag given on the command line, else the config file,
    # else the flag's default.
    resolved = dict(config)
    for name, value in values.items():
        dest = fs.flags[name].dest
        if dest is not None:
            resolved[dest] = value
    return resolved


async def _wait_for_signal(receiver: Any) -> None:
    async for _ in receiver:
        return


_Options = TypeVar("_Options", NSQDOptions, LookupdOptions)


def _daemon_options(
    name: str,
    fs: FlagSet,
    options_from_flags: Callable[[dict[str, Any]], _Options],
    argv: Sequence[str] | None,
) -> _Options | int:
    """A daemon's options from its flags, or the exit status when there is
    nothing to run (a flag error, ``--help``, ``--version``, a bad config)."""
    args = list(sys.argv[1:] if argv is None else argv)
    values = _parse_or_exit(fs, args)
    if isinstance(values, int):
        return values
    if values.get("version"):
        print(version_string(name), flush=True)
        return 0
    prefix = values.get("log-prefix", f"[{name}] ")
    try:
        return options_from_flags(values)
    except ConfigError as exc:
        return _fatal(prefix, str(exc))


def _go_os_error(exc: OSError, op: str = "open") -> str:
    """An OSError as Go's os.PathError prints: ``open /x: no such file or directory``."""
    reason = exc.strerror or str(exc)
    reason = reason[:1].lower() + reason[1:]
    return f"{op} {exc.filename}: {reason}" if exc.filename else reason


def _check_listeners(*addresses: str, unix: bool = True) -> None:
    """nsqd.New's and nsqlookupd.New's listens, in order: ValueError with
    ``listen (ADDRESS) failed - ...`` for the first that would fail."""
    for address in addresses:
        if address:
            error = listen_error(address, unix=unix)
            if error is not None:
                raise ValueError(f"listen ({address}) failed - {error}")


def _first_error(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc
