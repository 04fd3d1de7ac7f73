"""The driver side of the ``nsq`` source: plans batches, carries no message.

Runs in the process Spark runs the source's driver half in, on a Trio thread,
as a small TCP server.  The executors' agents connect to it (one link per agent
and query), tell it how many messages wait in their prefetch buffers, and ask it
how to serve every read (:mod:`._ledger`).  Spark's calls map onto it:

- ``latestOffset(start)``: the batches up to ``start`` are committed, so their
  message sets are FINed (told to their agents); then a batch is planned if an
  agent holds messages (or none is known yet: the first batch finds them);
- ``partitions``: one partition per executor core the agents reported (or the
  ``num_partitions`` option), each naming this server and the batch;
- ``stop()``: every agent requeues what it holds for the query and closes its
  connections to nsqd.

Offsets are ``{"batch": n}``: NSQ has no positions, so an offset only counts
micro-batches.
"""

from __future__ import annotations

import hmac
import logging
import math
import socket
from dataclasses import dataclass, field
from typing import Any

import trio

from ._executor import driver_settings, executor_cores
from ._framing import FramingError, Limits
from ._ledger import LateReadError, Ledger, SetState
from ._link import Link, ReadError
from ._options import SourceOptions
from ._peers import Gate, serve
from ._phases import mark
from ._secure import QueryKeys, accept

__all__ = ["Coordinator", "default_host"]

log = logging.getLogger("trionsq.spark")

#: Agents hear from the coordinator at least this often (their link times out
#: after agent.LINK_TIMEOUT of silence).
TICK = 1.0
#: How long planning waits at most for the agents to settle (see Agent.settled).
SETTLE_LIMIT = 30.0
LINK_TIMEOUT = 15.0
#: How long committing or stopping waits for the agents' acknowledgements.
ACK_TIMEOUT = 10.0
#: A connection must say hello (the query's token) within this, and at most this
#: many may be trying at once: a peer that has not proven itself costs little, briefly.
HELLO_TIMEOUT = 15.0
MAX_UNPROVEN = 64
#: The first frame is a hello: small, no payload.  A linked agent's frames
#: (status, read, ready, void, replies) are small too, and never carry a payload.
HELLO_LIMITS = Limits(header=4096)
LINK_LIMITS = Limits(header=64 << 10)
#: Set ids per resolve frame: 10,000 random ids (up to 19 digits) stay well under
#: the 1 MiB an agent accepts in a header.
RESOLVE_CHUNK = 10_000


def listen_address(options: SourceOptions, settings: dict[str, str] | None) -> tuple[str, str]:
    """Where the coordinator listens, and the host name its partitions give the
    executors: no wider than they need.

    ``coordinator_host`` if it is set; loopback if Spark runs in local mode
    (``local``, ``local-cluster``: every executor is on this machine); else the
    address Spark itself listens on for the driver (``spark.driver.bindAddress``,
    named ``spark.driver.host``); else (the driver's settings unknown) the host
    :func:`default_host` finds.  ``settings``: the driver's (see
    :func:`._executor.driver_settings`).
    """
    if options.coordinator_host:
        return options.coordinator_host, options.coordinator_host
    settings = settings or {}
    if settings.get("spark.master", "").startswith("local"):
        return "127.0.0.1", "127.0.0.1"
    named = settings.get("spark.driver.host")
    bind = settings.get("spark.driver.bindAddress") or named
    if bind:
        return bind, named or bind
    host = default_host()
    return host, host


def default_host() -> str:
    """The address executors reach this driver at: Spark's own choice if it was
    given (``SPARK_LOCAL_IP``, ``SPARK_LOCAL_HOSTNAME``), else this host's address
    on its default route, else loopback."""
    import os

    for name in ("SPARK_LOCAL_IP", "SPARK_LOCAL_HOSTNAME"):
        value = os.environ.get(name)
        if value:
            return value
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        # No packet is sent: connecting a UDP socket only picks the route.
        probe.connect(("192.0.2.1", 9))
        address: str = probe.getsockname()[0]
        return address
    except OSError:
        return "127.0.0.1"
    finally:
        probe.close()


@dataclass(slots=True)
class AgentInfo:
    id: str
    executor: str
    host: str
    cores: int
    peer: tuple[str, int]
    link: Link
    pid: int = 0
    buffered: int = 0
    slots: int = 0
    reads: int = 0
    finished: int = 0
    requeued: int = 0
    #: the agent's last word: nothing held, quiet since its last FINs (fresh only
    #: after the answer to the latest resolve)
    settled: bool = False


@dataclass(slots=True)
class BatchPlan:
    partitions: int
    limit: int | None


@dataclass(slots=True)
class CoordinatorStats:
    """What the coordinator knows (for tests, the benchmark and logs)."""

    agents: dict[str, dict[str, Any]] = field(default_factory=dict)
    finished: int = 0
    requeued: int = 0
    warnings: list[str] = field(default_factory=list)


class Coordinator:
    """The TCP server agents link to, and the bookkeeping behind Spark's calls."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        #: the query's token and TLS key, which its tasks carry to their agents
        self.keys = QueryKeys.new()
        self.token = self.keys.token
        self.ledger = Ledger()
        self.agents: dict[str, AgentInfo] = {}
        self.address: tuple[str, int] | None = None
        self.plans: dict[int, BatchPlan] = {}
        self.stats = CoordinatorStats()
        self._data = trio.Event()
        self._status_seen = trio.Event()
        self._changes: dict[int, trio.Event] = {}
        self._stopped = False
        self._gate = Gate(MAX_UNPROVEN, HELLO_TIMEOUT)
        #: the executors' task slots as the driver's settings say (None: unknown)
        self._cores: int | None = None

    # --- serving ---

    async def serve(
        self, *, task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED
    ) -> None:
        settings = driver_settings()
        self._cores = executor_cores(settings)
        bind, host = listen_address(self.options, settings)
        listeners = await trio.open_tcp_listeners(self.options.coordinator_port, host=bind)
        port = listeners[0].socket.getsockname()[1]
        self.address = (host, port)
        log.info("nsq source coordinator on %s:%d (as %s)", bind, port, host)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve, self._handle, listeners, "nsq source coordinator")
            nursery.start_soon(self._tick)
            task_status.started(self.address)

    async def _tick(self) -> None:
        while True:
            await trio.sleep(TICK)
            # Each on its own: an agent that stops reading delays nobody else's tick
            # (its link breaks after LINK_TIMEOUT).
            async with trio.open_nursery() as nursery:
                for agent in list(self.agents.values()):
                    nursery.start_soon(self._send_quietly, agent.link, {"op": "tick"})

    @staticmethod
    async def _send_quietly(link: Link, header: dict[str, Any]) -> None:
        try:
            await link.send(header)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def _handle(self, stream: trio.SocketStream) -> None:
        """One agent's link, from its hello to its end (failures end it alone: see
        :func:`._peers.serve`)."""
        link: Link | None = None
        agent: AgentInfo | None = None
        try:
            with self._gate.unproven():
                tls = await accept(stream, self.keys.server_context())
                link = Link(tls, HELLO_LIMITS, send_timeout=LINK_TIMEOUT)
                header, _ = await link.receive()
                refusal = self._refusal(header)
                if refusal is not None:
                    await link.send({"re": _ident(header), "error": refusal})
                    return
            # Proven: the same receiver reads on (it may hold the next frame already).
            link.receive.limits = LINK_LIMITS
            agent = self._admit(link, header)
            await link.send({"re": _ident(header), "ok": True})
            async with trio.open_nursery() as nursery:
                await self._receive(agent, nursery)
                nursery.cancel_scope.cancel()
        finally:
            if link is not None:
                link.fail_pending()
            if agent is not None:
                self._agent_lost(agent)

    def _refusal(self, header: dict[str, Any]) -> str | None:
        """Why a hello is refused (None: it is this query's agent)."""
        token = header.get("token")
        if (
            header.get("op") != "hello"
            or not isinstance(token, str)
            or not hmac.compare_digest(token.encode(), self.token.encode())
        ):
            return "not this query's agent"
        if self._stopped:
            return "the query is stopping"
        return None

    def _admit(self, link: Link, header: dict[str, Any]) -> AgentInfo:
        peer = header.get("peer") or ["", 0]
        agent = AgentInfo(
            id=str(header["agent"]),
            executor=str(header.get("executor", "?")),
            host=str(header.get("host", "?")),
            cores=max(1, int(header.get("cores", 1))),
            peer=(str(peer[0]), int(peer[1])),
            link=link,
            pid=int(header.get("pid", 0)),
        )
        self.agents[agent.id] = agent
        self.ledger.agent_joined(agent.id)
        mark("coordinator.agent_linked", agent=agent.id)
        log.info("nsq source: agent %s (executor %s) linked", agent.id, agent.executor)
        return agent

    async def _receive(self, agent: AgentInfo, nursery: trio.Nursery) -> None:
        link = agent.link
        try:
            while True:
                with trio.fail_after(LINK_TIMEOUT):
                    header, _ = await link.receive()
                if not link.deliver(header):
                    self._dispatch(agent, header, nursery)
        except (EOFError, OSError, FramingError, trio.TooSlowError) as exc:
            log.info("nsq source: agent %s gone (%r)", agent.id, exc)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    def _agent_lost(self, agent: AgentInfo) -> None:
        if self.agents.get(agent.id) is agent:
            del self.agents[agent.id]
        for set_id in self.ledger.agent_lost(agent.id):
            self._changed(set_id)

    def _changed(self, set_id: int) -> None:
        event = self._changes.pop(set_id, None)
        if event is not None:
            event.set()

    def _dispatch(self, agent: AgentInfo, header: dict[str, Any], nursery: trio.Nursery) -> None:
        op = header.get("op")
        if op == "status":
            agent.buffered = int(header.get("buffered", 0))
            agent.slots = int(header.get("slots", 0))
            agent.settled = bool(header.get("settled", False))
            if agent.buffered > 0:
                self._data.set()
            self._status_seen.set()
        elif op == "read":
            agent.reads += 1
            nursery.start_soon(self._decide, agent, header)
        elif op == "ready":
            self.ledger.set_ready(int(header["set"]), int(header.get("count", 0)))
            self._changed(int(header["set"]))
        elif op == "void":
            self.ledger.set_void(int(header["set"]))
            self._changed(int(header["set"]))
        else:
            log.warning("nsq source: agent %s sent an unknown operation %r", agent.id, op)

    async def _decide(self, agent: AgentInfo, header: dict[str, Any]) -> None:
        """Answer a read: fresh, or replay the partition's live set (once it is ready)."""
        batch, partition = int(header["batch"]), int(header["partition"])
        reply: dict[str, Any]
        while True:
            live = self.ledger.live_set(batch, partition)
            if live is not None and live.state is SetState.TAKING:
                # Another attempt is taking it right now: replay it once complete.
                event = self._changes.setdefault(live.id, trio.Event())
                await event.wait()
                continue
            try:
                decision = self.ledger.start_read(
                    batch,
                    partition,
                    int(header.get("stage", 0)),
                    int(header.get("attempt", 0)),
                    int(header.get("task", 0)),
                    agent.id,
                )
            except LateReadError as exc:
                reply = {"error": f"{exc}: this task's rows are not used"}
                break
            except KeyError:
                reply = {"error": "this executor's agent is not linked any more"}
                break
            holder = self.agents.get(decision.holder)
            reply = {
                "fresh": decision.fresh,
                "set": decision.set_id,
                "holder": decision.holder,
                "peer": list(holder.peer) if holder is not None else None,
            }
            break
        await self._send_quietly(agent.link, {"re": header.get("id"), **reply})

    # --- Spark's calls ---

    def buffered(self) -> int:
        return sum(a.buffered for a in self.agents.values())

    def partition_count(self) -> int:
        """``num_partitions``, else one per executor core the agents reported (before
        any has: the cores the driver's settings give, else one per nsqd address,
        at least 2).  A first batch with more partitions than task slots would run
        in two waves, each reading and writing its share: a second's loss."""
        if self.options.num_partitions is not None:
            return self.options.num_partitions
        cores: dict[tuple[str, str], int] = {}
        for agent in self.agents.values():
            if agent.executor == "driver":
                # Local mode: the JVM does not say how many task slots it has; count
                # the slots its agent needed (tasks that ran at once), at least 2.
                slots = max(2, agent.slots)
            else:
                slots = agent.cores
            key = (agent.executor, agent.host)
            cores[key] = max(cores.get(key, 0), slots)
        if not cores:
            return self._cores or max(2, len(self.options.connection.nsqd_tcp_addresses))
        return max(1, sum(cores.values()))

    async def latest(self, start: int, per_trigger: int | None, ending: bool = False) -> int:
        """Commit through ``start``, then the end of the next batch (``start``: none).

        ``ending``: ``Trigger.AvailableNow``, whose first "no batch" ends the query:
        said as soon as every agent has settled (a stream that goes on waits up to
        ``max_batch_wait`` for messages first, so that an idle channel is not
        asked about in a busy loop)."""
        await self.commit(start)
        # With no agent (the first batch, or all were lost) or no slot open yet,
        # nobody could report messages: a batch finds out (and opens them).
        probing = not any(agent.slots for agent in self.agents.values())
        if not probing and self.buffered() == 0:
            self._data = trio.Event()
            if not ending:
                with trio.move_on_after(self.options.max_batch_wait):
                    await self._data.wait()
            # No batch (and the end of an AvailableNow query) only once every agent
            # has seen nothing come since its last FINs: nsqd may still be refilling.
            with trio.move_on_after(SETTLE_LIMIT):
                while self.buffered() == 0 and not all(a.settled for a in self.agents.values()):
                    self._status_seen = trio.Event()
                    await self._status_seen.wait()
            if self.buffered() == 0:
                mark("coordinator.no_batch", start=start)
                return start
        # Messages wait on some executor, or no agent is known yet (the first batch
        # starts them; it reads what arrives within max_batch_wait).
        partitions = self.partition_count()
        limit = math.ceil(per_trigger / partitions) if per_trigger is not None else None
        self.plans[start + 1] = BatchPlan(partitions, limit)
        return start + 1

    def plan(self, batch: int) -> BatchPlan:
        """How batch ``batch`` is read (planned now if an earlier run planned it)."""
        plan = self.plans.pop(batch, None)
        for old in [b for b in self.plans if b < batch]:
            del self.plans[old]
        if plan is None:
            per_trigger = self.options.max_messages_per_trigger
            partitions = self.partition_count()
            limit = math.ceil(per_trigger / partitions) if per_trigger is not None else None
            plan = BatchPlan(partitions, limit)
        return plan

    async def commit(self, through: int) -> None:
        """The batches up to ``through`` are committed: FIN the sets they used."""
        if through <= self.ledger.resolved_through:
            return
        resolution = self.ledger.resolve(through)
        for warning in resolution.warnings:
            log.warning("nsq source %s/%s: %s", self.options.topic, self.options.channel, warning)
            self.stats.warnings.append(warning)
        agents = resolution.agents
        if not agents:
            return
        async with trio.open_nursery() as nursery:
            for agent_id in agents:
                agent = self.agents.get(agent_id)
                if agent is None:
                    continue
                fin = resolution.fin.get(agent_id, [])
                req = resolution.req.get(agent_id, [])
                # In frames the agent accepts (its limit on a header), however many.
                headers = [
                    {
                        "op": "resolve",
                        "fin": fin[start : start + RESOLVE_CHUNK],
                        "req": req[start : start + RESOLVE_CHUNK],
                    }
                    for start in range(0, max(len(fin), len(req)), RESOLVE_CHUNK)
                ]
                nursery.start_soon(self._tell_each, agent, headers)

    async def _tell_each(self, agent: AgentInfo, headers: list[dict[str, Any]]) -> None:
        for header in headers:
            await self._tell(agent, header)

    async def _tell(self, agent: AgentInfo, header: dict[str, Any]) -> None:
        try:
            reply = await agent.link.request(header, patience=ACK_TIMEOUT)
        except (
            OSError,
            ConnectionError,
            ReadError,
            trio.TooSlowError,
            trio.BrokenResourceError,
            trio.ClosedResourceError,
        ) as exc:
            log.warning("nsq source: agent %s did not answer %s: %r", agent.id, header["op"], exc)
            return
        if header["op"] == "resolve":
            agent.settled = False  # until a status sent after this answer says so
        finished = int(reply.get("finished", 0))
        requeued = int(reply.get("requeued", 0))
        agent.finished += finished
        agent.requeued += requeued
        self.stats.finished += finished
        self.stats.requeued += requeued

    async def stop(self) -> None:
        """Every agent requeues what it holds of this query and closes its connections."""
        self._stopped = True
        self.ledger.release_all()
        async with trio.open_nursery() as nursery:
            for agent in list(self.agents.values()):
                nursery.start_soon(self._tell, agent, {"op": "stop"})

    def snapshot(self) -> CoordinatorStats:
        self.stats.agents = {
            a.id: {
                "executor": a.executor,
                "host": a.host,
                "pid": a.pid,
                "cores": a.cores,
                "slots": a.slots,
                "buffered": a.buffered,
                "reads": a.reads,
                "finished": a.finished,
                "requeued": a.requeued,
            }
            for a in self.agents.values()
        }
        return self.stats


def _ident(header: dict[str, Any]) -> int | None:
    """A request's id, to answer it (only an int: nothing else is echoed back)."""
    ident = header.get("id")
    return ident if isinstance(ident, int) else None
