"""A whole NSQ cluster in process: several nsqds wired to several nsqlookupds.

::

    async with fakensq.Cluster(nsqd=3, lookupd=2) as cluster:
        cluster.nsqd_tcp_addresses        # ["127.0.0.1:41234", ...]
        cluster.lookupd_http_addresses    # give these to a consumer
        await cluster.stop_nsqd(1)
        await cluster.start_nsqd(1)       # same ports, same data path

Every node runs inside the caller's task tree.  Each nsqd registers with every
nsqlookupd (through :mod:`fakensq.nsqd.lookup_peer`, exactly as a real nsqd does);
entering the context returns once every nsqd is registered with every lookupd.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import trio

from ..golang.net import join_host_port, split_host_port
from ..lookupd.daemon import NSQLookupd
from ..nsqd.lookup_peer import LookupPeers, lookup_peers_of, run_lookup_peers, set_lookup_connector
from ..nsqd.node import NSQD
from ..nsqd.options import NSQDOptions
from ..serving import ServingNode
from .faults import Faults, Tracer

if TYPE_CHECKING:
    from .simulation import SimNetwork

__all__ = ["Cluster"]

N = TypeVar("N", NSQD, NSQLookupd)

#: How long start-up and restarts wait for registrations before failing.
READY_TIMEOUT = 10.0


@dataclass
class _Slot(Generic[N]):
    """One node position: the running node (if any) and how to stop it."""

    tcp_address: str
    http_address: str
    name: str = ""
    node: N | None = None
    scope: trio.CancelScope | None = None
    done: trio.Event | None = None
    data_path: str = ""
    generation: int = 0


class Cluster(ServingNode):
    """``nsqd`` nsqds and ``lookupd`` nsqlookupds on loopback, all wired together.

    ``nsqd_options`` (a dict of :class:`NSQDOptions` fields, or an NSQDOptions)
    applies to every nsqd; ``lookupd_options`` (fields of
    :class:`fakensq.lookupd.LookupdOptions`) to every nsqlookupd.  Ports are free
    ones unless ``nsqd_ports``/``lookupd_ports`` give ``(tcp, http)`` pairs.  Each
    nsqd gets a data path of its own under ``data_root`` (a temporary directory,
    removed on exit, when not given).  nsqds broadcast ``host`` to the lookupds,
    so that consumers discovering them connect to loopback.

    With ``network`` (a :class:`fakensq.simulation.SimNetwork`) no socket is
    opened: nodes are reached through the network at ``"nsqd-0:4150"``
    (HTTP ``"nsqd-0:4151"``), ``"lookupd-0:4160"`` (HTTP ``"lookupd-0:4161"``)...
    (see :class:`fakensq.simulation.SimCluster`).  ``trace`` (a list or a path)
    records every frame and fault (:class:`fakensq.faults.Tracer`).  ``faults``
    (:class:`fakensq.faults.Faults`) injects faults; nodes are named ``"nsqd-0"``,
    ``"lookupd-0"``...  A clean stop (:meth:`stop_nsqd`) keeps an nsqd's messages in
    its data path for the next start; :meth:`kill_nsqd` loses them.  With an
    ``nsqd_options`` ``seed``, each nsqd (and each of its restarts) draws from its
    own generator derived from it.
    """

    def __init__(
        self,
        nsqd: int = 1,
        lookupd: int = 1,
        *,
        nsqd_options: Mapping[str, Any] | NSQDOptions | None = None,
        lookupd_options: Mapping[str, Any] | None = None,
        host: str = "127.0.0.1",
        nsqd_ports: list[tuple[int, int]] | None = None,
        lookupd_ports: list[tuple[int, int]] | None = None,
        data_root: str | None = None,
        network: SimNetwork | None = None,
        trace: Tracer | list[dict[str, Any]] | str | None = None,
    ) -> None:
        if isinstance(nsqd_options, NSQDOptions):
            nsqd_options = dict(nsqd_options.__dict__)
        self._nsqd_options = dict(nsqd_options or {})
        self._lookupd_options = dict(lookupd_options or {})
        self.host = host
        self._data_root = data_root
        self._own_data_root: str | None = None
        nsqd_ports = nsqd_ports or [(0, 0)] * nsqd
        lookupd_ports = lookupd_ports or [(0, 0)] * lookupd
        if len(nsqd_ports) != nsqd or len(lookupd_ports) != lookupd:
            raise ValueError("one (tcp, http) port pair per node")
        self.network = network
        if network is not None:
            # Virtual hosts named after the nodes, on nsq's usual ports.
            nsqd_ports = [(4150, 4151)] * nsqd
            lookupd_ports = [(4160, 4161)] * lookupd
        self._nsqd_slots: list[_Slot[NSQD]] = _slots("nsqd", nsqd_ports, host, network is not None)
        self._lookupd_slots: list[_Slot[NSQLookupd]] = _slots(
            "lookupd", lookupd_ports, host, network is not None
        )
        self.tracer = trace if isinstance(trace, Tracer) or trace is None else Tracer(trace)
        #: Fault injection (:class:`fakensq.faults.Faults`).
        self.faults = Faults(self, self.tracer)
        if network is not None:
            network.faults = self.faults
        self._nursery: trio.Nursery | None = None

    # -- what tests use ----------------------------------------------------

    @property
    def nsqds(self) -> list[NSQD]:
        """The running nsqds (a stopped one is left out)."""
        return [s.node for s in self._nsqd_slots if s.node is not None]

    @property
    def lookupds(self) -> list[NSQLookupd]:
        """The running nsqlookupds (a stopped one is left out)."""
        return [s.node for s in self._lookupd_slots if s.node is not None]

    def nsqd(self, i: int) -> NSQD:
        """nsqd number ``i`` (raises if it is stopped)."""
        node = self._nsqd_slots[i].node
        if node is None:
            raise RuntimeError(f"nsqd {i} is stopped")
        return node

    def lookupd(self, i: int) -> NSQLookupd:
        """nsqlookupd number ``i`` (raises if it is stopped)."""
        node = self._lookupd_slots[i].node
        if node is None:
            raise RuntimeError(f"nsqlookupd {i} is stopped")
        return node

    # Addresses are per slot, so they stay put while a node is stopped.
    @property
    def nsqd_tcp_addresses(self) -> list[str]:
        return [s.tcp_address for s in self._nsqd_slots]

    @property
    def nsqd_http_addresses(self) -> list[str]:
        return [s.http_address for s in self._nsqd_slots]

    @property
    def lookupd_tcp_addresses(self) -> list[str]:
        return [s.tcp_address for s in self._lookupd_slots]

    @property
    def lookupd_http_addresses(self) -> list[str]:
        return [s.http_address for s in self._lookupd_slots]

    # -- lifecycle ---------------------------------------------------------

    async def _start_serving(self, nursery: trio.Nursery) -> None:
        if self._data_root is None:
            self._own_data_root = tempfile.mkdtemp(prefix="fakensq-cluster-")
            self._data_root = self._own_data_root
        self._nursery = nursery
        for i in range(len(self._lookupd_slots)):
            await self.start_lookupd(i, wait=False)
        for i in range(len(self._nsqd_slots)):
            await self.start_nsqd(i, keep_data=False, wait=False)
        await self.wait_registered()

    def _stopped(self, *, started: bool) -> None:
        self._nursery = None
        for nsqd_slot in self._nsqd_slots:
            nsqd_slot.node = None
        for lookupd_slot in self._lookupd_slots:
            lookupd_slot.node = None
        if self._own_data_root is not None:
            shutil.rmtree(self._own_data_root, ignore_errors=True)
        if self.tracer is not None:
            self.tracer.close()

    async def _run_node(
        self,
        slot: _Slot[Any],
        factory: Callable[[], Any],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        done = slot.done = trio.Event()
        try:
            with trio.CancelScope() as scope:
                slot.scope = scope
                async with factory() as node, trio.open_nursery() as nursery:
                    if isinstance(node, NSQD) and lookup_peers_of(node) is None:
                        # NSQD does not run its own lookup peers (yet): run them here.
                        await nursery.start(run_lookup_peers, node)
                    slot.node = node
                    if self.network is None:
                        slot.tcp_address = node.tcp_address
                        slot.http_address = node.http_address
                    else:
                        self.network.serve_node(slot.name, node, slot, nursery)
                    self.faults.trace("up", node=slot.name)
                    task_status.started()
                    await trio.sleep_forever()
        finally:
            if self.network is not None:
                self.network.unlisten(slot.tcp_address)
                self.network.unlisten(slot.http_address)
            if isinstance(slot.node, NSQD):
                self.faults.detach_nsqd(slot.name)
            slot.node = None
            done.set()

    async def _start(self, slot: _Slot[Any], factory: Callable[[str, str], Any]) -> None:
        if self._nursery is None:
            raise RuntimeError("the cluster is not running")
        if slot.node is not None:
            raise RuntimeError("already running")
        try:
            await self._nursery.start(
                self._run_node, slot, lambda: factory(slot.tcp_address, slot.http_address)
            )
        except (OSError, BaseExceptionGroup) as exc:
            if not _only_oserrors(exc):
                raise
            # The old ports were taken meanwhile: take free ones.
            host = split_host_port(slot.tcp_address)[0]
            await self._nursery.start(
                self._run_node,
                slot,
                lambda: factory(join_host_port(host, 0), join_host_port(host, 0)),
            )

    @staticmethod
    async def _stop(slot: _Slot[Any]) -> None:
        if slot.node is None or slot.scope is None or slot.done is None:
            return
        slot.scope.cancel()
        await slot.done.wait()

    async def start_lookupd(self, i: int, *, wait: bool = True) -> NSQLookupd:
        """Start nsqlookupd ``i`` (on its previous ports when it ran before).

        With ``wait``, the nsqds reconnect at once (a real nsqd would at its next
        15 s heartbeat) and this returns when they are all registered again.
        """
        slot = self._lookupd_slots[i]

        def factory(tcp: str, http: str) -> NSQLookupd:
            if self.network is None:
                options = {**self._lookupd_options, "tcp_address": tcp, "http_address": http}
                return NSQLookupd(**options)
            # Served through the network, no sockets; named after its slot.
            lookupd = NSQLookupd(
                **{
                    **self._lookupd_options,
                    "tcp_address": "",
                    "http_address": "",
                    "broadcast_address": split_host_port(tcp)[0],
                }
            )
            lookupd.advertise(tcp, http)
            return lookupd

        await self._start(slot, factory)
        if wait:
            with trio.fail_after(READY_TIMEOUT):
                # Each poke round ends once the peer reconnected and re-registered.
                rounds = [p.poke() for n in self.nsqds if (p := lookup_peers_of(n)) is not None]
                for done in rounds:
                    await done.wait()
            await self.wait_registered()
        return self.lookupd(i)

    async def kill_lookupd(self, i: int) -> None:
        """Kill nsqlookupd ``i`` (the same as stopping it: a lookupd keeps nothing)."""
        await self.stop_lookupd(i)

    async def stop_lookupd(self, i: int) -> None:
        """Stop nsqlookupd ``i``; its registrations are lost, as with a real one."""
        await self._stop(self._lookupd_slots[i])

    async def start_nsqd(self, i: int, *, keep_data: bool = True, wait: bool = True) -> NSQD:
        """Start nsqd ``i`` on its previous ports; ``keep_data=False`` empties its
        data path first.  With ``wait``, returns once it is registered everywhere."""
        slot = self._nsqd_slots[i]
        assert self._data_root is not None
        if not slot.data_path:
            slot.data_path = str(Path(self._data_root) / f"nsqd-{i}")
        _prepare_data_path(slot.data_path, keep_data)

        slot.generation += 1

        def factory(tcp: str, http: str) -> NSQD:
            options: dict[str, Any] = {"broadcast_address": self.host, "data_path": slot.data_path}
            options.update(self._nsqd_options)
            options.update(
                tcp_address=tcp,
                http_address=http,
                lookupd_tcp_addresses=self.lookupd_tcp_addresses,
            )
            if options.get("seed") is not None:
                # Each node and each restart its own stream (a restarted node must
                # not hand out the message ids of the messages it kept).
                options["seed"] = hash((options["seed"], i, slot.generation)) & (2**63 - 1)
            if self.network is not None:
                host, tcp_port = split_host_port(tcp)
                options.update(
                    tcp_address="",
                    http_address="",
                    broadcast_address=host,
                    broadcast_tcp_port=tcp_port,
                    broadcast_http_port=split_host_port(http)[1],
                    node_id=i,
                )
            nsqd = NSQD(**options)
            if self.network is not None:
                set_lookup_connector(nsqd, self.network.connector(slot.name))
                nsqd.http_transport = self.network.http_transport(slot.name)
            self.faults.attach_nsqd(slot.name, nsqd)
            return nsqd

        # The NSQD restores what its last clean stop saved in its data path.
        await self._start(slot, factory)
        if wait:
            await self.wait_registered()
        return self.nsqd(i)

    async def stop_nsqd(self, i: int) -> None:
        """Stop nsqd ``i`` cleanly: its messages (queued, in flight, deferred) are
        kept in its data path for its next start, as a real nsqd flushes them to
        disk; its lookupd connections close, so it is unregistered."""
        # The NSQD saves its state to its data path itself, when its run ends.
        await self._stop(self._nsqd_slots[i])

    async def kill_nsqd(self, i: int) -> None:
        """Kill nsqd ``i``: no clean shutdown, what it held in memory is lost (its
        data path keeps what an earlier clean stop left there)."""
        slot = self._nsqd_slots[i]
        if slot.node is not None:
            slot.node.persist_on_stop = False
        await self._stop(slot)

    # -- nodes by name (fakensq.faults) ---------------------------------------

    def _slot_named(self, name: str) -> tuple[str, int]:
        kind, _, index = name.rpartition("-")
        if kind not in ("nsqd", "lookupd") or not index.isdigit():
            raise ValueError(f"no node {name!r}: names are 'nsqd-N' and 'lookupd-N'")
        slots: list[Any] = self._nsqd_slots if kind == "nsqd" else self._lookupd_slots
        if int(index) >= len(slots):
            raise ValueError(f"no node {name!r}")
        return kind, int(index)

    async def stop_node(self, name: str, *, kill: bool = False) -> None:
        """Stop (or kill) the node named ``"nsqd-N"`` or ``"lookupd-N"``."""
        kind, i = self._slot_named(name)
        if kind == "nsqd":
            await (self.kill_nsqd(i) if kill else self.stop_nsqd(i))
        else:
            await self.stop_lookupd(i)  # a lookupd keeps nothing: kill is stop

    async def start_node(self, name: str) -> None:
        """Start the node named ``"nsqd-N"`` or ``"lookupd-N"`` (keeping its data)."""
        kind, i = self._slot_named(name)
        if kind == "nsqd":
            await self.start_nsqd(i)
        else:
            await self.start_lookupd(i)

    def node_name_at(self, address: str) -> str:
        """The name of the node whose TCP or HTTP address is ``address``."""
        slots: list[_Slot[Any]] = [*self._nsqd_slots, *self._lookupd_slots]
        for slot in slots:
            if address in (slot.tcp_address, slot.http_address):
                return slot.name
        return address

    async def wait_registered(self) -> None:
        """Wait until every running nsqd is a node of every running lookupd
        (``TooSlowError`` after :data:`READY_TIMEOUT`)."""
        with trio.fail_after(READY_TIMEOUT):
            for lookupd in self.lookupds:
                await lookupd.wait_until(lambda lk=lookupd: self._all_registered(lk))  # type: ignore[misc]

    def _all_registered(self, lookupd: NSQLookupd) -> bool:
        known = {(n["broadcast_address"], n["tcp_port"]) for n in lookupd.nodes()}
        for nsqd in self.nsqds:
            opts = nsqd.options
            port = opts.broadcast_tcp_port or split_host_port(nsqd.tcp_address)[1]
            if (opts.broadcast_address, port) not in known:
                return False
        return True

    def lookup_peers(self, i: int) -> LookupPeers | None:
        """nsqd ``i``'s lookup loop (to ``poke()`` it, or inspect its peers)."""
        return lookup_peers_of(self.nsqd(i))


def _slots(kind: str, ports: list[tuple[int, int]], host: str, virtual: bool) -> list[Any]:
    """A slot per ``(tcp, http)`` port pair for the nodes of ``kind``, named
    ``kind-N``; on a simulated network each node is a host of its own name."""
    slots: list[_Slot[Any]] = []
    for i, (tcp, http) in enumerate(ports):
        name = f"{kind}-{i}"
        where = name if virtual else host
        slots.append(_Slot(join_host_port(where, tcp), join_host_port(where, http), name=name))
    return slots


def _only_oserrors(exc: BaseException) -> bool:
    """True for an OSError, or a group (however nested) of nothing else."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_only_oserrors(e) for e in exc.exceptions)
    return isinstance(exc, OSError)


def _prepare_data_path(path: str, keep: bool) -> None:
    # A few small synchronous filesystem calls, at node start only.
    if not keep:
        shutil.rmtree(path, ignore_errors=True)
    Path(path).mkdir(parents=True, exist_ok=True)
