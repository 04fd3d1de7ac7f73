"""``fakensq cluster``: nsqds wired to nsqlookupds (and an admin UI), their
addresses printed on stdout, until Ctrl-C."""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence
from typing import Any

import trio

from trionsq.tools.flags import FlagSet

from ..admin import Admin
from ..testing.cluster import Cluster
from .common import fatal, first_error, setup_logging, wait_for_signal

__all__ = ["cluster_flagset", "cluster_main"]


def cluster_flagset() -> FlagSet:
    fs = FlagSet("fakensq cluster")
    fs.int("nsqd", 1, "number of nsqds")
    fs.int("lookupd", 1, "number of nsqlookupds")
    fs.string("host", "127.0.0.1", "address every node listens on and broadcasts")
    fs.int(
        "base-port",
        0,
        "first port: nsqd i listens on base+2i (TCP) and base+2i+1 (HTTP), nsqlookupd j on "
        "base+100+2j and base+101+2j (default 0: free ports)",
    )
    fs.string("data-path", "", "directory for the nsqds' data (default: a temporary one)")
    fs.string(
        "admin-http-address",
        "",
        "<addr>:<port> to serve the admin web UI on, with fault controls (default: none)",
    )
    fs.string("log-level", "warn", "set log verbosity: debug, info, warn, error, or fatal")
    return fs


def cluster_main(argv: Sequence[str]) -> int:
    """``fakensq cluster``: run a Cluster, print its addresses, stop on Ctrl-C."""
    fs = cluster_flagset()
    parsed = fs.parse_or_exit(argv)
    if isinstance(parsed, int):
        return parsed
    values = parsed[0]
    n_nsqd = values.get("nsqd", 1)
    n_lookupd = values.get("lookupd", 1)
    base = values.get("base-port", 0)
    nsqd_ports = [(base + 2 * i, base + 2 * i + 1) if base else (0, 0) for i in range(n_nsqd)]
    lookupd_ports = [
        (base + 100 + 2 * j, base + 101 + 2 * j) if base else (0, 0) for j in range(n_lookupd)
    ]
    setup_logging("[fakensq] ", values.get("log-level", "warn"), sys.stderr)

    async def run() -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with Cluster(
                nsqd=n_nsqd,
                lookupd=n_lookupd,
                host=values.get("host", "127.0.0.1"),
                nsqd_ports=nsqd_ports,
                lookupd_ports=lookupd_ports,
                data_root=values.get("data-path") or None,
            ) as cluster:
                admin_address = values.get("admin-http-address", "")
                if not admin_address:
                    _print_cluster(cluster)
                    await wait_for_signal(signals)
                    return
                async with Admin(cluster=cluster, http_address=admin_address) as admin:
                    _print_cluster(cluster, admin_url=admin.url)
                    await wait_for_signal(signals)

    try:
        trio.run(run)
    except (OSError, BaseExceptionGroup) as exc:
        return fatal("[fakensq] ", f"failed to start the cluster - {first_error(exc)}")
    return 0


def _print_cluster(cluster: Any, admin_url: str = "") -> None:
    out = sys.stdout
    for i, (tcp, http) in enumerate(
        zip(cluster.nsqd_tcp_addresses, cluster.nsqd_http_addresses, strict=True)
    ):
        print(f"nsqd {i}: tcp {tcp} http {http}", file=out)
    for j, (tcp, http) in enumerate(
        zip(cluster.lookupd_tcp_addresses, cluster.lookupd_http_addresses, strict=True)
    ):
        print(f"nsqlookupd {j}: tcp {tcp} http {http}", file=out)
    print("NSQD_TCP_ADDRESSES=" + ",".join(cluster.nsqd_tcp_addresses), file=out)
    print("NSQD_HTTP_ADDRESSES=" + ",".join(cluster.nsqd_http_addresses), file=out)
    print("NSQLOOKUPD_TCP_ADDRESSES=" + ",".join(cluster.lookupd_tcp_addresses), file=out)
    print("NSQLOOKUPD_HTTP_ADDRESSES=" + ",".join(cluster.lookupd_http_addresses), file=out)
    if admin_url:
        print(f"ADMIN_URL={admin_url}", file=out)
    print("ready (Ctrl-C to stop)", file=out, flush=True)
