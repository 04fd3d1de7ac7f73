"""nsq's ``internal/lg`` and ``internal/version``, shared by the daemons: log
levels and their names, the log line (``[nsqd] 2026/11/22 01:02:03.123456 INFO:
...``), the version string, and the flags every daemon has (``--version``,
``--config``, ``--log-level``, ``--log-prefix``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Final, TypeAlias

from trionsq.tools.flags import FlagSet, FlagValueError

from ..version import BUILD, VERSION

__all__ = [
    "LOG_LEVELS",
    "GoLogFormatter",
    "HTTP_CLIENT_TIMEOUT_FLAGS",
    "OptionFlag",
    "add_option_flags",
    "daemon_flagset",
    "parse_log_level",
    "python_level",
    "version_string",
]

#: ``lg.LogLevel``'s values by name (``/config/log_level`` shows the number).
LOG_LEVELS: Final = {"debug": 1, "info": 2, "warn": 3, "error": 4, "fatal": 5}

_PYTHON_LEVELS: Final = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "fatal": logging.CRITICAL,
}


_LEVEL_NAMES: Final = {
    logging.DEBUG: "DEBUG",
    logging.INFO: "INFO",
    logging.WARNING: "WARNING",
    logging.ERROR: "ERROR",
    logging.CRITICAL: "FATAL",
}


def version_string(app: str) -> str:
    """``internal/version.String``'s shape with fakensq's build note:
    ``nsqd v1.3.0 (fakensq 0.1.0, Python 3.11.7)`` where the real binary says
    ``nsqd v1.3.0 (built w/go1.21.5)``."""
    return f"{app} v{VERSION} ({BUILD})"


class GoLogFormatter(logging.Formatter):
    """nsq's ``internal/lg`` lines: ``PREFIX YYYY/MM/DD HH:MM:SS.micros LEVEL: msg``.

    The prefix is the record's ``nsq_prefix`` (set by fakensq's nodes) or the
    formatter's default.
    """

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def format(self, record: logging.LogRecord) -> str:
        prefix = getattr(record, "nsq_prefix", self.prefix)
        when = datetime.fromtimestamp(record.created).strftime("%Y/%m/%d %H:%M:%S.%f")
        level = _LEVEL_NAMES.get(record.levelno, record.levelname)
        text = f"{prefix}{when} {level}: {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def python_level(name: str, default: int = logging.INFO) -> int:
    """Python logging's level for an ``lg`` level name (any case)."""
    return _PYTHON_LEVELS.get(name.lower(), default)


def parse_log_level(text: str) -> str:
    """``lg.ParseLogLevel``: the level's name, lower case; FlagValueError with
    nsq's text for an unknown one."""
    if text.lower() not in LOG_LEVELS:
        raise FlagValueError(f"invalid log level '{text}' (debug, info, warn, error, fatal)")
    return text.lower()


def daemon_flagset(name: str, log_level: str) -> FlagSet:
    """The flags nsqd, nsqlookupd and nsqadmin share: version, config, logging."""
    fs = FlagSet(name)
    fs.bool("version", False, "print version string", dest=None)
    fs.string("config", "", "path to config file", dest=None)
    fs.var(
        "log-level",
        parse_log_level,
        log_level,
        "set log verbosity: debug, info, warn, error, or fatal",
        default_text=_LEVEL_NAMES[_PYTHON_LEVELS[log_level]],
    )
    fs.string("log-prefix", f"[{name}] ", "log message prefix")
    fs.bool("verbose", False, "[deprecated] has no effect, use --log-level", dest=None)
    return fs


#: A flag that sets the option of its name (``-`` for ``_``), the option's
#: value its default: ``(declaration, name, usage)``, the declaration one of
#: ``string``, ``int``, ``bool``, ``duration``.
OptionFlag: TypeAlias = tuple[str, str, str]

#: The HTTP client's timeouts: flags of nsqd and nsqadmin alike (each daemon's
#: table holds this one declaration).
HTTP_CLIENT_TIMEOUT_FLAGS: Final[tuple[OptionFlag, ...]] = (
    ("duration", "http-client-connect-timeout", "timeout for HTTP connect"),
    ("duration", "http-client-request-timeout", "timeout for HTTP request"),
)


def add_option_flags(fs: FlagSet, defaults: object, flags: Iterable[OptionFlag]) -> None:
    """Declare ``flags`` on ``fs``, each with its option's value in ``defaults``."""
    declare: dict[str, Callable[..., None]] = {
        "string": fs.string,
        "int": fs.int,
        "bool": fs.bool,
        "duration": fs.duration,
    }
    for kind, name, usage in flags:
        declare[kind](name, getattr(defaults, name.replace("-", "_")), usage)
