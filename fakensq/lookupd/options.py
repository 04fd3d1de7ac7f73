"""nsqlookupd's options, with v1.3's defaults."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

__all__ = ["LookupdOptions"]


@dataclass
class LookupdOptions:
    """nsqlookupd's options with v1.3's defaults (durations in seconds).

    Addresses default to loopback with a free port: fakensq is a test double
    (the real daemon binds ``0.0.0.0:4160`` and ``0.0.0.0:4161``).
    """

    tcp_address: str = "127.0.0.1:0"
    http_address: str = "127.0.0.1:0"
    broadcast_address: str = field(default_factory=socket.gethostname)
    inactive_producer_timeout: float = 300.0
    tombstone_lifetime: float = 45.0
    log_level: str = "info"
    log_prefix: str = "[nsqlookupd] "
    #: fakensq only: also serve the HTTP aliases nsqlookupd v1.3.0 removed
    #: (:data:`LEGACY_ALIASES`).  Off, as in v1.3.0: they answer 404.
    legacy_http_aliases: bool = False
