"""nsqd v1.3's command-line flags, each mapped onto its :class:`NSQDOptions`
field, and the ``cfg`` names (``GET /config/<name>``, config files) they go by.
"""

from __future__ import annotations

import functools
from typing import Final

from trionsq.protocol.names import go_quote
from trionsq.tools.flags import Flag, FlagFatal, FlagSet, FlagValueError, go_float

from ..golang.lg import HTTP_CLIENT_TIMEOUT_FLAGS, OptionFlag, add_option_flags, daemon_flagset
from .options import TLS_NOT_REQUIRED, TLS_REQUIRED, TLS_REQUIRED_EXCEPT_HTTP, NSQDOptions

__all__ = [
    "CFG_ALIASES",
    "DURATION_FIELDS",
    "TLS_VERSIONS",
    "nsqd_cfg_fields",
    "nsqd_command_defaults",
    "nsqd_flagset",
    "parse_tls_min_version",
    "parse_tls_required",
]


def parse_tls_required(text: str) -> int:
    """``--tls-required`` (and its config key): nsqd's tlsRequiredOption."""
    lowered = text.lower()
    if lowered == "tcp-https":
        return TLS_REQUIRED_EXCEPT_HTTP
    if lowered in ("1", "t", "true"):
        return TLS_REQUIRED
    if lowered in ("0", "f", "false"):
        return TLS_NOT_REQUIRED
    raise FlagValueError(f'strconv.ParseBool: parsing "{lowered}": invalid syntax')


#: ``--tls-min-version``'s names and Go's numbers (``/config/tls_min_version``).
TLS_VERSIONS: Final = {"ssl3.0": 768, "tls1.0": 769, "tls1.1": 770, "tls1.2": 771, "tls1.3": 772}


def parse_tls_min_version(text: str) -> str:
    """``--tls-min-version`` (and its config key): nsqd's tlsMinVersionOption."""
    lowered = text.lower()
    if lowered and lowered not in TLS_VERSIONS:
        raise FlagValueError(f"unknown tlsVersionOption {go_quote(lowered)}")
    return lowered


def _parse_percentiles(text: str) -> list[float]:
    # nsqd's FloatArray.Set: log.Fatalf on a part it cannot parse.
    values = []
    for part in text.split(","):
        try:
            values.append(go_float(part))
        except FlagValueError:
            raise FlagFatal(f"Could not parse: {part}") from None
    return values


def nsqd_command_defaults() -> NSQDOptions:
    """The options of ``nsqd`` run with no flags: v1.3.0's defaults (all
    interfaces, ports 4150/4151/4152), where the in-process :class:`NSQDOptions`
    listens on loopback."""
    return NSQDOptions(
        tcp_address="0.0.0.0:4150",
        http_address="0.0.0.0:4151",
        https_address="0.0.0.0:4152",
    )


_ADDRESS_USAGE: Final = (
    "address to listen on for {} clients (<addr>:<port> for TCP/IP or <path> for unix socket)"
)


#: nsqd's flags that each set the option of their name, with its default:
#: (declaration, name, usage), in nsqd's order.
_OPTION_FLAGS: Final[tuple[OptionFlag, ...]] = (
    (
        "int",
        "node-id",
        "unique part for message IDs, (int) in range [0,1024) (default is hash of hostname)",
    ),
    ("string", "https-address", "<addr>:<port> to listen on for HTTPS clients"),
    ("string", "http-address", _ADDRESS_USAGE.format("HTTP")),
    ("string", "tcp-address", _ADDRESS_USAGE.format("TCP")),
    (
        "string",
        "broadcast-address",
        "address that will be registered with lookupd (defaults to the OS hostname)",
    ),
    (
        "int",
        "broadcast-tcp-port",
        "TCP port that will be registered with lookupd "
        "(defaults to the TCP port that this nsqd is listening on)",
    ),
    (
        "int",
        "broadcast-http-port",
        "HTTP port that will be registered with lookupd "
        "(defaults to the HTTP port that this nsqd is listening on)",
    ),
    *HTTP_CLIENT_TIMEOUT_FLAGS,
    # diskqueue options
    ("string", "data-path", "path to store disk-backed messages"),
    ("int", "mem-queue-size", "number of messages to keep in memory (per topic/channel)"),
    ("int", "max-bytes-per-file", "number of bytes per diskqueue file before rolling"),
    ("int", "sync-every", "number of messages per diskqueue fsync"),
    ("duration", "sync-timeout", "duration of time per diskqueue fsync"),
    (
        "int",
        "queue-scan-worker-pool-max",
        "max concurrency for checking in-flight and deferred message timeouts",
    ),
    (
        "int",
        "queue-scan-selection-count",
        "number of channels to check per cycle (every 100ms) for in-flight and deferred timeouts",
    ),
    # msg and command options
    ("duration", "msg-timeout", "default duration to wait before auto-requeing a message"),
    ("duration", "max-msg-timeout", "maximum duration before a message will timeout"),
    ("int", "max-msg-size", "maximum size of a single message in bytes"),
    ("duration", "max-req-timeout", "maximum requeuing timeout for a message"),
    ("int", "max-body-size", "maximum size of a single command body"),
    # client overridable configuration options
    (
        "duration",
        "max-heartbeat-interval",
        "maximum client configurable duration of time between client heartbeats",
    ),
    ("int", "max-rdy-count", "maximum RDY count for a client"),
    (
        "int",
        "max-output-buffer-size",
        "maximum client configurable size (in bytes) for a client output buffer",
    ),
    (
        "duration",
        "max-output-buffer-timeout",
        "maximum client configurable duration of time between flushing to a client",
    ),
    (
        "duration",
        "min-output-buffer-timeout",
        "minimum client configurable duration of time between flushing to a client",
    ),
    (
        "duration",
        "output-buffer-timeout",
        "default duration of time between flushing data to clients",
    ),
    (
        "int",
        "max-channel-consumers",
        "maximum channel consumer connection count per nsqd instance (default 0, i.e., unlimited)",
    ),
    # statsd integration options
    ("string", "statsd-address", "UDP <addr>:<port> of a statsd daemon for pushing stats"),
    ("duration", "statsd-interval", "duration between pushing to statsd"),
    ("bool", "statsd-mem-stats", "toggle sending memory and GC stats to statsd"),
    ("string", "statsd-prefix", "prefix used for keys sent to statsd (%s for host replacement)"),
    ("int", "statsd-udp-packet-size", "the size in bytes of statsd UDP packets"),
    (
        "bool",
        "statsd-exclude-ephemeral",
        "Skip ephemeral topics and channels when sending stats to statsd",
    ),
    # end to end percentile flags (and e2e-processing-latency-percentile below)
    (
        "duration",
        "e2e-processing-latency-window-time",
        "calculate end to end latency quantiles for this duration of time "
        "(ie: 60s would only show quantile calculations from the past 60 seconds)",
    ),
    # TLS config (and tls-required, tls-min-version below)
    ("string", "tls-cert", "path to certificate file"),
    ("string", "tls-key", "path to key file"),
    (
        "string",
        "tls-client-auth-policy",
        "client certificate auth policy ('require' or 'require-verify')",
    ),
    ("string", "tls-root-ca-file", "path to certificate authority file"),
    # compression
    ("bool", "deflate", "enable deflate feature negotiation (client compression)"),
    (
        "int",
        "max-deflate-level",
        "max deflate compression level a client can negotiate (> values == > nsqd CPU usage)",
    ),
    ("bool", "snappy", "enable snappy feature negotiation (client compression)"),
)


def nsqd_flagset(defaults: NSQDOptions | None = None) -> FlagSet:
    """nsqd v1.3's flags, each mapped onto its :class:`NSQDOptions` field."""
    o = defaults or nsqd_command_defaults()
    fs = daemon_flagset("nsqd", o.log_level)
    add_option_flags(fs, o, _OPTION_FLAGS)
    fs.bool("worker-id", False, "[deprecated] use --node-id", dest=None)  # ignored
    fs.strings(
        "auth-http-address",
        "<addr>:<port> or a full url to query auth server (may be given multiple times)",
        dest="auth_http_addresses",
    )
    fs.strings(
        "lookupd-tcp-address",
        "lookupd TCP address (may be given multiple times)",
        dest="lookupd_tcp_addresses",
    )
    fs.var(
        "e2e-processing-latency-percentile",
        _parse_percentiles,
        [],
        "message processing time percentiles (as float (0, 1.0]) to track "
        "(can be specified multiple times or comma separated '1.0,0.99,0.95', default none)",
        dest="e2e_processing_latency_percentiles",
        join="extend_sorted",
    )
    fs.var(
        "tls-required",
        parse_tls_required,
        o.tls_required,
        "require TLS for client connections (true, false, tcp-https)",
        kind="",
        is_bool=True,
        default_text=str(o.tls_required) if o.tls_required else "",
    )
    fs.var(
        "tls-min-version",
        parse_tls_min_version,
        o.tls_min_version,
        "minimum SSL/TLS version acceptable ('ssl3.0', 'tls1.0', 'tls1.1', 'tls1.2' or 'tls1.3')",
        default_text=o.tls_min_version,
    )
    return fs


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


#: nsqd's cfg names that are not fakensq's field names.
CFG_ALIASES: Final = {
    "nsqlookupd_tcp_addresses": "lookupd_tcp_addresses",
    "id": "node_id",
    "e2e_processing_latency_percentile": "e2e_processing_latency_percentiles",
}


#: The options that are durations (a config file gives them as Go's text or
#: integer milliseconds).
DURATION_FIELDS: Final = {
    f.dest for f in nsqd_flagset().flags.values() if f.kind == "duration" and f.dest
}
