"""Hostile peers of nsqd's HTTP listener (fakensq's and, where nsqd has a
behaviour for the case, the real one's, compared).

The profiler first: Go's runtime runs one CPU profile at a time (the second
concurrent ``/debug/pprof/profile`` gets a 500), and a profile or a delta
profile ends when its client goes (``r.Context().Done()``).
"""

from __future__ import annotations

import threading
from typing import Any

import h11
import pytest
import trio

from ..conformance.conftest import Conformance, Target
from ..support.waiting import poll_until, wait_until
from .peers import (
    TIMEOUT,
    Answer,
    MiB,
    ask,
    closed_by_peer,
    connect,
    exchange,
    get,
    read_answer,
    traced_peak,
)

#: A profile that would run for 27 hours.
LONG_PROFILE = get("/debug/pprof/profile?seconds=100000")
#: Headers that say what an answer is (not its date).
HEADERS = (
    "content-type",
    "content-disposition",
    "x-content-type-options",
    "x-go-pprof",
    "content-length",
)


def _shape(answer: Answer) -> tuple[Any, ...]:
    headers = {k: v for k, v in sorted(answer.headers.items()) if k in HEADERS}
    if answer.headers.get("content-type") == "application/octet-stream":
        headers.pop("content-length", None)
        return (answer.status, headers, ("gzip", answer.body[:2] == b"\x1f\x8b"))
    return (answer.status, headers, answer.body)


async def _profile_once(t: Target) -> tuple[Any, ...]:
    """A one-second CPU profile, once none is running any more."""
    answer = await poll_until(
        lambda: ask(t.http_address, get("/debug/pprof/profile?seconds=1")),
        lambda a: a.status == 200,
        "a CPU profile to be possible again",
    )
    return _shape(answer)


async def _delta_waiting(t: Target) -> bool:
    """Whether a delta profile's request waits (Go's serveDeltaProfile in a
    goroutine's stack; fakensq's _delta in a task's)."""
    dump = (await ask(t.http_address, get("/debug/pprof/goroutine?debug=2"))).body
    return any(
        line.startswith((b"net/http/pprof.handler.serveDeltaProfile(", b"_delta("))
        for line in dump.splitlines()
    )


async def test_45_concurrent_cpu_profiles(conformance: Conformance) -> None:
    """One runs; the 44 others get nsqd's 500 at once; the node serves other
    requests meanwhile; the clients gone, no sampler is left and a profile can
    run again.  (fakensq before: 40 sampler threads ran for 27 hours and the
    41st request hung on Trio's thread limiter.)"""

    async def scenario(t: Target) -> Any:
        threads_before = threading.active_count()
        streams = [await connect(t.http_address) for _ in range(45)]
        answers: list[Answer] = []
        try:
            with trio.fail_after(TIMEOUT):
                async with trio.open_nursery() as nursery:
                    all_refused = trio.Event()

                    async def read(stream: trio.SocketStream) -> None:
                        answers.append(await read_answer(stream))
                        if len(answers) == 44:
                            all_refused.set()

                    for stream in streams:
                        await stream.send_all(LONG_PROFILE)
                        nursery.start_soon(read, stream)
                    await all_refused.wait()
                    nursery.cancel_scope.cancel()  # (the running one never answers)
                ping = await ask(t.http_address, get("/ping"))
        finally:
            for stream in streams:
                await trio.aclose_forcefully(stream)
        again = await _profile_once(t)
        if t.fake is not None:
            await wait_until(
                lambda: threading.active_count() <= threads_before, limit=TIMEOUT, step=0.01
            )
        shapes = []
        for shape in map(_shape, answers):
            if shape not in shapes:
                shapes.append(shape)
        return len(answers), shapes, (ping.status, ping.body), again

    outcome = await conformance.nsqd(scenario)
    _, (count, shapes, _, _) = outcome
    assert count == 44
    assert shapes == [
        (
            500,
            {
                "content-length": "61",
                "content-type": "text/plain; charset=utf-8",
                "x-content-type-options": "nosniff",
                "x-go-pprof": "1",
            },
            b"Could not enable CPU profiling: cpu profiling already in use\n",
        )
    ]


async def test_delta_profile_ends_with_its_client(conformance: Conformance) -> None:
    """``goroutine?seconds=100000``: the request's task goes with its client."""

    async def scenario(t: Target) -> Any:
        waiting = [await _delta_waiting(t)]
        stream = await connect(t.http_address)
        await stream.send_all(get("/debug/pprof/goroutine?seconds=100000"))
        waiting.append(await poll_until(lambda: _delta_waiting(t), bool, "the request to wait"))
        await stream.aclose()
        waiting.append(await poll_until(lambda: _delta_waiting(t), lambda w: not w, "it to end"))
        return waiting

    assert (await conformance.nsqd(scenario))[1] == [False, True, False]


# --- heads and bodies past Go's limits ------------------------------------------------

GiB = 1024 * MiB
#: Go's limit on a request line and headers: http.DefaultMaxHeaderBytes + 4096.
MAX_HEAD = 1024 * 1024 + 4096


def _head_of(total: int) -> bytes:
    """A GET /ping whose request line and headers are ``total`` bytes."""
    start, end = b"GET /ping HTTP/1.1\r\nHost: x\r\nX-A: ", b"\r\n\r\n"
    return start + b"a" * (total - len(start) - len(end)) + end


def _post(path: str, length: int, body: bytes, chunked: bool = False, end: bool = False) -> bytes:
    """A POST's bytes: ``length`` in its Content-Length (or ``body`` as one
    chunk, and with ``end`` the last chunk after it)."""
    if chunked:
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        return head.encode() + b"%x\r\n" % len(body) + body + (b"\r\n0\r\n\r\n" if end else b"")
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n"
    return head.encode() + body


LIMIT_CASES = [
    (_head_of(MAX_HEAD), "head_at_the_limit"),
    (_head_of(MAX_HEAD + 1), "head_one_past"),
    (b"G" * (4 * MiB), "request_line_without_end"),
    (_post("/pub?topic=t", GiB, b"x" * (2 * MiB)), "pub_1GiB_declared_2MiB_sent"),
    (_post("/pub?topic=t", 1024 * 1024 + 1, b"x" * 100), "pub_over_max_msg_size_by_length"),
    (_post("/pub?topic=t", 0, b"x" * (2 * MiB), chunked=True), "pub_chunked_2MiB"),
    (_post("/mpub?topic=t", GiB, b"x\n" * (3 * MiB)), "mpub_1GiB_declared_6MiB_sent"),
    (_post("/ping", GiB, b""), "ping_1GiB_declared_none_sent"),
    (_post("/ping", 100 * 1024, b"y" * (100 * 1024)), "ping_100KiB_body"),
    (_post("/topic/create?topic=t2", 300 * 1024, b"y" * (300 * 1024)), "create_300KiB_body"),
    (_post("/pub?topic=t", 2, b"ok"), "pub_small"),
    (_post("/channel/empty?topic=t&channel=c", 3 * MiB, b"z" * (3 * MiB)), "empty_reads_it_all"),
    (_post("/topic/pause?topic=nope", 3 * MiB, b"z" * (3 * MiB)), "pause_reads_it_all"),
]


@pytest.mark.parametrize("data", [c[0] for c in LIMIT_CASES], ids=[c[1] for c in LIMIT_CASES])
async def test_limits(conformance: Conformance, data: bytes) -> None:
    """Go's net/http and nsqd's handlers: a head over 1 MiB + 4 KiB gets a 431;
    a handler answers once it has read its share of a body (nsqd's /pub refuses
    a Content-Length over --max-msg-size unread, reads --max-msg-size + 1 bytes
    of a chunked one; a handler that parses its parameters with NewReqParams
    reads all of it; /ping reads none); after it, the server drops up to
    256 KiB of what is left to keep the connection, else answers with
    "Connection: close" and closes.  (fakensq before: read every body whole,
    however large, before any answer; a head's limit depended on how its
    bytes came in.)"""

    async def scenario(t: Target) -> Any:
        with traced_peak() as peak:
            answer = await exchange(t.http_address, data, then=get("/ping"))
            ping = await ask(t.http_address, get("/ping"))  # another client, served
        if t.fake is not None:
            print(f"PEAK nsqd http {data[:24]!r}...: {peak.mib:.2f} MiB")
            assert peak.bytes < 16 * MiB
        return answer, ping.status

    await conformance.nsqd(scenario)


async def test_half_closed_request(conformance: Conformance) -> None:
    """A client that sends its request and shuts its sending side still gets
    the answer (the peer's EOF ends only what waits on it: a profile)."""

    async def scenario(t: Target) -> Any:
        stream = await connect(t.http_address)
        try:
            await stream.send_all(get("/ping") + get("/debug/pprof/profile?seconds=100000"))
            await stream.send_eof()
            with trio.fail_after(TIMEOUT):
                conn = h11.Connection(h11.CLIENT)
                answers = []
                for _ in range(2):
                    conn.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
                    conn.send(h11.EndOfMessage())
                    answers.append(_shape(await read_answer(stream, conn)))
                    if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
                        conn.start_next_cycle()
                closed = await closed_by_peer(stream)
        finally:
            await trio.aclose_forcefully(stream)
        return answers, closed

    await conformance.nsqd(scenario)


# --- slow and deaf clients ------------------------------------------------------------


async def test_slowloris_heads(conformance: Conformance) -> None:
    """50 clients each with a head that never ends (one at 1 MiB, a byte
    short of the limit): Go's server keeps them (it has no read timeout here),
    and serves everyone else meanwhile; fakensq's memory grows by what the
    heads hold, not more."""

    async def scenario(t: Target) -> Any:
        streams = []
        with traced_peak() as peak:
            try:
                for i in range(50):
                    stream = await connect(t.http_address)
                    streams.append(stream)
                    await stream.send_all(b"GET /ping HTTP/1.1\r\nHost: x\r\nX-Slow: %d" % i)
                await streams[0].send_all(b"a" * (MAX_HEAD - 100))
                answers = [(await ask(t.http_address, get("/ping"))).status for _ in range(3)]
                # each one finishes its head at last, and is answered
                for stream in streams:
                    await stream.send_all(b"\r\n\r\n")
                ends = []
                with trio.fail_after(TIMEOUT):
                    for stream in streams:
                        ends.append((await read_answer(stream)).status)
            finally:
                for stream in streams:
                    await trio.aclose_forcefully(stream)
        if t.fake is not None:
            print(f"PEAK nsqd http 50 slow heads (one of 1 MiB): {peak.mib:.2f} MiB")
            assert peak.bytes < 8 * MiB
        return answers, sorted(set(ends))

    await conformance.nsqd(scenario)


async def test_clients_that_never_read_stats(conformance: Conformance) -> None:
    """20 clients ask for a large /stats and never read it: each holds its own
    answer, the node serves others meanwhile, and goes on once they leave."""

    async def scenario(t: Target) -> Any:
        async with t.http() as http:
            for i in range(300):
                topic = f"topic-{i:03d}-" + "x" * 40
                assert (await http.post(f"/topic/create?topic={topic}")).status_code == 200
                created = await http.post(f"/channel/create?topic={topic}&channel=channel-{i}")
                assert created.status_code == 200
            size = len((await http.get("/stats?format=json")).content)
        streams = []
        with traced_peak() as peak:
            try:
                for _ in range(20):
                    stream = await connect(t.http_address)
                    streams.append(stream)
                    await stream.send_all(get("/stats?format=json") * 20)
                served = [(await ask(t.http_address, get("/ping"))).status for _ in range(3)]
            finally:
                for stream in streams:
                    await trio.aclose_forcefully(stream)
            again = (await ask(t.http_address, get("/ping"))).status
        if t.fake is not None:
            print(f"PEAK nsqd http 20 deaf /stats clients ({size} B each): {peak.mib:.2f} MiB")
            assert peak.bytes < 60 * size + 4 * MiB  # (each holds about one answer)
        return served, again, size > 30_000

    await conformance.nsqd(scenario)
