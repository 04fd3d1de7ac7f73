"""The executor's agent: NSQ connections that outlive the tasks reading them.

One agent process runs per Spark executor (per PySpark daemon, to be exact),
started by the first task of an ``nsq`` query that runs there
(``python -m trionsq.spark.agent``).  It serves:

- the executor's tasks, on a Unix socket: a task asks for its partition's
  messages and gets them as Arrow rows;
- the other agents, on a TLS port per query (only holders of the query's key
  get past its handshake, see :mod:`._secure`): a task retried or speculated on
  another executor replays the messages this agent handed to the first attempt;
- and it keeps, per query, a link to the driver's coordinator (TLS too): it announces
  every read there (which decides *fresh* or *replay*), and hears there which
  message sets to FIN (their batch was committed) or REQ.

Messages stay un-FINed, TOUCHed before nsqd's timeout, until the coordinator
says; if the coordinator goes away (the driver died, the query stopped) the
agent requeues everything of that query and closes its connections.  The agent
leaves when its executor does (the PySpark daemon's SIGHUP, or its anchor
process gone), and on its own after a minute with no query.  A peer that lies on
any of its sockets ends its own connection, nothing else (:mod:`._peers`).
"""

from __future__ import annotations

import argparse
import hmac
import importlib
import json
import logging
import math
import os
import pickle
import secrets
import signal
import ssl
import sys
from typing import Any

import trio

from .. import __version__
from ..telemetry.semconv import FINISHED, REQUEUED
from ._diagnose import reason as _reason
from ._diagnose import unreachable_reason
from ._executor import ExecutorIdentity, process_alive
from ._framing import FramingError, Limits, receive, send, send_file
from ._held import Held, ipc_limit, to_ipc
from ._link import Link, ReadError
from ._options import SourceOptions
from ._peers import Gate, bind_unix, same_user, serve
from ._phases import mark
from ._secure import QueryKeys, accept, connect
from ._slot import NoConnectionError, Slot
from ._telemetry import SourceTelemetry

__all__ = ["Agent", "main"]

log = logging.getLogger("trionsq.spark.agent")

#: How often a link's peer hears from us, and how long silence means it is gone.
TICK = 1.0
LINK_TIMEOUT = 15.0
#: A slot no task used for this long gives back its prefetched messages and closes.
SLOT_IDLE = 30.0
#: With no query for this long, the agent leaves.
IDLE_EXIT = 60.0
#: How long a stopping agent gives its connections to requeue and close.
SHUTDOWN_GRACE = 3.0
#: A task's request, a peer's fetch: each must arrive within this, and at most this
#: many connections may be waiting to (a slow or half-open peer holds little, briefly).
REQUEST_TIMEOUT = 30.0
MAX_UNPROVEN = 64
#: How long a task or a peer agent may take to read the rows it asked for.
REPLY_TIMEOUT = 120.0
#: A task's read request: a small header, the pickled source options as payload.
TASK_LIMITS = Limits(
    header=64 << 10, payload=lambda header: 1 << 20 if header.get("op") == "read" else 0
)
#: A peer agent's fetch: a small header, no payload (and the answer to ours).
FETCH_LIMITS = Limits(header=4096)
#: What the coordinator sends: a resolve lists set ids; nothing carries a payload.
COORDINATOR_LIMITS = Limits(header=1 << 20)


class QueryRun:
    """One query's state on this agent: its coordinator link, slots and held sets."""

    def __init__(
        self, agent: Agent, keys: QueryKeys, coordinator: tuple[str, int], options: SourceOptions
    ) -> None:
        self.agent = agent
        self.keys = keys
        self.token = keys.token
        self.coordinator = coordinator
        self.options = options
        self.link: Link | None = None
        self.slots: list[Slot] = []
        #: set id -> (slot, messages)
        self.sets: dict[int, tuple[Slot, list[Held]]] = {}
        #: the sets' process spans, the bodies' envelopes taken off
        self.telemetry = SourceTelemetry.start(options, agent.identity.executor_id)
        self.cutoff_ns: int | None = None
        #: set to end the query here; ``finished`` once everything is released
        self.ended = trio.Event()
        self.finished = trio.Event()
        self._ready = trio.Event()
        self._error: str | None = None
        self._nursery: trio.Nursery | None = None
        self._status_due = trio.Event()
        #: when sets were last resolved or their FINs/REQs last went out, and how many
        #: resolves are still answering nsqd (see :meth:`settled`)
        self._activity = -math.inf
        self._answering = 0
        #: this agent's name at the coordinator: a new link (after one was lost) is a
        #: new name, so that the coordinator never confuses the two
        self.name = f"{agent.id}#{secrets.token_hex(4)}"
        #: where the other agents fetch this query's sets (TLS, this query's key)
        self.peer_port = 0
        self._peer_gate = Gate(MAX_UNPROVEN, agent.request_timeout)

    # --- life ---

    async def run(self) -> None:
        """Link to the coordinator, then serve until it goes away or says stop."""
        listeners: list[trio.SocketListener] = []
        link: Link | None = None
        try:
            # This query's own peer port: only its agents (its TLS key) get past the
            # handshake, and it closes with the query.
            mark("query.starting")
            listeners = await trio.open_tcp_listeners(0, host=self.agent.peer_host)
            self.peer_port = listeners[0].socket.getsockname()[1]
            link = self.link = await self._connect()
            mark("query.coordinator_connected")
            if link is not None and await self._hello(link):
                mark("query.linked")
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    what = f"query {self.token[:8]} peers"
                    nursery.start_soon(serve, self._serve_peer, listeners, what)
                    nursery.start_soon(self._receive_loop, link)
                    nursery.start_soon(self._status_loop, link)
                    nursery.start_soon(self._touch_loop)
                    nursery.start_soon(self._idle_slots_loop)
                    self._ready.set()
                    await self.ended.wait()
                    with trio.move_on_after(SHUTDOWN_GRACE):
                        await self._release_everything()
                    nursery.cancel_scope.cancel()
        except Exception as exc:  # the query ends here; the agent serves the others
            log.exception("query %s: ended by a failure", self.token[:8])
            self._error = f"the query's state on this executor failed: {exc!r}"
        finally:
            if link is not None:
                link.fail_pending()
            self._ready.set()
            self.ended.set()
            with trio.CancelScope(shield=True):
                # Cancelled (the agent is leaving): REQs are queued, and go out if the
                # connections live long enough; otherwise nsqd's timeout brings them back.
                await self._requeue_sets()
                if link is not None:
                    await trio.aclose_forcefully(link.stream)
                for listener in listeners:
                    await trio.aclose_forcefully(listener)
            if self.agent.queries.get(self.token) is self:
                del self.agent.queries[self.token]
            self.finished.set()

    async def _connect(self) -> Link | None:
        """The TLS link to the coordinator (None, and why in ``_error``, if it fails)."""
        host, port = self.coordinator
        timeout = self.options.connection.connect_timeout
        try:
            context = self.keys.client_context()
        except ssl.SSLError as exc:
            self._error = f"the query's TLS keys cannot be loaded: {exc}"
            return None
        try:
            with trio.fail_after(timeout):
                stream = await connect(host, port, context)
        except (OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
            self._error = (
                f"cannot reach the nsq source's coordinator on the driver at {host}:{port} "
                f"within {timeout:g}s ({_reason(exc)}); executors must reach it "
                "(options coordinator_host, coordinator_port)"
            )
            return None
        return Link(stream, COORDINATOR_LIMITS, send_timeout=LINK_TIMEOUT)

    async def _hello(self, link: Link) -> bool:
        """Introduce this agent to the coordinator; False (and why) if it refuses."""
        identity = self.agent.identity
        hello = {
            "op": "hello",
            "id": 0,
            "token": self.token,
            "agent": self.name,
            "executor": identity.executor_id,
            "host": identity.host,
            "cores": identity.cores,
            "peer": [self.agent.peer_host, self.peer_port],
            "pid": os.getpid(),
        }
        try:
            with trio.fail_after(self.options.connection.connect_timeout):
                await link.send(hello)
                reply, _ = await link.receive()
        except (EOFError, OSError, FramingError, trio.TooSlowError) as exc:
            self._error = f"the nsq source's coordinator did not answer: {exc!r}"
            return False
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._error = f"the nsq source's coordinator closed the link: {exc!r}"
            return False
        if "error" in reply:
            self._error = f"the nsq source's coordinator refused this executor: {reply['error']}"
            return False
        return True

    async def wait_ready(self) -> None:
        await self._ready.wait()
        if self._error is not None:
            raise ReadError(self._error)
        if self.ended.is_set():
            raise ReadError("the query's state on this executor was closed (query stopped?)")

    async def _requeue_sets(self) -> int:
        # Forget them first: a replay asked for meanwhile must not get messages
        # that are going back to nsqd.
        entries = list(self.sets.items())
        self.sets.clear()
        requeued = 0
        for set_id, (slot, held) in entries:
            self.telemetry.ended(set_id, REQUEUED)
            slot.in_sets -= len(held)
            for item in held:
                await item.message.requeue(0, backoff=False)
            requeued += len(held)
        return requeued

    async def _release_everything(self) -> int:
        """REQ every message this query holds here, and close every slot (CLS)."""
        requeued = await self._requeue_sets()
        slots, self.slots = self.slots, []
        for slot in slots:
            requeued += await slot.requeue_unbatched()
            await slot.close()
        if requeued:
            log.info("query %s: requeued %d message(s) held here", self.token[:8], requeued)
        return requeued

    # --- the coordinator link ---

    async def _receive_loop(self, link: Link) -> None:
        try:
            while True:
                with trio.fail_after(LINK_TIMEOUT):
                    header, _ = await link.receive()
                link.last_heard = trio.current_time()
                if link.deliver(header):
                    continue
                op = header.get("op")
                if op == "resolve":
                    result = await self._resolve(header)
                    await link.send({"re": header.get("id"), **result})
                elif op == "stop":
                    requeued = 0
                    with trio.move_on_after(SHUTDOWN_GRACE):
                        requeued = await self._release_everything()
                    await link.send({"re": header.get("id"), "requeued": requeued})
                    self.ended.set()
                    return
                elif op == "tick":
                    continue
                else:
                    log.warning("coordinator sent an unknown operation %r", op)
        except (EOFError, OSError, FramingError, trio.TooSlowError) as exc:
            log.info("query %s: coordinator link ended (%r)", self.token[:8], exc)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            link.fail_pending()
            self.ended.set()

    async def _resolve(self, header: dict[str, Any]) -> dict[str, Any]:
        """Take the sets out, answer at once, and FIN / REQ them in the background:
        the coordinator plans the next batch while the FINs go out (and nsqd
        refills the slots as they do)."""
        # Before anything is answered: whether these FINs can let nsqd send what
        # it could not (see settled); REQs always can (nsqd sends them again).
        opening = bool(header.get("req")) or self.nsqd_may_wait()
        fin: list[Held] = []
        req: list[Held] = []
        for key, into in (("fin", fin), ("req", req)):
            for set_id in header.get(key) or []:
                entry = self.sets.pop(int(set_id), None)
                if entry is not None:
                    self.telemetry.ended(int(set_id), FINISHED if key == "fin" else REQUEUED)
                    slot, held = entry
                    slot.in_sets -= len(held)
                    into.extend(held)
        if opening:
            self._activity = trio.current_time()
        if fin or req:
            assert self._nursery is not None
            self._answering += 1
            self._nursery.start_soon(self._answer, fin, req, opening)
        return {"finished": len(fin), "requeued": len(req)}

    async def _answer(self, fin: list[Held], req: list[Held], opening: bool) -> None:
        try:
            await trio.lowlevel.checkpoint()
            # Without a cancellation point per message (a batch is tens of thousands).
            for item in fin:
                item.message.finish_now()
            for item in req:
                item.message.requeue_now(0, False)
        finally:
            self._answering -= 1
            if opening:
                self._activity = trio.current_time()
            self.status_changed()

    def nsqd_may_wait(self) -> bool:
        """Whether some nsqd may hold messages it cannot send here: every connection
        of this query to it has its RDY count in flight (or no connection is up).
        Only then do FINs prove something by a quiet spell after them (see
        :meth:`settled`); when every nsqd had room all along, its silence since the
        last arrival already says it has nothing more."""
        room: dict[str, bool] = dict.fromkeys(self.options.connection.nsqd_tcp_addresses, False)
        for slot in self.slots:
            for consumer in slot.consumers:
                for address, conn in consumer.stats.connections.items():
                    room[address] = room.get(address, False) or conn.in_flight < conn.rdy
        return not room or not all(room.values())

    def settled(self) -> bool:
        """Nothing held here, and nothing received for ``max_batch_wait`` while
        every nsqd could send: since the last FINs went out if they freed room
        (nsqd refills the connections their FINs freed), else since the last
        arrival or take.  The coordinator ends a ``Trigger.AvailableNow`` query
        only once every agent is.  A quiet spell right after a commit that freed
        room proves nothing on a loaded machine; one while every connection had
        room does (nsqd sends a ready connection what it has at once)."""
        return trio.current_time() >= self.settles_at()

    def settles_at(self) -> float:
        """When :meth:`settled` turns true if nothing happens meanwhile (infinity:
        not before something held, answering or reading is done)."""
        if self.buffered() or self._answering or any(slot.busy for slot in self.slots):
            return math.inf
        last = max(
            [
                self._activity,
                # A take changes nothing nsqd sees (its messages stay in flight):
                # the quiet spell counts from the last arrival, or the slot's start.
                *(s.last_arrival for s in self.slots),
                *(s.started_at for s in self.slots),
                *(s.budget_raised for s in self.slots),
            ]
        )
        return last + self.options.max_batch_wait

    def buffered(self) -> int:
        return sum(len(slot.buffer) for slot in self.slots)

    def status_changed(self) -> None:
        self._status_due.set()

    async def _status_loop(self, link: Link) -> None:
        """Tell the coordinator how many messages wait here and whether this agent
        has settled (it plans batches from that): on a change, and every TICK."""
        poll = max(0.02, min(TICK, self.options.max_batch_wait / 4))
        sent_settled: bool | None = None
        last_sent = -math.inf
        while True:
            now = trio.current_time()
            wake = now + poll
            if not sent_settled:
                # The moment it settles, not the next poll after it: the end of an
                # AvailableNow query waits for this word (the poll catches arrivals).
                settles = self.settles_at()
                if now < settles < wake:
                    wake = settles
            with trio.move_on_at(wake):
                await self._status_due.wait()
            due = self._status_due.is_set()
            self._status_due = trio.Event()
            settled = self.settled()
            now = trio.current_time()
            if due or settled != sent_settled or now - last_sent >= TICK:
                await link.send(
                    {
                        "op": "status",
                        "buffered": self.buffered(),
                        "slots": len(self.slots),
                        "settled": settled,
                    }
                )
                sent_settled, last_sent = settled, now

    async def _touch_loop(self) -> None:
        """TOUCH what has been held for a third of msg_timeout, so that nsqd keeps it
        ours (a TOUCH goes out at most 0.53 msg_timeout after the last one)."""
        timeout = self.options.msg_timeout
        while True:
            await trio.sleep(timeout / 5)
            now = trio.current_time()
            groups: list[Any] = [held for _, held in self.sets.values()]
            for slot in self.slots:
                groups.extend((slot.buffer, slot.later))
            due = [h for group in groups for h in group if now - h.touched >= timeout / 3]
            for held in due:
                held.touched = now
                await held.message.touch()

    async def _idle_slots_loop(self) -> None:
        """Close the slots no task used for a while, but one: its prefetch tells the
        coordinator when messages wait (and serves the next task at once)."""
        while True:
            await trio.sleep(SLOT_IDLE / 4)
            now = trio.current_time()
            for slot in sorted(self.slots, key=lambda s: s.last_used)[:-1]:
                if not slot.busy and not slot.in_sets and now - slot.last_used > SLOT_IDLE:
                    self.slots.remove(slot)
                    count = await slot.requeue_unbatched()
                    await slot.close()
                    log.info(
                        "query %s: closed idle slot %d (%d requeued)",
                        self.token[:8],
                        slot.index,
                        count,
                    )
                    self.status_changed()

    # --- reads ---

    def _free_slot(self) -> Slot | None:
        free = [s for s in self.slots if not s.busy]
        # The fullest free slot: its messages have waited longest.
        return max(free, key=lambda s: len(s.buffer), default=None)

    async def _new_slot(self) -> Slot:
        assert self._nursery is not None
        identity = self.agent.identity
        index = max((s.index for s in self.slots), default=-1) + 1
        user_agent = (
            f"trionsq/{__version__} spark-agent executor={identity.executor_id} "
            f"pid={os.getpid()} slot={index}"
        )
        slot = Slot(index, self.options, user_agent, self.status_changed, identity.executor_id)
        slot.unwrap = self.telemetry.unwrapper()
        slot.set_cutoff(self.cutoff_ns)
        mark("slot.starting", slot=index)
        await self._nursery.start(slot.run)
        mark("slot.started", slot=index)
        self.slots.append(slot)
        return slot

    async def read(self, request: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        """Serve one task's read: ask the coordinator, then take, replay or fetch."""
        await self.wait_ready()
        link = self.link
        assert link is not None
        cutoff = request.get("cutoff")
        if cutoff != self.cutoff_ns:
            self.cutoff_ns = cutoff
            for slot in self.slots:
                slot.set_cutoff(cutoff)
        decision = await link.request(
            {
                "op": "read",
                "batch": request["batch"],
                "partition": request["partition"],
                "stage": request["stage"],
                "attempt": request["attempt"],
                "task": request["task"],
            }
        )
        set_id = int(decision["set"])
        topic = self.options.topic
        mark("agent.decided", batch=request["batch"], fresh=decision["fresh"])
        if not decision["fresh"]:
            if decision["holder"] == self.name:
                entry = self.sets.get(set_id)
                if entry is None:
                    raise ReadError(f"message set {set_id} is no longer held here")
                if not self.agent.pyarrow_ready.is_set():
                    await self.agent.pyarrow_ready.wait()
                return {"rows": len(entry[1]), "set": set_id, "replayed": True}, to_ipc(
                    topic, entry[1]
                )
            return await self._fetch(decision, set_id)
        try:
            slot, taken = await self._take(request.get("limit"))
            mark("agent.taken", batch=request["batch"], slot=slot.index, rows=len(taken))
            if not self.agent.pyarrow_ready.is_set():
                await self.agent.pyarrow_ready.wait()
            try:
                # The rows before anything yields: every turn of the event loop
                # waits behind the connections' reads (their refill starts now).
                data = to_ipc(topic, taken)
                mark("agent.rows_made", batch=request["batch"], bytes=len(data))
            except BaseException:
                slot.in_sets -= len(taken)
                for item in taken:
                    item.message.requeue_now(0, False)
                raise
        except BaseException as exc:
            with trio.CancelScope(shield=True):
                try:
                    await link.send({"op": "void", "set": set_id})
                except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
            if isinstance(exc, NoConnectionError):
                raise ReadError(await unreachable_reason(self.options)) from None
            raise
        self.sets[set_id] = (slot, taken)
        self.telemetry.began(set_id, taken, request.get("batch"), request.get("partition"))
        await link.send({"op": "ready", "set": set_id, "count": len(taken)})
        self.status_changed()
        return {"rows": len(taken), "set": set_id, "replayed": False}, data

    async def _take(self, limit: int | None) -> tuple[Slot, list[Held]]:
        slot = self._free_slot()
        if slot is None:
            slot = await self._new_slot()
        slot.busy = True
        try:
            with trio.move_on_after(self.options.connection.connect_timeout):
                await slot.wait_connected()
            if not slot.connected():
                raise NoConnectionError("no nsqd connection")
            mark("slot.connected", slot=slot.index, connections=len(slot.connected()))
            before = slot.connected()
            taken = await slot.take(limit, self.options.max_batch_wait)
            now = slot.connected()
            lost = (before - now) | ({h.message.address for h in taken} - now)
            if lost:
                slot.in_sets -= len(taken)
                for item in taken:
                    await item.message.requeue(0, backoff=False)
                raise ReadError(
                    f"lost the connection to nsqd {', '.join(sorted(lost))} while reading "
                    "this partition; its messages come again (Spark retries the task)"
                )
            return slot, taken
        finally:
            slot.busy = False
            slot.last_used = trio.current_time()

    async def _fetch(self, decision: dict[str, Any], set_id: int) -> tuple[dict[str, Any], bytes]:
        """Replay a set another executor's agent holds (a retried or speculated task)."""
        host, port = decision["peer"]
        request = {"op": "fetch", "token": self.token, "set": set_id}
        limits = Limits(FETCH_LIMITS.header, ipc_limit(self.options))
        try:
            with trio.fail_after(self.options.connection.connect_timeout + 30):
                stream = await connect(host, int(port), self.keys.client_context())
                try:
                    await send(stream, request)
                    header, payload = await receive(stream, limits)
                finally:
                    await trio.aclose_forcefully(stream)
        except (
            OSError,
            EOFError,
            FramingError,
            trio.TooSlowError,
            trio.BrokenResourceError,
            trio.ClosedResourceError,
        ) as exc:
            raise ReadError(
                f"cannot replay message set {set_id} from the agent at {host}:{port}: "
                f"{_reason(exc)}"
            ) from None
        if "error" in header:
            raise ReadError(str(header["error"]))
        return {"rows": header.get("rows", 0), "set": set_id, "replayed": True}, payload

    async def _serve_peer(self, stream: trio.SocketStream) -> None:
        """Another agent's fetch of a set held here (a retried task's replay); its
        failures end this connection only (see :func:`._peers.serve`)."""
        with self._peer_gate.unproven():
            tls = await accept(stream, self.keys.server_context())
            header, _ = await receive(tls, FETCH_LIMITS)
        token = header.get("token")
        if (
            header.get("op") != "fetch"
            or not isinstance(token, str)
            or not hmac.compare_digest(token.encode(), self.token.encode())
        ):
            reply, data = {"error": f"{self.agent.id} holds nothing of that query"}, b""
        else:
            reply, data = self.serve_fetch(header.get("set"))
        with trio.fail_after(REPLY_TIMEOUT):
            await send(tls, reply, data)
            await tls.aclose()

    def serve_fetch(self, set_id: object) -> tuple[dict[str, Any], bytes]:
        entry = None
        if isinstance(set_id, int) and not self.ended.is_set():
            entry = self.sets.get(set_id)
        if entry is None:
            return {"error": f"message set {set_id!r:.30} is not held by {self.agent.id}"}, b""
        return {"rows": len(entry[1])}, to_ipc(self.options.topic, entry[1])


class Agent:
    """The agent process (see the module docstring)."""

    def __init__(
        self,
        identity: ExecutorIdentity,
        socket_path: str,
        anchor_start: int | None,
        request_timeout: float = REQUEST_TIMEOUT,
        ready_fd: int | None = None,
    ):
        self.identity = identity
        #: a pipe whose writer is told once tasks can connect (the task that started us)
        self.ready_fd = ready_fd
        self.socket_path = socket_path
        self.anchor_start = anchor_start
        self.id = f"{identity.executor_id}/{identity.host}/{os.getpid()}"
        self.queries: dict[str, QueryRun] = {}
        #: where this agent's queries take the other agents' fetches: loopback in
        #: local mode (one executor, on the driver's machine), else the address Spark
        #: gave the executor
        self.peer_host = "127.0.0.1" if identity.executor_id == "driver" else identity.host
        self.request_timeout = request_timeout
        self._nursery: trio.Nursery | None = None
        self._leave = trio.Event()
        self.pyarrow_ready = trio.Event()
        self._task_gate = Gate(MAX_UNPROVEN, request_timeout)

    async def main(self) -> None:
        mark("agent.main")
        try:
            unix = bind_unix(self.socket_path)
        finally:
            if self.ready_fd is not None:  # listening (or leaving): the task may go on
                os.close(self.ready_fd)
        try:
            log.info("agent %s: tasks on %s", self.id, self.socket_path)
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                tasks = [trio.SocketListener(trio.socket.from_stdlib_socket(unix))]
                nursery.start_soon(serve, self._serve_task, tasks, f"agent {self.id} tasks")
                nursery.start_soon(self._watchdog)
                nursery.start_soon(self._signals)
                nursery.start_soon(self._import_pyarrow)
                await self._leave.wait()
                # Each query requeues what it holds and closes its connections (CLS).
                for run in list(self.queries.values()):
                    run.ended.set()
                with trio.move_on_after(SHUTDOWN_GRACE + 1):
                    for run in list(self.queries.values()):
                        await run.finished.wait()
                nursery.cancel_scope.cancel()
        finally:
            try:
                os.unlink(self.socket_path)
            except OSError:
                pass

    async def _import_pyarrow(self) -> None:
        """pyarrow in a thread while the first read connects: importing it in the
        event loop would stall every connection (and their TOUCHes) meanwhile."""
        await trio.to_thread.run_sync(importlib.import_module, "pyarrow")
        mark("agent.pyarrow_imported")
        self.pyarrow_ready.set()

    async def _signals(self) -> None:
        # The PySpark daemon sends its process group SIGHUP when the executor stops.
        with trio.open_signal_receiver(signal.SIGHUP, signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.info("agent %s: signal %d, leaving", self.id, signum)
                self._leave.set()
                return

    async def _watchdog(self) -> None:
        """Leave with the executor (anchor gone) or after a while with nothing to do."""
        anchor = self.identity.anchor_pid
        last_busy = trio.current_time()
        while True:
            await trio.sleep(1.0)
            if not process_alive(anchor, self.anchor_start):
                log.info("agent %s: process %d is gone, leaving", self.id, anchor)
                self._leave.set()
                return
            now = trio.current_time()
            if self.queries:
                last_busy = now
            elif now - last_busy > IDLE_EXIT:
                log.info("agent %s: no query for %.0fs, leaving", self.id, IDLE_EXIT)
                self._leave.set()
                return

    async def _query(
        self, keys: QueryKeys, coordinator: tuple[str, int], options: SourceOptions
    ) -> QueryRun:
        run = self.queries.get(keys.token)
        if run is None:
            assert self._nursery is not None
            run = self.queries[keys.token] = QueryRun(self, keys, coordinator, options)
            self._nursery.start_soon(run.run)
        elif run.keys != keys:
            raise ReadError("the read's TLS keys are not its query's")
        return run

    async def _serve_task(self, stream: trio.SocketStream) -> None:
        """A task's read (failures end this connection only: see :func:`._peers.serve`)."""
        if not same_user(stream.socket):
            log.warning("agent %s: refused a task connection from another user", self.id)
            return
        with self._task_gate.unproven():
            header, payload = await receive(stream, TASK_LIMITS)
        mark("agent.task_request", batch=header.get("batch"))
        reply: dict[str, Any]
        try:
            if header.get("op") != "read":
                raise ReadError(f"unknown operation {header.get('op')!r:.40}")
            try:
                options = pickle.loads(payload)
            except Exception:  # a task of another version, or not a task at all
                options = None
            if not isinstance(options, SourceOptions):
                raise ReadError("the read request carries no source options")
            try:
                keys = QueryKeys.from_fields(header)
            except ValueError as exc:
                raise ReadError(str(exc)) from None
            host, port = header["coordinator"]
            run = await self._query(keys, (str(host), int(port)), options)
            reply, data = await run.read(header)
            mark("agent.reply_built", batch=header.get("batch"), rows=reply.get("rows"))
            limit = ipc_limit(options)
            if len(data) > limit:
                raise ReadError(
                    f"the partition's rows take {len(data)} bytes, more than a task takes "
                    f"({limit}: four times max_bytes_in_flight, and 64 MiB)"
                )
        except ReadError as exc:
            reply, data = {"error": str(exc)}, b""
        except Exception as exc:  # one task's failure must not end the agent
            log.exception("read failed")
            reply, data = {"error": f"{type(exc).__name__}: {exc}"}, b""
        try:
            with trio.fail_after(REPLY_TIMEOUT):
                await send_file(stream, reply, data)
            mark("agent.reply_sent", batch=header.get("batch"))
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError):
            log.info("a task left before its rows were sent")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m trionsq.spark.agent")
    parser.add_argument("--socket", required=True, help="the Unix socket tasks connect to")
    parser.add_argument("--identity", required=True, help="the executor (JSON, see _executor)")
    parser.add_argument("--anchor-start", type=int, default=None)
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=REQUEST_TIMEOUT,
        help="how long a task's request or a peer's fetch may take to arrive (seconds)",
    )
    parser.add_argument("--ready-fd", type=int, help="a pipe to close once tasks can connect")
    args = parser.parse_args(argv)
    level = os.environ.get("TRIONSQ_SPARK_AGENT_LOG", "WARNING").upper()
    logging.basicConfig(
        level=getattr(logging, level, logging.WARNING),
        format="%(asctime)s trionsq-spark-agent[%(process)d] %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    identity = ExecutorIdentity(**json.loads(args.identity))
    agent = Agent(identity, args.socket, args.anchor_start, args.request_timeout, args.ready_fd)
    trio.run(agent.main)


if __name__ == "__main__":
    main()
