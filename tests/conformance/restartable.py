"""An nsqd of either kind that stops (killed or not) and starts again on the
same ports and data path: the scenarios of what a restarted nsqd keeps
(``test_kills``) and of how it registers again (``test_restarts``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

import fakensq
from fakensq.cli import nsqd_flagset, nsqd_options_from_flags

from .. import reference
from .conftest import _parse_flags

__all__ = ["RestartableNSQD", "restartable"]


class RestartableNSQD:
    """The real nsqd (``kind`` ``"real"``) or fakensq's, with ``flags`` (Go
    style, the same for both) on the data path ``data``."""

    def __init__(self, kind: str, data: Path, flags: list[str]) -> None:
        self.kind, self.data, self.flags = kind, data, flags
        self.real: reference.RealDaemon | None = None
        self.fake: fakensq.NSQD | None = None
        self.tcp_address = self.http_address = ""
        self._scope: trio.CancelScope | None = None
        self._done = trio.Event()

    async def start(self, nursery: trio.Nursery) -> None:
        """Start it (again: on the ports it had); a fake one runs in ``nursery``."""
        if self.kind == "real":
            if self.real is None:
                self.real = reference.RealDaemon("nsqd", self.flags, data_path=self.data)
            await trio.to_thread.run_sync(self.real.start)
            self.tcp_address, self.http_address = self.real.tcp_address, self.real.http_address
            return
        options = nsqd_options_from_flags(_parse_flags(nsqd_flagset(), self.flags)).replace(
            tcp_address=self.tcp_address or "127.0.0.1:0",
            http_address=self.http_address or "127.0.0.1:0",
            broadcast_address="127.0.0.1",
            data_path=str(self.data),
        )
        self.fake = fakensq.NSQD(options=options)
        self._done = trio.Event()
        await nursery.start(self._serve, self.fake)
        self.tcp_address, self.http_address = self.fake.tcp_address, self.fake.http_address

    async def _serve(self, node: fakensq.NSQD, *, task_status: trio.TaskStatus[None]) -> None:
        try:
            with trio.CancelScope() as self._scope:
                await node.run(task_status=task_status)
        finally:
            self._done.set()

    async def stop(self, *, kill: bool) -> None:
        """SIGKILL (``kill``: a killed nsqd saves nothing at exit) or SIGTERM."""
        if self.kind == "real":
            assert self.real is not None
            await trio.to_thread.run_sync(self.real.kill if kill else self.real.stop)
            return
        assert self.fake is not None and self._scope is not None
        self.fake.persist_on_stop = not kill  # as Cluster.kill_nsqd
        self._scope.cancel()
        await self._done.wait()

    async def kill(self) -> None:
        await self.stop(kill=True)

    async def close(self) -> None:
        if self.real is not None:
            await trio.to_thread.run_sync(self.real.close)
        if self._scope is not None:
            self._scope.cancel()


@asynccontextmanager
async def restartable(kind: str, data: Path, flags: list[str]) -> AsyncIterator[RestartableNSQD]:
    """A started :class:`RestartableNSQD`, closed on leaving."""
    async with trio.open_nursery() as nursery:
        node = RestartableNSQD(kind, data, flags)
        try:
            await node.start(nursery)
            yield node
        finally:
            await node.close()
        nursery.cancel_scope.cancel()
