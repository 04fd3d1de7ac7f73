"""Building blocks of the TCP scenarios: connection states, probes, a state view.

A *probe* sends one command in a given connection state and records what nsqd
does about it: its answer or error, whether the connection stays open (a sync
point after it), and what the node looks like afterwards (:func:`node_state`).
"""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from trionsq.protocol import commands as cmds

from ..support.waiting import poll_until
from .conftest import Target
from .session import Session

__all__ = [
    "ANSWERED",
    "Ctx",
    "STATES",
    "body",
    "mpub_body",
    "node_state",
    "probe",
    "size",
    "setup_state",
]

#: Commands nsqd answers when they succeed (the others answer only errors).
ANSWERED = {b"PUB", b"MPUB", b"DPUB", b"SUB", b"CLS", b"IDENTIFY", b"AUTH"}


def size(n: int) -> bytes:
    """A size as the wire writes it (a signed 32-bit big-endian int: any ``n``
    that fits, negative ones too, for the tests that lie about sizes)."""
    return struct.pack(">l", n)


def body(data: bytes) -> bytes:
    """A size-prefixed body."""
    return size(len(data)) + data


def mpub_body(*bodies: bytes, count: int | None = None) -> bytes:
    """MPUB's body: a message count (``count`` overrides it), then sized bodies."""
    inner = size(len(bodies) if count is None else count)
    inner += b"".join(body(b) for b in bodies)
    return body(inner)


@dataclass
class Ctx:
    """What a state's setup made: the session, and a message in flight (if any)."""

    session: Session
    msg_id: bytes = b"0" * 16


async def _fresh(t: Target) -> Ctx:
    return Ctx(await t.connect())


async def _identified(t: Target) -> Ctx:
    c = await t.connect()
    await c.identify(feature_negotiation=True)
    return Ctx(c)


async def _subscribed(t: Target) -> Ctx:
    c = await t.connect()
    await c.identify(feature_negotiation=True)
    await c.sub("t", "ch")
    return Ctx(c)


async def _in_flight(t: Target) -> Ctx:
    # Subscribed with one message in flight (its id for FIN/REQ/TOUCH), then
    # RDY 0: a message the probe requeues is not delivered again, which would
    # race with the answer to the sync point (in nsqd, another goroutine
    # delivers it); redeliveries have scenarios of their own, read by count.
    c = await t.connect()
    await c.identify(feature_negotiation=True)
    await c.sub("t", "ch", rdy=1)
    p = await t.connect("p")
    await p.call(cmds.pub("t", b"in flight"))
    await p.close()
    (msg,) = await c.read_messages(1)
    await c.send(cmds.rdy(0))
    return Ctx(c, msg.id)


async def _closing(t: Target) -> Ctx:
    ctx = await _in_flight(t)
    await ctx.session.call(cmds.cls())
    return ctx


#: Connection states a probe can start from.
STATES: dict[str, Callable[[Target], Awaitable[Ctx]]] = {
    "fresh": _fresh,
    "identified": _identified,
    "subscribed": _subscribed,
    "in_flight": _in_flight,
    "closing": _closing,
}


async def setup_state(t: Target, state: str) -> Ctx:
    return await STATES[state](t)


async def settled_stats(t: Target) -> Any:
    """``/stats`` once nsqd has let go of every connection the scenario saw
    closed (nsqd closes the socket a moment before it removes the client)."""
    # (A port the server closed is free again at once: a later session may
    # have it, and counts as one client there.)
    gone = {s.local_address for s in t.sessions if s.closed}
    still_open = Counter(s.local_address for s in t.sessions if not s.closed)

    def let_go(doc: Any) -> bool:
        remaining = Counter(
            c["remote_address"]
            for topic in doc["topics"]
            for ch in topic["channels"]
            for c in ch["clients"]
        )
        return all(remaining[a] <= still_open[a] for a in gone)

    return await poll_until(t.stats, let_go, f"nsqd to let go of the closed clients {sorted(gone)}")


async def node_state(t: Target) -> Any:
    """What a client could learn about topics and channels (from ``/stats``):
    names, depths, counts, pause states and the clients' states."""
    doc = await settled_stats(t)
    view = []
    for topic in doc["topics"]:
        channels = []
        for ch in topic["channels"]:
            clients = [
                (
                    c["state"],
                    c["ready_count"],
                    c["in_flight_count"],
                    c["message_count"],
                    c["finish_count"],
                    c["requeue_count"],
                )
                for c in ch["clients"]
            ]
            channels.append(
                {
                    "name": ch["channel_name"],
                    "depth": ch["depth"],
                    "in_flight": ch["in_flight_count"],
                    "deferred": ch["deferred_count"],
                    "messages": ch["message_count"],
                    "requeued": ch["requeue_count"],
                    "timed_out": ch["timeout_count"],
                    "paused": ch["paused"],
                    "clients": sorted(clients),
                }
            )
        view.append(
            {
                "name": topic["topic_name"],
                "depth": topic["depth"],
                "messages": topic["message_count"],
                "bytes": topic["message_bytes"],
                "paused": topic["paused"],
                "channels": sorted(channels, key=lambda c: c["name"]),
            }
        )
    return sorted(view, key=lambda t: t["name"])


async def probe(t: Target, state: str, command: bytes, *, wait_answer: bool = True) -> Any:
    """Send ``command`` (``{id}`` stands for the message in flight) in ``state``;
    record its answer, a sync point (or the close), and the node's state.

    ``wait_answer=False`` for a command left incomplete on purpose (nsqd reads
    what follows as the rest of it: the sync command's bytes).
    """
    ctx = await setup_state(t, state)
    c = ctx.session
    data = command.replace(b"{id}", ctx.msg_id)
    await c.send(data)
    name = data.split(b"\n", 1)[0].split(b" ", 1)[0]
    if name in ANSWERED and wait_answer:
        await c.read(1)
    await c.sync()
    return await node_state(t)
