"""Hostile peers of the admin's HTTP listener (nsqadmin's API and pages on Go's
net/http), on ``fakensq admin`` and, where nsqadmin v1.3.0 has a behaviour for
the case, the real one beside it, both over one fakensq nsqlookupd."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from fakensq.admin.server import Admin
from fakensq.lookupd.daemon import NSQLookupd
from fakensq.lookupd.options import LookupdOptions

from .. import reference
from .peers import TIMEOUT, MiB, ask, connect, exchange, get, read_answer, traced_peak
from .test_nsqd_http import MAX_HEAD, _head_of, _post

GiB = 1024 * MiB

Scenario = Callable[[str, bool], Awaitable[Any]]


@asynccontextmanager
async def _lookupd() -> AsyncIterator[str]:
    options = LookupdOptions(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0")
    async with NSQLookupd(options) as lookupd:
        yield lookupd.http_address


async def _on_both(scenario: Scenario) -> Any:
    """``scenario(address, fake)`` on fakensq's admin, then on the real
    nsqadmin (both over one fakensq nsqlookupd); the outcomes must match.
    Skips after fakensq's run without the real binary."""
    async with _lookupd() as lookupd:
        admin = Admin(lookupd_http_addresses=[lookupd], http_address="127.0.0.1:0")
        async with admin:
            fake = await scenario(admin.url.removeprefix("http://").rstrip("/"), True)
        if reference.binary("nsqadmin") is None:
            pytest.skip(f"fakensq ran it; no real nsqadmin: {reference.skip_reason()}")
        async with reference.open_nsqadmin(f"--lookupd-http-address={lookupd}") as real_admin:
            real = await scenario(real_admin.http_address, False)
    assert fake == real
    return fake


CASES = [
    (_head_of(MAX_HEAD), "head_at_the_limit"),
    (_head_of(MAX_HEAD + 1), "head_one_past"),
    (b"G" * (4 * MiB), "request_line_without_end"),
    (_post("/ping", GiB, b""), "ping_1GiB_declared_none_sent"),
    (_post("/api/nodes", 300 * 1024, b"y" * (300 * 1024)).replace(b"POST", b"GET", 1), "nodes"),
    (
        _post("/config/log_level", 0, b"x" * (2 * MiB), chunked=True).replace(b"POST", b"PUT", 1),
        "config_2MiB_chunked",
    ),
]


@pytest.mark.parametrize("data", [c[0] for c in CASES], ids=[c[1] for c in CASES])
async def test_limits(data: bytes) -> None:
    """Go's limits on heads; a body no handler reads: an answer at once, the
    connection closed past 256 KiB of body left; PUT /config's 1 MiB limit.
    (fakensq before: read every body whole, up to 5 MiB kept, first.)"""

    async def scenario(address: str, fake: bool) -> Any:
        with traced_peak() as peak:
            answer = await exchange(address, data, then=get("/ping"))
            ping = await ask(address, get("/ping"))
        if fake:
            print(f"PEAK admin http {data[:24]!r}...: {peak.mib:.2f} MiB")
            assert peak.bytes < 16 * MiB
        status, headers, _, after = answer
        headers.pop("content-length", None)  # (the JSON texts' lengths vary)
        return status, headers, after, ping.status

    await _on_both(scenario)


async def test_slow_heads_and_deaf_clients() -> None:
    """30 heads that never end and 20 clients pipelining the index page and
    never reading: others are served meanwhile, each slow one at last."""

    async def scenario(address: str, fake: bool) -> Any:
        slow, deaf = [], []
        with traced_peak() as peak:
            try:
                for i in range(30):
                    stream = await connect(address)
                    slow.append(stream)
                    await stream.send_all(b"GET /ping HTTP/1.1\r\nHost: x\r\nX-Slow: %d" % i)
                for _ in range(20):
                    stream = await connect(address)
                    deaf.append(stream)
                    await stream.send_all(get("/") * 50)
                served = [(await ask(address, get("/ping"))).status for _ in range(3)]
                for stream in slow:
                    await stream.send_all(b"\r\n\r\n")
                with trio.fail_after(TIMEOUT):
                    ends = {(await read_answer(stream)).status for stream in slow}
            finally:
                for stream in slow + deaf:
                    await trio.aclose_forcefully(stream)
        if fake:
            print(f"PEAK admin http 30 slow heads, 20 deaf clients: {peak.mib:.2f} MiB")
            assert peak.bytes < 16 * MiB
        return served, sorted(ends)

    await _on_both(scenario)
