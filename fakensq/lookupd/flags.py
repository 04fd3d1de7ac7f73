"""nsqlookupd v1.3's command-line flags, mapped onto :class:`LookupdOptions`."""

from __future__ import annotations

from trionsq.tools.flags import FlagSet

from ..golang.lg import daemon_flagset
from .options import LookupdOptions

__all__ = ["nsqlookupd_command_defaults", "nsqlookupd_flagset"]


def nsqlookupd_command_defaults() -> LookupdOptions:
    """The options of ``nsqlookupd`` run with no flags: v1.3.0's defaults."""
    return LookupdOptions(tcp_address="0.0.0.0:4160", http_address="0.0.0.0:4161")


def nsqlookupd_flagset(defaults: LookupdOptions | None = None) -> FlagSet:
    """nsqlookupd v1.3's flags, mapped onto :class:`LookupdOptions` fields."""
    o = defaults or nsqlookupd_command_defaults()
    fs = daemon_flagset("nsqlookupd", o.log_level)
    fs.string("tcp-address", o.tcp_address, "<addr>:<port> to listen on for TCP clients")
    fs.string("http-address", o.http_address, "<addr>:<port> to listen on for HTTP clients")
    fs.string(
        "broadcast-address",
        o.broadcast_address,
        "address of this lookupd node, (default to the OS hostname)",
    )
    fs.duration(
        "inactive-producer-timeout",
        o.inactive_producer_timeout,
        "duration of time a producer will remain in the active list since its last ping",
    )
    fs.duration(
        "tombstone-lifetime",
        o.tombstone_lifetime,
        "duration of time a producer will remain tombstoned if registration remains",
    )
    return fs
