"""Hostile peers of nsqlookupd's HTTP listener (Go's net/http: its limits on
heads and unread bodies; no handler of nsqlookupd reads a body), on fakensq and
nsqlookupd v1.3.0, compared; the profiler is the one nsqd's listener serves
(tests/hostile/test_nsqd_http)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from ..conformance.conftest import Conformance, Target
from ..conformance.lookupd import lookupd_state
from .peers import TIMEOUT, MiB, ask, connect, exchange, get, read_answer, traced_peak
from .test_nsqd_http import MAX_HEAD, _head_of, _post

GiB = 1024 * MiB

CASES = [
    (_head_of(MAX_HEAD), "head_at_the_limit"),
    (_head_of(MAX_HEAD + 1), "head_one_past"),
    (b"G" * (4 * MiB), "request_line_without_end"),
    (_post("/topic/create?topic=t", 3 * MiB, b"x" * (3 * MiB)), "create_3MiB_body_read_whole"),
    (
        _post("/topic/create?topic=t", 0, b"x" * (3 * MiB), chunked=True, end=True),
        "create_chunked_3MiB",
    ),
    (_post("/topic/create?topic=t", 100, b"x" * 100), "create_small_body"),
    (_post("/ping", GiB, b""), "ping_1GiB_declared_none_sent"),
    (_post("/nodes", 300 * 1024, b"y" * (300 * 1024)).replace(b"POST", b"GET", 1), "nodes_300KiB"),
    (_post("/nodes", 100 * 1024, b"y" * (100 * 1024)).replace(b"POST", b"GET", 1), "nodes_100KiB"),
]


@pytest.mark.parametrize("data", [c[0] for c in CASES], ids=[c[1] for c in CASES])
async def test_limits(conformance: Conformance, data: bytes) -> None:
    """A head over 1 MiB + 4 KiB: 431; a handler that parses its parameters
    with NewReqParams reads the whole body first; one that reads none answers
    at once, then the server drops up to 256 KiB of the body to keep the
    connection, else closes it.  (fakensq before: read every body whole first;
    a head's limit depended on how its bytes came in.)"""

    async def scenario(t: Target) -> Any:
        with traced_peak() as peak:
            answer = await exchange(t.http_address, data, then=get("/ping"))
            ping = await ask(t.http_address, get("/ping"))
        if t.fake is not None:
            print(f"PEAK lookupd http {data[:24]!r}...: {peak.mib:.2f} MiB")
            assert peak.bytes < 16 * MiB
        return answer, ping.status, await lookupd_state(t, "t")

    await conformance.nsqlookupd(scenario)


async def test_slow_heads_and_deaf_clients(conformance: Conformance) -> None:
    """30 heads that never end and 20 clients pipelining /nodes and never
    reading: other clients are served meanwhile, each slow one at last."""

    async def scenario(t: Target) -> Any:
        slow, deaf = [], []
        with traced_peak() as peak:
            try:
                for i in range(30):
                    stream = await connect(t.http_address)
                    slow.append(stream)
                    await stream.send_all(b"GET /ping HTTP/1.1\r\nHost: x\r\nX-Slow: %d" % i)
                for _ in range(20):
                    stream = await connect(t.http_address)
                    deaf.append(stream)
                    await stream.send_all(get("/debug/pprof/goroutine?debug=2") * 10)
                served = [(await ask(t.http_address, get("/ping"))).status for _ in range(3)]
                for stream in slow:
                    await stream.send_all(b"\r\n\r\n")
                with trio.fail_after(TIMEOUT):
                    ends = {(await read_answer(stream)).status for stream in slow}
            finally:
                for stream in slow + deaf:
                    await trio.aclose_forcefully(stream)
        if t.fake is not None:
            print(f"PEAK lookupd http 30 slow heads, 20 deaf clients: {peak.mib:.2f} MiB")
            assert peak.bytes < 16 * MiB
        return served, sorted(ends)

    await conformance.nsqlookupd(scenario)
