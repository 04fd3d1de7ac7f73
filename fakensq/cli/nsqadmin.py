"""``fakensq admin``: nsqadmin v1.3.0's command line, serving fakensq's admin.

::

    fakensq admin --lookupd-http-address 127.0.0.1:4161 --http-address 127.0.0.1:4171

Every flag of ``nsqadmin --help`` is accepted, with Go's flag syntax
(``-flag=value``, ``--flag value``), nsqadmin's defaults and its ``--config``
file (TOML, nsqadmin's option names; a flag given on the command line wins).
Where a flag only matters to nsqadmin's own web pages, its help says what it
does here.  Like nsqadmin, it logs on stderr (``HTTP: listening on ADDR``),
exits 2 on a bad flag, 1 when it cannot start (``FATAL: ...``), and 0 after
SIGTERM or SIGINT.
"""

from __future__ import annotations

import errno
import logging
import signal
import sys
import tomllib
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

import trio

from trionsq.tools.flags import FlagSet, FlagValueError, go_duration

from ..admin.options import LOG_LEVELS, AdminOptions, OptionsError, go_file_error, split_host_port
from ..admin.server import Admin, client_tls_context
from ..golang.lg import (
    HTTP_CLIENT_TIMEOUT_FLAGS,
    OptionFlag,
    add_option_flags,
    daemon_flagset,
    version_string,
)
from .common import fatal, first_error, resolve, setup_logging

__all__ = ["admin_flagset", "admin_main", "admin_options_from_flags", "ConfigError"]

log = logging.getLogger("fakensq.admin")


#: nsqadmin's flags that each set the option of their name: (declaration, name, usage).
_OPTION_FLAGS: Final[tuple[OptionFlag, ...]] = (
    ("string", "http-address", "<addr>:<port> to listen on for HTTP clients"),
    ("string", "base-path", "URL base path"),
    (
        "string",
        "dev-static-dir",
        "(development use only) here: a folder whose files replace the pages' "
        "admin.js/admin.css/chart.js",
    ),
    (
        "string",
        "graphite-url",
        "graphite HTTP address (here: /api/graphite asks it for rates; the pages' "
        "charts come from the admin's own polling of /stats)",
    ),
    ("bool", "proxy-graphite", "proxy HTTP requests to graphite"),
    (
        "string",
        "statsd-counter-format",
        "The counter stats key formatting applied by the implementation of statsd. If no "
        "formatting is desired, set this to an empty string. (here: only reported by "
        "/config; nsqadmin's pages use it to name graphite series)",
    ),
    (
        "string",
        "statsd-gauge-format",
        "The gauge stats key formatting applied by the implementation of statsd. If no "
        "formatting is desired, set this to an empty string. (here: only reported by /config)",
    ),
    (
        "string",
        "statsd-prefix",
        "prefix used for keys sent to statsd (%s for host replacement, must match nsqd) "
        "(here: only reported by /config)",
    ),
    (
        "duration",
        "statsd-interval",
        "time interval nsqd is configured to push to statsd (must match nsqd) "
        "(here: the window /api/graphite asks graphite for)",
    ),
    *HTTP_CLIENT_TIMEOUT_FLAGS,
    (
        "bool",
        "http-client-tls-insecure-skip-verify",
        "configure the HTTP client to skip verification of TLS certificates",
    ),
    ("string", "http-client-tls-root-ca-file", "path to CA file for the HTTP client"),
    ("string", "http-client-tls-cert", "path to certificate file for the HTTP client"),
    ("string", "http-client-tls-key", "path to key file for the HTTP client"),
    (
        "string",
        "allow-config-from-cidr",
        "A CIDR from which to allow HTTP requests to the /config endpoint",
    ),
    (
        "string",
        "notification-http-endpoint",
        "HTTP endpoint (fully qualified) to which POST notifications of admin actions will be sent",
    ),
    ("string", "acl-http-header", "HTTP header to check for authenticated admin users"),
)


def admin_flagset(defaults: AdminOptions | None = None) -> FlagSet:
    """The flags of ``fakensq admin``: nsqadmin v1.3.0's, with its defaults."""
    o = defaults or AdminOptions()
    fs = daemon_flagset("nsqadmin", o.log_level)
    add_option_flags(fs, o, _OPTION_FLAGS)
    fs.strings(
        "lookupd-http-address",
        "lookupd HTTP address (may be given multiple times)",
        dest="nsqlookupd_http_addresses",
    )
    fs.strings(
        "nsqd-http-address",
        "nsqd HTTP address (may be given multiple times)",
        dest="nsqd_http_addresses",
    )
    # fakensq's own (nsqadmin has no such flag): the Faults page's proxy buttons.
    fs.strings(
        "proxy-http-address",
        "here only (not nsqadmin's): HTTP address of a 'fakensq proxy' whose fault buttons "
        "the Faults page shows (may be given multiple times)",
        dest="proxy_http_addresses",
    )
    fs.strings(
        "admin-user",
        "admin user (may be given multiple times; if specified, only these users will be "
        "able to perform privileged actions; acl-http-header is used to determine the "
        "authenticated user)",
        dest="admin_users",
    )
    return fs


class ConfigError(Exception):
    """The ``--config`` file cannot be read (nsqadmin exits 1 with this text)."""


_LIST_FIELDS = {
    "nsqlookupd_http_addresses",
    "nsqd_http_addresses",
    "proxy_http_addresses",
    "admin_users",
}
_DURATION_FIELDS = {"statsd_interval", "http_client_connect_timeout", "http_client_request_timeout"}
_BOOL_FIELDS = {"proxy_graphite", "http_client_tls_insecure_skip_verify"}


def _coerce(name: str, value: Any) -> Any:
    """options.Resolve's conversion of a config value; FlagValueError if it cannot."""
    if name in _DURATION_FIELDS:
        # Go durations as strings, or integer milliseconds.
        if isinstance(value, str):
            return go_duration(value)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return value / 1000.0
        raise FlagValueError(f"invalid time.Duration value type {type(value).__name__}")
    if name in _LIST_FIELDS:
        if not isinstance(value, list):
            raise FlagValueError(f"invalid []string value type {type(value).__name__}")
        return [str(v) for v in value]
    if name in _BOOL_FIELDS:
        if not isinstance(value, bool):
            raise FlagValueError(f"invalid bool value type {type(value).__name__}")
        return value
    if not isinstance(value, str):
        raise FlagValueError(f"invalid string value type {type(value).__name__}")
    return value


def _load_config(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(
            f"failed to load config file {path} - {go_file_error(path, exc)}"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"failed to load config file {path} - toml: {exc}") from None
    if "log_level" in raw:  # nsqadmin's config.Validate
        level = str(raw["log_level"]).lower()
        if level not in LOG_LEVELS:
            raise ConfigError(f"failed parsing log_level {raw['log_level']}")
        raw["log_level"] = level
    fields = set(AdminOptions.__dataclass_fields__)
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in fields:
            continue  # nsqadmin ignores keys it has no option for
        try:
            values[key] = _coerce(key, value)
        except FlagValueError as exc:
            # options.Resolve logs it and keeps the default.
            when = datetime.now().strftime("%Y/%m/%d %H:%M:%S")
            print(
                f"{when} ERROR: Resolve failed to coerce value {value} for field {key} - {exc}",
                file=sys.stderr,
            )
    return values


def admin_options_from_flags(values: dict[str, Any]) -> AdminOptions:
    """:class:`AdminOptions` from parsed flags: a flag given on the command line
    wins over the ``--config`` file, which wins over nsqadmin's defaults."""
    config = _load_config(values["config"]) if values.get("config") else {}
    return AdminOptions(**resolve(admin_flagset(), values, config))


def admin_main(argv: Sequence[str]) -> int:
    """Run the admin server until SIGTERM/SIGINT, as ``nsqadmin`` runs."""
    parsed = admin_flagset().parse_or_exit(argv)
    if isinstance(parsed, int):
        return parsed
    values = parsed[0]
    if values.get("version"):
        print(version_string("nsqadmin"), flush=True)
        return 0
    prefix = values.get("log-prefix", AdminOptions.log_prefix)
    try:
        options = admin_options_from_flags(values)
    except ConfigError as exc:
        return fatal(prefix, str(exc))
    try:
        options.validate()
        client_tls_context(options)
    except OptionsError as exc:
        return fatal(options.log_prefix, f"failed to instantiate nsqadmin - {exc}")
    setup_logging(options.log_prefix, options.log_level, sys.stderr)
    log.info(version_string("nsqadmin"))
    try:
        split_host_port(options.http_address)
    except ValueError as exc:
        return fatal(options.log_prefix, _listen_failed(options.http_address, f"listen tcp: {exc}"))
    try:
        trio.run(_serve, options)
    except (OSError, OptionsError, BaseExceptionGroup) as group:
        error = first_error(group)
        if isinstance(error, OptionsError):
            return fatal(options.log_prefix, f"failed to instantiate nsqadmin - {error}")
        return fatal(
            options.log_prefix, _listen_failed(options.http_address, _os_error(options, error))
        )
    return 0


def _listen_failed(address: str, why: str) -> str:
    return f"failed to instantiate nsqadmin - listen ({address}) failed - {why}"


def _os_error(options: AdminOptions, exc: BaseException) -> str:
    """Go's text for a listen that failed."""
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        return f"listen tcp {options.http_address}: bind: address already in use"
    if isinstance(exc, OSError) and exc.errno == errno.EADDRNOTAVAIL:
        return f"listen tcp {options.http_address}: bind: cannot assign requested address"
    if isinstance(exc, OSError) and exc.strerror:
        return f"listen tcp {options.http_address}: {exc.strerror.lower()}"
    return str(exc)


async def _serve(options: AdminOptions) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with Admin(options=options) as admin:
            async for _ in signals:
                break
            log.info("HTTP: closing %s", admin.listen_address)
