"""The ``nsqlookupd`` command (``fakensq nsqlookupd``)."""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any

import trio

from ..golang.lg import version_string
from ..lookupd.daemon import NSQLookupd
from ..lookupd.flags import nsqlookupd_command_defaults, nsqlookupd_flagset
from ..lookupd.options import LookupdOptions
from .common import (
    check_listeners,
    config_fields,
    config_values,
    daemon_options,
    fatal,
    resolve,
    serve,
    setup_logging,
    wait_for_signal,
)

__all__ = ["nsqlookupd_main", "nsqlookupd_options_from_flags"]


def nsqlookupd_options_from_flags(values: dict[str, Any]) -> LookupdOptions:
    """:class:`LookupdOptions` from parsed nsqlookupd flags (and ``--config``)."""
    config = config_values(
        values,
        config_fields(nsqlookupd_flagset()),
        {"inactive_producer_timeout", "tombstone_lifetime"},
        {},
    )
    base = nsqlookupd_command_defaults()
    return LookupdOptions(**{**base.__dict__, **resolve(nsqlookupd_flagset(), values, config)})


def nsqlookupd_main(argv: Sequence[str] | None = None) -> int:
    """The ``nsqlookupd`` command: parse nsqlookupd's flags, serve until a signal."""
    options = daemon_options(
        "nsqlookupd", nsqlookupd_flagset(), nsqlookupd_options_from_flags, argv
    )
    if isinstance(options, int):
        return options
    setup_logging(options.log_prefix, options.log_level, sys.stderr)
    # nsqlookupd.New logs its version, then listens.
    logging.getLogger("fakensq.nsqlookupd").info(
        version_string("nsqlookupd"), extra={"nsq_prefix": options.log_prefix}
    )
    try:
        check_listeners(options.tcp_address, options.http_address, unix=False)
    except ValueError as exc:
        # nsqlookupd's main.go passes the error to a format without a verb:
        # Go prints it as %!(EXTRA ...).
        return fatal(
            options.log_prefix,
            f"failed to instantiate nsqlookupd%!(EXTRA *errors.errorString={exc})",
        )
    return serve("nsqlookupd", _run_nsqlookupd, options)


async def _run_nsqlookupd(options: LookupdOptions) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        # NSQLookupd logs "TCP: listening on" and "HTTP: listening on" itself.
        async with NSQLookupd(options):
            await wait_for_signal(signals)
