"""nsqadmin's options, with nsqadmin v1.3.0's defaults.

Field names are nsqadmin's config-file names (the flag names with ``-`` turned
into ``_``, except ``--lookupd-http-address`` → ``nsqlookupd_http_addresses``,
``--nsqd-http-address`` → ``nsqd_http_addresses`` and ``--admin-user`` →
``admin_users``); ``GET /config/<name>`` answers them as nsqadmin does.
Durations are in seconds.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import socket
from dataclasses import dataclass, field
from typing import Any

from ..golang.lg import LOG_LEVELS

__all__ = [
    "AdminOptions",
    "OptionsError",
    "normalize_base_path",
    "split_host_port",
    "go_file_error",
    "LOG_LEVELS",
]


class OptionsError(ValueError):
    """Options nsqadmin refuses to start with; ``str()`` is nsqadmin's reason."""


@dataclass
class AdminOptions:
    """Everything nsqadmin is configured with (``nsqadmin --help``)."""

    log_level: str = "info"
    log_prefix: str = "[nsqadmin] "
    http_address: str = "0.0.0.0:4171"
    base_path: str = "/"
    dev_static_dir: str = ""
    graphite_url: str = ""
    proxy_graphite: bool = False
    statsd_prefix: str = "nsq.%s"
    statsd_counter_format: str = "stats.counters.%s.count"
    statsd_gauge_format: str = "stats.gauges.%s"
    statsd_interval: float = 60.0
    nsqlookupd_http_addresses: list[str] = field(default_factory=list)
    nsqd_http_addresses: list[str] = field(default_factory=list)
    #: fakensq only (no nsqadmin flag): HTTP addresses of ``fakensq proxy``s, whose
    #: fault buttons the Faults page shows
    proxy_http_addresses: list[str] = field(default_factory=list)
    http_client_connect_timeout: float = 2.0
    http_client_request_timeout: float = 5.0
    http_client_tls_insecure_skip_verify: bool = False
    http_client_tls_root_ca_file: str = ""
    http_client_tls_cert: str = ""
    http_client_tls_key: str = ""
    allow_config_from_cidr: str = "127.0.0.1/8"
    notification_http_endpoint: str = ""
    acl_http_header: str = "X-Forwarded-User"
    admin_users: list[str] = field(default_factory=list)

    def replace(self, **changes: Any) -> AdminOptions:
        return dataclasses.replace(self, **changes)

    def validate(self) -> None:
        """nsqadmin's ``New`` checks; raises :class:`OptionsError` with its text."""
        if not self.nsqd_http_addresses and not self.nsqlookupd_http_addresses:
            raise OptionsError("--nsqd-http-address or --lookupd-http-address required")
        if self.nsqd_http_addresses and self.nsqlookupd_http_addresses:
            raise OptionsError("use --nsqd-http-address or --lookupd-http-address not both")
        if self.http_client_tls_cert and not self.http_client_tls_key:
            raise OptionsError(
                "--http-client-tls-key must be specified with --http-client-tls-cert"
            )
        if self.http_client_tls_key and not self.http_client_tls_cert:
            raise OptionsError(
                "--http-client-tls-cert must be specified with --http-client-tls-key"
            )
        for flag, addresses in (
            ("--lookupd-http-address", self.nsqlookupd_http_addresses),
            ("--nsqd-http-address", self.nsqd_http_addresses),
            ("--proxy-http-address", self.proxy_http_addresses),
        ):
            for address in addresses:
                reason = _address_problem(address)
                if reason:
                    raise OptionsError(f"failed to resolve {flag} ({address}) - {reason}")
        if self.allow_config_from_cidr:
            try:
                ipaddress.ip_network(self.allow_config_from_cidr, strict=False)
            except ValueError:
                raise OptionsError(
                    f"failed to parse --allow-config-from-cidr ({self.allow_config_from_cidr})"
                    f" - invalid CIDR address: {self.allow_config_from_cidr}"
                ) from None
        if self.log_level not in LOG_LEVELS:
            raise OptionsError(f"invalid log level '{self.log_level}'")

    def config_value(self, name: str) -> tuple[bool, Any]:
        """``(found, value)`` of ``/config/<name>``: durations in nanoseconds and
        the log level as its number, as Go's JSON has them."""
        if name not in _FIELDS:
            return False, None
        value = getattr(self, name)
        if name in _DURATIONS:
            return True, round(value * 1e9)
        if name == "log_level":
            return True, LOG_LEVELS[value]
        return True, value


# /config answers nsqadmin's options only (404 for fakensq's own, as nsqadmin would).
_FIELDS = {f.name for f in dataclasses.fields(AdminOptions)} - {"proxy_http_addresses"}
_DURATIONS = {"statsd_interval", "http_client_connect_timeout", "http_client_request_timeout"}


def go_file_error(path: str, exc: OSError) -> str:
    """Go's ``os.ReadFile`` error text (``open PATH: no such file or directory``)."""
    if isinstance(exc, IsADirectoryError):
        return f"read {path}: is a directory"
    return f"open {path}: {(exc.strerror or str(exc)).lower()}"


def normalize_base_path(path: str) -> str:
    """nsqadmin's base path, as Go's ``path.Join("/", p)``: rooted, cleaned, no
    trailing slash (``"foo/"`` → ``"/foo"``, ``""`` → ``"/"``)."""
    parts: list[str] = []
    for segment in path.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if parts:
                parts.pop()
            continue
        parts.append(segment)
    return "/" + "/".join(parts)


def split_host_port(address: str) -> tuple[str, str]:
    """Go's ``net.SplitHostPort``; raises ValueError with Go's text."""
    if address.startswith("["):
        end = address.find("]")
        if end < 0:
            raise ValueError(f"address {address}: missing ']' in address")
        host, rest = address[1:end], address[end + 1 :]
        if not rest:
            raise ValueError(f"address {address}: missing port in address")
        if rest[0] != ":" or ":" in rest[1:]:
            raise ValueError(f"address {address}: too many colons in address")
        return host, rest[1:]
    host, sep, port = address.rpartition(":")
    if not sep:
        raise ValueError(f"address {address}: missing port in address")
    if ":" in host:
        raise ValueError(f"address {address}: too many colons in address")
    return host, port


def _address_problem(address: str) -> str:
    """Why ``net.ResolveTCPAddr("tcp", address)`` would fail ('' when it would not)."""
    try:
        host, port = split_host_port(address)
    except ValueError as exc:
        return str(exc)
    if port.isdigit():
        if int(port) > 65535:
            return f"address {port}: invalid port"
    else:
        try:
            socket.getservbyname(port, "tcp")
        except OSError:
            return f"lookup tcp/{port}: unknown port"
    if host:
        try:
            socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except OSError:
            return f"lookup {host}: no such host"
    return ""
