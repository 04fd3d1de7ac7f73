"""Client configuration: every option a Consumer or Producer accepts, validated once.

Defaults follow go-nsq's where NSQ's client guide leaves a choice open.  Times are
seconds as floats; they are converted to nsqd's milliseconds on the wire.
"""

from __future__ import annotations

import dataclasses
import math
import os
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

from .protocol.frames import DEFAULT_MAX_FRAME_SIZE
from .protocol.identify import IdentifyBody
from .transport import Connector, parse_address, tcp_connector

if TYPE_CHECKING:
    import httpx

__all__ = ["BackoffPolicy", "Config"]

#: a span or metric attribute's value (OpenTelemetry's primitive types)
AttributeValue: TypeAlias = str | bool | int | float

_VERSION = "0.1.0"


def _check_number(
    name: str,
    value: object,
    *,
    minimum: float = 0.0,
    allow_none: bool = False,
    strictly_positive: bool = False,
) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, not {type(value).__name__}")
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if strictly_positive and value <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")


def _check_int(name: str, value: object, *, minimum: int, maximum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise ValueError(f"{name} must be {bound}, got {value!r}")


def _check_lookupd_address(address: str) -> None:
    # Imported here: only lookupd users pay for importing httpx.
    import httpx

    url = address if "://" in address else f"http://{address}"
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise ValueError(f"invalid lookupd address {address!r}: {exc}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"invalid lookupd address {address!r}: expected host:port or a URL")


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    """How long a Consumer pauses after handler failures.

    The pause after ``n`` consecutive failures (net of successes) is
    ``base * multiplier ** (n - 1)``, capped at ``max``, then shortened by a random
    fraction up to ``jitter`` (``0`` disables jitter) so that consumers do not
    resume in lockstep.
    """

    base: float = 1.0
    max: float = 120.0
    multiplier: float = 2.0
    jitter: float = 0.3

    def __post_init__(self) -> None:
        _check_number("backoff base", self.base, strictly_positive=True)
        _check_number("backoff max", self.max, strictly_positive=True)
        _check_number("backoff multiplier", self.multiplier, minimum=1.0)
        _check_number("backoff jitter", self.jitter)
        if self.jitter > 1:
            raise ValueError(f"backoff jitter must be between 0 and 1, got {self.jitter!r}")
        if self.max < self.base:
            raise ValueError("backoff max must be >= backoff base")


#: Config fields whose values never show (repr, logs, errors)
_SECRETS = frozenset({"auth_secret", "tls_key_password"})


class KeyPasswordMissing(ValueError):
    """``tls_key`` is encrypted and no ``tls_key_password`` was given."""


def load_client_certificate(context: ssl.SSLContext, config: Config) -> None:
    """Load ``config``'s client certificate into ``context`` (one of
    trionsq's own).  OpenSSL is never left to prompt for a key's password on
    the terminal: an encrypted key without ``tls_key_password`` raises
    :class:`KeyPasswordMissing`."""
    password = config.tls_key_password

    def give_password() -> str | bytes:
        if password is None:
            raise KeyPasswordMissing("tls_key is encrypted: set tls_key_password")
        return password

    assert config.tls_cert is not None
    context.load_cert_chain(config.tls_cert, config.tls_key, password=give_password)


def tls_context(config: Config) -> ssl.SSLContext:
    """The context a TLS connection uses: the caller's own, as it is (never
    changed: it may be shared, and another client would then present what
    was loaded into it; Config refuses a client certificate with one), or a
    new one of trionsq's for ``tls=True``, with the client certificate if
    any (a context per connection: a renewed certificate file is picked up
    at the next connection)."""
    if isinstance(config.tls, ssl.SSLContext):
        return config.tls
    context = ssl.create_default_context()
    if config.tls_cert is not None:
        load_client_certificate(context, config)
    return context


def _is_http_transport(value: object) -> bool:
    import httpx

    return isinstance(value, httpx.AsyncBaseTransport)


def _default_hostname() -> str:
    return socket.gethostname()


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """All connection and consumer options; Consumer and Producer take them as
    keyword arguments.  Times are in seconds.

    Where to connect
        ``nsqd_tcp_addresses`` (``"host:port"``, reconnected with
        ``reconnect_backoff``), ``lookupd_http_addresses`` (``"host:port"`` or a
        URL, polled every ``lookupd_poll_interval``, spread by
        ``lookupd_poll_jitter``, a fraction), ``connector`` (how a stream is
        opened; see :mod:`trionsq.transport`), ``http_transport`` (for lookupd),
        ``connect_timeout`` (connect and handshake).
    Consuming
        ``max_in_flight``, ``max_attempts`` (0: never give up),
        ``default_requeue_delay`` (times the attempts, capped at
        ``max_requeue_delay``), ``backoff`` (a :class:`BackoffPolicy`, True for
        the default one, False to disable), ``low_rdy_idle_timeout`` (how long a
        connection holds RDY while others wait, when ``max_in_flight`` is below
        the number of connections), ``close_timeout`` (how long leaving waits for
        handlers).
    Negotiated with nsqd (IDENTIFY)
        ``client_id``, ``hostname``, ``user_agent``, ``heartbeat_interval``
        (``None``: no heartbeats), ``msg_timeout``, ``output_buffer_size``,
        ``output_buffer_timeout``, ``sample_rate`` (0-99 %), ``tls`` (True for
        the system's trust store, or an :class:`ssl.SSLContext` of yours, used
        as it is: never changed), ``tls_cert`` / ``tls_key`` /
        ``tls_key_password`` (a client certificate, with ``tls=True``: loaded
        into a context of trionsq's own), ``snappy``, ``deflate``,
        ``deflate_level``, ``auth_secret`` (sent when nsqd requires AUTH).
    Observability (see :mod:`trionsq.telemetry`)
        ``telemetry`` (False: no spans or metrics whatever the providers),
        ``tracer_provider`` / ``meter_provider`` (OpenTelemetry providers;
        ``None``: the global ones), ``telemetry_attributes`` (added to every
        span and metric point), ``trace_context`` (a producer wraps each
        body in a W3C trace context envelope, a consumer unwraps it:
        :mod:`trionsq.tracecontext`).
    Limits
        ``read_timeout`` (silence after which a connection is considered dead;
        must exceed ``heartbeat_interval``), ``max_frame_size``,
        ``publish_window`` (a Producer's requests awaiting responses at once).

    Unknown keywords raise :class:`TypeError`; bad values raise :class:`ValueError`
    or :class:`TypeError` naming the option.  Secrets (``auth_secret``,
    ``tls_key_password``) never show in a repr or an error message.
    """

    nsqd_tcp_addresses: tuple[str, ...] = ()
    lookupd_http_addresses: tuple[str, ...] = ()
    max_in_flight: int = 1
    #: messages with more attempts than this are given up (0: never give up)
    max_attempts: int = 5
    tls: bool | ssl.SSLContext = False
    tls_cert: str | None = None
    tls_key: str | None = None
    #: the password of an encrypted ``tls_key`` (never prompted for)
    tls_key_password: str | bytes | None = None
    snappy: bool = False
    deflate: bool = False
    deflate_level: int = 6
    sample_rate: int = 0
    auth_secret: str | bytes | None = None
    #: ``None`` disables nsqd's heartbeats
    heartbeat_interval: float | None = 30.0
    #: ``None`` keeps nsqd's default
    msg_timeout: float | None = None
    lookupd_poll_interval: float = 60.0
    lookupd_poll_jitter: float = 0.3
    #: ``True`` for the default policy, ``False``/``None`` to never back off
    backoff: BackoffPolicy | bool | None = True
    default_requeue_delay: float = 90.0
    max_requeue_delay: float = 15 * 60.0
    client_id: str = field(default_factory=lambda: _default_hostname().split(".")[0])
    hostname: str = field(default_factory=_default_hostname)
    user_agent: str = f"trionsq/{_VERSION}"
    #: ``None`` keeps nsqd's default; ``-1`` disables output buffering
    output_buffer_size: int | None = None
    output_buffer_timeout: float | None = None
    low_rdy_idle_timeout: float = 10.0
    connect_timeout: float = 5.0
    read_timeout: float = 60.0
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    #: publishes a Producer keeps in flight on one connection before waiting
    publish_window: int = 256
    #: how long leaving a Consumer waits for in-flight handlers
    close_timeout: float = 30.0
    connector: Connector = tcp_connector
    #: delays between reconnects to a configured nsqd (jittered, growing, capped;
    #: from ``base`` again after a connection that worked)
    reconnect_backoff: BackoffPolicy = BackoffPolicy(base=1.0, max=60.0, multiplier=2.0)
    #: an httpx transport for lookupd queries (tests and simulations swap it)
    http_transport: httpx.AsyncBaseTransport | None = None
    #: ``False``: no OpenTelemetry spans or metrics, whatever is configured
    telemetry: bool = True
    #: an OpenTelemetry TracerProvider (``None``: the global one)
    tracer_provider: Any = None
    #: an OpenTelemetry MeterProvider (``None``: the global one)
    meter_provider: Any = None
    #: wrap (producer) and unwrap (consumer) bodies in the trace context envelope
    trace_context: bool = False
    #: attributes added to every span and metric point of the client (a
    #: mapping; kept as sorted pairs), e.g. the Spark executor's id
    telemetry_attributes: Mapping[str, AttributeValue] | tuple[tuple[str, AttributeValue], ...] = ()

    def __post_init__(self) -> None:
        for name in ("nsqd_tcp_addresses", "lookupd_http_addresses"):
            value: Any = getattr(self, name)
            if isinstance(value, str | bytes):
                raise TypeError(f"{name} must be a list of 'host:port' strings, not a string")
            addresses = tuple(value)
            for address in addresses:
                if name == "nsqd_tcp_addresses":
                    parse_address(address)
                elif not isinstance(address, str) or not address:
                    raise TypeError(f"{name} entries must be non-empty strings")
                else:
                    _check_lookupd_address(address)
            object.__setattr__(self, name, addresses)
        _check_int("max_in_flight", self.max_in_flight, minimum=0)
        _check_int("max_attempts", self.max_attempts, minimum=0, maximum=65535)
        self._check_tls()
        self._check_telemetry_attributes()
        for flag in ("snappy", "deflate", "telemetry", "trace_context"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"{flag} must be a bool")
        if self.snappy and self.deflate:
            raise ValueError("snappy and deflate are mutually exclusive")
        _check_int("deflate_level", self.deflate_level, minimum=1, maximum=9)
        _check_int("sample_rate", self.sample_rate, minimum=0, maximum=99)
        if self.auth_secret is not None and not isinstance(self.auth_secret, str | bytes):
            raise TypeError("auth_secret must be a str or bytes")
        _check_number(
            "heartbeat_interval", self.heartbeat_interval, allow_none=True, strictly_positive=True
        )
        if self.heartbeat_interval is not None and self.heartbeat_interval < 1:
            raise ValueError("heartbeat_interval must be >= 1 second (nsqd's minimum)")
        _check_number("msg_timeout", self.msg_timeout, allow_none=True, strictly_positive=True)
        _check_number("lookupd_poll_interval", self.lookupd_poll_interval, strictly_positive=True)
        _check_number("lookupd_poll_jitter", self.lookupd_poll_jitter)
        if self.lookupd_poll_jitter > 1:
            raise ValueError("lookupd_poll_jitter must be between 0 and 1")
        if self.backoff is None:
            object.__setattr__(self, "backoff", False)
        if not isinstance(self.backoff, bool | BackoffPolicy):
            raise TypeError("backoff must be a BackoffPolicy, True or False")
        _check_number("default_requeue_delay", self.default_requeue_delay)
        _check_number("max_requeue_delay", self.max_requeue_delay)
        for name in ("client_id", "hostname", "user_agent"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"{name} must be a str")
        if self.output_buffer_size is not None:
            _check_int("output_buffer_size", self.output_buffer_size, minimum=-1)
        _check_number("output_buffer_timeout", self.output_buffer_timeout, allow_none=True)
        _check_number("low_rdy_idle_timeout", self.low_rdy_idle_timeout, strictly_positive=True)
        _check_number("connect_timeout", self.connect_timeout, strictly_positive=True)
        _check_number("read_timeout", self.read_timeout, strictly_positive=True)
        if self.heartbeat_interval is not None and self.read_timeout <= self.heartbeat_interval:
            raise ValueError("read_timeout must be longer than heartbeat_interval")
        _check_int("max_frame_size", self.max_frame_size, minimum=64)
        _check_int("publish_window", self.publish_window, minimum=1)
        _check_number("close_timeout", self.close_timeout)
        if not isinstance(self.reconnect_backoff, BackoffPolicy):
            raise TypeError("reconnect_backoff must be a BackoffPolicy")
        if self.http_transport is not None and not _is_http_transport(self.http_transport):
            raise TypeError("http_transport must be an httpx.AsyncBaseTransport")
        if not callable(self.connector):
            raise TypeError("connector must be an async callable (host, port) -> Stream")

    def _check_telemetry_attributes(self) -> None:
        given = self.telemetry_attributes
        pairs = tuple(given.items()) if isinstance(given, Mapping) else tuple(given)
        for pair in pairs:
            if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)):
                raise TypeError("telemetry_attributes must map names (str) to values")
            if not isinstance(pair[1], str | bool | int | float):
                raise TypeError(
                    f"telemetry_attributes[{pair[0]!r}] must be a str, bool, int or float"
                )
        object.__setattr__(self, "telemetry_attributes", tuple(sorted(pairs)))

    def _check_tls(self) -> None:
        if not isinstance(self.tls, bool | ssl.SSLContext):
            raise TypeError("tls must be True, False or an ssl.SSLContext")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key must be given together")
        password = self.tls_key_password
        if password is not None and not isinstance(password, str | bytes):
            raise TypeError("tls_key_password must be a str or bytes")
        if password is not None and self.tls_key is None:
            raise ValueError("tls_key_password needs tls_key")
        if self.tls_cert is None:
            return
        if self.tls is False:
            raise ValueError("tls_cert/tls_key need tls enabled")
        if isinstance(self.tls, ssl.SSLContext):
            # Loading the certificate would change the caller's context, which
            # may be shared (another client would then present this
            # certificate), and an SSLContext cannot be copied.
            raise ValueError(
                "tls_cert/tls_key go with tls=True (trionsq loads them into a "
                "context of its own); trionsq never changes an ssl.SSLContext it "
                "is given: load the certificate into yours (context.load_cert_chain) "
                "and pass only tls=context"
            )
        for name in ("tls_cert", "tls_key"):
            path = getattr(self, name)
            if not os.path.isfile(path):
                raise ValueError(f"{name}: no such file {path!r}")
        # Load them once now: a wrong password or a key that does not match
        # fails here, naming the option, rather than at every connection.
        try:
            load_client_certificate(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), self)
        except ssl.SSLError as exc:
            raise ValueError(
                f"tls_cert/tls_key: cannot load the certificate and key ({exc.reason or exc}; "
                "a wrong tls_key_password, or a key that is not the certificate's?)"
            ) from None

    def __repr__(self) -> str:
        # The dataclass repr, with secrets masked: a Config is logged, shown
        # in tracebacks and debuggers.
        parts = []
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            shown = "'***'" if item.name in _SECRETS and value is not None else repr(value)
            parts.append(f"{item.name}={shown}")
        return f"Config({', '.join(parts)})"

    @property
    def backoff_policy(self) -> BackoffPolicy | None:
        """The effective policy, or ``None`` when backoff is disabled."""
        if self.backoff is True:
            return BackoffPolicy()
        if isinstance(self.backoff, BackoffPolicy):
            return self.backoff
        return None

    def replace(self, **changes: Any) -> Config:
        return dataclasses.replace(self, **changes)

    def requeue_delay(self, attempts: int) -> float:
        """A requeue's delay when none is given: ``default_requeue_delay``
        times the attempts, capped at ``max_requeue_delay`` (go-nsq's)."""
        return min(self.default_requeue_delay * attempts, self.max_requeue_delay)

    def identify_body(self) -> IdentifyBody:
        """The IDENTIFY JSON, with times in milliseconds as nsqd expects."""
        body: IdentifyBody = {
            "client_id": self.client_id,
            "hostname": self.hostname,
            "user_agent": self.user_agent,
            "feature_negotiation": True,
            "heartbeat_interval": (
                -1 if self.heartbeat_interval is None else int(self.heartbeat_interval * 1000)
            ),
            "tls_v1": self.tls is not False,
            "snappy": self.snappy,
            "deflate": self.deflate,
            "deflate_level": self.deflate_level,
            "sample_rate": self.sample_rate,
        }
        if self.output_buffer_size is not None:
            body["output_buffer_size"] = self.output_buffer_size
        if self.output_buffer_timeout is not None:
            body["output_buffer_timeout"] = int(self.output_buffer_timeout * 1000)
        if self.msg_timeout is not None:
            body["msg_timeout"] = int(self.msg_timeout * 1000)
        return body
