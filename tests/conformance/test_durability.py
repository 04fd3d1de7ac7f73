"""What an nsqd keeps across clean stops, restarts and kills: a stateful test.

Hypothesis drives a :class:`~hypothesis.stateful.RuleBasedStateMachine` whose
steps are what durability depends on: publishing (PUB, MPUB, DPUB; to memory
and, with a small ``--mem-queue-size``, to disk), creating, emptying, deleting
and pausing topics and channels whose names collide on disk (a prefix of
another, ``.diskqueue.`` inside a name, ``#ephemeral`` ones), draining a
channel with a consumer, taking messages with a consumer that leaves them in
flight, a clean stop and start (SIGTERM), and a kill and start (SIGKILL).  Each step runs on fakensq's nsqd and on the real nsqd
v1.3.0, side by side, and after each step what they hold is compared: every
topic's and channel's paused flag, depth, backend (disk) depth, in-flight
and deferred counts (``/stats``), and the bodies a drain reads.  Both are also compared
with :class:`Model`, a small statement of nsqd's rules (read from nsqd's and
go-diskqueue's source, then checked by these very runs): without the real
binary, fakensq is checked against the model alone.

What nsqd does by chance is kept out, so that one run of a sequence gives one
outcome:

- ``--sync-every=1``: go-diskqueue records its positions after every read
  and write, so a kill keeps exactly what went to disk (with the default
  2500 and the 2 s ticker, what a kill keeps depends on when it comes);
  before a kill the test still waits until each queue's meta file records
  the depth ``/stats`` shows (the sync runs just after the write is
  answered);
- nsqd rewrites ``nsqd.dat`` in a goroutine of its own after a topic or
  channel comes or goes, and at a deletion that goroutine reads the topics
  and channels while the deleted one is still listed or not (measured: 14
  times in 30 the deleted topic was still in the file): before a kill, the
  test unpauses the untouched ``sentinel`` topic (``/topic/unpause`` writes
  the file in the request, from the state left by everything answered
  before it), so the kill sees the file both daemons would end with;
- nsqd's topic reads its memory and its disk in no fixed order: when what a
  topic hands on to a channel came from both (an MPUB larger than the memory
  queue, a backlog drained at unpause) and the channel's memory cannot take
  it all, which bodies land in the channel's memory (lost at a kill) is
  chance: the model marks that channel's bodies uncertain (counts are still
  compared) until it is emptied;
- a clean stop writes a channel's in-flight and deferred messages in Go's
  map order (random): the model marks their order unknown, and what a
  consumer then takes of part of them uncertain;
- a PUB or DPUB finds room in a topic's memory only if its pump has handed
  on what came before (with ``--mem-queue-size=0``: only if the pump waits
  on it), else it goes to disk, where a DPUB's delay is lost: each is sent
  once the topic's queue is empty (:meth:`durable.Daemon.publish`);
- an ephemeral topic's memory queue drops what does not fit while its pump
  is busy: it gets single publishes only;
- the real nsqd changes state just after answering (its topic pump moves
  messages on in a goroutine): it is read again until it holds what
  fakensq holds, and compared once that is so or after a bounded wait.

Hypothesis runs state machines synchronously: the machine runs in a worker
thread, each step calling into the test's trio run, where fakensq's node
lives.  The run is bounded (30 examples of at most 25 steps, derandomized as
the whole suite: the same sequences each time; 15 to 35 s on a busy
machine, most of it the real nsqd's restarts).  A failure shrinks to a short sequence, printed as
Python; shrinking a sequence with kills takes minutes.  A longer search, on new
sequences each run: ``DURABILITY_RANDOM=1 DURABILITY_EXAMPLES=400
DURABILITY_STEPS=40 pytest tests/conformance/test_durability.py`` (400 such
sequences: about 7 minutes).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
    run_state_machine_as_test,
)

from trionsq.protocol.names import is_ephemeral

from .. import reference
from .conftest import Conformance, _diff
from .durable import SENTINEL, Run

T = TypeVar("T")

#: Names that collide on disk if a daemon matches files by pattern: "t" is a
#: prefix of "t.diskqueue.0" ("t.diskqueue.*.dat" matches the other's files).
TOPICS = ["t", "t.diskqueue.0", "e#ephemeral"]
CHANNELS = ["c", "c.diskqueue.0", "x#ephemeral"]

topics = st.sampled_from(TOPICS)
channels = st.sampled_from(CHANNELS)
ACTIONS = ["empty", "delete", "pause", "unpause"]
known_topics: Bundle[str] = Bundle("topic")
known_channels: Bundle[tuple[str, str]] = Bundle("channel")


# --- the model: nsqd's rules -------------------------------------------------


@dataclass
class Queue:
    """A topic's or channel's messages, by where nsqd keeps them."""

    #: In memory (lost at a kill): bodies, with whether a DPUB put them there
    #: (a topic's memory keeps the delay; its disk does not).
    mem: list[tuple[bytes, bool]] = field(default_factory=list)
    disk: list[bytes] = field(default_factory=list)
    #: A channel's messages in flight (to a consumer gone without finishing
    #: them: nsqd keeps them in flight until their timeout) and deferred ones
    #: (neither in its depth; lost at a kill).
    in_flight: list[bytes] = field(default_factory=list)
    deferred: list[bytes] = field(default_factory=list)
    #: Whether the bodies in mem and disk are known (module doc).
    certain: bool = True
    #: Whether their order on disk is known: a clean stop writes in-flight and
    #: deferred messages in Go's map order (random), so which of them a
    #: consumer gets first is chance.
    ordered: bool = True
    #: Whether in_flight's bodies are a guess (taken by a consumer while the
    #: bodies or their order were not known): a clean stop writes them back.
    guessed: bool = False

    def clear(self) -> None:
        self.mem, self.disk, self.in_flight, self.deferred = [], [], [], []
        self.certain = self.ordered = True
        self.guessed = False

    def flush(self) -> None:
        """A clean stop: nsqd writes memory, then in-flight and deferred
        messages after what is on disk (a DPUB's delay is not written), each
        of those two in no fixed order."""
        if len(self.in_flight) > 1 or len(self.deferred) > 1:
            self.ordered = False
        if self.guessed:
            self.certain, self.guessed = False, False
        self.disk += [body for body, _ in self.mem] + self.in_flight + self.deferred
        self.mem, self.in_flight, self.deferred = [], [], []


@dataclass
class ChannelModel:
    name: str
    paused: bool = False
    queue: Queue = field(default_factory=Queue)


@dataclass
class TopicModel:
    name: str
    paused: bool = False
    queue: Queue = field(default_factory=Queue)
    channels: dict[str, ChannelModel] = field(default_factory=dict)


class Model:
    """What nsqd v1.3.0 holds, step by step (``mem``: --mem-queue-size)."""

    def __init__(self, mem: int) -> None:
        self.mem = mem
        self.topics: dict[str, TopicModel] = {SENTINEL: TopicModel(SENTINEL)}
        #: Disk queues left on disk by a stop but not listed in nsqd.dat (a
        #: non-ephemeral channel of an ephemeral topic), by "topic:channel":
        #: the same channel made again reads them.
        self.leftovers: dict[str, Queue] = {}

    def topic(self, name: str) -> TopicModel:
        if name not in self.topics:
            self.topics[name] = TopicModel(name)
        return self.topics[name]

    def publish(self, name: str, bodies: list[bytes], deferred: bool) -> None:
        topic = self.topic(name)
        if topic.channels and not topic.paused:
            # Through the topic's memory while it has room, the rest through
            # its disk: both when the batch is larger than the memory queue.
            mixed = 0 < self.mem < len(bodies)
            self._fan_out(topic, [(b, deferred) for b in bodies], mixed)
            return
        for body in bodies:
            if len(topic.queue.mem) < self.mem:
                topic.queue.mem.append((body, deferred))
            elif not is_ephemeral(name):
                topic.queue.disk.append(body)  # the delay is lost on disk
            # (an ephemeral topic drops what its memory cannot take)

    def _fan_out(self, topic: TopicModel, msgs: list[tuple[bytes, bool]], mixed: bool) -> None:
        ready = [b for b, deferred in msgs if not deferred]
        for channel in topic.channels.values():
            q = channel.queue
            q.deferred += [b for b, deferred in msgs if deferred]
            room = max(0, self.mem - len(q.mem))
            if mixed and room < len(ready):
                q.certain = False  # which of them stay in memory is chance
            for body in ready:
                if len(q.mem) < self.mem:
                    q.mem.append((body, False))
                elif not is_ephemeral(channel.name):
                    q.disk.append(body)

    def drain_topic(self, topic: TopicModel) -> None:
        """The topic's pump hands its backlog on (a channel came, or unpause)."""
        if topic.paused or not topic.channels:
            return
        q = topic.queue
        mixed = bool(q.mem) and bool(q.disk)
        msgs = [(b, False) for b in q.disk] + q.mem
        q.mem, q.disk = [], []
        self._fan_out(topic, msgs, mixed)

    def create_channel(self, topic_name: str, name: str) -> int:
        topic = self.topics.get(topic_name)
        if topic is None:
            return 404
        if name not in topic.channels:
            channel = topic.channels[name] = ChannelModel(name)
            channel.queue = self.leftovers.pop(f"{topic_name}:{name}", channel.queue)
            self.drain_topic(topic)
        return 200

    def delete_channel(self, topic_name: str, name: str) -> int:
        topic = self.topics.get(topic_name)
        if topic is None or name not in topic.channels:
            return 404
        del topic.channels[name]
        if is_ephemeral(topic_name) and not topic.channels:
            del self.topics[topic_name]
        return 200

    def stop(self, *, kill: bool) -> None:
        """A clean stop (everything written to disk) or a kill (memory and
        deferred messages lost), then a start: ephemeral ones are gone."""
        for name in list(self.topics):
            topic = self.topics[name]
            for cname in list(topic.channels):
                if is_ephemeral(cname):
                    del topic.channels[cname]
            for q in [topic.queue, *(c.queue for c in topic.channels.values())]:
                if kill:
                    q.mem, q.in_flight, q.deferred, q.guessed = [], [], [], False
                else:
                    q.flush()
            if is_ephemeral(name):
                del self.topics[name]
                for cname, c in topic.channels.items():
                    self.leftovers[f"{name}:{cname}"] = c.queue
                continue
            self.drain_topic(topic)

    def view(self) -> list[Any]:
        return sorted(
            (
                t.name,
                t.paused,
                len(t.queue.mem) + len(t.queue.disk),
                len(t.queue.disk),
                sorted(
                    (
                        c.name,
                        c.paused,
                        len(c.queue.mem) + len(c.queue.disk),
                        len(c.queue.disk),
                        len(c.queue.in_flight),
                        len(c.queue.deferred),
                    )
                    for c in t.channels.values()
                ),
            )
            for t in self.topics.values()
        )


# --- the machine ---------------------------------------------------------------


class Durability(RuleBasedStateMachine):
    """The rules; each runs on both daemons (from hypothesis's thread into the
    test's trio run) and on the model, then compares what they hold."""

    #: Set by the test: (the trio nursery, a fresh folder, whether nsqd is real).
    context: Callable[[], tuple[trio.Nursery, Path, bool]]

    def __init__(self) -> None:
        super().__init__()
        self.run: Run | None = None
        self.model = Model(0)
        self.bodies = count()
        self.acted = False

    def _call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        return trio.from_thread.run(fn, *args)

    @initialize(
        mem=st.sampled_from([0, 1, 3]),
        max_bytes=st.sampled_from([100, 1 << 20]),
    )
    def start(self, mem: int, max_bytes: int) -> None:
        nursery, folder, real = type(self).context()
        flags = [
            "--sync-every=1",
            f"--mem-queue-size={mem}",
            f"--max-bytes-per-file={max_bytes}",
            "--msg-timeout=10m",  # (in flight until a stop, however slow the run)
        ]
        self.model = Model(mem)
        self.run = Run(nursery, folder, flags, real)
        self._call(self.run.start)
        self.check()

    def teardown(self) -> None:
        if self.run is not None:
            self._call(self.run.close)

    def check(self) -> None:
        assert self.run is not None
        self.acted = True
        views = self._call(self.run.settle)
        want = self.model.view()
        if views[0] != want:
            raise AssertionError("fakensq and the model differ:\n" + _diff(views[0], want, "model"))
        if len(views) > 1 and views[1] != views[0]:
            raise AssertionError("fakensq and the real nsqd differ:\n" + _diff(views[0], views[1]))

    def _same(self, outcomes: list[Any], what: str) -> Any:
        if len(outcomes) > 1 and outcomes[1] != outcomes[0]:
            raise AssertionError(f"{what}: fakensq and the real nsqd differ:\n" + _diff(*outcomes))
        return outcomes[0]

    def _post(self, path: str, expected: int) -> None:
        assert self.run is not None
        run = self.run
        answers = self._call(run.each, lambda d: d.post(run.http, path))
        status, text = self._same(answers, path)
        assert status == expected, f"{path}: {status} {text}, the model says {expected}"

    # --- publishing ---

    # Rules that act on a topic or channel take one made before (a bundle), so
    # that most steps act on something; deleted ones still come up (404).

    @rule(
        target=known_topics,
        topic=st.one_of(known_topics, topics),
        how=st.sampled_from(["pub", "mpub", "dpub"]),
        n=st.integers(min_value=1, max_value=5),
    )
    def publish(self, topic: str, how: str, n: int) -> str:
        assert self.run is not None
        if is_ephemeral(topic):
            n = 1  # (the module doc)
        bodies = [b"m%d" % next(self.bodies) for _ in range(n)]
        answers = self._call(self.run.publish, topic, bodies, how)
        self._same(answers, f"{how} {topic}")
        self.model.publish(topic, bodies, how == "dpub")
        self.check()
        return topic

    # --- topics and channels ---

    @rule(target=known_topics, topic=topics)
    def create_topic(self, topic: str) -> str:
        self._post(f"/topic/create?topic={_q(topic)}", 200)
        self.model.topic(topic)
        self.check()
        return topic

    @rule(target=known_channels, topic=known_topics, channel=channels)
    def create_channel(self, topic: str, channel: str) -> tuple[str, str]:
        expected = self.model.create_channel(topic, channel)
        self._post(f"/channel/create?topic={_q(topic)}&channel={_q(channel)}", expected)
        self.check()
        return topic, channel

    # Emptying, deleting, pausing: one rule for topics and one for channels
    # (hypothesis leaves a random few rules out of each example: with fewer
    # rules, fewer examples lack one that matters).

    @rule(topic=known_topics, action=st.sampled_from(ACTIONS))
    def topic_admin(self, topic: str, action: str) -> None:
        t = self.model.topics.get(topic)
        if t is not None:
            if action == "empty":
                t.queue.clear()
            elif action == "delete":
                del self.model.topics[topic]
            else:
                t.paused = action == "pause"
                self.model.drain_topic(t)
        self._post(f"/topic/{action}?topic={_q(topic)}", 404 if t is None else 200)
        self.check()

    @rule(channel=known_channels, action=st.sampled_from(ACTIONS))
    def channel_admin(self, channel: tuple[str, str], action: str) -> None:
        c = self._channel(channel)
        status = 404 if c is None else 200
        if c is not None:
            if action == "empty":
                c.queue.clear()
            elif action == "delete":
                self.model.delete_channel(*channel)
            else:
                c.paused = action == "pause"
        self._post(f"/channel/{action}?{_args(channel)}", status)
        self.check()

    def _channel(self, channel: tuple[str, str]) -> ChannelModel | None:
        t = self.model.topics.get(channel[0])
        return t.channels.get(channel[1]) if t is not None else None

    # --- consuming ---

    def _drainable(self) -> list[tuple[TopicModel, ChannelModel]]:
        return [
            (t, c)
            for t in self.model.topics.values()
            for c in t.channels.values()
            if (c.queue.mem or c.queue.disk)
            and not (c.paused or is_ephemeral(c.name) or is_ephemeral(t.name))
        ]

    @precondition(lambda self: self._drainable())
    @rule()
    def drain(self) -> None:
        """A consumer reads (and FINs) what each channel holds, channel by
        channel (not an ephemeral one: its consumer's leaving would delete it;
        not a paused one: it delivers nothing)."""
        assert self.run is not None
        run = self.run
        for topic, c in self._drainable():
            q = c.queue
            n = len(q.mem) + len(q.disk)
            where = f"drained {topic.name}/{c.name}"
            got = self._call(run.drain, topic.name, c.name, n)
            if q.certain:
                self._same(got, where)
                want = sorted([b for b, _ in q.mem] + q.disk)
                assert got[0] == want, f"{where}: {got[0]}, the model says {want}"
            q.mem, q.disk, q.certain, q.ordered = [], [], True, True
        self.check()

    def _holdable(self) -> list[tuple[TopicModel, ChannelModel]]:
        # (Messages in one place only, memory or disk: nsqd's consumer takes
        # from both in no fixed order, and which it took shows in the backend
        # depth.)
        return [(t, c) for t, c in self._drainable() if not (c.queue.mem and c.queue.disk)]

    @precondition(lambda self: self._holdable())
    @rule(data=st.data(), k=st.integers(min_value=1, max_value=3))
    def hold(self, data: st.DataObject, k: int) -> None:
        """A consumer takes ``k`` messages of a channel and leaves without
        finishing them: they stay in flight (``--msg-timeout=10m``), to be
        written to disk by a clean stop or lost by a kill."""
        assert self.run is not None
        topic, c = data.draw(st.sampled_from(self._holdable()), label="channel")
        q = c.queue
        k = min(k, len(q.mem) + len(q.disk))
        got = self._call(self.run.hold, topic.name, c.name, k)
        # (Taking all of a place is exact even when its order is not known.)
        exact = q.certain and (q.ordered or k == len(q.mem or q.disk))
        if q.mem:
            taken = [b for b, _ in q.mem[:k]]
            q.mem = q.mem[k:]
        else:
            taken, q.disk = q.disk[:k], q.disk[k:]
        q.in_flight += taken
        if not exact:
            # Which were taken is chance: so is what is left, and what a
            # clean stop writes back.
            q.certain, q.guessed = False, True
        else:
            self._same(got, f"held {topic.name}/{c.name}")
            assert got[0] == sorted(taken), f"held: {got[0]}, the model says {sorted(taken)}"
        self.check()

    # (Not twice in a row: a stop of a node that did nothing since the last
    # one tests little and costs the most.)
    @precondition(lambda self: self.acted)
    @rule(kill=st.booleans())
    def stop(self, kill: bool) -> None:
        """SIGTERM (fakensq: a cancelled run) or SIGKILL (fakensq: a run ended
        without writing anything), then a start on the same data."""
        run = self.run
        assert run is not None
        self._call(lambda: run.stop(kill=kill))
        self.model.stop(kill=kill)
        self.check()
        self.acted = False


def _q(name: str) -> str:
    return name.replace("#", "%23")


def _args(channel: tuple[str, str]) -> str:
    return f"topic={_q(channel[0])}&channel={_q(channel[1])}"


async def test_durability_state_machine(tmp_path: Path, conformance: Conformance) -> None:
    real = reference.binary("nsqd") is not None
    runs = count()
    async with trio.open_nursery() as nursery:

        def context() -> tuple[trio.Nursery, Path, bool]:
            return nursery, tmp_path / f"run{next(runs)}", real

        machine = type("DurabilityTest", (Durability,), {"context": staticmethod(context)})
        await trio.to_thread.run_sync(
            lambda: run_state_machine_as_test(
                machine,
                settings=settings(
                    max_examples=int(os.environ.get("DURABILITY_EXAMPLES", "30")),
                    stateful_step_count=int(os.environ.get("DURABILITY_STEPS", "25")),
                    # A campaign: DURABILITY_RANDOM=1 draws new sequences each run.
                    derandomize=not os.environ.get("DURABILITY_RANDOM"),
                    database=None,
                    deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
                ),
            )
        )
        nursery.cancel_scope.cancel()
    if not real:
        conformance.skip_reason = (
            f"fakensq ran it, checked by the model; no real nsqd: {reference.skip_reason()}"
        )
        pytest.skip(conformance.skip_reason)
