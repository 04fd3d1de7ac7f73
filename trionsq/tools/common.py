"""What the tools share: flags, option mapping, reachability checks, stopping.

Flags are the Go tools' own (see :mod:`trionsq.tools.flags` for the syntax):
``--topic``, ``--channel``, ``--nsqd-tcp-address``, ``--lookupd-http-address``,
``--max-in-flight``, ``--consumer-opt``/``--producer-opt`` (go-nsq's option
names, ``name,value``), ``--status-every``; each is declared here once.  A
command line the Go tool would refuse after parsing (a missing flag, a bad
name) is a :class:`ToolError` with the Go tool's message (exit 1), and so is an
unreachable node.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import ssl
from collections.abc import Sequence
from typing import Any

from ..config import BackoffPolicy, Config, load_client_certificate
from ..connection import Connection, NegotiationError
from ..protocol.errors import NSQError
from ..protocol.names import is_valid_channel_name, is_valid_topic_name
from ..reasons import cannot_connect, reason
from .flags import FlagSet, explained, go_bool, go_int, seconds_or_duration

__all__ = [
    "STOP_GRACE",
    "GC_YOUNG_THRESHOLD",
    "tune_gc",
    "ToolError",
    "add_consumer_flags",
    "add_http_client_flags",
    "add_source_flags",
    "add_status_every",
    "add_tls_flags",
    "add_topic_flag",
    "check_names",
    "check_lookupds",
    "check_nsqds",
    "check_sources",
    "consumer_options",
    "opt_pair",
    "parse_opts",
    "producer_options",
    "reason",
    "require_sources",
    "tls_options",
]

log = logging.getLogger("trionsq.tools")

#: After SIGINT/SIGTERM, how long deliveries already under way (an HTTP
#: request, a publish) may take to complete before they are cancelled and their
#: messages requeued.  A second signal cancels at once.
STOP_GRACE = 1.0


class ToolError(Exception):
    """A failure to report in one line and exit 1 (a bad flag value the Go tool
    refuses after parsing, an unreachable node, a full disk)."""


# --- flags ---------------------------------------------------------------------


def add_topic_flag(flags: FlagSet, *, many: bool, help: str = "nsq topic") -> None:
    """``--topic``: repeatable (``many``) or a single string, as each Go tool has it."""
    if many:
        flags.strings("topic", f"{help} (may be given multiple times)", dest="topics")
    else:
        flags.string("topic", "", help)


def add_source_flags(flags: FlagSet) -> None:
    """``--nsqd-tcp-address`` and ``--lookupd-http-address`` (each repeatable)."""
    flags.strings("nsqd-tcp-address", "nsqd TCP address (may be given multiple times)")
    flags.strings("lookupd-http-address", "lookupd HTTP address (may be given multiple times)")


def add_tls_flags(flags: FlagSet) -> None:
    """TLS and AUTH, as trionsq flags (the Go tools take them as ``--consumer-opt``
    ``tls_v1,true``, ``tls_root_ca_file,FILE``, ...; both work)."""
    flags.bool("tls", False, "negotiate TLS with nsqd (trionsq; or --consumer-opt=tls_v1,true)")
    flags.string("tls-root-ca-file", "", "CA bundle to verify nsqd (implies --tls; trionsq)")
    flags.string("tls-cert", "", "client certificate (implies --tls; trionsq)")
    flags.string("tls-key", "", "client certificate's key (trionsq)")
    flags.bool("tls-insecure-skip-verify", False, "do not verify nsqd's certificate (trionsq)")
    flags.string("auth-secret", "", "secret sent when nsqd asks for AUTH (trionsq)")


def add_consumer_flags(
    flags: FlagSet,
    *,
    channel_default: str,
    channel_help: str = "nsq channel",
    many_topics: bool = True,
    topic_help: str = "nsq topic",
    consumer_opt_help: str = "http://godoc.org/github.com/nsqio/go-nsq#Config",
) -> None:
    """The flags every consuming tool has."""
    add_topic_flag(flags, many=many_topics, help=topic_help)
    flags.string("channel", channel_default, channel_help)
    add_source_flags(flags)
    flags.int("max-in-flight", 200, "max number of messages to allow in flight")
    flags.var(
        "consumer-opt",
        opt_pair,
        [],
        "option to passthrough to nsq.Consumer (may be given multiple times, "
        f"{consumer_opt_help}); go-nsq's names (name,value), or a trionsq.Config "
        "option (name=value)",
        join="append",
    )
    add_tls_flags(flags)


def add_status_every(flags: FlagSet, *, default: int, per: str = "") -> None:
    """``--status-every N``: a status line on stderr every N messages (0: none).

    nsq_to_http and nsq_to_nsq log their request statistics every N requests;
    every tool that has the flag here means the same count.
    """
    scope = f" ({per})" if per else ""
    flags.int(
        "status-every",
        default,
        f"the # of requests between logging status{scope}, 0 disables",
    )


def add_http_client_flags(flags: FlagSet, *, request_timeout: float) -> None:
    """The HTTP client timeouts of nsq_to_http, nsq_to_file and nsq_stat."""
    flags.duration(
        "http-client-connect-timeout", 2.0, "timeout for HTTP connect", plain_seconds=True
    )
    flags.duration(
        "http-client-request-timeout",
        request_timeout,
        "timeout for HTTP request",
        plain_seconds=True,
    )


# --- go-nsq options ------------------------------------------------------------


def opt_pair(text: str) -> tuple[str, str | None]:
    """``name,value`` (go-nsq's ConfigFlag; a bare name means true) or
    ``name=value`` (a trionsq.Config name), checked now: a bad one is a flag
    error, as in the Go tools."""
    if "," in text:
        name, _, raw = text.partition(",")
        value: str | None = raw
    elif "=" in text:
        name, _, raw = text.partition("=")
        name, value = name.replace("-", "_"), raw
    else:
        name, value = text, None
    try:
        parse_opts([(name, value)], "")
    except ToolError as exc:
        raise explained(str(exc)) from None
    return name, value


def _seconds(value: str) -> float:
    return seconds_or_duration(value)


#: go-nsq Config option -> (trionsq Config field, conversion).  Options with no
#: trionsq counterpart are accepted and ignored (see _IGNORED).
_GO_OPTIONS: dict[str, tuple[str, Any]] = {
    "read_timeout": ("read_timeout", _seconds),
    "dial_timeout": ("connect_timeout", _seconds),
    "lookupd_poll_interval": ("lookupd_poll_interval", _seconds),
    "lookupd_poll_jitter": ("lookupd_poll_jitter", float),
    "max_requeue_delay": ("max_requeue_delay", _seconds),
    "default_requeue_delay": ("default_requeue_delay", _seconds),
    "max_attempts": ("max_attempts", go_int),
    "low_rdy_idle_timeout": ("low_rdy_idle_timeout", _seconds),
    "client_id": ("client_id", str),
    "hostname": ("hostname", str),
    "user_agent": ("user_agent", str),
    "heartbeat_interval": ("heartbeat_interval", _seconds),
    "sample_rate": ("sample_rate", go_int),
    "tls_v1": ("tls", go_bool),
    "tls_cert": ("tls_cert", str),
    "tls_key": ("tls_key", str),
    "deflate": ("deflate", go_bool),
    "deflate_level": ("deflate_level", go_int),
    "snappy": ("snappy", go_bool),
    "output_buffer_size": ("output_buffer_size", go_int),
    "output_buffer_timeout": ("output_buffer_timeout", _seconds),
    "max_in_flight": ("max_in_flight", go_int),
    "msg_timeout": ("msg_timeout", _seconds),
    "auth_secret": ("auth_secret", str),
}
#: go-nsq options with no trionsq equivalent: accepted, logged, ignored.
_IGNORED = {
    "write_timeout",
    "local_addr",
    "backoff_strategy",
    "low_rdy_timeout",
    "rdy_redistribute_interval",
    "tls_min_version",
}
_CONFIG_FIELDS = {f.name: f for f in dataclasses.fields(Config)}
#: Config options whose values are objects, not text
_OBJECT_FIELDS = {"connector", "http_transport", "tracer_provider", "meter_provider"}


def _trionsq_value(name: str, text: str | None) -> Any:
    default: Any = getattr(Config(), name)
    if text is None:
        text = "true"
    lowered = text.lower()
    if isinstance(default, bool) or name == "backoff":
        if lowered in ("1", "t", "true", "yes", "on"):
            return True
        if lowered in ("0", "f", "false", "no", "off"):
            return False
        raise ValueError(f"expected true or false, got {text!r}")
    if lowered in ("none", "null") and default is None:
        return None
    if isinstance(default, int):
        return go_int(text)
    if isinstance(default, float) or default is None:
        return seconds_or_duration(text)
    return text


def parse_opts(pairs: Sequence[tuple[str, str | None]], flag: str) -> dict[str, Any]:
    """Config keywords from ``--consumer-opt``/``--producer-opt`` values."""
    options: dict[str, Any] = {}
    tls: dict[str, Any] = {}
    backoff: dict[str, float] = {}
    for name, text in pairs:
        value = "true" if text is None else text
        try:
            if name in _IGNORED:
                log.info("%s %s: no trionsq equivalent, ignored", flag, name)
            elif name in ("tls_root_ca_file", "tls_insecure_skip_verify"):
                tls[name] = value if name == "tls_root_ca_file" else go_bool(value)
            elif name == "max_backoff_duration":
                backoff["max"] = seconds_or_duration(value)
            elif name == "backoff_multiplier":
                backoff["base"] = seconds_or_duration(value)
            elif name in _GO_OPTIONS:
                field, convert = _GO_OPTIONS[name]
                options[field] = convert(value)
            elif name in _CONFIG_FIELDS and name not in _OBJECT_FIELDS:
                options[name] = _trionsq_value(name, text)
            else:
                raise ToolError(f"invalid option {name}")
        except (ValueError, TypeError) as exc:
            raise ToolError(f"failed to coerce option {name} ({value}) - {exc}") from None
    if backoff.get("max", 1.0) == 0:
        options["backoff"] = False  # go-nsq: a max_backoff_duration of 0 disables backoff
    elif backoff:
        policy = BackoffPolicy()
        base = backoff.get("base", policy.base)
        top = backoff.get("max", policy.max)
        options["backoff"] = BackoffPolicy(base=base, max=max(top, base))
    if tls:
        options.update(
            _tls_config(
                root_ca=tls.get("tls_root_ca_file") or None,
                skip_verify=bool(tls.get("tls_insecure_skip_verify")),
            )
        )
    return options


# --- TLS -----------------------------------------------------------------------


def _tls_config(root_ca: str | None, skip_verify: bool) -> dict[str, Any]:
    try:
        context = ssl.create_default_context(cafile=root_ca)
    except (OSError, ssl.SSLError) as exc:
        raise ToolError(f"--tls-root-ca-file: {exc}") from None
    if skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return {"tls": context}


def tls_options(args: argparse.Namespace) -> dict[str, Any]:
    """Config keywords from the TLS/AUTH flags."""
    options: dict[str, Any] = {}
    if args.tls_root_ca_file or args.tls_insecure_skip_verify:
        options.update(_tls_config(args.tls_root_ca_file or None, args.tls_insecure_skip_verify))
    elif args.tls or args.tls_cert:
        options["tls"] = True
    if args.tls_cert or args.tls_key:
        options["tls_cert"] = args.tls_cert or None
        options["tls_key"] = args.tls_key or None
    if args.auth_secret:
        options["auth_secret"] = args.auth_secret
    return options


# --- options -------------------------------------------------------------------


def _valid(options: dict[str, Any]) -> dict[str, Any]:
    context = options.get("tls")
    # A client certificate with --tls-root-ca-file: the context is the tool's
    # own (made by _tls_config), so the certificate is loaded into it here
    # (Config refuses one with a caller's context: it never changes those).
    own = isinstance(context, ssl.SSLContext) and options.get("tls_cert") is not None
    try:
        config = Config(**({**options, "tls": True} if own else options))
    except (ValueError, TypeError) as exc:
        raise ToolError(str(exc)) from None
    if own:
        assert isinstance(context, ssl.SSLContext)
        load_client_certificate(context, config)
        for name in ("tls_cert", "tls_key", "tls_key_password"):
            options.pop(name, None)
    return options


def consumer_options(args: argparse.Namespace) -> dict[str, Any]:
    """Config keywords from a consuming tool's flags (ToolError when invalid)."""
    options: dict[str, Any] = {
        "nsqd_tcp_addresses": tuple(args.nsqd_tcp_address),
        "lookupd_http_addresses": tuple(args.lookupd_http_address),
    }
    options.update(tls_options(args))
    options.update(parse_opts(args.consumer_opt, "--consumer-opt"))
    options["max_in_flight"] = args.max_in_flight
    if args.max_in_flight < 0:
        raise ToolError("--max-in-flight must be >= 0")
    return _valid(options)


def producer_options(args: argparse.Namespace) -> dict[str, Any]:
    """Config keywords from ``--producer-opt`` (and the TLS flags, when present)."""
    options: dict[str, Any] = {}
    if hasattr(args, "tls"):
        options.update(tls_options(args))
    options.update(parse_opts(args.producer_opt, "--producer-opt"))
    return _valid(options)


def require_sources(args: argparse.Namespace, suffix: str = "") -> None:
    """The Go tools' rule: nsqd addresses or lookupd addresses, not both."""
    if not args.nsqd_tcp_address and not args.lookupd_http_address:
        raise ToolError(f"--nsqd-tcp-address or --lookupd-http-address required{suffix}")
    if args.nsqd_tcp_address and args.lookupd_http_address:
        raise ToolError(f"use --nsqd-tcp-address or --lookupd-http-address not both{suffix}")


def check_names(
    topics: Sequence[str],
    channel: str,
    *,
    topic_error: str = "invalid topic name",
    channel_error: str = "invalid channel name",
) -> None:
    """nsq_tail's messages for a bad topic or channel name."""
    for topic in topics:
        if not is_valid_topic_name(topic):
            raise ToolError(topic_error)
    if not is_valid_channel_name(channel):
        raise ToolError(channel_error)


# --- reachability --------------------------------------------------------------


async def check_nsqds(addresses: Sequence[str], config: Config) -> None:
    """Connect and handshake with every nsqd (TLS, AUTH included), then hang up.

    Like go-nsq's ``ConnectToNSQD``, a tool refuses to start when a node it was
    told about is unreachable, rather than retrying silently forever.
    """
    for address in addresses:
        try:
            conn = await Connection.open(address, config)
        except (NSQError, NegotiationError) as exc:
            raise ToolError(cannot_connect(address, exc)) from None
        await conn.aclose()


async def check_lookupds(addresses: Sequence[str], wait: float = 5.0) -> None:
    """``GET /ping`` every nsqlookupd; fail when none answers (one is enough)."""
    import httpx  # only the tools that use nsqlookupd pay for importing it

    failures: list[str] = []
    async with httpx.AsyncClient(timeout=wait) as client:
        for address in addresses:
            base = (address if "://" in address else f"http://{address}").rstrip("/")
            try:
                response = await client.get(f"{base}/ping")
                response.raise_for_status()
            except httpx.HTTPError as exc:
                failures.append(f"{address}: {reason(exc, address)}")
    if failures and len(failures) == len(addresses):
        raise ToolError("no nsqlookupd reachable (" + "; ".join(failures) + ")")
    for failure in failures:
        log.warning("nsqlookupd %s", failure)


async def check_sources(config: Config) -> None:
    """Reachability of what a consumer was told to use."""
    if config.nsqd_tcp_addresses:
        await check_nsqds(config.nsqd_tcp_addresses, config)
    if config.lookupd_http_addresses:
        await check_lookupds(config.lookupd_http_addresses, config.connect_timeout)


#: Allocations between two collections of the youngest generation (Python's
#: default is 700).
GC_YOUNG_THRESHOLD = 7000


def tune_gc() -> None:
    """Garbage collection for a tool's run, which holds up to --max-in-flight messages.

    With Python's defaults a tool spent 3-8% of its CPU in the collector, more
    with more messages held (at 10,000 in flight the held messages and their
    frames reach the oldest generation, and a full collection traverses them
    and every module, class and function loaded at start).  So: what start-up
    made is frozen (never traversed again: it lives as long as the process
    anyway; not collected first, which would cost more than the little garbage
    of the imports), and the young generation is collected ten times less
    often (a tool's messages form no reference cycles; what does, Trio's
    tasks and exceptions, is still collected, a little later).
    """
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
