"""The ``fakensq`` command, and ``nsqd``/``nsqlookupd`` stand-ins for the real binaries.

- ``fakensq nsqd [flags]`` / ``nsqd [flags]``: nsqd v1.3's flags, Go flag semantics;
- ``fakensq nsqlookupd [flags]`` / ``nsqlookupd [flags]``: nsqlookupd v1.3's flags;
- ``fakensq cluster [-nsqd N] [-lookupd M] [-base-port P]``: a whole cluster, with
  its addresses printed on stdout;
- ``fakensq shims DIR``: writes executable ``nsqd`` and ``nsqlookupd`` into DIR,
  for test suites that start the binaries by name from ``PATH``.

The daemons log on stderr in the real ones' format
(``[nsqd] 2026/11/22 01:02:03.123456 INFO: TCP: listening on 127.0.0.1:4150``),
with the real port when port 0 was asked.  SIGTERM and SIGINT shut down cleanly
and exit 0.  Flag errors exit 2, start-up failures 1 (``FATAL: ...``).
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import tomllib
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Final, TextIO, TypeVar

import trio

from ..golang.flags import (
    Flag,
    FlagError,
    FlagFatal,
    FlagSet,
    FlagValueError,
    HelpRequested,
    parse_go_duration,
)
from ..golang.json import format_float
from ..lookupd.daemon import LookupdOptions, NSQLookupd
from ..nsqd.options import (
    GO_TOOLCHAIN,
    TLS_NOT_REQUIRED,
    TLS_REQUIRED,
    TLS_REQUIRED_EXCEPT_HTTP,
    VERSION,
    NSQDOptions,
)

__all__ = [
    "main",
    "nsqd_main",
    "nsqlookupd_main",
    "cluster_main",
    "GoLogFormatter",
    "ConfigError",
    "nsqd_flagset",
    "nsqlookupd_flagset",
    "nsqd_options_from_flags",
    "nsqd_cfg_fields",
    "check_nsqd_options",
    "nsqd_command_defaults",
    "nsqlookupd_command_defaults",
    "nsqlookupd_options_from_flags",
    "version_string",
]

#: What ``--version`` and the text ``/stats`` report as the Go toolchain: the
#: reference v1.3.0 binaries' (tests/reference.py).
GO_VERSION: Final = GO_TOOLCHAIN

_LEVELS: Final = {
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
    """``internal/version.String``: ``nsqd v1.3.0 (built w/go1.21.5)``."""
    return f"{app} v{VERSION} (built w/{GO_VERSION})"


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


# -- flag value types of nsqd's command line ----------------------------------


def _parse_log_level(text: str) -> str:
    if text.lower() not in _LEVELS:
        raise FlagValueError(f"invalid log level '{text}' (debug, info, warn, error, fatal)")
    return text.lower()


def _parse_tls_required(text: str) -> int:
    lowered = text.lower()
    if lowered == "tcp-https":
        return TLS_REQUIRED_EXCEPT_HTTP
    if lowered in ("1", "t", "true"):
        return TLS_REQUIRED
    if lowered in ("0", "f", "false"):
        return TLS_NOT_REQUIRED
    raise FlagValueError(f'strconv.ParseBool: parsing "{lowered}": invalid syntax')


_TLS_VERSIONS: Final = {"ssl3.0": 768, "tls1.0": 769, "tls1.1": 770, "tls1.2": 771, "tls1.3": 772}


def _parse_tls_min_version(text: str) -> str:
    lowered = text.lower()
    if lowered and lowered not in _TLS_VERSIONS:
        from trionsq.protocol.names import go_quote

        raise FlagValueError(f"unknown tlsVersionOption {go_quote(lowered)}")
    return lowered


def _daemon_flagset(name: str, log_level: str) -> FlagSet:
    """The flags nsqd and nsqlookupd share: version, config, logging."""
    fs = FlagSet(name)
    fs.add_bool("version", False, "print version string")
    fs.add_string("config", "", "path to config file")
    fs.add(
        Flag(
            "log-level",
            "custom",
            log_level,
            "set log verbosity: debug, info, warn, error, or fatal",
            "log_level",
            parse=_parse_log_level,
            default_text=_LEVEL_NAMES[_LEVELS[log_level]],
        )
    )
    fs.add_string("log-prefix", f"[{name}] ", "log message prefix", "log_prefix")
    fs.add_bool("verbose", False, "[deprecated] has no effect, use --log-level")  # ignored
    return fs


def nsqd_command_defaults() -> NSQDOptions:
    """The options of ``nsqd`` run with no flags: v1.3.0's defaults (all
    interfaces, ports 4150/4151/4152), where the in-process :class:`NSQDOptions`
    listens on loopback."""
    return NSQDOptions(
        tcp_address="0.0.0.0:4150",
        http_address="0.0.0.0:4151",
        https_address="0.0.0.0:4152",
    )


def nsqlookupd_command_defaults() -> LookupdOptions:
    """The options of ``nsqlookupd`` run with no flags: v1.3.0's defaults."""
    return LookupdOptions(tcp_address="0.0.0.0:4160", http_address="0.0.0.0:4161")


_ADDRESS_USAGE: Final = (
    "address to listen on for {} clients (<addr>:<port> for TCP/IP or <path> for unix socket)"
)


def nsqd_flagset(defaults: NSQDOptions | None = None) -> FlagSet:
    """nsqd v1.3's flags, each mapped onto its :class:`NSQDOptions` field."""
    o = defaults or nsqd_command_defaults()
    fs = _daemon_flagset("nsqd", o.log_level)
    fs.add_int(
        "node-id",
        o.node_id,
        "unique part for message IDs, (int) in range [0,1024) (default is hash of hostname)",
        "node_id",
    )
    fs.add_bool("worker-id", False, "[deprecated] use --node-id")  # ignored
    fs.add_string(
        "https-address",
        o.https_address,
        "<addr>:<port> to listen on for HTTPS clients",
        "https_address",
    )
    fs.add_string("http-address", o.http_address, _ADDRESS_USAGE.format("HTTP"), "http_address")
    fs.add_string("tcp-address", o.tcp_address, _ADDRESS_USAGE.format("TCP"), "tcp_address")
    fs.add_list(
        "auth-http-address",
        "<addr>:<port> or a full url to query auth server (may be given multiple times)",
        "auth_http_addresses",
    )
    fs.add_string(
        "broadcast-address",
        o.broadcast_address,
        "address that will be registered with lookupd (defaults to the OS hostname)",
        "broadcast_address",
    )
    fs.add_int(
        "broadcast-tcp-port",
        o.broadcast_tcp_port,
        "TCP port that will be registered with lookupd "
        "(defaults to the TCP port that this nsqd is listening on)",
        "broadcast_tcp_port",
    )
    fs.add_int(
        "broadcast-http-port",
        o.broadcast_http_port,
        "HTTP port that will be registered with lookupd "
        "(defaults to the HTTP port that this nsqd is listening on)",
        "broadcast_http_port",
    )
    fs.add_list(
        "lookupd-tcp-address",
        "lookupd TCP address (may be given multiple times)",
        "lookupd_tcp_addresses",
    )
    fs.add_duration(
        "http-client-connect-timeout",
        o.http_client_connect_timeout,
        "timeout for HTTP connect",
        "http_client_connect_timeout",
    )
    fs.add_duration(
        "http-client-request-timeout",
        o.http_client_request_timeout,
        "timeout for HTTP request",
        "http_client_request_timeout",
    )
    # diskqueue options
    fs.add_string("data-path", o.data_path, "path to store disk-backed messages", "data_path")
    fs.add_int(
        "mem-queue-size",
        o.mem_queue_size,
        "number of messages to keep in memory (per topic/channel)",
        "mem_queue_size",
    )
    fs.add_int(
        "max-bytes-per-file",
        o.max_bytes_per_file,
        "number of bytes per diskqueue file before rolling",
        "max_bytes_per_file",
    )
    fs.add_int("sync-every", o.sync_every, "number of messages per diskqueue fsync", "sync_every")
    fs.add_duration(
        "sync-timeout", o.sync_timeout, "duration of time per diskqueue fsync", "sync_timeout"
    )
    fs.add_int(
        "queue-scan-worker-pool-max",
        o.queue_scan_worker_pool_max,
        "max concurrency for checking in-flight and deferred message timeouts",
        "queue_scan_worker_pool_max",
    )
    fs.add_int(
        "queue-scan-selection-count",
        o.queue_scan_selection_count,
        "number of channels to check per cycle (every 100ms) for in-flight and deferred timeouts",
        "queue_scan_selection_count",
    )
    # msg and command options
    fs.add_duration(
        "msg-timeout",
        o.msg_timeout,
        "default duration to wait before auto-requeing a message",
        "msg_timeout",
    )
    fs.add_duration(
        "max-msg-timeout",
        o.max_msg_timeout,
        "maximum duration before a message will timeout",
        "max_msg_timeout",
    )
    fs.add_int(
        "max-msg-size", o.max_msg_size, "maximum size of a single message in bytes", "max_msg_size"
    )
    fs.add_duration(
        "max-req-timeout",
        o.max_req_timeout,
        "maximum requeuing timeout for a message",
        "max_req_timeout",
    )
    fs.add_int(
        "max-body-size", o.max_body_size, "maximum size of a single command body", "max_body_size"
    )
    # client overridable configuration options
    fs.add_duration(
        "max-heartbeat-interval",
        o.max_heartbeat_interval,
        "maximum client configurable duration of time between client heartbeats",
        "max_heartbeat_interval",
    )
    fs.add_int("max-rdy-count", o.max_rdy_count, "maximum RDY count for a client", "max_rdy_count")
    fs.add_int(
        "max-output-buffer-size",
        o.max_output_buffer_size,
        "maximum client configurable size (in bytes) for a client output buffer",
        "max_output_buffer_size",
    )
    fs.add_duration(
        "max-output-buffer-timeout",
        o.max_output_buffer_timeout,
        "maximum client configurable duration of time between flushing to a client",
        "max_output_buffer_timeout",
    )
    fs.add_duration(
        "min-output-buffer-timeout",
        o.min_output_buffer_timeout,
        "minimum client configurable duration of time between flushing to a client",
        "min_output_buffer_timeout",
    )
    fs.add_duration(
        "output-buffer-timeout",
        o.output_buffer_timeout,
        "default duration of time between flushing data to clients",
        "output_buffer_timeout",
    )
    fs.add_int(
        "max-channel-consumers",
        o.max_channel_consumers,
        "maximum channel consumer connection count per nsqd instance (default 0, i.e., unlimited)",
        "max_channel_consumers",
    )
    # statsd integration options
    fs.add_string(
        "statsd-address",
        o.statsd_address,
        "UDP <addr>:<port> of a statsd daemon for pushing stats",
        "statsd_address",
    )
    fs.add_duration(
        "statsd-interval",
        o.statsd_interval,
        "duration between pushing to statsd",
        "statsd_interval",
    )
    fs.add_bool(
        "statsd-mem-stats",
        o.statsd_mem_stats,
        "toggle sending memory and GC stats to statsd",
        "statsd_mem_stats",
    )
    fs.add_string(
        "statsd-prefix",
        o.statsd_prefix,
        "prefix used for keys sent to statsd (%s for host replacement)",
        "statsd_prefix",
    )
    fs.add_int(
        "statsd-udp-packet-size",
        o.statsd_udp_packet_size,
        "the size in bytes of statsd UDP packets",
        "statsd_udp_packet_size",
    )
    fs.add_bool(
        "statsd-exclude-ephemeral",
        o.statsd_exclude_ephemeral,
        "Skip ephemeral topics and channels when sending stats to statsd",
        "statsd_exclude_ephemeral",
    )
    # End to end percentile flags
    fs.add(
        Flag(
            "e2e-processing-latency-percentile",
            "floatlist",
            [],
            "message processing time percentiles (as float (0, 1.0]) to track "
            "(can be specified multiple times or comma separated '1.0,0.99,0.95', default none)",
            "e2e_processing_latency_percentiles",
        )
    )
    fs.add_duration(
        "e2e-processing-latency-window-time",
        o.e2e_processing_latency_window_time,
        "calculate end to end latency quantiles for this duration of time "
        "(ie: 60s would only show quantile calculations from the past 60 seconds)",
        "e2e_processing_latency_window_time",
    )
    # TLS config
    fs.add_string("tls-cert", o.tls_cert, "path to certificate file", "tls_cert")
    fs.add_string("tls-key", o.tls_key, "path to key file", "tls_key")
    fs.add_string(
        "tls-client-auth-policy",
        o.tls_client_auth_policy,
        "client certificate auth policy ('require' or 'require-verify')",
        "tls_client_auth_policy",
    )
    fs.add_string(
        "tls-root-ca-file",
        o.tls_root_ca_file,
        "path to certificate authority file",
        "tls_root_ca_file",
    )
    fs.add(
        Flag(
            "tls-required",
            "custom",
            o.tls_required,
            "require TLS for client connections (true, false, tcp-https)",
            "tls_required",
            parse=_parse_tls_required,
            is_bool=True,
            type_name="",
            default_text=str(o.tls_required) if o.tls_required else "",
        )
    )
    fs.add(
        Flag(
            "tls-min-version",
            "custom",
            o.tls_min_version,
            "minimum SSL/TLS version acceptable "
            "('ssl3.0', 'tls1.0', 'tls1.1', 'tls1.2' or 'tls1.3')",
            "tls_min_version",
            parse=_parse_tls_min_version,
            default_text=o.tls_min_version,
        )
    )
    # compression
    fs.add_bool(
        "deflate", o.deflate, "enable deflate feature negotiation (client compression)", "deflate"
    )
    fs.add_int(
        "max-deflate-level",
        o.max_deflate_level,
        "max deflate compression level a client can negotiate (> values == > nsqd CPU usage)",
        "max_deflate_level",
    )
    fs.add_bool(
        "snappy", o.snappy, "enable snappy feature negotiation (client compression)", "snappy"
    )
    return fs


def nsqlookupd_flagset(defaults: LookupdOptions | None = None) -> FlagSet:
    """nsqlookupd v1.3's flags, mapped onto :class:`LookupdOptions` fields."""
    o = defaults or nsqlookupd_command_defaults()
    fs = _daemon_flagset("nsqlookupd", o.log_level)
    fs.add_string(
        "tcp-address", o.tcp_address, "<addr>:<port> to listen on for TCP clients", "tcp_address"
    )
    fs.add_string(
        "http-address",
        o.http_address,
        "<addr>:<port> to listen on for HTTP clients",
        "http_address",
    )
    fs.add_string(
        "broadcast-address",
        o.broadcast_address,
        "address of this lookupd node, (default to the OS hostname)",
        "broadcast_address",
    )
    fs.add_duration(
        "inactive-producer-timeout",
        o.inactive_producer_timeout,
        "duration of time a producer will remain in the active list since its last ping",
        "inactive_producer_timeout",
    )
    fs.add_duration(
        "tombstone-lifetime",
        o.tombstone_lifetime,
        "duration of time a producer will remain tombstoned if registration remains",
        "tombstone_lifetime",
    )
    return fs


# -- config files (TOML, keys as nsqd's cfg names) -----------------------------

# The cfg names (config file keys, ``/config/<name>``) that are not the flag's
# name with ``_`` for ``-``: nsqd's ``cfg`` struct tags.
_NSQD_CFG_NAMES: Final = {
    "node-id": "id",
    "lookupd-tcp-address": "nsqlookupd_tcp_addresses",
    "auth-http-address": "auth_http_addresses",
    "e2e-processing-latency-percentile": "e2e_processing_latency_percentiles",
}


@functools.cache
def nsqd_cfg_fields() -> dict[str, Flag]:
    """nsqd's options by cfg name (what ``GET /config/<name>`` and a config file
    know): every flag that sets an option, under its ``cfg`` tag's name."""
    return {
        _NSQD_CFG_NAMES.get(flag.name, flag.name.replace("-", "_")): flag
        for flag in nsqd_flagset(NSQDOptions()).flags.values()
        if flag.dest is not None
    }


# nsqd's cfg names that are not fakensq's field names.
_NSQD_CFG_ALIASES: Final = {
    "nsqlookupd_tcp_addresses": "lookupd_tcp_addresses",
    "id": "node_id",
    "e2e_processing_latency_percentile": "e2e_processing_latency_percentiles",
}
_DURATION_FIELDS_NSQD: Final = {
    f.dest for f in nsqd_flagset().flags.values() if f.kind == "duration" and f.dest
} | {"queue_scan_interval", "queue_scan_refresh_interval", "client_timeout"}


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


# -- running -----------------------------------------------------------------


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


def nsqd_options_from_flags(values: dict[str, Any]) -> NSQDOptions:
    """:class:`NSQDOptions` from parsed nsqd flags (``nsqd_flagset().parse(argv)[0]``).

    As nsqd's ``options.Resolve``: a flag given on the command line wins over the
    ``--config`` file (TOML, nsqd's cfg names), which wins over the defaults.
    """
    config = _config_values(
        values,
        set(NSQDOptions.__dataclass_fields__),
        set(_DURATION_FIELDS_NSQD),
        dict(_NSQD_CFG_ALIASES),
    )
    return nsqd_command_defaults().replace(**_resolve(nsqd_flagset(), values, config))


def nsqlookupd_options_from_flags(values: dict[str, Any]) -> LookupdOptions:
    """:class:`LookupdOptions` from parsed nsqlookupd flags (and ``--config``)."""
    config = _config_values(
        values,
        set(LookupdOptions.__dataclass_fields__),
        {"inactive_producer_timeout", "tombstone_lifetime"},
        {},
    )
    base = nsqlookupd_command_defaults()
    return LookupdOptions(**{**base.__dict__, **_resolve(nsqlookupd_flagset(), values, config)})


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


def nsqd_main(argv: Sequence[str] | None = None) -> int:
    """The ``nsqd`` command: parse nsqd's flags, serve until SIGTERM/SIGINT."""
    options = _daemon_options("nsqd", nsqd_flagset(), nsqd_options_from_flags, argv)
    if isinstance(options, int):
        return options
    if not options.data_path:
        # nsqd keeps its data in the working directory then (and /config shows
        # the empty flag).
        options = options.replace(data_path=os.getcwd(), data_path_shown="")
    lock: int | None = None
    try:
        lock = _lock_data_path(options.data_path)
        options = check_nsqd_options(options)
        # nsqd.New logs these once its options are checked, then listens.
        _setup_logging(options.log_prefix, options.log_level, sys.stderr)
        log = logging.getLogger("fakensq.nsqd.main")
        log.info(version_string("nsqd"))
        log.info("ID: %d", options.node_id)
        _check_listeners(options.tcp_address, options.http_address)
    except ValueError as exc:
        if lock is not None:
            os.close(lock)
        return _fatal(options.log_prefix, f"failed to instantiate nsqd - {exc}")
    try:
        try:
            trio.run(_run_nsqd, options)
        except (OSError, ValueError) as exc:
            return _fatal(options.log_prefix, f"failed to start nsqd - {_first_error(exc)}")
        except BaseExceptionGroup as group:
            return _fatal(options.log_prefix, f"failed to start nsqd - {_first_error(group)}")
        return 0
    finally:
        os.close(lock)


def _lock_data_path(path: str) -> int:
    """nsqd's dirlock: an exclusive flock on the data folder for the process's
    life (a second nsqd on the same folder is refused); its descriptor."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise ValueError(f"failed to lock data-path: {_go_os_error(exc)}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        reason = _go_os_error(exc)
        raise ValueError(
            f"failed to lock data-path: cannot flock directory {path} - {reason} "
            "(possibly in use by another instance of nsqd)"
        ) from None
    return fd


def _go_os_error(exc: OSError, op: str = "open") -> str:
    """An OSError as Go's os.PathError prints: ``open /x: no such file or directory``."""
    reason = exc.strerror or str(exc)
    reason = reason[:1].lower() + reason[1:]
    return f"{op} {exc.filename}: {reason}" if exc.filename else reason


def check_nsqd_options(options: NSQDOptions) -> NSQDOptions:
    """nsqd.New's checks, in its order, with its texts (ValueError); returns the
    options as nsqd goes on with them (a client auth policy requires TLS)."""
    if not 1 <= options.max_deflate_level <= 9:
        raise ValueError("--max-deflate-level must be [1,9]")
    if not 0 <= options.node_id < 1024:
        raise ValueError("--node-id must be [0,1024)")
    if options.tls_client_auth_policy and options.tls_required == TLS_NOT_REQUIRED:
        options = options.replace(tls_required=TLS_REQUIRED)
    has_tls = bool(options.tls_cert or options.tls_key)
    if has_tls:
        for path in (options.tls_cert, options.tls_key):
            try:
                with open(path, "rb"):
                    pass
            except OSError as exc:
                raise ValueError(f"failed to build TLS config - {_go_os_error(exc)}") from None
    if not has_tls and options.tls_required != TLS_NOT_REQUIRED:
        raise ValueError("cannot require TLS client connections without TLS key and cert")
    for value in options.e2e_processing_latency_percentiles:
        if not 0 < value <= 1:
            raise ValueError(f"invalid E2E processing latency percentile: {format_float(value)}")
    return options


def _check_listeners(*addresses: str, unix: bool = True) -> None:
    """nsqd.New's and nsqlookupd.New's listens, in order: ValueError with
    ``listen (ADDRESS) failed - ...`` for the first that would fail."""
    from ..nsqd.listeners import listen_error

    for address in addresses:
        if address:
            error = listen_error(address, unix=unix)
            if error is not None:
                raise ValueError(f"listen ({address}) failed - {error}")


def _first_error(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


async def _run_nsqd(options: NSQDOptions) -> None:
    from ..nsqd.lookup_peer import lookup_peers_of, run_lookup_peers
    from ..nsqd.node import NSQD

    log = logging.getLogger("fakensq.nsqd.main")
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with NSQD(options=options) as nsqd:
            log.info("TCP: listening on %s", nsqd.tcp_address)
            if nsqd.http_address:
                log.info("HTTP: listening on %s", nsqd.http_address)
            if nsqd.https_address:
                log.info("HTTPS: listening on %s", nsqd.https_address)
            async with trio.open_nursery() as nursery:
                if lookup_peers_of(nsqd) is None and options.lookupd_tcp_addresses:
                    await nursery.start(run_lookup_peers, nsqd)
                await _wait_for_signal(signals)
                nursery.cancel_scope.cancel()
            log.info("TCP: closing %s", nsqd.tcp_address)
            if nsqd.http_address:
                log.info("HTTP: closing %s", nsqd.http_address)


def nsqlookupd_main(argv: Sequence[str] | None = None) -> int:
    """The ``nsqlookupd`` command: parse nsqlookupd's flags, serve until a signal."""
    options = _daemon_options(
        "nsqlookupd", nsqlookupd_flagset(), nsqlookupd_options_from_flags, argv
    )
    if isinstance(options, int):
        return options
    _setup_logging(options.log_prefix, options.log_level, sys.stderr)
    # nsqlookupd.New logs its version, then listens.
    logging.getLogger("fakensq.nsqlookupd").info(
        version_string("nsqlookupd"), extra={"nsq_prefix": options.log_prefix}
    )
    try:
        _check_listeners(options.tcp_address, options.http_address, unix=False)
    except ValueError as exc:
        # nsqlookupd's main.go passes the error to a format without a verb:
        # Go prints it as %!(EXTRA ...).
        return _fatal(
            options.log_prefix,
            f"failed to instantiate nsqlookupd%!(EXTRA *errors.errorString={exc})",
        )
    try:
        trio.run(_run_nsqlookupd, options)
    except (OSError, ValueError) as exc:
        return _fatal(options.log_prefix, f"failed to start nsqlookupd - {_first_error(exc)}")
    except BaseExceptionGroup as group:
        return _fatal(options.log_prefix, f"failed to start nsqlookupd - {_first_error(group)}")
    return 0


async def _run_nsqlookupd(options: LookupdOptions) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        # NSQLookupd logs "TCP: listening on" and "HTTP: listening on" itself.
        async with NSQLookupd(options):
            await _wait_for_signal(signals)


def cluster_flagset() -> FlagSet:
    fs = FlagSet("fakensq cluster")
    fs.add_int("nsqd", 1, "number of nsqds", "nsqd")
    fs.add_int("lookupd", 1, "number of nsqlookupds", "lookupd")
    fs.add_string("host", "127.0.0.1", "address every node listens on and broadcasts", "host")
    fs.add_int(
        "base-port",
        0,
        "first port: nsqd i listens on base+2i (TCP) and base+2i+1 (HTTP), nsqlookupd j on "
        "base+100+2j and base+101+2j (default 0: free ports)",
        "base_port",
    )
    fs.add_string("data-path", "", "directory for the nsqds' data (default: a temporary one)")
    fs.add_string(
        "admin-http-address",
        "",
        "<addr>:<port> to serve the admin web UI on, with fault controls (default: none)",
    )
    fs.add_string(
        "log-level", "warn", "set log verbosity: debug, info, warn, error, or fatal", "log_level"
    )
    return fs


def cluster_main(argv: Sequence[str]) -> int:
    """``fakensq cluster``: run a Cluster, print its addresses, stop on Ctrl-C."""
    fs = cluster_flagset()
    values = _parse_or_exit(fs, argv)
    if isinstance(values, int):
        return values
    n_nsqd = values.get("nsqd", 1)
    n_lookupd = values.get("lookupd", 1)
    base = values.get("base-port", 0)
    nsqd_ports = [(base + 2 * i, base + 2 * i + 1) if base else (0, 0) for i in range(n_nsqd)]
    lookupd_ports = [
        (base + 100 + 2 * j, base + 101 + 2 * j) if base else (0, 0) for j in range(n_lookupd)
    ]
    _setup_logging("[fakensq] ", values.get("log-level", "warn"), sys.stderr)

    async def run() -> None:
        from ..testing.cluster import Cluster

        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with Cluster(
                nsqd=n_nsqd,
                lookupd=n_lookupd,
                host=values.get("host", "127.0.0.1"),
                nsqd_ports=nsqd_ports,
                lookupd_ports=lookupd_ports,
                data_root=values.get("data-path") or None,
            ) as cluster:
                admin_address = values.get("admin-http-address", "")
                if not admin_address:
                    _print_cluster(cluster)
                    await _wait_for_signal(signals)
                    return
                from ..admin import Admin

                async with Admin(cluster=cluster, http_address=admin_address) as admin:
                    _print_cluster(cluster, admin_url=admin.url)
                    await _wait_for_signal(signals)

    try:
        trio.run(run)
    except (OSError, BaseExceptionGroup) as exc:
        return _fatal("[fakensq] ", f"failed to start the cluster - {_first_error(exc)}")
    return 0


def _print_cluster(cluster: Any, admin_url: str = "") -> None:
    out = sys.stdout
    for i, (tcp, http) in enumerate(
        zip(cluster.nsqd_tcp_addresses, cluster.nsqd_http_addresses, strict=True)
    ):
        print(f"nsqd {i}: tcp {tcp} http {http}", file=out)
    for j, (tcp, http) in enumerate(
        zip(cluster.lookupd_tcp_addresses, cluster.lookupd_http_addresses, strict=True)
    ):
        print(f"nsqlookupd {j}: tcp {tcp} http {http}", file=out)
    print("NSQD_TCP_ADDRESSES=" + ",".join(cluster.nsqd_tcp_addresses), file=out)
    print("NSQD_HTTP_ADDRESSES=" + ",".join(cluster.nsqd_http_addresses), file=out)
    print("NSQLOOKUPD_TCP_ADDRESSES=" + ",".join(cluster.lookupd_tcp_addresses), file=out)
    print("NSQLOOKUPD_HTTP_ADDRESSES=" + ",".join(cluster.lookupd_http_addresses), file=out)
    if admin_url:
        print(f"ADMIN_URL={admin_url}", file=out)
    print("ready (Ctrl-C to stop)", file=out, flush=True)


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
        "admin": _admin_main,
        "proxy": _proxy_main,
    }
    run = commands.get(command)
    if run is None:
        sys.stderr.write(f"fakensq: unknown command {command!r}\n{_USAGE}")
        return 2
    return run(rest)


def _admin_main(argv: Sequence[str]) -> int:
    from ..admin.cli import admin_main

    return admin_main(argv)


def _proxy_main(argv: Sequence[str]) -> int:
    from ..testing.proxy import proxy_main

    return proxy_main(list(argv))


def _shims_main(argv: Sequence[str]) -> int:
    from .shims import write_shims

    if len(argv) != 1:
        sys.stderr.write("usage: fakensq shims DIR\n")
        return 2
    for path in write_shims(argv[0]):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
