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
import json
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, Literal, Protocol

import trio

from trionsq.protocol.errors import PubFailedError

from ..nsqd.lookup_peer import LookupConnector

if TYPE_CHECKING:
    from ..nsqd.node import NSQD

__all__ = ["Direction", "Fault", "Faults", "FaultyStream", "NodeControl", "Role", "Tracer"]

#: ``"in"``: towards the node (what it reads); ``"out"``: from the node.
Direction = Literal["in", "out", "both"]

#: What a connection is to the node: it subscribed, it published, or neither yet.
Role = Literal["consumer", "producer", "unknown"]


class NodeControl(Protocol):
    """What node faults (stop, kill, start) need: a :class:`fakensq.Cluster`, or
    :class:`fakensq.testing.restartable.RestartableNSQD` for a lone nsqd."""

    async def stop_node(self, name: str, *, kill: bool = False) -> None: ...

    async def start_node(self, name: str) -> None: ...

    def node_name_at(self, address: str) -> str: ...


_HEARTBEAT = b"_heartbeat_"
_BODY_COMMANDS = (b"IDENTIFY", b"PUB", b"MPUB", b"DPUB", b"AUTH")
_MAX_SCAN = 64 * 1024 * 1024
#: The longest command line followed (nsqd's own limit is 16 KiB), and the
#: largest IDENTIFY body read for the client's names (nsqd's default
#: --max-body-size); bodies of other commands are never held.
_MAX_LINE_SCAN = 64 * 1024
_MAX_IDENTIFY_SCAN = 5 * 1024 * 1024
#: The largest frame of the node's held whole before it goes on; a larger one
#: (a message of a large body) is passed on as it comes.
_MAX_FRAME_HOLD = 64 * 1024
#: How much of a message's body the trace keeps.
_TRACED_BODY = 200


class Tracer:
    """Records events as JSON-serialisable dicts with their (virtual) time.

    ``sink`` is a list (events are appended to it) or a path (JSON lines, written
    as they happen, for debugging a failing run).  Times are seconds since the
    tracer's first event, so that runs on a ``MockClock`` compare equal.
    """

    def __init__(self, sink: list[dict[str, Any]] | str | None = None) -> None:
        self.events: list[dict[str, Any]] = sink if isinstance(sink, list) else []
        self._file: IO[str] | None = None
        if isinstance(sink, str):
            # Synchronous, line-buffered writes: the trace is a debugging aid and a
            # crash must not lose its tail.
            self._file = open(sink, "w", buffering=1, encoding="utf-8")
        self._t0: float | None = None

    def record(self, event: str, **fields: Any) -> None:
        now = trio.current_time()
        if self._t0 is None:
            self._t0 = now
        doc = {"t": round(now - self._t0, 6), "event": event, **fields}
        self.events.append(doc)
        if self._file is not None:
            self._file.write(json.dumps(doc, sort_keys=True) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


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
        if self.kind in ("delay", "stall"):
            doc["direction"] = self.direction
        if self.kind == "delay":
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
    """One nsqd's :class:`fakensq.hooks.NodeHooks`, backed by the shared Faults."""

    def __init__(self, faults: Faults, name: str, nsqd: NSQD) -> None:
        self.faults = faults
        self.name = name
        self.nsqd = nsqd

    def wrap_stream(self, stream: trio.abc.Stream, remote: str | None) -> trio.abc.Stream:
        peer = remote or _socket_peer(stream)
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
        for fault in self.faults.active:
            if fault.kind in ("fail_publishes", "fail_backend") and fault.node in (None, self.name):
                if fault.topic is None or fault.topic == topic:
                    self.faults._record("fault_hit", fault, topic=topic, count=count)
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

    def _matching(
        self, kind: str, node: str, peers: tuple[str, ...], role: Role = "unknown"
    ) -> list[Fault]:
        return [f for f in self.active if f.kind == kind and f._concerns(node, peers, role)]

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
    ) -> Fault:
        """Stop the bytes in ``direction`` (connections stay open) until ``heal()``."""
        return self._add(Fault("stall", node=node, peer=client, direction=direction, role=role))

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

    def fail_publishes(self, *, node: str | None = None, topic: str | None = None) -> Fault:
        """Publishes (TCP and HTTP) fail with ``E_PUB_FAILED``."""
        return self._add(Fault("fail_publishes", node=node, topic=topic))

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
        self, *, node: str | None = None, topic: str | None = None, channel: str | None = None
    ) -> int:
        """Time out the matching in-flight messages now (they go back to their
        queues, as at their msg-timeout); returns how many."""
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
                    msgs = list(ch.in_flight.values())
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


def _socket_peer(stream: trio.abc.Stream) -> str:
    sock = getattr(stream, "socket", None)
    if sock is not None:
        try:
            host, port = sock.getpeername()[:2]
            return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        except OSError:
            pass
    return "unknown:0"


class FaultyStream(trio.abc.Stream):
    """A stream that applies a :class:`Faults`'s faults to the bytes it carries.

    ``node`` is the node's name, ``peer`` the other end (a client's name or
    ``"host:port"``, or for a ``dialer`` stream, the node dialled).  With
    ``parse_nsq`` (an nsqd's side of a client connection) it follows NSQ's framing
    both ways: it learns the client's IDENTIFY ``client_id``/``hostname``, traces
    each command and frame, and applies frame faults.  Once a connection upgrades
    to TLS or compression the bytes are opaque and only byte-level faults apply.
    """

    _serials = itertools.count(1)

    def __init__(
        self,
        inner: trio.abc.Stream,
        faults: Faults,
        node: str,
        peer: str,
        *,
        parse_nsq: bool,
        dialer: bool = False,
    ) -> None:
        self.inner = inner
        self.faults = faults
        self.node = node
        self.peer = peer
        self.serial = next(FaultyStream._serials)
        self.dialer = dialer
        self.client_id = ""
        self.hostname = ""
        #: the role seen in the commands (before any TLS or compression)
        self.parsed_role: Role = "unknown"
        #: asks the node for the role (set by the node's hooks)
        self.role_of: Callable[[], Role] | None = None
        self._parse = parse_nsq
        self._opaque = not parse_nsq
        self._in_buf = bytearray()
        self._in_magic = False
        # A body being stepped over: bytes left, and its command (traced once
        # the body has passed).
        self._in_skip = 0
        self._in_pending: tuple[bytes, bytes, int] | None = None
        self._out_buf = bytearray()
        # A large frame being passed on: bytes left, and whether the connection
        # ends after them (a truncate fault).
        self._out_passing = 0
        self._out_cut = False
        self._aborted = False
        self._scopes: set[trio.CancelScope] = set()
        faults._streams.add(self)
        faults.trace("connect", node=node, peer=peer)

    @property
    def socket(self) -> Any:
        """The inner stream's socket (so the node still sees the peer address)."""
        sock = getattr(self.inner, "socket", None)
        if sock is None:
            raise AttributeError("socket")
        return sock

    @property
    def role(self) -> Role:
        """``"consumer"``, ``"producer"`` or ``"unknown"`` (not subscribed, no
        publish yet)."""
        return self.role_of() if self.role_of is not None else self.parsed_role

    @property
    def opaque(self) -> bool:
        """Whether its frames are hidden (TLS or compression): only byte-level
        faults act on it."""
        return self._opaque

    def names(self) -> tuple[str, ...]:
        """The names faults know the client by: its address, host, IDENTIFY
        ``client_id`` and ``hostname``."""
        return self._names()

    def _names(self) -> tuple[str, ...]:
        host = self.peer.rpartition(":")[0].strip("[]")
        names = [self.peer, host]
        if self.client_id:
            names.append(self.client_id)
        if self.hostname:
            names.append(self.hostname)
        return tuple(names)

    def matches(self, node: str | None, client: str | None) -> bool:
        if node is not None and node not in (self.node, self.peer):
            return False
        return client is None or client in self._names()

    # -- gating ----------------------------------------------------------------

    def _blocked(self, direction: Literal["in", "out"]) -> bool:
        names = self._names()
        if self.faults.partitioned(self.node, names):
            return True
        for fault in self.faults._matching("stall", self.node, names, self.role):
            if fault.direction in ("both", direction):
                return True
        return False

    def _delay(self, direction: Literal["in", "out"]) -> float:
        seconds = 0.0
        for fault in self.faults._matching("delay", self.node, self._names(), self.role):
            if fault.direction in ("both", direction):
                seconds = max(seconds, fault.seconds)
        return seconds

    async def _gate(self, direction: Literal["in", "out"]) -> None:
        while self._blocked(direction):
            await self.faults._changed.wait()
        delay = self._delay(direction)
        if delay > 0:
            await trio.sleep(delay)

    def _direction_of(self, sending: bool) -> Literal["in", "out"]:
        # For the node's own side, sending is "out"; a dialer stream is the node
        # dialling a lookupd, where sending is also "out" of the node.
        return "out" if sending else "in"

    async def _guarded(self, op: Callable[[], Awaitable[Any]]) -> Any:
        if self._aborted:
            raise trio.BrokenResourceError("connection dropped (fakensq fault)")
        with trio.CancelScope() as scope:
            self._scopes.add(scope)
            try:
                return await op()
            finally:
                self._scopes.discard(scope)
        raise trio.BrokenResourceError("connection dropped (fakensq fault)")

    async def abort(self) -> None:
        """Drop the connection: pending and later operations fail, the peer sees EOF."""
        if self._aborted:
            return
        self._aborted = True
        self.faults.trace("dropped", node=self.node, peer=self.peer)
        for scope in list(self._scopes):
            scope.cancel()
        await trio.aclose_forcefully(self.inner)

    # -- trio.abc.Stream -----------------------------------------------------

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        async def op() -> None:
            payload = bytes(data)
            if not self._opaque:
                # Frames are traced as the node writes them, before a stall or a
                # delay holds them: the trace keeps the node's view of time.
                payload, truncate = self._scan_out(payload)
                await self._gate(self._direction_of(True))
                await self.inner.send_all(payload)
                if truncate:
                    await self.abort()
                    raise trio.BrokenResourceError("frame truncated (fakensq fault)")
                return
            await self._gate(self._direction_of(True))
            self.faults.trace("bytes", node=self.node, peer=self.peer, dir="out", n=len(payload))
            await self.inner.send_all(payload)

        await self._guarded(op)

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        async def op() -> bytes:
            data = bytes(await self.inner.receive_some(max_bytes))
            if not data:
                # Traced when the peer closed, even if a stall hides it from the node.
                self.faults.trace("eof", node=self.node, peer=self.peer)
            await self._gate(self._direction_of(False))
            if data and self._opaque:
                self.faults.trace("bytes", node=self.node, peer=self.peer, dir="in", n=len(data))
            elif data:
                self._scan_in(data)
            return data

        result: bytes = await self._guarded(op)
        return result

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        if self in self.faults._streams:
            self.faults._streams.discard(self)
            self.faults.trace("closed", node=self.node, peer=self.peer)
            self.faults._wake()  # for waiters on the set of connections
        await self.inner.aclose()

    # -- NSQ framing -----------------------------------------------------------

    def _scan_in(self, data: bytes) -> None:
        """Trace the client's commands; learn its IDENTIFY names.

        What is held is bounded: a line (nsqd's are 16 KiB at most) and an
        IDENTIFY body; the other bodies are stepped over as they pass, never
        held, however long (:meth:`_skip_in`)."""
        if self._in_skip:
            data = self._skip_in(data)
        buf = self._in_buf
        buf += data
        if not self._in_magic:
            if len(buf) < 4:
                return
            self.faults.trace(
                "magic", node=self.node, peer=self.peer, data=buf[:4].decode("latin-1")
            )
            del buf[:4]
            self._in_magic = True
        while buf:
            end = buf.find(b"\n", 0, _MAX_LINE_SCAN)
            if end < 0:
                if len(buf) >= _MAX_LINE_SCAN:
                    self._go_opaque()  # (nsqd closes such a connection)
                return
            line = bytes(buf[:end]).rstrip(b"\r")
            name = line.split(b" ", 1)[0]
            body: bytes | None = None
            size = -1
            if name in _BODY_COMMANDS:
                if len(buf) < end + 5:
                    return
                (size,) = struct.unpack(">l", buf[end + 1 : end + 5])
                if size < 0 or size > _MAX_SCAN:
                    self._go_opaque()
                    return
                if name != b"IDENTIFY" or size > _MAX_IDENTIFY_SCAN:
                    have = len(buf) - (end + 5)
                    if have < size:
                        # Step over the rest of the body as it comes.
                        buf.clear()
                        self._in_skip = size - have
                        self._in_pending = (line, name, size)
                        return
                    del buf[: end + 5 + size]
                else:
                    if len(buf) < end + 5 + size:
                        return
                    body = bytes(buf[end + 5 : end + 5 + size])
                    del buf[: end + 5 + size]
            else:
                del buf[: end + 1]
            if not self._command_in(line, name, size, body):
                return

    def _skip_in(self, data: bytes) -> bytes:
        """Step over the body being skipped; what follows it in ``data``."""
        taken = min(self._in_skip, len(data))
        self._in_skip -= taken
        if not self._in_skip and self._in_pending is not None:
            line, name, size = self._in_pending
            self._in_pending = None
            if not self._command_in(line, name, size, None):
                return b""
        return data[taken:]

    def _command_in(self, line: bytes, name: bytes, size: int, body: bytes | None) -> bool:
        """Trace one whole command and learn from it; False once the bytes are
        not NSQ commands any more (the scan stops)."""
        fields: dict[str, Any] = {"dir": "in", "cmd": line[:120].decode("latin-1")}
        if size >= 0:
            fields["size"] = size
        if name == b"IDENTIFY" and body is not None:
            fields.update(self._learn_identify(body))
        elif name == b"SUB":
            self.parsed_role = "consumer"
        elif name in (b"PUB", b"MPUB", b"DPUB") and self.parsed_role == "unknown":
            self.parsed_role = "producer"
        self.faults.trace("frame", node=self.node, peer=self.peer, **fields)
        if not name.isalpha() or not name.isupper():
            self._go_opaque()  # not NSQ commands (TLS, compression): stop parsing
            return False
        return True

    def _learn_identify(self, body: bytes) -> dict[str, Any]:
        """Learn the client's names; what the trace keeps of its IDENTIFY."""
        try:
            doc = json.loads(body)
        except ValueError:
            return {}
        if not isinstance(doc, dict):
            return {}
        self.client_id = str(doc.get("client_id") or "")
        self.hostname = str(doc.get("hostname") or "")
        timeout = doc.get("msg_timeout")
        # Its own message timeout (ms), which nsqd applies to its messages.
        return {"msg_timeout": timeout} if isinstance(timeout, int) and timeout > 0 else {}

    def _go_opaque(self) -> None:
        self._opaque = True
        self._in_buf.clear()
        self._out_buf.clear()

    def _scan_out(self, data: bytes) -> tuple[bytes, bool]:
        """Apply frame faults to the node's frames; (bytes to send, truncate after)."""
        buf = self._out_buf
        buf += data
        out = bytearray()
        names = self._names()
        role = self.role
        while buf:
            if self._out_passing:
                # A large frame's rest, passed on as it comes.
                taken = min(self._out_passing, len(buf))
                out += buf[:taken]
                del buf[:taken]
                self._out_passing -= taken
                if self._out_passing:
                    break
                if self._out_cut:
                    self._out_cut = False
                    return bytes(out), True
                continue
            if len(buf) < 8:
                break
            (size,) = struct.unpack(">l", buf[:4])
            if size < 4 or size > _MAX_SCAN:
                out += buf
                buf.clear()
                self._go_opaque()
                break
            if len(buf) < 4 + size:
                if size > _MAX_FRAME_HOLD and len(buf) >= 8 + 26 + _TRACED_BODY:
                    self._pass_large_frame(size, names, role)
                    continue
                break
            frame = bytes(buf[: 4 + size])
            del buf[: 4 + size]
            (ftype,) = struct.unpack(">l", frame[4:8])
            payload = frame[8:]
            self._trace_out(ftype, payload)
            if ftype == 0 and payload == _HEARTBEAT:
                swallow = self.faults._matching("swallow_heartbeats", self.node, names, role)
                if swallow:
                    self.faults._record("fault_hit", swallow[0], frame="heartbeat")
                    continue
            for kind in ("corrupt", "truncate"):
                spoil = [
                    f
                    for f in self.faults._matching(kind, self.node, names, role)
                    if f.remaining > 0
                ]
                if not spoil:
                    continue
                fault = spoil[0]
                fault.remaining -= 1
                self.faults._record("fault_hit", fault)
                if fault.remaining == 0:
                    fault.heal()
                if kind == "corrupt":
                    frame = frame[:4] + struct.pack(">l", 0x7F) + frame[8:]
                else:
                    out += frame[: max(1, len(frame) // 2)]
                    return bytes(out), True
            out += frame
            if ftype == 0 and payload[:1] == b"{" and self._upgrades(payload):
                # IDENTIFY's answer turned on TLS or compression: the rest is opaque.
                out += buf
                self._go_opaque()
                break
        return bytes(out), False

    def _pass_large_frame(self, size: int, names: tuple[str, ...], role: Role) -> None:
        """Start passing a frame too large to hold on as it comes (a message
        of a large body): traced, and spoiled by a frame fault, by its head
        (corrupt: its type; truncate: half of it goes, then the connection)."""
        buf = self._out_buf
        (ftype,) = struct.unpack(">l", buf[4:8])
        self._trace_out(ftype, bytes(buf[8 : 8 + 26 + _TRACED_BODY]), size - 4)
        self._out_passing = 4 + size
        for kind in ("corrupt", "truncate"):
            spoil = [
                f for f in self.faults._matching(kind, self.node, names, role) if f.remaining > 0
            ]
            if not spoil:
                continue
            fault = spoil[0]
            fault.remaining -= 1
            self.faults._record("fault_hit", fault)
            if fault.remaining == 0:
                fault.heal()
            if kind == "corrupt":
                buf[4:8] = struct.pack(">l", 0x7F)
            else:
                self._out_passing = max(1, (4 + size) // 2)
                self._out_cut = True
                return

    @staticmethod
    def _upgrades(payload: bytes) -> bool:
        try:
            doc = json.loads(payload)
        except ValueError:
            return False
        return isinstance(doc, dict) and any(doc.get(k) for k in ("tls_v1", "snappy", "deflate"))

    def _trace_out(self, ftype: int, payload: bytes, length: int | None = None) -> None:
        """Trace one frame of the node's (``length``: the payload's, when
        ``payload`` is only its start)."""
        if self.faults.tracer is None:
            return
        fields: dict[str, Any] = {"dir": "out"}
        if length is None:
            length = len(payload)
        if ftype == 2 and len(payload) >= 26:
            (attempts,) = struct.unpack(">H", payload[8:10])
            # The timestamp (bytes 0-8) is wall-clock time: left out so runs compare.
            fields.update(
                frame="message",
                id=payload[10:26].decode("latin-1"),
                attempts=attempts,
                size=length - 26,
                # The body's start, to tell messages apart in a trace.
                body=payload[26 : 26 + _TRACED_BODY].decode("latin-1"),
            )
        else:
            kind = {0: "response", 1: "error"}.get(ftype, str(ftype))
            fields.update(frame=kind, data=payload[:120].decode("latin-1"))
        self.faults.tracer.record("frame", node=self.node, peer=self.peer, **fields)
