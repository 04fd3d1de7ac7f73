"""nsqlookupd v1.3's command-line flags, mapped onto :class:`LookupdOptions`."""

from __future__ import annotations

from typing import Final

from trionsq.tools.flags import FlagSet

from ..golang.lg import OptionFlag, add_option_flags, daemon_flagset
from .options import LookupdOptions

__all__ = ["nsqlookupd_command_defaults", "nsqlookupd_flagset"]


def nsqlookupd_command_defaults() -> LookupdOptions:
    """The options of ``nsqlookupd`` run with no flags: v1.3.0's defaults."""
    return LookupdOptions(tcp_address="0.0.0.0:4160", http_address="0.0.0.0:4161")


#: nsqlookupd's flags, each setting the option of its name: (declaration, name, usage).
_OPTION_FLAGS: Final[tuple[OptionFlag, ...]] = (
    ("string", "tcp-address", "<addr>:<port> to listen on for TCP clients"),
    ("string", "http-address", "<addr>:<port> to listen on for HTTP clients"),
    ("string", "broadcast-address", "address of this lookupd node, (default to the OS hostname)"),
    (
        "duration",
        "inactive-producer-timeout",
        "duration of time a producer will remain in the active list since its last ping",
    ),
    (
        "duration",
        "tombstone-lifetime",
        "duration of time a producer will remain tombstoned if registration remains",
    ),
)


def nsqlookupd_flagset(defaults: LookupdOptions | None = None) -> FlagSet:
    """nsqlookupd v1.3's flags, mapped onto :class:`LookupdOptions` fields."""
    o = defaults or nsqlookupd_command_defaults()
    fs = daemon_flagset("nsqlookupd", o.log_level)
    add_option_flags(fs, o, _OPTION_FLAGS)
    return fs
