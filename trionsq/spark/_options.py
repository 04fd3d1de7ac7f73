"""The data source's options: parsed from Spark's strings, validated once, with
errors that name the option.

Spark hands options over as a case-insensitive ``{name: str}`` mapping.  Every
value is checked here, on the driver, before any query runs: a typo or a bad
value fails ``load()``, ``save()`` or ``start()`` with a :class:`NSQOptionError`
that says which option and why, instead of a stuck stream or a task failure.
"""

from __future__ import annotations

import difflib
import math
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..config import Config, load_client_certificate
from ..protocol.names import is_valid_channel_name, is_valid_topic_name

__all__ = [
    "COMMON_OPTIONS",
    "SINK_OPTIONS",
    "SOURCE_OPTIONS",
    "ConnectionOptions",
    "NSQOptionError",
    "SinkOptions",
    "SourceOptions",
    "parse_sink_options",
    "parse_source_options",
]

#: nsqd's default max-rdy-count: how many messages one connection may hold in flight.
DEFAULT_MAX_RDY_COUNT = 2500
DEFAULT_MSG_TIMEOUT = 60.0
DEFAULT_MAX_BATCH_WAIT = 0.5
DEFAULT_CONNECTIONS_PER_NSQD = 16
DEFAULT_MAX_BYTES_IN_FLIGHT = 128 << 20
DEFAULT_SINK_BATCH_SIZE = 500

#: Options Spark itself adds or passes through (``save(path)``, ``writeStream``).
_SPARK_OPTIONS = frozenset({"path", "checkpointlocation"})

COMMON_OPTIONS = (
    "topic",
    "nsqd_tcp_addresses",
    "lookupd_http_addresses",
    "tls",
    "tls_ca_file",
    "tls_cert",
    "tls_key",
    "snappy",
    "deflate",
    "deflate_level",
    "auth_secret",
    "connect_timeout",
    "heartbeat_interval",
    "client_id",
)
SOURCE_OPTIONS = (
    "channel",
    "max_in_flight",
    "max_bytes_in_flight",
    "connections_per_nsqd",
    "max_messages_per_trigger",
    "max_batch_wait",
    "num_partitions",
    "msg_timeout",
    "max_attempts",
    "lookupd_poll_interval",
    "coordinator_host",
    "coordinator_port",
    "trace_context",
)
SINK_OPTIONS = ("value_column", "batch_size")


class NSQOptionError(ValueError):
    """A missing, unknown or bad option of the ``nsq`` data source."""

    def __init__(self, message: str) -> None:
        super().__init__(f"nsq data source: {message}")


# --- parsing helpers ----------------------------------------------------------


def _get(options: Mapping[str, str], name: str) -> str | None:
    value = options.get(name)
    if value is None:
        return None
    return str(value).strip()


def _required(options: Mapping[str, str], name: str, what: str) -> str:
    value = _get(options, name)
    if not value:
        raise NSQOptionError(f"option '{name}' is required ({what})")
    return value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    value = _get(options, name)
    if value is None or value == "":
        return default
    lowered = value.lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise NSQOptionError(f"option '{name}' must be true or false, got {value!r}")


def _int(
    options: Mapping[str, str], name: str, default: int, minimum: int, maximum: int | None = None
) -> int:
    value = _get(options, name)
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except ValueError:
        raise NSQOptionError(f"option '{name}' must be an integer, got {value!r}") from None
    if number < minimum or (maximum is not None and number > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise NSQOptionError(f"option '{name}' must be {bound}, got {number}")
    return number


def _auto_int(options: Mapping[str, str], name: str, minimum: int) -> int | None:
    """An integer option that may be left out (or ``auto``) for an automatic value."""
    value = _get(options, name)
    if value is None or value == "" or value.lower() == "auto":
        return None
    return _int(options, name, minimum, minimum=minimum)


_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def _bytes(options: Mapping[str, str], name: str, default: int) -> int:
    """A size: bytes, or with a k, m or g suffix (KiB, MiB, GiB); at least 1 KiB."""
    value = _get(options, name)
    if value is None or value == "":
        return default
    text = value.lower().removesuffix("b").removesuffix("i")
    unit = text[-1:] if text[-1:] in _UNITS else ""
    try:
        number = float(text[: len(text) - len(unit)]) * _UNITS[unit]
    except ValueError:
        raise NSQOptionError(
            f"option '{name}' must be a size in bytes (k, m or g suffixes), got {value!r}"
        ) from None
    if not math.isfinite(number) or number < 1024:
        raise NSQOptionError(f"option '{name}' must be at least 1k, got {value!r}")
    return int(number)


def _seconds(options: Mapping[str, str], name: str, default: float, minimum: float) -> float:
    value = _get(options, name)
    if value is None or value == "":
        return default
    try:
        number = float(value)
    except ValueError:
        raise NSQOptionError(
            f"option '{name}' must be a number of seconds, got {value!r}"
        ) from None
    if not math.isfinite(number) or number < minimum:
        raise NSQOptionError(f"option '{name}' must be >= {minimum:g} seconds, got {value!r}")
    return number


def _addresses(options: Mapping[str, str], name: str) -> tuple[str, ...]:
    value = _get(options, name) or ""
    return tuple(part.strip() for part in value.split(",") if part.strip())


def _check_known(
    options: Mapping[str, str], known: tuple[str, ...], other: tuple[str, ...]
) -> None:
    for key in options:
        name = str(key).lower()
        if name in _SPARK_OPTIONS or name in known:
            continue
        if name in other:
            side = "reading" if name in SOURCE_OPTIONS else "writing"
            raise NSQOptionError(f"option '{name}' only applies to {side}")
        close = difflib.get_close_matches(name, [*known, *other], n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise NSQOptionError(
            f"unknown option '{name}'{hint}; known options: {', '.join(sorted(known))}"
        )


# --- parsed options -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConnectionOptions:
    """Where and how to connect: what both directions share.

    Frozen and hashable (executors pool producers by it); plain data, so that it
    pickles (an SSL context is built where the connection is made).
    """

    nsqd_tcp_addresses: tuple[str, ...]
    lookupd_http_addresses: tuple[str, ...]
    tls: bool = False
    tls_ca_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    snappy: bool = False
    deflate: bool = False
    deflate_level: int = 6
    auth_secret: str | None = field(default=None, repr=False)
    connect_timeout: float = 5.0
    heartbeat_interval: float = 30.0
    client_id: str | None = None

    def config(self, *, check_files: bool = True, **extra: Any) -> Config:
        """The trionsq :class:`~trionsq.Config` (``extra``: consumer settings)."""
        tls: bool | ssl.SSLContext = self.tls
        if self.tls and self.tls_ca_file is not None and check_files:
            try:
                tls = ssl.create_default_context(cafile=self.tls_ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise NSQOptionError(f"option 'tls_ca_file': cannot load {exc}") from None
        keywords: dict[str, Any] = {
            "nsqd_tcp_addresses": self.nsqd_tcp_addresses,
            "lookupd_http_addresses": self.lookupd_http_addresses,
            "tls": tls,
            "snappy": self.snappy,
            "deflate": self.deflate,
            "deflate_level": self.deflate_level,
            "auth_secret": self.auth_secret,
            "connect_timeout": self.connect_timeout,
            "heartbeat_interval": self.heartbeat_interval,
            "read_timeout": max(60.0, 2 * self.heartbeat_interval),
        }
        if check_files:
            keywords["tls_cert"] = self.tls_cert
            keywords["tls_key"] = self.tls_key
        if self.client_id is not None:
            keywords["client_id"] = self.client_id
        keywords.update(extra)
        # A client certificate with tls_ca_file: the context is this
        # method's own, so the certificate is loaded into it (Config refuses
        # one with a caller's context: it never changes those).
        own = isinstance(tls, ssl.SSLContext) and keywords.get("tls_cert") is not None
        try:
            config = Config(**({**keywords, "tls": True} if own else keywords))
        except (TypeError, ValueError) as exc:
            raise NSQOptionError(str(exc)) from None
        if not own:
            return config
        assert isinstance(tls, ssl.SSLContext)
        load_client_certificate(tls, config)
        return config.replace(tls=tls, tls_cert=None, tls_key=None)


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """What ``spark.readStream.format("nsq")`` was given, validated.

    ``None`` means automatic: ``max_in_flight`` (per partition) is what nsqd grants
    each connection (its max-rdy-count), ``max_messages_per_trigger`` is everything
    the partitions hold, ``num_partitions`` is one per executor core.
    """

    topic: str
    channel: str
    connection: ConnectionOptions
    max_in_flight: int | None = None
    #: what a partition may hold in message bodies (its RDY follows their sizes)
    max_bytes_in_flight: int = DEFAULT_MAX_BYTES_IN_FLIGHT
    connections_per_nsqd: int = DEFAULT_CONNECTIONS_PER_NSQD
    max_messages_per_trigger: int | None = None
    max_batch_wait: float = DEFAULT_MAX_BATCH_WAIT
    num_partitions: int | None = None
    msg_timeout: float = DEFAULT_MSG_TIMEOUT
    max_attempts: int = 0
    lookupd_poll_interval: float = 60.0
    #: the address executors reach the driver's coordinator at (None: found)
    coordinator_host: str | None = None
    coordinator_port: int = 0
    #: take the trace context envelope off each body (see docs/observability.md)
    trace_context: bool = False

    def consumer_config(self) -> Config:
        return self.connection.config(
            max_in_flight=self.max_in_flight or DEFAULT_MAX_RDY_COUNT,
            # Always sent, so the touch schedule knows nsqd's timeout for us.
            msg_timeout=self.msg_timeout,
            max_attempts=self.max_attempts,
            # The source never requeues for a failure: no backoff to enter.
            backoff=False,
            lookupd_poll_interval=self.lookupd_poll_interval,
            # nsqd holds messages up to this long to fill a write (250 ms by default);
            # the source closes a batch when deliveries pause, so ask for nsqd's minimum.
            output_buffer_timeout=0.025,
            close_timeout=5.0,
        )


@dataclass(frozen=True, slots=True)
class SinkOptions:
    """What ``df.write.format("nsq")`` (or ``writeStream``) was given, validated."""

    topic: str
    connection: ConnectionOptions
    value_column: str | None = None
    batch_size: int = DEFAULT_SINK_BATCH_SIZE


def _connection_options(options: Mapping[str, str]) -> ConnectionOptions:
    tls_cert = _get(options, "tls_cert") or None
    tls_key = _get(options, "tls_key") or None
    tls_ca_file = _get(options, "tls_ca_file") or None
    tls = _bool(options, "tls", default=False)
    if not tls and (tls_cert or tls_key or tls_ca_file):
        raise NSQOptionError("options 'tls_ca_file', 'tls_cert' and 'tls_key' need tls=true")
    connection = ConnectionOptions(
        nsqd_tcp_addresses=_addresses(options, "nsqd_tcp_addresses"),
        lookupd_http_addresses=_addresses(options, "lookupd_http_addresses"),
        tls=tls,
        tls_ca_file=tls_ca_file,
        tls_cert=tls_cert,
        tls_key=tls_key,
        snappy=_bool(options, "snappy", default=False),
        deflate=_bool(options, "deflate", default=False),
        deflate_level=_int(options, "deflate_level", 6, minimum=1, maximum=9),
        auth_secret=_get(options, "auth_secret") or None,
        connect_timeout=_seconds(options, "connect_timeout", 5.0, minimum=0.001),
        heartbeat_interval=_seconds(options, "heartbeat_interval", 30.0, minimum=1.0),
        client_id=_get(options, "client_id") or None,
    )
    if connection.snappy and connection.deflate:
        raise NSQOptionError("options 'snappy' and 'deflate' are mutually exclusive")
    return connection


def _topic(options: Mapping[str, str]) -> str:
    topic = _required(options, "topic", "the NSQ topic")
    if not is_valid_topic_name(topic):
        raise NSQOptionError(
            f"option 'topic': {topic!r} is not a valid NSQ topic name "
            "(1-64 characters of [.a-zA-Z0-9_-], optionally ending in #ephemeral)"
        )
    return topic


def parse_source_options(options: Mapping[str, str]) -> SourceOptions:
    """Validate the options of ``readStream.format("nsq")``."""
    _check_known(options, (*COMMON_OPTIONS, *SOURCE_OPTIONS), SINK_OPTIONS)
    topic = _topic(options)
    channel = _required(options, "channel", "the NSQ channel to consume from")
    if not is_valid_channel_name(channel):
        raise NSQOptionError(
            f"option 'channel': {channel!r} is not a valid NSQ channel name "
            "(1-64 characters of [.a-zA-Z0-9_-], optionally ending in #ephemeral)"
        )
    connection = _connection_options(options)
    if not connection.nsqd_tcp_addresses and not connection.lookupd_http_addresses:
        raise NSQOptionError(
            "give 'nsqd_tcp_addresses' or 'lookupd_http_addresses' (comma-separated host:port)"
        )
    parsed = SourceOptions(
        topic=topic,
        channel=channel,
        connection=connection,
        max_in_flight=_auto_int(options, "max_in_flight", minimum=1),
        max_bytes_in_flight=_bytes(options, "max_bytes_in_flight", DEFAULT_MAX_BYTES_IN_FLIGHT),
        connections_per_nsqd=_int(
            options, "connections_per_nsqd", DEFAULT_CONNECTIONS_PER_NSQD, minimum=1, maximum=64
        ),
        max_messages_per_trigger=_auto_int(options, "max_messages_per_trigger", minimum=1),
        max_batch_wait=_seconds(options, "max_batch_wait", DEFAULT_MAX_BATCH_WAIT, minimum=0.0),
        num_partitions=_auto_int(options, "num_partitions", minimum=1),
        msg_timeout=_seconds(options, "msg_timeout", DEFAULT_MSG_TIMEOUT, minimum=1.0),
        max_attempts=_int(options, "max_attempts", 0, minimum=0, maximum=65535),
        lookupd_poll_interval=_seconds(options, "lookupd_poll_interval", 60.0, minimum=0.01),
        coordinator_host=_get(options, "coordinator_host") or None,
        coordinator_port=_int(options, "coordinator_port", 0, minimum=0, maximum=65535),
        trace_context=_bool(options, "trace_context", default=False),
    )
    parsed.consumer_config()  # what trionsq itself checks (addresses, TLS files...)
    return parsed


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    """Validate the options of ``write.format("nsq")`` / ``writeStream.format("nsq")``."""
    _check_known(options, (*COMMON_OPTIONS, *SINK_OPTIONS), SOURCE_OPTIONS)
    topic = _topic(options)
    connection = _connection_options(options)
    if not connection.nsqd_tcp_addresses and not connection.lookupd_http_addresses:
        raise NSQOptionError(
            "give 'nsqd_tcp_addresses' (the nsqds to publish to) or 'lookupd_http_addresses' "
            "(publish to the nsqds they list), or both"
        )
    parsed = SinkOptions(
        topic=topic,
        connection=connection,
        value_column=_get(options, "value_column") or None,
        batch_size=_int(options, "batch_size", DEFAULT_SINK_BATCH_SIZE, minimum=1),
    )
    # TLS files are checked where they are read: on the executors.
    connection.config(check_files=False)
    return parsed
