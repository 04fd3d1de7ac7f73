"""The daemons the client's end-to-end tests run against, behind one interface:
fakensq's nsqd and nsqlookupd (in process, in the test's nursery) or the real
NSQ v1.3.0 binaries (:mod:`tests.reference`, subprocesses).

A test takes the ``daemons`` fixture, parametrized over both kinds (``real``
skips with the reason where the binaries are absent), and asks it for nodes
configured with the real daemons' command-line flags, which fakensq parses the
same way::

    async def test_something(daemons: Daemons) -> None:
        lookupd = await daemons.nsqlookupd()
        nsqd = await daemons.nsqd("--msg-timeout=2s", lookupd=lookupd)
        ...
        await nsqd.kill()      # SIGKILL (fakensq: stops without saving anything)
        await nsqd.start()     # again, same ports, same data path
        channel = await nsqd.channel("topic", "chan")   # from /stats

fakensq's nsqd runs with ``requeue_on_disconnect=False``: like real nsqd, a
consumer's disconnect leaves its in-flight messages in flight until their
timeout, so that a client leaving messages behind shows in ``/stats`` on both.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import trio

from fakensq.cli import (
    nsqd_flagset,
    nsqd_options_from_flags,
    nsqlookupd_flagset,
    nsqlookupd_options_from_flags,
)
from fakensq.lookupd.daemon import NSQLookupd
from fakensq.nsqd.node import NSQD

from .. import reference

if TYPE_CHECKING:
    import trionsq

#: The fixture's parameters: fakensq always, the real daemons where found.
KINDS = [
    "fakensq",
    pytest.param(
        "real",
        marks=pytest.mark.skipif(
            reference.binary("nsqd") is None or reference.binary("nsqlookupd") is None,
            reason=reference.skip_reason() or "no real nsqd/nsqlookupd",
        ),
    ),
]


async def wait_until(predicate: Callable[[], Any], limit: float = 20.0, step: float = 0.02) -> None:
    """Poll a (sync) condition on real sockets, under ``trio.fail_after``: the
    conditions span the client and the daemons, with no single event to wait on."""
    with trio.fail_after(limit):
        while not predicate():  # noqa: ASYNC110 - see the docstring
            await trio.sleep(step)


class Node:
    """One daemon, restartable on the same ports (and, for nsqd, data path)."""

    name = "nsqd"

    def __init__(self, kind: str, flags: list[str], data_path: Path, nursery: trio.Nursery):
        self.kind = kind
        self.flags = flags
        self.data_path = data_path
        self._nursery = nursery
        self.tcp_address = ""
        self.http_address = ""
        self._real: reference.RealDaemon | None = None
        self._fake: NSQD | NSQLookupd | None = None
        self._scope: trio.CancelScope | None = None
        self._done: trio.Event | None = None
        self.running = False
        # One HTTP client for all of this node's queries: a client per query
        # costs milliseconds of CPU (an SSL context each), which tests that
        # poll /stats pay many times over on a busy machine.
        self._http: httpx.AsyncClient | None = None

    def __repr__(self) -> str:
        return f"<{self.kind} {self.name} {self.tcp_address}>"

    # --- life ---

    async def start(self) -> None:
        """Start (again): the first start picks free ports, later ones reuse them."""
        assert not self.running, f"{self} is running"
        if self.kind == "real":
            if self._real is None:
                self._real = reference.RealDaemon(
                    self.name,
                    self.flags,
                    data_path=self.data_path if self.name == "nsqd" else None,
                )
                self.tcp_address = self._real.tcp_address
                self.http_address = self._real.http_address
            await trio.to_thread.run_sync(self._real.start)
        else:
            await self._start_fake()
        self.running = True

    async def _start_fake(self) -> None:
        argv = [
            *self.flags,
            f"--tcp-address={self.tcp_address or '127.0.0.1:0'}",
            f"--http-address={self.http_address or '127.0.0.1:0'}",
            "--broadcast-address=127.0.0.1",
        ]
        if self.name == "nsqd":
            argv.append(f"--data-path={self.data_path}")
            options = nsqd_options_from_flags(nsqd_flagset().parse(argv)[0])
            node: NSQD | NSQLookupd = NSQD(options=options, requeue_on_disconnect=False)
        else:
            lookupd_options = nsqlookupd_options_from_flags(nsqlookupd_flagset().parse(argv)[0])
            node = NSQLookupd(lookupd_options)
        self._fake = node
        self._scope = scope = trio.CancelScope()
        self._done = done = trio.Event()

        async def run(*, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
            try:
                with scope:
                    if isinstance(node, NSQD):
                        await node.run(task_status=task_status)
                    else:
                        await node.serve(task_status=task_status)
            finally:
                done.set()

        await self._nursery.start(run)
        self.tcp_address = node.tcp_address
        self.http_address = node.http_address

    async def stop(self) -> None:
        """As an operator stops it (SIGTERM): nsqd saves its messages."""
        await self._end(kill=False)

    async def kill(self) -> None:
        """SIGKILL: connections cut, nothing saved beyond what is on disk."""
        await self._end(kill=True)

    async def _end(self, kill: bool) -> None:
        if not self.running:
            return
        self.running = False
        if self._real is not None:
            await trio.to_thread.run_sync(self._real.kill if kill else self._real.stop)
            return
        assert self._scope is not None and self._done is not None
        if kill and isinstance(self._fake, NSQD):
            self._fake.persist_on_stop = False
        self._scope.cancel()
        await self._done.wait()

    async def close(self) -> None:
        with trio.CancelScope(shield=True):
            if self._http is not None:
                await self._http.aclose()
            await self._end(kill=False)
            if self._real is not None:
                await trio.to_thread.run_sync(self._real.close)

    def log(self) -> str:
        return self._real.log() if self._real is not None else ""

    # --- HTTP ---

    @property
    def http(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=10.0)
        return self._http

    async def get(self, path: str) -> Any:
        response = await self.http.get(f"http://{self.http_address}{path}")
        response.raise_for_status()
        return response.json()


class Nsqd(Node):
    name = "nsqd"

    async def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = await self.get("/stats?format=json")
        return stats

    async def channel(self, topic: str, channel: str) -> dict[str, Any] | None:
        """The channel's entry in ``/stats`` (None if it does not exist)."""
        for t in (await self.stats())["topics"]:
            if t["topic_name"] == topic:
                for c in t["channels"]:
                    if c["channel_name"] == channel:
                        found: dict[str, Any] = c
                        return found
        return None

    async def create_channel(self, topic: str, channel: str) -> None:
        for path in (
            f"/topic/create?topic={topic}",
            f"/channel/create?topic={topic}&channel={channel}",
        ):
            response = await self.http.post(f"http://{self.http_address}{path}")
            response.raise_for_status()

    async def scanned_channel(self, topic: str, channel: str) -> None:
        """Create the channel and restart nsqd, so that its in-flight timeouts
        are scanned at once: real nsqd v1.3.0 looks for new channels to scan
        only every 5 s (its queue-scan-refresh-interval, not a flag), so a
        message in a fresh channel may outlive msg_timeout by up to 5 s."""
        await self.create_channel(topic, channel)
        await self.stop()
        await self.start()

    async def topic_depth(self, topic: str) -> int:
        for t in (await self.stats())["topics"]:
            if t["topic_name"] == topic:
                return int(t["depth"])
        return 0


class Nsqlookupd(Node):
    name = "nsqlookupd"

    async def producers(self, topic: str) -> list[str]:
        """``host:port`` of the nsqds nsqlookupd lists for ``topic``."""
        response = await self.http.get(f"http://{self.http_address}/lookup?topic={topic}")
        if response.status_code != 200:
            return []
        return sorted(
            f"{p['broadcast_address']}:{p['tcp_port']}" for p in response.json()["producers"]
        )


class Daemons:
    """Makes nodes of one kind for a test and stops them all afterwards."""

    def __init__(self, kind: str, nursery: trio.Nursery, tmp_path: Path) -> None:
        self.kind = kind
        self._nursery = nursery
        self._tmp = tmp_path
        self._count = itertools.count()
        self.nodes: list[Node] = []

    @property
    def real(self) -> bool:
        return self.kind == "real"

    def _folder(self, name: str) -> Path:
        path = self._tmp / f"{name}-{next(self._count)}"
        path.mkdir()
        return path

    async def nsqd(self, *flags: str, lookupd: Nsqlookupd | None = None) -> Nsqd:
        """A started nsqd (registering with ``lookupd`` if given)."""
        argv = list(flags)
        if lookupd is not None:
            argv.append(f"--lookupd-tcp-address={lookupd.tcp_address}")
        node = Nsqd(self.kind, argv, self._folder("nsqd"), self._nursery)
        self.nodes.append(node)
        await node.start()
        return node

    async def nsqlookupd(self, *flags: str) -> Nsqlookupd:
        node = Nsqlookupd(self.kind, list(flags), self._folder("nsqlookupd"), self._nursery)
        self.nodes.append(node)
        await node.start()
        return node

    async def close(self) -> None:
        for node in reversed(self.nodes):
            await node.close()


@pytest.fixture(params=KINDS)
async def daemons(
    request: pytest.FixtureRequest, nursery: trio.Nursery, tmp_path: Path
) -> AsyncIterator[Daemons]:
    """Nodes of one kind (``fakensq`` or ``real``), all stopped after the test."""
    made = Daemons(request.param, nursery, tmp_path)
    try:
        yield made
    finally:
        await made.close()


# --- helpers the end-to-end tests share ---


def consumer(nsqds: list[Nsqd], **options: Any) -> trionsq.Consumer:
    """A Consumer of ``topic``/``chan`` on these nsqds."""
    import trionsq

    return trionsq.Consumer(
        "topic", "chan", nsqd_tcp_addresses=[n.tcp_address for n in nsqds], **options
    )


async def publish(nsqd: Nsqd, topic: str, bodies: list[bytes], **options: Any) -> None:
    """MPUB ``bodies`` (in batches) to ``nsqd``."""
    import trionsq

    async with trionsq.Producer([nsqd.tcp_address], **options) as producer:
        for start in range(0, len(bodies), 500):
            await producer.multi_publish(topic, bodies[start : start + 500])


async def wait_channel(
    nsqd: Nsqd,
    topic: str,
    channel: str,
    predicate: Callable[[dict[str, Any]], bool],
    limit: float = 20.0,
) -> dict[str, Any]:
    """Poll ``/stats`` until the channel exists and ``predicate(channel)``; returns it.

    Fails with what it saw last (no channel at all, or its counters), so that
    a failure tells "never subscribed" from "something stayed in flight"."""
    found: dict[str, Any] | None = None
    with trio.move_on_after(limit):
        while True:
            found = await nsqd.channel(topic, channel)
            if found is not None and predicate(found):
                return found
            await trio.sleep(0.02)
    if found is None:
        raise AssertionError(f"{nsqd}: no channel {topic}/{channel} after {limit}s")
    counters = {k: v for k, v in found.items() if k != "clients"}
    raise AssertionError(f"{nsqd}: {topic}/{channel} still {counters} after {limit}s")


async def nothing_in_flight(nsqd: Nsqd, topic: str, channel: str) -> dict[str, Any]:
    """Wait until nothing of the channel is in flight (REQs written just before
    need a moment to be read); returns the channel's stats.  Messages nobody
    answered would stay in flight until msg_timeout, so tests that use this
    leave nsqd's default (60 s) or longer."""
    return await wait_channel(nsqd, topic, channel, lambda c: c["in_flight_count"] == 0)


async def ready_counts(nsqd: Nsqd, topic: str, channel: str) -> list[int]:
    """RDY of every client of the channel, as nsqd sees it."""
    found = await nsqd.channel(topic, channel)
    return [] if found is None else [int(c["ready_count"]) for c in found["clients"]]
