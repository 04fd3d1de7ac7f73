"""Fault injection for fakensq clusters, in TCP and in in-memory (simulated) mode.

Every :class:`fakensq.Cluster` (and :class:`fakensq.simulation.SimCluster`) has a
``faults`` attribute, a :class:`Faults`.  Nodes are named ``"nsqd-0"``,
``"nsqd-1"``, ..., ``"lookupd-0"``, ...; a client is named by what the node sees
of it: its in-memory connector's name (``cluster.connector_for("c1")``), its
``client_id`` or ``hostname`` from IDENTIFY, or its remote ``"host:port"``.

Faults that last return a :class:`Fault`; ``fault.heal()`` (or
``faults.heal_all()``) ends it.  Connection faults take a ``role``: ``"consumer"``
(the connection subscribed), ``"producer"`` (it published, never subscribed), or
``None`` for every connection.  A partition's ``"*"`` end stands for every peer.
Each is listed in the affected nsqd's ``/stats``
(a top-level ``"faults"`` list) while active, and every start and end of a fault is
recorded in the trace (:class:`Tracer`), with every frame the nodes exchange.

How it works: each connection an nsqd serves is wrapped in a :class:`FaultyStream`
(through :attr:`fakensq.NSQD.hooks`), and each nsqd's connections to its lookupds
are dialled through a wrapping connector; the wrappers parse NSQ's framing so that
faults can act frame by frame (swallow a heartbeat, corrupt the next frame).  So any
client, in any language, meets the faults in TCP mode.
"""

from __future__ import annotations

import errno
import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import trio

from trionsq.protocol.errors import PubFailedError

from ..faultkinds import KINDS, Direction, Role
from ..nsqd.lookup_peer import LookupConnector
from .stream import FaultyStream, socket_peer
from .tracer import Tracer

if TYPE_CHECKING:
    from ..nsqd.node import NSQD

__all__ = [
    "Direction",
    "Fault",
    "Faults",
    "FaultyStream",
    "NodeControl",
    "Role",
    "Tracer",
    "socket_peer",
]


class FlowObserver(Protocol):
    """Follows the message flow (see :meth:`Faults.observe`)."""

    def __call__(self, stream: FaultyStream, event: str, count: int) -> str: ...


class NodeControl(Protocol):
    """What node faults (stop, kill, start) need: a :class:`fakensq.Cluster`, or
    :class:`fakensq.testing.restartable.RestartableNSQD` for a lone nsqd."""

    async def stop_node(self, name: str, *, kill: bool = False) -> None: ...

    async def start_node(self, name: str) -> None: ...

    def node_name_at(self, address: str) -> str: ...


@dataclass(eq=False)
class Fault:
    """An active fault; :meth:`heal` ends it."""

    kind: str
    node: str | None = None
    peer: str | None = None
    direction: Direction = "both"
    seconds: float = 0.0
    topic: str | None = None
    channel: str | None = None
    #: for one-shot faults (``corrupt``, ``truncate``): frames left to spoil
    remaining: int = -1
    #: only connections with this role (``None``: every connection)
    role: Role | None = None
    #: a stall of the node's writes that takes them (up to a socket buffer's
    #: worth) and holds them, rather than blocking the node's write: the node
    #: goes on reading its client's commands, as behind a stalled network
    buffered: bool = False
    id: int = 0
    _faults: Faults | None = field(default=None, repr=False)
    _undo: Callable[[], None] | None = field(default=None, repr=False)

    @property
    def active(self) -> bool:
        return self._faults is not None and self in self._faults.active

    def heal(self) -> None:
        """End the fault (no-op when it already ended)."""
        if self._faults is not None:
            self._faults._remove(self)

    def describe(self) -> dict[str, Any]:
        """The fault as ``/stats`` and the trace show it."""
        doc: dict[str, Any] = {"id": self.id, "kind": self.kind}
        for name in ("node", "peer", "topic", "channel"):
            value = getattr(self, name)
            if value is not None:
                doc[name] = value
        params = KINDS[self.kind].params
        if "direction" in params:
            doc["direction"] = self.direction
        if "seconds" in params:
            doc["seconds"] = self.seconds
        if self.remaining >= 0:
            doc["remaining"] = self.remaining
        if self.role is not None:
            doc["role"] = self.role
        return doc

    def _concerns(self, a: str, b_names: tuple[str, ...], role: Role = "unknown") -> bool:
        """Whether this fault applies between node-or-peer ``a`` and any of ``b_names``
        (a connection whose role is ``role``)."""
        if self.role is not None and self.role != role:
            return False
        if self.kind == "partition":
            assert self.node is not None and self.peer is not None
            first, second = self.node, self.peer

            def end(name: str, *names: str) -> bool:
                return name == "*" or name in names

            return (end(first, a) and end(second, *b_names)) or (
                end(second, a) and end(first, *b_names)
            )
        if self.node is not None and self.node != a:
            return False
        return self.peer is None or self.peer in b_names


class _NodeHooks:
    """One nsqd's :class:`fakensq.nsqd.hooks.NodeHooks`, backed by the shared Faults."""

    def __init__(self, faults: Faults, name: str, nsqd: NSQD) -> None:
        self.faults = faults
        self.name = name
        self.nsqd = nsqd

    def wrap_stream(self, stream: trio.abc.Stream, remote: str | None) -> trio.abc.Stream:
        peer = remote or socket_peer(stream)
        faulty = FaultyStream(stream, self.faults, self.name, peer, parse_nsq=True)
        faulty.role_of = functools.partial(self.role_of, faulty)
        return faulty

    def role_of(self, stream: FaultyStream) -> Role:
        """The role of the client served over ``stream``, as the node knows it
        (it knows even once TLS or compression hide the commands)."""
        for client in list(self.nsqd.clients.values()):
            inner: Any = client.stream
            # TLS wraps the stream: look through the layers for ours.
            while inner is not None and inner is not stream:
                inner = getattr(inner, "transport_stream", None)
            if inner is stream:
                if client.channel is not None:
                    return "consumer"
                return "producer" if client.is_producer() else "unknown"
        return stream.parsed_role

    def before_put(self, topic: str, count: int) -> None:
        for fault in list(self.faults.active):
            if fault.kind in ("fail_publishes", "fail_backend") and fault.node in (None, self.name):
                if fault.topic is None or fault.topic == topic:
                    self.faults.hit(fault, topic=topic, count=count)
                    if fault.remaining > 0:
                        # One of a count of failing publishes.
                        fault.remaining -= 1
                        if fault.remaining == 0:
                            fault.heal()
                    if fault.kind == "fail_backend":
                        raise PubFailedError(f"PUB failed backend write failed for {topic}")
                    raise PubFailedError(f"PUB failed {topic}")

    def report(self) -> list[dict[str, Any]]:
        return [
            f.describe()
            for f in self.faults.active
            if f.node in (None, self.name) or (f.kind == "partition" and f.peer == self.name)
        ]


class Faults:
    """The fault injector of a cluster (``cluster.faults``); see the module doc."""

    def __init__(self, cluster: NodeControl | None = None, tracer: Tracer | None = None) -> None:
        #: what stops and starts nodes (a Cluster; None: node faults are refused)
        self.cluster = cluster
        self.tracer = tracer
        #: the faults in force, oldest first
        self.active: list[Fault] = []
        self._ids = itertools.count(1)
        self._changed = trio.Event()
        self._streams: set[FaultyStream] = set()
        self._nodes: dict[str, NSQD] = {}
        #: how many faults were injected, all kinds (node restarts included)
        self.injected = 0
        self._observers: list[FlowObserver] = []

    # -- wiring (called by the Cluster) ------------------------------------

    def attach_nsqd(self, name: str, nsqd: NSQD) -> None:
        """Route ``nsqd``'s connections (and its lookupd peers') through the faults."""
        from ..nsqd.lookup_peer import lookup_connector_of, set_lookup_connector

        nsqd.hooks = _NodeHooks(self, name, nsqd)
        self._nodes[name] = nsqd
        base = lookup_connector_of(nsqd)
        set_lookup_connector(nsqd, self.wrap_connector(name, base))
        for fault in self.active:
            if fault.kind in ("refuse_auth", "hang_auth", "fail_backend"):
                self._apply_node_fault(fault)

    def serves(self, node: str) -> bool:
        """Whether ``node`` is one of fakensq's own nsqds (attached), whose
        insides the faults reach (in-flight messages): not a real nsqd
        behind a proxy."""
        return node in self._nodes

    def detach_nsqd(self, name: str) -> None:
        self._nodes.pop(name, None)

    def wrap_connector(self, source: str, base: LookupConnector | None) -> LookupConnector:
        """A connector from ``source`` whose streams go through the faults."""
        from ..golang.net import join_host_port

        async def connect(host: str, port: int) -> trio.abc.Stream:
            target = self.node_at(join_host_port(host, port))
            if self.partitioned(source, (target,)):
                raise OSError(errno.ETIMEDOUT, f"dial tcp {host}:{port}: i/o timeout (partition)")
            if base is None:
                stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
            else:
                stream = await base(host, port)
            return FaultyStream(stream, self, source, target, parse_nsq=False, dialer=True)

        return connect

    def node_at(self, address: str) -> str:
        """The node name listening at ``address`` (the address itself if unknown)."""
        if self.cluster is not None:
            return self.cluster.node_name_at(address)
        return address

    # -- bookkeeping -----------------------------------------------------

    def _record(self, event: str, fault: Fault | None = None, **fields: Any) -> None:
        if self.tracer is not None:
            if fault is not None:
                fields = {**fault.describe(), **fields}
            self.tracer.record(event, **fields)

    def trace(self, event: str, **fields: Any) -> None:
        """Add an event of the caller's own to the trace (no-op without one)."""
        if self.tracer is not None:
            self.tracer.record(event, **fields)

    def _add(self, fault: Fault) -> Fault:
        fault.id = next(self._ids)
        fault._faults = self
        self.active.append(fault)
        self.injected += 1
        self._record("fault", fault)
        self._apply_node_fault(fault)
        self._wake()
        return fault

    def _remove(self, fault: Fault) -> None:
        if fault not in self.active:
            return
        self.active.remove(fault)
        if fault._undo is not None:
            fault._undo()
            fault._undo = None
        self._record("heal", fault)
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_changed(self) -> None:
        """Wait until a fault starts or ends, or a connection closes."""
        await self._changed.wait()

    def heal_all(self) -> None:
        """End every active fault."""
        for fault in list(self.active):
            fault.heal()

    def _apply_node_fault(self, fault: Fault) -> None:
        """Faults that change a node object (auth handler, health) rather than streams."""
        targets = [n for name, n in self._nodes.items() if fault.node in (None, name)]
        if fault.kind == "fail_backend":
            for node in targets:
                node.set_health(f"failed to write message to backend - {fault.kind} (fakensq)")

            def undo() -> None:
                for node in targets:
                    node.set_health(None)

            fault._undo = undo
        elif fault.kind in ("refuse_auth", "hang_auth"):
            saved = [(n, n.auth_handler) for n in targets if n.auth_enabled]

            async def refuse(query: dict[str, str]) -> dict[str, Any]:
                raise ConnectionRefusedError("auth server refused the connection (fakensq fault)")

            async def hang(query: dict[str, str]) -> dict[str, Any]:
                await trio.sleep_forever()
                raise AssertionError("unreachable")

            for node, _ in saved:
                node.auth_handler = refuse if fault.kind == "refuse_auth" else hang

            def restore() -> None:
                for node, handler in saved:
                    node.auth_handler = handler

            fault._undo = restore

    # -- queries used by the streams ----------------------------------------

    def partitioned(self, a: str, b_names: tuple[str, ...]) -> bool:
        """Whether ``a`` and any of ``b_names`` are partitioned from each other."""
        return any(f.kind == "partition" and f._concerns(a, b_names) for f in self.active)

    # -- what the streams ask (their internal API) ------------------------------

    def matching(
        self, kind: str, node: str, peers: tuple[str, ...], role: Role = "unknown"
    ) -> list[Fault]:
        """The active faults of ``kind`` that apply between ``node`` and a peer
        known by ``peers`` over a connection of ``role``."""
        return [f for f in self.active if f.kind == kind and f._concerns(node, peers, role)]

    def spend(self, kind: str, node: str, peers: tuple[str, ...], role: Role) -> Fault | None:
        """A one-shot frame fault of ``kind`` (``corrupt``, ``truncate``) that
        applies to the frame going out now: one of its frames is spent (it
        heals when none is left), recorded as hit; None when there is none."""
        for fault in self.matching(kind, node, peers, role):
            if fault.remaining > 0:
                fault.remaining -= 1
                self.hit(fault)
                if fault.remaining == 0:
                    fault.heal()
                return fault
        return None

    def hit(self, fault: Fault, **fields: Any) -> None:
        """Trace that ``fault`` acted (on a frame, a publish...)."""
        self._record("fault_hit", fault, **fields)

    @property
    def tracing(self) -> bool:
        """Whether the faults keep a trace (frames are traced only then)."""
        return self.tracer is not None

    @property
    def observing(self) -> bool:
        """Whether something follows the message flow (:meth:`watch`)."""
        return bool(self._observers)

    def watch(self, observer: FlowObserver) -> None:
        """Tell ``observer`` of every event of the message flow the streams see
        (:meth:`observe`), until :meth:`unwatch`."""
        self._observers.append(observer)

    def unwatch(self, observer: FlowObserver) -> None:
        if observer in self._observers:
            self._observers.remove(observer)

    def observe(self, stream: FaultyStream, event: str, count: int) -> str:
        """A stream saw ``count`` events of the flow (``"sent"``: a message to
        a consumer; ``"fin"``; ``"published"``: messages of a publish;
        ``"publish"``: the publish command, after its messages) before
        the node acts on it; what the stream does: ``"pass"``, ``"drop"`` (the
        connection drops: after the message sent, or before the node reads
        the command) or ``"withhold"`` (a message sent: the connection drops
        before it, so the client never gets it)."""
        verdicts = {observer(stream, event, count) for observer in list(self._observers)}
        for verdict in ("withhold", "drop"):
            if verdict in verdicts:
                return verdict
        return "pass"

    def opened(self, stream: FaultyStream) -> None:
        """A connection the faults now see."""
        self._streams.add(stream)
        self.trace("connect", node=stream.node, peer=stream.peer)

    def closed(self, stream: FaultyStream) -> None:
        """A connection closed (waiters on the set of connections wake)."""
        if stream in self._streams:
            self._streams.discard(stream)
            self.trace("closed", node=stream.node, peer=stream.peer)
            self._wake()

    def connections(
        self, *, node: str | None = None, client: str | None = None, role: Role | None = None
    ) -> list[FaultyStream]:
        """The live connections the faults see (oldest first), optionally only
        those of ``node``, ``client`` or with ``role``."""
        found = [
            s
            for s in self._streams
            if not s.dialer and s.matches(node, client) and (role is None or s.role == role)
        ]
        return sorted(found, key=lambda s: s.serial)

    # -- node faults (need a Cluster) ----------------------------------------

    def _need_cluster(self) -> NodeControl:
        if self.cluster is None:
            raise RuntimeError("node faults need a Cluster")
        return self.cluster

    async def stop(self, node: str) -> None:
        """Stop a node cleanly (an nsqd persists its messages to its data path)."""
        self.injected += 1
        self.trace("stop", node=node)
        await self._need_cluster().stop_node(node)

    async def kill(self, node: str) -> None:
        """Kill a node: no clean shutdown, its in-memory state is lost."""
        self.injected += 1
        self.trace("kill", node=node)
        await self._need_cluster().stop_node(node, kill=True)

    async def start(self, node: str) -> None:
        """Start a stopped node again (same addresses, same data path)."""
        self.trace("start", node=node)
        await self._need_cluster().start_node(node)

    async def restart(self, node: str, *, kill: bool = False) -> None:
        """Stop (or kill) and start a node again."""
        await (self.kill(node) if kill else self.stop(node))
        await self.start(node)

    # -- connection faults ---------------------------------------------------

    async def drop(
        self, *, node: str | None = None, client: str | None = None, role: Role | None = None
    ) -> int:
        """Drop (abort) the matching live connections (only those with ``role``,
        when given); returns how many."""
        victims = [s for s in self._streams if s.matches(node, client) and role in (None, s.role)]
        victims.sort(key=lambda s: s.serial)  # a set's order is not deterministic
        self.injected += 1
        self.trace("drop", node=node, peer=client, role=role, count=len(victims))
        for stream in victims:
            await stream.abort()
        return len(victims)

    def partition(self, a: str, b: str) -> Fault:
        """Cut ``a`` off from ``b`` (a client and a node, or an nsqd and a lookupd;
        ``"*"`` for every peer): their bytes stop flowing both ways and new
        connections between them fail, until ``heal()``."""
        return self._add(Fault("partition", node=a, peer=b))

    def delay(
        self,
        seconds: float,
        *,
        node: str | None = None,
        client: str | None = None,
        direction: Direction = "both",
        role: Role | None = None,
    ) -> Fault:
        """Hold every write (``"out"``: from the node, ``"in"``: to it) for ``seconds``."""
        return self._add(
            Fault("delay", node=node, peer=client, direction=direction, seconds=seconds, role=role)
        )

    def stall(
        self,
        *,
        node: str | None = None,
        client: str | None = None,
        direction: Direction = "both",
        role: Role | None = None,
        buffered: bool = False,
    ) -> Fault:
        """Stop the bytes in ``direction`` (connections stay open) until ``heal()``.
        ``buffered``: the node's writes are held, not blocked (up to a socket
        buffer's worth): it goes on reading, as nsqd behind a stalled network
        does; they go out once healed, when something sends them
        (:meth:`FaultyStream.release_held`, or the node's next write)."""
        return self._add(
            Fault(
                "stall", node=node, peer=client, direction=direction, role=role, buffered=buffered
            )
        )

    def swallow_heartbeats(
        self, *, node: str | None = None, client: str | None = None, role: Role | None = None
    ) -> Fault:
        """The node's heartbeats never reach the client."""
        return self._add(Fault("swallow_heartbeats", node=node, peer=client, role=role))

    def corrupt_next_frame(
        self,
        *,
        node: str | None = None,
        client: str | None = None,
        count: int = 1,
        role: Role | None = None,
    ) -> Fault:
        """The next ``count`` frames from the node get an invalid frame type."""
        return self._add(Fault("corrupt", node=node, peer=client, remaining=count, role=role))

    def truncate_next_frame(
        self, *, node: str | None = None, client: str | None = None, role: Role | None = None
    ) -> Fault:
        """The next frame from the node is cut in half, then the connection drops."""
        return self._add(Fault("truncate", node=node, peer=client, remaining=1, role=role))

    def fail_publishes(
        self, *, node: str | None = None, topic: str | None = None, count: int = -1
    ) -> Fault:
        """Publishes (TCP and HTTP) fail with ``E_PUB_FAILED`` (the next
        ``count`` of them, or until healed)."""
        return self._add(Fault("fail_publishes", node=node, topic=topic, remaining=count))

    def fail_backend(self, *, node: str | None = None) -> Fault:
        """The node's message store refuses writes: publishes fail with
        ``E_PUB_FAILED`` and ``/ping`` reports the node unhealthy."""
        return self._add(Fault("fail_backend", node=node))

    def refuse_auth(self, *, node: str | None = None) -> Fault:
        """The auth server refuses connections: ``AUTH`` fails (``E_AUTH_FAILED``)."""
        return self._add(Fault("refuse_auth", node=node))

    def hang_auth(self, *, node: str | None = None) -> Fault:
        """The auth server accepts but never answers: ``AUTH`` hangs."""
        return self._add(Fault("hang_auth", node=node))

    def time_out_in_flight(
        self,
        *,
        node: str | None = None,
        topic: str | None = None,
        channel: str | None = None,
        client: str | None = None,
    ) -> int:
        """Time out the matching in-flight messages now (they go back to their
        queues, as at their msg-timeout); ``client``: only those sent to the
        connection from that ``host:port``.  Returns how many."""
        count = 0
        timed_out: list[list[Any]] = []
        now = trio.current_time()
        for name, nsqd in sorted(self._nodes.items()):
            if node is not None and name != node:
                continue
            for tname, t in nsqd.topics.items():
                if topic is not None and tname != topic:
                    continue
                for cname, ch in t.channels.items():
                    if channel is not None and cname != channel:
                        continue
                    # Re-arm each message's deadline at "now" through the channel's
                    # own timer heap, so its normal timeout path requeues it.
                    msgs = [
                        m
                        for m in ch.in_flight.values()
                        if client is None
                        or (m.client is not None and m.client.remote_address == client)
                    ]
                    for msg in msgs:
                        timed_out.append([name, msg.id.decode("latin-1"), msg.attempts])
                        count += 1
                    ch.time_out(msgs, now)
        self.injected += 1
        # Which messages (node, id, attempts): some may not have left the
        # node's output buffer yet, and a checker must know they are void.
        self.trace(
            "time_out_in_flight",
            node=node,
            topic=topic,
            channel=channel,
            client=client,
            count=count,
            messages=timed_out,
        )
        return count

    def pause_channel(self, topic: str, channel: str, *, node: str | None = None) -> Fault:
        """Pause the channel (on one node, or all) until ``heal()``."""
        fault = Fault("pause_channel", node=node, topic=topic, channel=channel)
        self._add(fault)
        paused = []
        for name, nsqd in sorted(self._nodes.items()):
            if node is not None and name != node:
                continue
            t = nsqd.get_existing_topic(topic)
            ch = t.channels.get(channel) if t is not None else None
            if ch is not None and not ch.paused:
                ch.pause()
                paused.append(ch)

        def unpause() -> None:
            for ch in paused:
                if not ch.exiting:
                    ch.unpause()

        fault._undo = unpause
        return fault
