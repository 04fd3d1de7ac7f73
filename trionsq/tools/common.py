"""What the tools share: flags, option mapping, reachability checks, signals.

Flag names follow NSQ's Go utilities (``--nsqd-tcp-address``,
``--lookupd-http-address``, ``--max-in-flight``, ...), so that someone who knows
``nsq_tail`` feels at home; values go through :class:`trionsq.Config`, whose
errors become usage errors (exit 2).  An unreachable node is a :class:`ToolError`
(exit 1, one clear line on stderr).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import re
import signal
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import trio

from ..config import Config
from ..connection import Connection, NegotiationError
from ..protocol.errors import NSQError

__all__ = [
    "ToolError",
    "add_consumer_flags",
    "add_source_flags",
    "add_tls_flags",
    "check_lookupds",
    "check_nsqds",
    "consumer_options",
    "parse_duration",
    "source_options",
    "stop_on_signals",
    "tls_options",
]

log = logging.getLogger("trionsq.tools")


class ToolError(Exception):
    """A failure to report in one line and exit 1 (an unreachable node, a full disk)."""


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """A Go duration (``"1m30s"``, ``"250ms"``) or plain seconds (``"2.5"``), in seconds.

    Raises :class:`argparse.ArgumentTypeError`, so that argparse reports the flag.
    """
    value = text.strip()
    try:
        seconds = float(value)
    except ValueError:
        pos = 0
        seconds = 0.0
        while pos < len(value):
            match = _DURATION.match(value, pos)
            if match is None:
                raise argparse.ArgumentTypeError(f"invalid duration {text!r}") from None
            seconds += float(match.group(1)) * _UNITS[match.group(2)]
            pos = match.end()
        if not value:
            raise argparse.ArgumentTypeError("empty duration") from None
    if seconds < 0 or seconds != seconds:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}")
    return seconds


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """An argparse type: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


# --- flags ---------------------------------------------------------------------


def add_source_flags(parser: argparse.ArgumentParser) -> None:
    """``--nsqd-tcp-address`` and ``--lookupd-http-address`` (each repeatable)."""
    parser.add_argument(
        "--nsqd-tcp-address",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="nsqd TCP address (may be given multiple times)",
    )
    parser.add_argument(
        "--lookupd-http-address",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="lookupd HTTP address (may be given multiple times)",
    )


def add_tls_flags(parser: argparse.ArgumentParser) -> None:
    """TLS and AUTH, as go-nsq's ``tls_v1``/``tls_root_ca_file``/... options."""
    group = parser.add_argument_group("TLS and authentication")
    group.add_argument("--tls", action="store_true", help="negotiate TLS with nsqd")
    group.add_argument(
        "--tls-root-ca-file", metavar="FILE", help="CA bundle to verify nsqd (implies --tls)"
    )
    group.add_argument("--tls-cert", metavar="FILE", help="client certificate (implies --tls)")
    group.add_argument("--tls-key", metavar="FILE", help="client certificate's key")
    group.add_argument(
        "--tls-insecure-skip-verify",
        action="store_true",
        help="do not verify nsqd's certificate (implies --tls)",
    )
    group.add_argument("--auth-secret", metavar="SECRET", help="secret sent when nsqd asks AUTH")


def add_consumer_flags(
    parser: argparse.ArgumentParser, *, channel_default: str | None, max_in_flight: int = 200
) -> None:
    """The flags every consuming tool has."""
    parser.add_argument(
        "--topic", action="append", default=[], metavar="TOPIC", help="NSQ topic (repeatable)"
    )
    parser.add_argument(
        "--channel",
        default=channel_default,
        help=f"NSQ channel (default: {channel_default or 'tail<random>#ephemeral'})",
    )
    add_source_flags(parser)
    parser.add_argument(
        "--max-in-flight",
        type=positive_int,
        default=max_in_flight,
        help=f"max number of messages to allow in flight (default: {max_in_flight})",
    )
    parser.add_argument(
        "--consumer-opt",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a trionsq.Config option, e.g. max_attempts=10 or backoff=false (repeatable)",
    )
    add_tls_flags(parser)


def tls_options(args: argparse.Namespace) -> dict[str, Any]:
    """Config keywords from the TLS/AUTH flags."""
    options: dict[str, Any] = {}
    wants_tls = bool(
        args.tls or args.tls_root_ca_file or args.tls_cert or args.tls_insecure_skip_verify
    )
    if wants_tls:
        if args.tls_root_ca_file or args.tls_insecure_skip_verify:
            try:
                context = ssl.create_default_context(cafile=args.tls_root_ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"--tls-root-ca-file: {exc}") from None
            if args.tls_insecure_skip_verify:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            options["tls"] = context
        else:
            options["tls"] = True
    if args.tls_cert or args.tls_key:
        options["tls_cert"] = args.tls_cert
        options["tls_key"] = args.tls_key
    if args.auth_secret is not None:
        options["auth_secret"] = args.auth_secret
    return options


def source_options(args: argparse.Namespace) -> dict[str, Any]:
    """Config keywords for where to consume from."""
    return {
        "nsqd_tcp_addresses": tuple(args.nsqd_tcp_address),
        "lookupd_http_addresses": tuple(args.lookupd_http_address),
    }


_CONFIG_FIELDS = {f.name: f for f in dataclasses.fields(Config)}
_TRUE = {"1", "t", "true", "yes", "on"}
_FALSE = {"0", "f", "false", "no", "off"}


def _opt_value(name: str, text: str) -> Any:
    default: Any = getattr(Config(), name)
    lowered = text.lower()
    if isinstance(default, bool) or name == "backoff":
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise ValueError(f"--consumer-opt {name}: expected true or false, got {text!r}")
    if lowered in ("none", "null") and default is None:
        return None
    if isinstance(default, int):
        return int(text)
    if isinstance(default, float) or default is None:
        return parse_duration(text)
    return text


def parse_opts(values: list[str], flag: str = "--consumer-opt") -> dict[str, Any]:
    """``NAME=VALUE`` pairs as Config keywords (values typed after the defaults)."""
    options: dict[str, Any] = {}
    for item in values:
        name, sep, text = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep:
            raise ValueError(f"{flag} {item!r}: expected NAME=VALUE")
        if name not in _CONFIG_FIELDS or name in ("connector", "http_transport"):
            raise ValueError(f"{flag}: unknown option {name!r}")
        try:
            options[name] = _opt_value(name, text)
        except (ValueError, argparse.ArgumentTypeError) as exc:
            raise ValueError(f"{flag} {name}: {exc}") from None
    return options


def consumer_options(args: argparse.Namespace) -> dict[str, Any]:
    """Config keywords from a consuming tool's flags (raises ValueError/TypeError)."""
    options: dict[str, Any] = {**source_options(args), "max_in_flight": args.max_in_flight}
    options.update(tls_options(args))
    options.update(parse_opts(args.consumer_opt))
    Config(**options)  # validate now, so that a bad value is a usage error
    return options


def require_sources(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """nsq_tail's rule: nsqd addresses or lookupd addresses, not both."""
    if not args.nsqd_tcp_address and not args.lookupd_http_address:
        parser.error("--nsqd-tcp-address or --lookupd-http-address required")
    if args.nsqd_tcp_address and args.lookupd_http_address:
        parser.error("use --nsqd-tcp-address or --lookupd-http-address not both")


# --- reachability --------------------------------------------------------------


async def check_nsqds(addresses: tuple[str, ...] | list[str], config: Config) -> None:
    """Connect and handshake with every nsqd (TLS, AUTH included), then hang up.

    Like go-nsq's ``ConnectToNSQD``, a tool refuses to start when a node it was
    told about is unreachable, rather than retrying silently forever.
    """
    for address in addresses:
        try:
            conn = await Connection.open(address, config)
        except (NSQError, NegotiationError) as exc:
            raise ToolError(f"cannot connect to nsqd {address}: {exc}") from None
        await conn.aclose()


async def check_lookupds(addresses: tuple[str, ...] | list[str], wait: float = 5.0) -> None:
    """``GET /ping`` every nsqlookupd; fail when none answers (one is enough)."""
    failures: list[str] = []
    async with httpx.AsyncClient(timeout=wait) as client:
        for address in addresses:
            base = (address if "://" in address else f"http://{address}").rstrip("/")
            try:
                response = await client.get(f"{base}/ping")
                response.raise_for_status()
            except httpx.HTTPError as exc:
                failures.append(f"{address}: {exc or type(exc).__name__}")
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


# --- signals -------------------------------------------------------------------


@asynccontextmanager
async def stop_on_signals() -> AsyncIterator[trio.Event]:
    """An event set on the first SIGINT or SIGTERM, for a clean shutdown.

    The tools wind down on it (finish what they hold, close files) instead of
    dying mid-write; a second signal is not special-cased: the shutdown is quick.
    """
    stop = trio.Event()

    async def watch(receiver: Any) -> None:
        async for signum in receiver:
            log.info("received %s: stopping", signal.Signals(signum).name)
            stop.set()

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as receiver:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch, receiver)
            try:
                yield stop
            finally:
                nursery.cancel_scope.cancel()
