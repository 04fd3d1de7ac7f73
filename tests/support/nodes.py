"""The daemons tests run against, fakensq's or the real NSQ v1.3.0, behind one
interface.

A :class:`Node` is one nsqd (:class:`Nsqd`) or nsqlookupd (:class:`Nsqlookupd`)
of either kind: ``"fakensq"`` serves fakensq's in a Trio nursery of the test,
``"real"`` runs the real binary (:class:`tests.reference.RealDaemon`, a
subprocess).  Both are configured with the real daemons' command-line flags,
which fakensq parses the same way (a flag fakensq lacks fails loudly), and both
can be stopped (SIGTERM: nsqd saves what it holds), killed (SIGKILL: nothing
saved beyond what is on disk) and started again on the same ports and data
path::

    async with open_daemons("fakensq", tmp_path) as daemons:
        lookupd = await daemons.nsqlookupd()
        nsqd = await daemons.nsqd("--msg-timeout=2s", lookupd=lookupd)
        ...
        await nsqd.kill()      # SIGKILL (fakensq: stops without saving anything)
        await nsqd.start()     # again, same ports, same data path
        channel = await nsqd.channel("topic", "chan")   # from /stats

:class:`Daemons` makes the nodes of one kind for a test and closes them after
it (the client's ``daemons`` fixture is one); :class:`BlockingDaemons` serves
them on a thread of their own, for blocking and asyncio code.
"""

from __future__ import annotations

import abc
import functools
import itertools
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, ClassVar, TypeVar

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
from fakensq.lookupd.options import LookupdOptions
from fakensq.nsqd.node import NSQD
from fakensq.nsqd.options import NSQDOptions
from fakensq.testing.threaded import BackgroundNode

from .. import reference
from .ports import free_port
from .stats import channel_entry, topic_entry

__all__ = [
    "KINDS",
    "BlockingDaemons",
    "BlockingNode",
    "Daemons",
    "Node",
    "Nsqd",
    "Nsqlookupd",
    "fake_lookupd_options",
    "fake_nsqd_options",
    "open_daemons",
]

R = TypeVar("R")

#: The two kinds as pytest parameters: fakensq always, the real daemons where
#: found (else the ``real`` case skips, saying why).
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


def _parse(flagset: Any, flags: Sequence[str]) -> dict[str, Any]:
    values, rest = flagset.parse(list(flags))
    assert not rest, f"not flags: {rest}"
    return values  # type: ignore[no-any-return]


def fake_nsqd_options(flags: Sequence[str]) -> NSQDOptions:
    """fakensq's nsqd options from the real nsqd's flags (as ``fakensq nsqd``
    reads its command line)."""
    return nsqd_options_from_flags(_parse(nsqd_flagset(), flags))


def fake_lookupd_options(flags: Sequence[str]) -> LookupdOptions:
    """fakensq's nsqlookupd options from the real nsqlookupd's flags."""
    return nsqlookupd_options_from_flags(_parse(nsqlookupd_flagset(), flags))


class Node(abc.ABC):
    """One daemon of either kind, restartable on the same ports (and, for
    nsqd, data path).  ``flags`` come after the node's own (loopback
    addresses, ``--broadcast-address=127.0.0.1``, the data path): a flag given
    wins, as on the real daemon's command line."""

    name: ClassVar[str] = "nsqd"

    def __init__(
        self, kind: str, flags: Sequence[str], data_path: Path, nursery: trio.Nursery
    ) -> None:
        assert kind in ("fakensq", "real"), kind
        self.kind = kind
        self.flags = list(flags)
        self.data_path = data_path
        self._nursery = nursery
        self.tcp_address = ""
        self.http_address = ""
        #: the real daemon (kind "real"), made at the first start
        self.real: reference.RealDaemon | None = None
        #: fakensq's node of the current run (kind "fakensq"), for extra checks
        self.fake: Any = None
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
            if self.real is None:
                self.real = reference.RealDaemon(
                    self.name,
                    self.flags,
                    data_path=self.data_path if self.name == "nsqd" else None,
                )
            await trio.to_thread.run_sync(self.real.start)
            self.tcp_address, self.http_address = self.real.tcp_address, self.real.http_address
        else:
            await self._start_fake()
        self.running = True

    @abc.abstractmethod
    def _make_fake(self, own: list[str]) -> Any:
        """fakensq's node, with the node's own flags ``own`` before the given."""

    async def _start_fake(self) -> None:
        own = [
            f"--tcp-address={self.tcp_address or '127.0.0.1:0'}",
            f"--http-address={self.http_address or '127.0.0.1:0'}",
            "--broadcast-address=127.0.0.1",
        ]
        node = self.fake = self._make_fake(own)
        self._scope = scope = trio.CancelScope()
        self._done = done = trio.Event()

        async def serve(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            try:
                with scope:
                    async with node:
                        task_status.started()
                        await trio.sleep_forever()
            finally:
                done.set()

        await self._nursery.start(serve)
        self.tcp_address = node.tcp_address
        self.http_address = node.http_address

    async def stop(self, *, kill: bool = False) -> None:
        """As an operator stops it (SIGTERM: nsqd saves its messages), or with
        ``kill`` as SIGKILL does (connections cut, nothing saved beyond what is
        on disk)."""
        if not self.running:
            return
        self.running = False
        if self.real is not None:
            await trio.to_thread.run_sync(self.real.kill if kill else self.real.stop)
            return
        assert self._scope is not None and self._done is not None
        if kill and isinstance(self.fake, NSQD):
            self.fake.persist_on_stop = False
        self._scope.cancel()
        await self._done.wait()

    async def kill(self) -> None:
        """SIGKILL: connections cut, nothing saved beyond what is on disk."""
        await self.stop(kill=True)

    async def close(self) -> None:
        """Stop it, and remove what the real daemon made of its own."""
        with trio.CancelScope(shield=True):
            if self._http is not None:
                await self._http.aclose()
            await self.stop()
            if self.real is not None:
                await trio.to_thread.run_sync(self.real.close)

    def log(self) -> str:
        """The real daemon's output so far ('' for fakensq's)."""
        return self.real.log() if self.real is not None else ""

    # --- HTTP ---

    @property
    def http(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=10.0)
        return self._http

    async def get(self, path: str) -> Any:
        """``GET path`` on the node's HTTP address: the JSON answer."""
        response = await self.http.get(f"http://{self.http_address}{path}")
        response.raise_for_status()
        return response.json()


class Nsqd(Node):
    name = "nsqd"

    def __init__(
        self, kind: str, flags: Sequence[str], data_path: Path, nursery: trio.Nursery
    ) -> None:
        super().__init__(kind, flags, data_path, nursery)
        given = [flag.lstrip("-") for flag in self.flags]
        if any(f.startswith("tls-cert") for f in given) and not any(
            f.startswith("https-address") for f in given
        ):
            # With a certificate nsqd also serves HTTPS, by default on
            # 0.0.0.0:4152: one fixed port for every test on the machine.
            self.flags.append(f"--https-address=127.0.0.1:{free_port()}")

    def _make_fake(self, own: list[str]) -> NSQD:
        return NSQD(options=fake_nsqd_options([*own, f"--data-path={self.data_path}", *self.flags]))

    async def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = await self.get("/stats?format=json")
        return stats

    async def channel(self, topic: str, channel: str) -> dict[str, Any] | None:
        """The channel's entry in ``/stats`` (None if it does not exist)."""
        return channel_entry(await self.stats(), topic, channel)

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
        entry = topic_entry(await self.stats(), topic)
        return 0 if entry is None else int(entry["depth"])


class Nsqlookupd(Node):
    name = "nsqlookupd"

    def _make_fake(self, own: list[str]) -> NSQLookupd:
        return NSQLookupd(fake_lookupd_options([*own, *self.flags]))

    async def producers(self, topic: str) -> list[str]:
        """``host:port`` of the nsqds nsqlookupd lists for ``topic``."""
        response = await self.http.get(f"http://{self.http_address}/lookup?topic={topic}")
        if response.status_code != 200:
            return []
        return sorted(
            f"{p['broadcast_address']}:{p['tcp_port']}" for p in response.json()["producers"]
        )


class Daemons:
    """Makes started nodes of one kind (each with a folder of its own under
    ``tmp_path``), served in ``nursery``; :meth:`close` stops them all."""

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
        path.mkdir(parents=True)
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
        """A started nsqlookupd."""
        node = Nsqlookupd(self.kind, flags, self._folder("nsqlookupd"), self._nursery)
        self.nodes.append(node)
        await node.start()
        return node

    async def close(self) -> None:
        for node in reversed(self.nodes):
            await node.close()


@asynccontextmanager
async def open_daemons(kind: str, tmp_path: Path) -> AsyncIterator[Daemons]:
    """:class:`Daemons` in a nursery of their own, all closed on leaving."""
    async with trio.open_nursery() as nursery:
        daemons = Daemons(kind, nursery, tmp_path)
        try:
            yield daemons
        finally:
            await daemons.close()
        nursery.cancel_scope.cancel()


class BlockingNode:
    """A :class:`Node` for blocking code: its life runs in the daemons' thread."""

    def __init__(self, node: Node, background: BackgroundNode[Daemons]) -> None:
        self.node = node
        self._background = background

    @property
    def kind(self) -> str:
        return self.node.kind

    @property
    def tcp_address(self) -> str:
        return self.node.tcp_address

    @property
    def http_address(self) -> str:
        return self.node.http_address

    def start(self) -> None:
        self._background.call(self.node.start)

    def stop(self) -> None:
        self._background.call(self.node.stop)

    def kill(self) -> None:
        self._background.call(self.node.kill)

    def scanned_channel(self, topic: str, channel: str) -> None:
        """See :meth:`Nsqd.scanned_channel`."""
        node = self.node
        assert isinstance(node, Nsqd)
        self._background.call(functools.partial(node.scanned_channel, topic, channel))


class BlockingDaemons:
    """:class:`Daemons` served on a thread of their own (a
    :class:`fakensq.testing.threaded.BackgroundNode`), for blocking and
    asyncio tests; :meth:`close` stops them all and the thread."""

    def __init__(self, kind: str, tmp_path: Path) -> None:
        self.kind = kind
        self._background: BackgroundNode[Daemons] = BackgroundNode(
            lambda: open_daemons(kind, tmp_path), name=f"{kind}-daemons"
        )
        self._daemons = self._background.start()

    def _call(self, fn: Callable[[], Any]) -> Any:
        return self._background.call(fn)

    def nsqd(self, *flags: str, lookupd: BlockingNode | None = None) -> BlockingNode:
        """A started nsqd (registering with ``lookupd`` if given)."""
        registered = None if lookupd is None else lookupd.node
        assert registered is None or isinstance(registered, Nsqlookupd)
        node = self._call(functools.partial(self._daemons.nsqd, *flags, lookupd=registered))
        return BlockingNode(node, self._background)

    def nsqlookupd(self, *flags: str) -> BlockingNode:
        """A started nsqlookupd."""
        node = self._call(functools.partial(self._daemons.nsqlookupd, *flags))
        return BlockingNode(node, self._background)

    def close(self) -> None:
        self._background.stop()
