"""Hostile peers of nsqd's HTTP listener (fakensq's and, where nsqd has a
behaviour for the case, the real one's, compared).

The profiler first: Go's runtime runs one CPU profile at a time (the second
concurrent ``/debug/pprof/profile`` gets a 500), and a profile or a delta
profile ends when its client goes (``r.Context().Done()``).
"""

from __future__ import annotations

import threading
from typing import Any

import trio

from ..conformance.conftest import Conformance, Target
from ..conformance.polling import poll_until
from .peers import TIMEOUT, Answer, ask, connect, get, read_answer

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
            with trio.fail_after(TIMEOUT):
                while threading.active_count() > threads_before:  # noqa: ASYNC110
                    await trio.sleep(0.01)
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
