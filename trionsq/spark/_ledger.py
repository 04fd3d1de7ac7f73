"""Which messages a committed micro-batch really used (sans-IO, on the driver).

NSQ cannot replay, so a partition's rows are whatever messages its task took
from its executor's agent: a *message set*, held un-FINed by that agent until the
batch is committed.  Spark may read a partition more than once: a failed task is
retried, a slow one speculated, a lost shuffle output recomputed, a batch
DataFrame used by two actions.  Every read asks the coordinator first, and this
ledger answers:

- while a set of the partition is alive (its agent is connected), every read of
  the partition *replays* that set: the same rows, whichever executor runs it;
- only when no set is alive does a read take a *fresh* set (the earlier sets'
  messages are gone with their agent, and nsqd delivers them again).

When the batch is committed, :meth:`Ledger.resolve` says what to FIN and what to
REQ.  A partition read from one set FINs it.  A partition read from several sets
(one after the other, each time because the previous holder died) FINs the last
one only if that is provably the one the batch used: in every stage that read
the partition, the last set was read by a later task attempt than any read of an
earlier set (a retry, which Spark launches only after the earlier attempt
failed).  Otherwise (a stage retried as a whole, two stages that saw different
sets) nothing of the partition is FINed: its live set is requeued, and the batch's
messages come again (duplicates, never losses).
"""

from __future__ import annotations

import secrets
from collections import defaultdict
from dataclasses import dataclass, field
from enum import Enum

__all__ = ["Decision", "Ledger", "MessageSet", "Read", "Resolution", "SetState"]


class SetState(Enum):
    TAKING = "taking"  # a fresh read is collecting it
    READY = "ready"  # complete and handed to a task
    VOID = "void"  # the take failed: requeued by its agent, never used


@dataclass(slots=True)
class MessageSet:
    #: random: a set id names messages, so it must not be guessable
    id: int
    #: the order sets were made in
    seq: int
    batch: int
    partition: int
    holder: str
    state: SetState = SetState.TAKING
    count: int = 0


@dataclass(frozen=True, slots=True)
class Read:
    """One task attempt's read of one partition."""

    batch: int
    partition: int
    stage: int
    attempt: int
    task: int
    agent: str
    set_id: int


@dataclass(frozen=True, slots=True)
class Decision:
    """What a read does: take the fresh set ``set_id``, or replay it from ``holder``."""

    fresh: bool
    set_id: int
    holder: str


@dataclass(slots=True)
class Resolution:
    """What committing batches means for each agent: sets to FIN, sets to REQ."""

    fin: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    req: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    #: partitions whose messages come again, and why (for the driver's log)
    warnings: list[str] = field(default_factory=list)
    #: messages FINed (as counted by the sets)
    finished: int = 0

    @property
    def agents(self) -> set[str]:
        return set(self.fin) | set(self.req)


class LateReadError(Exception):
    """A read of a batch that is already committed (a zombie task): it must not count."""


class Ledger:
    """The sets and reads of the batches not committed yet."""

    def __init__(self) -> None:
        self.alive: set[str] = set()
        self.sets: dict[int, MessageSet] = {}
        self.reads: dict[int, list[Read]] = defaultdict(list)
        self.resolved_through = -1
        self._next_set = 1

    # --- agents ---

    def agent_joined(self, agent: str) -> None:
        self.alive.add(agent)

    def agent_lost(self, agent: str) -> list[int]:
        """The agent is gone, with every set it held (nsqd redelivers their messages)."""
        self.alive.discard(agent)
        return [s.id for s in self.sets.values() if s.holder == agent]

    def held_by(self, agent: str) -> list[int]:
        return [
            s.id for s in self.sets.values() if s.holder == agent and s.state is not SetState.VOID
        ]

    # --- reads ---

    def live_set(self, batch: int, partition: int) -> MessageSet | None:
        """The set every read of the partition replays, if one is alive."""
        for message_set in reversed(list(self._sets_of(batch, partition))):
            if message_set.state is not SetState.VOID and message_set.holder in self.alive:
                return message_set
        return None

    def start_read(
        self, batch: int, partition: int, stage: int, attempt: int, task: int, agent: str
    ) -> Decision:
        """Record a read and decide it (see the module docstring)."""
        if batch <= self.resolved_through:
            raise LateReadError(f"batch {batch} is already committed")
        if agent not in self.alive:
            raise KeyError(f"unknown agent {agent!r}")
        live = self.live_set(batch, partition)
        if live is None:
            live = MessageSet(self._new_id(), self._next_set, batch, partition, agent)
            self._next_set += 1
            self.sets[live.id] = live
            fresh = True
        else:
            fresh = False
        self.reads[batch].append(Read(batch, partition, stage, attempt, task, agent, live.id))
        return Decision(fresh, live.id, live.holder)

    def _new_id(self) -> int:
        while True:
            set_id = 1 + secrets.randbits(62)
            if set_id not in self.sets:
                return set_id

    def set_ready(self, set_id: int, count: int) -> None:
        message_set = self.sets.get(set_id)
        if message_set is not None and message_set.state is SetState.TAKING:
            message_set.state = SetState.READY
            message_set.count = count

    def set_void(self, set_id: int) -> None:
        """The take failed (its agent requeued what it had): no read may use it."""
        message_set = self.sets.get(set_id)
        if message_set is not None:
            message_set.state = SetState.VOID
            self.reads[message_set.batch] = [
                r for r in self.reads[message_set.batch] if r.set_id != set_id
            ]

    # --- commit ---

    def _sets_of(self, batch: int, partition: int) -> list[MessageSet]:
        return sorted(
            (s for s in self.sets.values() if s.batch == batch and s.partition == partition),
            key=lambda s: s.seq,
        )

    def resolve(self, through: int) -> Resolution:
        """Batches up to ``through`` are committed: FIN what they used, REQ the rest."""
        resolution = Resolution()
        batches = sorted({s.batch for s in self.sets.values() if s.batch <= through})
        for batch in batches:
            reads = self.reads.pop(batch, [])
            partitions = sorted({s.partition for s in self.sets.values() if s.batch == batch})
            for partition in partitions:
                self._resolve_partition(
                    batch, partition, [r for r in reads if r.partition == partition], resolution
                )
            for message_set in [s for s in self.sets.values() if s.batch == batch]:
                del self.sets[message_set.id]
        for batch in [b for b in self.reads if b <= through]:
            del self.reads[batch]
        self.resolved_through = max(self.resolved_through, through)
        return resolution

    def _resolve_partition(
        self, batch: int, partition: int, reads: list[Read], resolution: Resolution
    ) -> None:
        sets = [s for s in self._sets_of(batch, partition) if s.state is not SetState.VOID]
        if not sets:
            return
        live = [s for s in sets if s.holder in self.alive]
        last = sets[-1]
        if last in live and last.state is SetState.READY and _last_set_used(reads, last.id):
            resolution.fin[last.holder].append(last.id)
            resolution.finished += last.count
            live.remove(last)
        elif live:
            attempts = sorted({(r.stage, r.attempt) for r in reads})
            resolution.warnings.append(
                f"batch {batch} partition {partition} was read from {len(sets)} different "
                f"message sets (stage, attempt: {attempts}) and which one the batch used "
                "cannot be told: its messages are requeued and will be read again"
            )
        for message_set in live:
            resolution.req[message_set.holder].append(message_set.id)

    def release_all(self) -> Resolution:
        """The query stops: every live set goes back to nsqd."""
        resolution = Resolution()
        for message_set in self.sets.values():
            if message_set.holder in self.alive and message_set.state is not SetState.VOID:
                resolution.req[message_set.holder].append(message_set.id)
        self.sets.clear()
        self.reads.clear()
        return resolution


def _last_set_used(reads: list[Read], last: int) -> bool:
    """Whether every stage that read the partition used the set ``last`` in the end.

    Within a stage, Spark starts a task's attempt ``n + 1`` only after attempt
    ``n`` failed (speculative copies read the live set, so they never make a set of
    their own); a stage attempt that is retried as a whole numbers its task
    attempts from 0 again, so an equal or lower attempt number on the last set
    means a recomputed stage, whose other partitions may have used the old rows.
    """
    stages: dict[int, list[Read]] = defaultdict(list)
    for read in reads:
        stages[read.stage].append(read)
    if not stages:
        return True  # no read recorded (the batch was replanned): only this set exists
    for stage_reads in stages.values():
        on_last = [r.attempt for r in stage_reads if r.set_id == last]
        earlier = [r.attempt for r in stage_reads if r.set_id != last]
        if not on_last:
            return False
        if earlier and max(earlier) >= min(on_last):
            return False
    return True
