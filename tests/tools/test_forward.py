"""``trionsq to-nsq`` and ``trionsq to-http``: FIN after success, REQ on failure."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager

import pytest
import trio

from fakensq import NSQD
from fakensq.http.server import HTTPServer, Request, Response
from fakensq.testing.threaded import BackgroundNode

from ..support.stats import channel_stats, topic_depth
from ..support.waiting import wait_until_blocking
from .helpers import publish, start_tool, stop_when_drained

FAST_RETRY = ["--consumer-opt", "default_requeue_delay=0", "--consumer-opt", "backoff=false"]


class Endpoint:
    """A local HTTP server recording requests; fails each body's first ``fail_first``
    tries, and before that leaves its first ``hang_first`` tries unanswered."""

    def __init__(self, fail_first: int = 0, hang_first: int = 0) -> None:
        self.fail_first = fail_first
        self.hang_first = hang_first
        self.requests: list[tuple[str, str, bytes, str]] = []
        self.tries: dict[bytes, int] = {}
        self.lock = threading.Lock()
        self.address = ""

    async def handle(self, request: Request) -> Response:
        key = request.body or request.path.encode()
        with self.lock:
            self.tries[key] = self.tries.get(key, 0) + 1
            tries = self.tries[key]
        if tries <= self.hang_first:
            await trio.sleep_forever()  # the client's request timeout ends it
        with self.lock:
            if tries <= self.hang_first + self.fail_first:
                return Response.text("try again", 503)
            query = request.arg("q") or ""
            self.requests.append(
                (
                    request.method,
                    request.path,
                    request.body or query.encode(),
                    request.headers.get("content-type", ""),
                )
            )
        return Response.text("ok")

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[Endpoint]:
        server = HTTPServer(self.handle)
        async with trio.open_nursery() as nursery:
            host, port = await nursery.start(server.serve, "127.0.0.1", 0)
            self.address = f"http://{host}:{port}"
            yield self
            nursery.cancel_scope.cancel()


@pytest.fixture
def endpoint_factory() -> Iterator[Callable[..., Endpoint]]:
    nodes: list[BackgroundNode[Endpoint]] = []

    def make(fail_first: int = 0, hang_first: int = 0) -> Endpoint:
        endpoint = Endpoint(fail_first, hang_first)
        node: BackgroundNode[Endpoint] = BackgroundNode(endpoint.serving, "http-endpoint")
        nodes.append(node)
        return node.start()

    yield make
    for node in nodes:
        node.stop()


def test_to_nsq_copies_a_topic(nsqd_factory: Callable[..., NSQD]) -> None:
    source, destination = nsqd_factory(), nsqd_factory()
    publish(source.http_address, "orders", [f"o{i}".encode() for i in range(200)])
    process = start_tool(
        "to-nsq",
        "--topic",
        "orders",
        "--nsqd-tcp-address",
        source.tcp_address,
        "--destination-nsqd-tcp-address",
        destination.tcp_address,
        "--destination-topic",
        "copy",
        "--status-every",
        "50",
    )
    err = stop_when_drained(process, source.http_address, "orders", "nsq_to_nsq", 200)
    assert topic_depth(destination.http_address, "copy") == 200
    assert "published=200" in err
    assert "to-nsq orders -> copy: published=" in err  # a status line every 50


def test_to_http_post_round_robin_retries_failures(
    nsqd: NSQD, endpoint_factory: Callable[..., Endpoint]
) -> None:
    first, second = endpoint_factory(1), endpoint_factory(1)
    bodies = [f"b{i}".encode() for i in range(20)]
    publish(nsqd.http_address, "hooks", bodies)
    process = start_tool(
        "to-http",
        "--topic",
        "hooks",
        "--nsqd-tcp-address",
        nsqd.tcp_address,
        "--post",
        f"{first.address}/in",
        "--post",
        f"{second.address}/in",
        "--content-type",
        "text/plain",
        "--mode",
        "round-robin",
        *FAST_RETRY,
    )
    stop_when_drained(process, nsqd.http_address, "hooks", "nsq_to_http", 20)
    delivered = first.requests + second.requests
    assert sorted(r[2] for r in delivered) == sorted(bodies)
    assert first.requests and second.requests  # round-robin
    assert all(r[0] == "POST" and r[1] == "/in" and r[3] == "text/plain" for r in delivered)
    stats = channel_stats(nsqd.http_address, "hooks", "nsq_to_http")
    assert stats is not None and stats["requeue_count"] >= 20  # every first try failed: REQ


def test_to_http_requeues_a_request_that_times_out(
    nsqd: NSQD, endpoint_factory: Callable[..., Endpoint]
) -> None:
    endpoint = endpoint_factory(hang_first=1)
    bodies = [f"t{i}".encode() for i in range(5)]
    publish(nsqd.http_address, "slow", bodies)
    process = start_tool(
        "to-http",
        "--topic",
        "slow",
        "--nsqd-tcp-address",
        nsqd.tcp_address,
        "--post",
        f"{endpoint.address}/in",
        "--http-client-request-timeout",
        "1s",
        "-n",
        "5",
        *FAST_RETRY,
    )
    stop_when_drained(process, nsqd.http_address, "slow", "nsq_to_http", 5)
    # Every first try timed out and was requeued; a later one was answered
    # (normally the second: a machine busy enough to hold an answer past the
    # timeout makes it a later one, and a duplicate, as for any NSQ consumer).
    assert {r[2] for r in endpoint.requests} == set(bodies)
    assert all(endpoint.tries[body] >= 2 for body in bodies)
    stats = channel_stats(nsqd.http_address, "slow", "nsq_to_http")
    assert stats is not None and stats["requeue_count"] >= 5
    assert stats["timeout_count"] == 0  # nsqd's own message timeout never came into it


def test_to_http_get_multicast_substitutes_the_body(
    nsqd: NSQD, endpoint_factory: Callable[..., Endpoint]
) -> None:
    first, second = endpoint_factory(0), endpoint_factory(0)
    publish(nsqd.http_address, "hooks", [b"a b&c", b"x/y"])
    process = start_tool(
        "to-http",
        "--topic",
        "hooks",
        "--nsqd-tcp-address",
        nsqd.tcp_address,
        "--mode",
        "multicast",
        "--get",
        f"{first.address}/get?q=%s",
        "--get",
        f"{second.address}/get?q=%s",
    )
    stop_when_drained(process, nsqd.http_address, "hooks", "nsq_to_http", 2)
    for endpoint in (first, second):
        assert sorted(r[2] for r in endpoint.requests) == [b"a b&c", b"x/y"]
        assert all(r[0] == "GET" for r in endpoint.requests)


def test_to_http_finishes_what_it_delivered_when_stopped(
    nsqd: NSQD, endpoint_factory: Callable[..., Endpoint], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Delivered messages wait (briefly) to be finished together; a stop
    finishes those still waiting, it does not requeue them."""
    from trionsq.cli import tool_flags
    from trionsq.tools import to_http

    monkeypatch.setattr(to_http, "FIN_DELAY", 3600.0)  # only the stop finishes them
    endpoint = endpoint_factory()
    publish(nsqd.http_address, "later", [f"m{i}".encode() for i in range(5)])
    args = tool_flags("to-http").parse_args(
        [
            "--topic=later",
            f"--nsqd-tcp-address={nsqd.tcp_address}",
            f"--post={endpoint.address}/in",
            "--max-in-flight=100",
        ]
    )
    prepared = to_http.prepare(args)

    def stats() -> dict[str, int]:
        return channel_stats(nsqd.http_address, "later", "nsq_to_http") or {}

    async def main() -> None:
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(to_http.run, args, prepared, stop)
            await trio.to_thread.run_sync(
                lambda: wait_until_blocking(lambda: len(endpoint.requests) == 5, what="delivered")
            )
            held = await trio.to_thread.run_sync(stats)
            assert (held["in_flight_count"], held["depth"]) == (5, 0)  # none finished yet
            stop.set()

    trio.run(main)
    after = stats()
    finished_all = {"depth": 0, "in_flight_count": 0, "requeue_count": 0, "timeout_count": 0}
    assert {k: after[k] for k in finished_all} == finished_all, after
