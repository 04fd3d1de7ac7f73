"""``fakensq admin``: the admin web server against running nsqlookupd/nsqd.

::

    fakensq admin --lookupd-http-address 127.0.0.1:4161 --http-address 127.0.0.1:4171

Flags as nsqadmin's (``--lookupd-http-address`` and ``--nsqd-http-address`` may be
given several times); SIGTERM and SIGINT stop it cleanly.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence

import trio

from ..flags import FlagError, FlagSet, HelpRequested

__all__ = ["admin_flagset", "admin_main"]


def admin_flagset() -> FlagSet:
    """The flags of ``fakensq admin`` (nsqadmin's names)."""
    fs = FlagSet("fakensq admin")
    fs.add_string(
        "http-address",
        "127.0.0.1:4171",
        "<addr>:<port> to listen on for HTTP clients (nsqadmin's default is 0.0.0.0:4171; "
        "loopback here, as the pages can delete topics)",
        "http",
    )
    fs.add_list(
        "lookupd-http-address",
        "lookupd HTTP address (may be given multiple times)",
        "lookupd_http_addresses",
    )
    fs.add_list(
        "nsqd-http-address",
        "nsqd HTTP address (may be given multiple times)",
        "nsqd_http_addresses",
    )
    return fs


def admin_main(argv: Sequence[str]) -> int:
    """Run the admin server until SIGTERM/SIGINT; 2 on bad flags, 1 if it cannot start."""
    fs = admin_flagset()
    try:
        values, _ = fs.parse(argv)
    except HelpRequested:
        sys.stderr.write(fs.usage())
        return 0
    except FlagError as exc:
        sys.stderr.write(f"{exc}\n{fs.usage()}")
        return 2
    lookupds = list(values.get("lookupd-http-address", []))
    nsqds = list(values.get("nsqd-http-address", []))
    if not lookupds and not nsqds:
        sys.stderr.write("fakensq admin: --lookupd-http-address or --nsqd-http-address required\n")
        return 2

    async def run() -> None:
        from .server import Admin

        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with Admin(
                lookupd_http_addresses=lookupds,
                nsqd_http_addresses=nsqds,
                http_address=values.get("http-address", "127.0.0.1:4171"),
            ) as admin:
                print(f"admin: {admin.url}", flush=True)
                async for _ in signals:
                    return

    try:
        trio.run(run)
    except (OSError, BaseExceptionGroup) as exc:
        while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]
        sys.stderr.write(f"fakensq admin: failed to start - {exc}\n")
        return 1
    return 0
