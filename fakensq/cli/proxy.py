"""``fakensq proxy``: a :class:`~fakensq.testing.proxy.FaultProxy` in front of a
real nsqd, from the command line."""

from __future__ import annotations

import functools
import signal
import sys
from collections.abc import Sequence
from typing import Final

import trio

from trionsq.tools.flags import FlagSet

from ..golang.net import split_host_port
from ..testing.proxy import SCHEDULE_KINDS, FaultProxy
from .common import fatal, first_error, setup_logging, wait_for_signal

__all__ = ["proxy_main"]

_PREFIX: Final = "[fakensq proxy] "


def proxy_main(argv: Sequence[str]) -> int:
    """``fakensq proxy --upstream HOST:PORT [--tcp-address ...] [--http-address ...]``:
    relay to a real nsqd with faults; print the addresses, stop on Ctrl-C.
    With ``--faults-seed``, plays seeded fault schedules and prints each fault
    as it happens.  Exit 2 for bad flags, 1 (one line) when upstream cannot be
    reached."""
    fs = FlagSet("fakensq proxy")
    fs.string("upstream", "", "<addr>:<port> of the real nsqd's TCP address (required)")
    fs.string("tcp-address", "127.0.0.1:0", "<addr>:<port> to listen on for NSQ clients")
    fs.string("http-address", "127.0.0.1:0", "<addr>:<port> of the faults' HTTP API")
    fs.duration("connect-timeout", 5.0, "how long to wait for upstream (e.g. 5s)")
    fs.string(
        "faults-seed",
        "",
        "play fault schedules drawn from this seed (an integer) on consumers' connections",
    )
    fs.float("faults-rate", 4.0, "mean number of faults per --faults-every")
    fs.duration("faults-every", 60.0, "how long each drawn schedule spans (e.g. 30s)")
    fs.string("faults-kinds", ",".join(SCHEDULE_KINDS), "the kinds the schedules may hold")
    fs.string("log-level", "warn", "set log verbosity: debug, info, warn, error, or fatal")
    parsed = fs.parse_or_exit(argv)
    if isinstance(parsed, int):
        return parsed
    values = parsed[0]
    upstream = values.get("upstream", "")
    addresses = {
        "upstream": upstream,
        "tcp-address": values.get("tcp-address", "127.0.0.1:0"),
        "http-address": values.get("http-address", "127.0.0.1:0"),
    }
    if not upstream:
        sys.stderr.write("fakensq proxy: --upstream HOST:PORT is required\n")
        return 2
    for flag, address in addresses.items():
        try:
            split_host_port(address)
        except ValueError as exc:
            sys.stderr.write(f"fakensq proxy: --{flag}: {exc}\n")
            return 2
    seed: int | None = None
    raw_seed = values.get("faults-seed", "")
    default_kinds = ",".join(SCHEDULE_KINDS)
    kinds = tuple(
        k.strip() for k in values.get("faults-kinds", default_kinds).split(",") if k.strip()
    )
    rate, every = values.get("faults-rate", 4.0), values.get("faults-every", 60.0)
    if raw_seed:
        if not raw_seed.isdigit():
            sys.stderr.write(
                f"fakensq proxy: --faults-seed wants an integer >= 0, not {raw_seed!r}\n"
            )
            return 2
        seed = int(raw_seed)
    wrong = [k for k in kinds if k not in SCHEDULE_KINDS]
    if wrong or not kinds:
        known = ", ".join(SCHEDULE_KINDS)
        sys.stderr.write(f"fakensq proxy: --faults-kinds: unknown {wrong} (known: {known})\n")
        return 2
    if rate < 0 or every <= 0:
        sys.stderr.write("fakensq proxy: --faults-rate must be >= 0 and --faults-every > 0\n")
        return 2
    setup_logging(_PREFIX, values.get("log-level", "warn"), sys.stderr)
    proxy = FaultProxy(
        upstream,
        tcp_address=addresses["tcp-address"],
        http_address=addresses["http-address"],
        connect_timeout=values.get("connect-timeout", 5.0),
    )

    async def run() -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            await proxy.check_upstream()
            async with proxy:
                print(f"proxy: tcp {proxy.tcp_address} http {proxy.http_address}")
                print(f"upstream: {proxy.upstream}")
                print("NSQD_TCP_ADDRESSES=" + proxy.tcp_address)
                print("FAULTS_URL=http://" + str(proxy.http_address) + "/faults")
                print("ready (Ctrl-C to stop)", flush=True)
                async with trio.open_nursery() as nursery:
                    if seed is not None:
                        nursery.start_soon(
                            functools.partial(
                                proxy.play_seeded,
                                seed,
                                rate=rate,
                                horizon=every,
                                kinds=kinds,
                                on_met=lambda met: print(f"fault: {met.describe()}", flush=True),
                            )
                        )
                    await wait_for_signal(signals)
                    nursery.cancel_scope.cancel()

    try:
        trio.run(run)
    except (OSError, BaseExceptionGroup) as exc:
        return fatal(_PREFIX, f"{first_error(exc)}")
    return 0
