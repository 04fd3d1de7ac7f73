"""Random command sequences on several connections, run on fakensq and on nsqd.

Hypothesis draws a sequence of steps; each step is one command (valid or not:
IDENTIFY with assorted fields, SUB, RDY, PUB, MPUB, DPUB, FIN, REQ, TOUCH, CLS,
NOP, unknown commands, bad names and numbers) sent on one of three
connections, or a connection closed.  After each step every open connection
reads up to a sync point, so the transcripts are deterministic:

- each connection subscribes only to a channel of its own (``c0``, ``c1``...),
  so nsqd's random choice between consumers of one channel never comes in;
- nothing depends on time: no heartbeat or msg_timeout short enough to fire,
  no DPUB or REQ delay short enough to come due (long ones stay deferred);
- how many messages each connection gets after a step is not known in
  advance: fakensq runs first, and once its node is idle, what it has written
  to each connection (before or after the sync point) is read; the real run
  waits for as many.  If nsqd delivered another number, the transcripts
  differ (or the wait times out, which fails the example too);
- within one step, a connection's answers and its messages are compared
  apart (:func:`_canonical`: nsqd itself races the two).

The node's topics and channels are compared at the end as well.  Runs are
derandomized (the suite's hypothesis profile).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from typing import Any

import trio
import trio.testing
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from trionsq.protocol import commands as cmds

from .conftest import Conformance, Target
from .normalize import Normalizer
from .session import Entry, Session
from .tcp import node_state

CONNECTIONS = 3
ANSWERED = {b"PUB", b"MPUB", b"DPUB", b"SUB", b"CLS"}
TOPICS = ["t0", "t1"]
BOGUS_ID = b"0123456789abcdef"


@dataclass(frozen=True)
class Step:
    conn: int
    kind: str
    args: tuple[Any, ...] = ()


def _body(data: bytes) -> bytes:
    return struct.pack(">l", len(data)) + data


bodies = st.binary(min_size=1, max_size=12)
# Mostly valid values (invalid ones end the connection, and the rest of the
# sequence then tests less), some invalid ones.
topic_names = st.sampled_from([*TOPICS, *TOPICS, *TOPICS, "", "a b", "bad!", "x" * 65])
identify_fields = st.fixed_dictionaries(
    {},
    optional={
        "feature_negotiation": st.booleans(),
        "client_id": st.sampled_from(["", "me", "h\u00e9"]),
        "user_agent": st.sampled_from(["", "random/1.0"]),
        # Intervals short enough to fire are left out: they would race the steps.
        "heartbeat_interval": st.sampled_from([0, 30000, 60000, -1, 999, 60001]),
        "output_buffer_size": st.sampled_from([0, 64, 16384, -1, 63, 65537]),
        "output_buffer_timeout": st.sampled_from([0, 25, 100, -1, 24, 30001]),
        "msg_timeout": st.sampled_from([0, 60000, 999, 900001]),
        "sample_rate": st.sampled_from([0, 99, 100, -1]),
        "snappy": st.booleans(),
        "deflate": st.booleans(),
        "deflate_level": st.sampled_from([0, 1, 6, 9]),
    },
)

#: Step kinds, the common ones several times (a rough weighting).
KINDS = [
    *["pub"] * 6,
    *["mpub"] * 3,
    *["dpub"] * 2,
    *["fin"] * 6,
    *["req"] * 3,
    *["touch"] * 2,
    *["rdy"] * 3,
    *["sub"] * 2,
    "identify",
    "pub_empty",
    "cls",
    "nop",
    "unknown",
    "short_fin",
    "close",
]


def step_strategy(conn: int) -> st.SearchStrategy[Step]:
    own = f"c{conn}"
    channels = st.sampled_from([own, own, own, f"{own}#ephemeral", "bad channel", ""])
    refs = st.sampled_from([0, 0, 1, 2, -1])  # -1: an id nsqd never gave out
    args: dict[str, st.SearchStrategy[tuple[Any, ...]]] = {
        "identify": st.tuples(identify_fields),
        "sub": st.tuples(topic_names, channels),
        "rdy": st.tuples(st.sampled_from(["1", "2", "5", "0", "2500", "2501", "-1", "x", ""])),
        "pub": st.tuples(topic_names, bodies),
        "mpub": st.tuples(topic_names, st.lists(bodies, min_size=0, max_size=3)),
        # 0 is due at once; an hour never comes due during the test.
        "dpub": st.tuples(
            topic_names, st.sampled_from(["0", "0", "3600000", "3600001", "-1"]), bodies
        ),
        "fin": st.tuples(refs),
        "req": st.tuples(refs, st.sampled_from(["0", "0", "0", "3600000", "99999999", "-1", "x"])),
        "touch": st.tuples(refs),
    }
    return st.sampled_from(KINDS).flatmap(
        lambda kind: st.builds(Step, st.just(conn), st.just(kind), args.get(kind, st.just(())))
    )


def _setup(conn: int, topic: str, rdy: str) -> list[Step]:
    return [
        Step(conn, "identify", ({"feature_negotiation": True},)),
        Step(conn, "sub", (topic, f"c{conn}")),
        Step(conn, "rdy", (rdy,)),
    ]


# Connections often start subscribed with room for messages, so that the random
# steps that follow have deliveries, FINs and REQs to act on.
setups = st.tuples(
    st.permutations(list(range(CONNECTIONS))),
    st.integers(min_value=2, max_value=CONNECTIONS),
    st.lists(st.sampled_from(TOPICS), min_size=CONNECTIONS, max_size=CONNECTIONS),
    st.lists(st.sampled_from(["1", "3"]), min_size=CONNECTIONS, max_size=CONNECTIONS),
).map(
    lambda s: [
        step
        for conn, topic, rdy in zip(s[0][: s[1]], s[2], s[3], strict=False)
        for step in _setup(conn, topic, rdy)
    ]
)

steps = st.tuples(
    setups,
    st.lists(
        st.integers(min_value=0, max_value=CONNECTIONS - 1).flatmap(step_strategy),
        min_size=1,
        max_size=25,
    ),
).map(lambda parts: parts[0] + parts[1])


@dataclass
class Plan:
    """Messages each connection got after each step on fakensq (what the real
    run waits for before its sync points)."""

    counts: dict[tuple[int, int], int] = field(default_factory=dict)


def _message_id(session: Session, ref: int) -> bytes:
    if ref < 0 or not session.messages:
        return BOGUS_ID
    return session.messages[-1 - min(ref, len(session.messages) - 1)].id


def _command(session: Session, step: Step) -> bytes:
    kind, args = step.kind, step.args
    if kind == "identify":
        return cmds.identify(args[0])
    if kind == "sub":
        return f"SUB {args[0]} {args[1]}\n".encode()
    if kind == "rdy":
        return f"RDY {args[0]}\n".encode() if args[0] else b"RDY\n"
    if kind == "pub":
        return f"PUB {args[0]}\n".encode() + _body(args[1])
    if kind == "pub_empty":
        return b"PUB t0\n" + _body(b"")
    if kind == "mpub":
        inner = struct.pack(">l", len(args[1])) + b"".join(_body(b) for b in args[1])
        return f"MPUB {args[0]}\n".encode() + _body(inner)
    if kind == "dpub":
        return f"DPUB {args[0]} {args[1]}\n".encode() + _body(args[2])
    if kind == "fin":
        return cmds.fin(_message_id(session, args[0]))
    if kind == "req":
        return b"REQ " + _message_id(session, args[0]) + f" {args[1]}\n".encode()
    if kind == "touch":
        return cmds.touch(_message_id(session, args[0]))
    if kind == "cls":
        return cmds.cls()
    if kind == "nop":
        return cmds.nop()
    if kind == "short_fin":
        return b"FIN 1234\n"
    return b"NOPE\n"


def _sent_by_fakensq(t: Target, session: Session) -> int:
    """How many messages fakensq's node has written to ``session`` so far."""
    for client in t.fake.clients.values():
        if client.remote_address == session.local_address:
            return int(client.message_count)
    return len(session.messages)  # gone: everything it sent was read before


class _TopicIds:
    """A session's stand-in for the target's normalizer: message ids are kept
    raw, with the topic the session subscribed to, until their step is put in
    canonical order (:func:`_alias_ids`).  Aliases are then numbered in that
    order (not in the order read, which races as the entries do), and per
    topic (nsqd's ids are unique within a topic only: two topics publishing
    in the same millisecond may give out the same id).
    """

    def __init__(self, base: Normalizer, pending: dict[str, tuple[str, bytes]]) -> None:
        self.base = base
        self.pending = pending
        self.topic = ""

    def alias(self, raw: str | int, placeholder: str, *, within: bool = True) -> None:
        self.base.alias(raw, placeholder, within=within)

    def message_id(self, raw: bytes) -> str:
        key = f"<raw id {len(self.pending)}>"
        self.pending[key] = (self.topic, raw)
        return key


#: An id in an error text (``E_FIN_FAILED FIN <id> failed ...``).
_FAILED_ID = re.compile(r"^(E_\w+ (?:FIN|REQ|TOUCH) )(.{16})( failed)")


def _alias_ids(
    entries: list[Entry],
    base: Normalizer,
    pending: dict[str, tuple[str, bytes]],
    topics: dict[str, str],
) -> list[Entry]:
    out = []
    for entry in entries:
        if entry[1] == "msg" and entry[2] in pending:
            topic, raw = pending.pop(entry[2])
            entry = (*entry[:2], base.message_id(raw, topic.encode()), *entry[3:])
        elif isinstance(entry[1], str) and (found := _FAILED_ID.match(entry[1])):
            # The id of the session's own topic (another topic's may be equal).
            alias = base.message_id(found[2].encode("latin-1"), topics[entry[0]].encode())
            entry = (entry[0], found[1] + alias + entry[1][found.end(2) :], *entry[2:])
        out.append(entry)
    return out


def _canonical(entries: list[Entry]) -> list[Entry]:
    """One step's entries, by connection; on each, answers, then messages, then
    ``closed`` (each kind in the order read).

    nsqd answers commands in its IOLoop while its messagePump (a goroutine of
    its own) writes messages, both into one buffered writer: a message that a
    command makes available (a FIN or RDY making room, REQ 0, a PUB) is
    written before or after the answers to the commands that follow, as the
    two goroutines happen to run.  Measured on nsqd v1.3.0: ``REQ <id> 0`` and
    ``PUB`` in one write gave the message first 177 times in 200 and the
    ``OK`` first 23 times.  So only that interleaving is left out of the
    comparison: the answers among themselves, the messages among themselves,
    and how many messages each step brought, are compared exactly (the orders
    that nsqd keeps are checked in test_tcp_channels).
    """

    def rank(entry: Entry) -> tuple[str, int]:
        kind = entry[1]
        return entry[0], 2 if kind == "closed" else 1 if kind == "msg" else 0

    return sorted(entries, key=rank)


async def run_steps(t: Target, plan: Plan, sequence: list[Step]) -> Any:
    sessions: dict[int, Session] = {}
    generation = [0] * CONNECTIONS
    pending: dict[str, tuple[str, bytes]] = {}
    ids: dict[int, _TopicIds] = {}

    async def session(i: int) -> Session:
        if i not in sessions or sessions[i].closed:
            generation[i] += 1
            sessions[i] = await t.connect(f"c{i}.{generation[i]}")
            ids[i] = _TopicIds(t.normalizer, pending)
            sessions[i].normalizer = ids[i]  # type: ignore[assignment]
        return sessions[i]

    for index, step in enumerate(sequence):
        mark = len(t.transcript)
        s = await session(step.conn)
        before = {i: len(c.messages) for i, c in sessions.items()}
        if step.kind == "sub" and not ids[step.conn].topic:
            ids[step.conn].topic = step.args[0]  # (its messages come after the OK)
        answered = False
        if step.kind == "close":
            await s.close()
        elif step.kind == "identify":
            await s.identify(**step.args[0])  # (follows the negotiated compression)
        else:
            command = _command(s, step)
            await s.send(command)
            answered = command.split(b"\n", 1)[0].split(b" ", 1)[0] in ANSWERED
        # Every open connection reads up to a sync point (sent at once, right
        # behind the command), then the messages this step brought it that
        # came after the sync: on fakensq, all it has written once the node is
        # idle; on nsqd, as many as on fakensq.
        open_sessions = [(i, c) for i, c in sorted(sessions.items()) if not c.closed]
        for _, c in open_sessions:
            await c.send_sync()
        if answered:
            await s.read_answer()
        for _, c in open_sessions:
            await c.read_sync()
        if t.kind == "fakensq":
            await trio.testing.wait_all_tasks_blocked()
        for i, c in open_sessions:
            key = (index, i)
            if t.kind == "fakensq":
                await c.read_messages(_sent_by_fakensq(t, c) - len(c.messages))
                plan.counts[key] = len(c.messages) - before.get(i, 0)
            else:
                await c.read_messages(plan.counts.get(key, 0) - len(c.messages) + before.get(i, 0))
        topics = {c.name: ids[i].topic for i, c in sessions.items()}
        for c in t.sessions:
            topics.setdefault(c.name, "")
        t.transcript[mark:] = _alias_ids(
            _canonical(t.transcript[mark:]), t.normalizer, pending, topics
        )
    if t.kind == "real":
        delivered = sum(1 for e in t.transcript if e[1] == "msg")
        errors = sum(1 for e in t.transcript if e[1].startswith("E_"))
        event(f"messages delivered: {'0' if not delivered else '1-5' if delivered <= 5 else '6+'}")
        event(f"error frames: {'0' if not errors else '1' if errors == 1 else '2+'}")
    return await node_state(t)


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sequence=steps)
async def test_random_command_sequences(conformance: Conformance, sequence: list[Step]) -> None:
    plan = Plan()

    async def scenario(t: Target) -> Any:
        return await run_steps(t, plan, sequence)

    await conformance.nsqd(scenario)
