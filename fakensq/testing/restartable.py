"""A lone nsqd that can be stopped and started again in place, same object.

A :class:`fakensq.Cluster` restarts a node by building a new :class:`NSQD` on the
old ports; a test holding a lone nsqd (the pytest plugin's ``nsqd`` fixture)
keeps its reference, so here the *same* object runs again: a clean stop writes
its messages to its data path (as nsqd flushes them to disk), its listeners
close, and the next start reads them back and listens on the ports it had.  A
kill writes nothing: what it held in memory is lost (its ``nsqd.dat`` keeps the
topics and channels, and its disk queues what they last synced, as nsqd's).

It is what node faults (:meth:`fakensq.faults.Faults.restart`) need of a lone
node::

    nsqd = NSQD(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0", data_path=path)
    async with RestartableNSQD(nsqd) as node:
        faults = Faults(node)
        faults.attach_nsqd(node.name, nsqd)
        await faults.restart(node.name)
"""

from __future__ import annotations

import trio

from ..nsqd.node import NSQD
from ..serving import ServingNode

__all__ = ["RestartableNSQD"]


class RestartableNSQD(ServingNode):
    """Runs ``nsqd`` (which needs a ``data_path`` to keep messages across a stop)
    and stops and starts it on request; ``name`` is its name for the faults."""

    def __init__(self, nsqd: NSQD, name: str = "nsqd-0") -> None:
        self.nsqd = nsqd
        self.name = name
        self._nursery: trio.Nursery | None = None
        self._scope: trio.CancelScope | None = None
        self._done: trio.Event | None = None
        #: how many times it was started
        self.generation = 0

    @property
    def running(self) -> bool:
        return self._done is not None and not self._done.is_set()

    async def _start_serving(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        await self._start()

    async def _start(self) -> None:
        assert self._nursery is not None
        scope = self._scope = trio.CancelScope()
        done = self._done = trio.Event()
        self.generation += 1

        async def run(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            try:
                with scope:
                    await self.nsqd.serve(task_status=task_status)
            finally:
                done.set()

        await self._nursery.start(run)

    # -- fakensq.faults.NodeControl ----------------------------------------------

    async def stop_node(self, name: str, *, kill: bool = False) -> None:
        """Stop (clean: messages saved) or kill (nothing saved) the node."""
        self._check(name)
        if not self.running:
            return
        assert self._scope is not None and self._done is not None
        self.nsqd.persist_on_stop = not kill
        try:
            self._scope.cancel()
            await self._done.wait()
        finally:
            self.nsqd.persist_on_stop = True

    async def start_node(self, name: str) -> None:
        """Start the node again on its previous addresses, restoring its data path."""
        self._check(name)
        if self.running:
            raise RuntimeError(f"{name} is already running")
        nsqd = self.nsqd
        # A fresh process: no topics, clients or counters of the last run (they
        # come back from the data path), the same ports.
        nsqd.topics = {}
        nsqd.clients = {}
        addresses = {"tcp_address": nsqd.tcp_address, "http_address": nsqd.http_address}
        if nsqd.https_address:
            addresses["https_address"] = nsqd.https_address
        nsqd.options = nsqd.options.replace(
            **{k: v for k, v in addresses.items() if v and not v.startswith("/")}
        )
        await self._start()

    def node_name_at(self, address: str) -> str:
        nsqd = self.nsqd
        if address in (nsqd.tcp_address, nsqd.http_address, nsqd.https_address):
            return self.name
        return address

    def _check(self, name: str) -> None:
        if name != self.name:
            raise ValueError(f"no node {name!r}: this one is {self.name!r}")
