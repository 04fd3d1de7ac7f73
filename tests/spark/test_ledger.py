"""The ledger's rules: what a committed batch FINs and what it requeues (no Spark, no I/O)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trionsq.spark._ledger import LateReadError, Ledger, SetState


def ledger(*agents: str) -> Ledger:
    book = Ledger()
    for agent in agents:
        book.agent_joined(agent)
    return book


def read(
    book: Ledger,
    agent: str,
    *,
    batch: int = 1,
    partition: int = 0,
    stage: int = 7,
    attempt: int = 0,
    task: int = 0,
    count: int = 10,
) -> int:
    decision = book.start_read(batch, partition, stage, attempt, task, agent)
    if decision.fresh:
        book.set_ready(decision.set_id, count)
    return decision.set_id


def test_one_read_per_partition_fins_every_set() -> None:
    book = ledger("a", "b")
    first = read(book, "a", partition=0)
    second = read(book, "b", partition=1)
    resolution = book.resolve(1)
    assert dict(resolution.fin) == {"a": [first], "b": [second]}
    assert not resolution.req and not resolution.warnings
    assert resolution.finished == 20
    assert not book.sets


def test_a_retry_replays_the_live_set_wherever_it_runs() -> None:
    book = ledger("a", "b")
    original = book.start_read(1, 0, 7, 0, 100, "a")
    assert original.fresh
    book.set_ready(original.set_id, 5)
    retry = book.start_read(1, 0, 7, 1, 101, "b")  # attempt 1, on another executor
    assert (retry.fresh, retry.set_id, retry.holder) == (False, original.set_id, "a")
    # Whichever attempt succeeded, it wrote the same rows: FIN them once.
    assert dict(book.resolve(1).fin) == {"a": [original.set_id]}


def test_a_second_stage_reading_the_partition_replays_it_too() -> None:
    book = ledger("a", "b")
    first = read(book, "a", stage=3)
    assert read(book, "b", stage=4) == first  # foreachBatch using the batch twice
    assert dict(book.resolve(1).fin) == {"a": [first]}


def test_a_retry_after_the_holder_died_takes_a_fresh_set_which_is_fined() -> None:
    book = ledger("a", "b")
    lost = read(book, "a", attempt=0, task=1)
    assert book.agent_lost("a") == [lost]
    fresh = book.start_read(1, 0, 7, 1, 2, "b")
    assert fresh.fresh and fresh.set_id != lost
    book.set_ready(fresh.set_id, 10)
    resolution = book.resolve(1)
    # The dead executor's task failed with it: the retry's set is the batch's.
    assert dict(resolution.fin) == {"b": [fresh.set_id]} and not resolution.req


def test_a_recomputed_stage_after_the_holder_died_requeues() -> None:
    book = ledger("a", "b")
    read(book, "a", attempt=0, task=1)
    book.agent_lost("a")
    # Stage attempt 1 numbers its task attempts from 0 again: other partitions of the
    # recomputed stage may have used the old rows, so the new ones are not provably used.
    again = read(book, "b", attempt=0, task=9)
    resolution = book.resolve(1)
    assert not resolution.fin and dict(resolution.req) == {"b": [again]}
    assert resolution.warnings and "cannot be told" in resolution.warnings[0]


def test_two_stages_that_saw_different_sets_requeue() -> None:
    book = ledger("a", "b")
    read(book, "a", stage=3, task=1)
    book.agent_lost("a")
    second = read(book, "b", stage=4, task=2)
    resolution = book.resolve(1)
    assert not resolution.fin and dict(resolution.req) == {"b": [second]}


def test_a_read_waits_for_nothing_once_the_set_is_void() -> None:
    book = ledger("a")
    decision = book.start_read(1, 0, 7, 0, 1, "a")
    book.set_void(decision.set_id)  # the take failed (a lost connection)
    retry = book.start_read(1, 0, 7, 1, 2, "a")
    assert retry.fresh and retry.set_id != decision.set_id
    book.set_ready(retry.set_id, 3)
    assert dict(book.resolve(1).fin) == {"a": [retry.set_id]}


def test_a_set_still_being_taken_at_commit_is_requeued() -> None:
    book = ledger("a")
    decision = book.start_read(1, 0, 7, 0, 1, "a")
    assert book.sets[decision.set_id].state is SetState.TAKING
    resolution = book.resolve(1)
    assert not resolution.fin and dict(resolution.req) == {"a": [decision.set_id]}


def test_reads_of_committed_batches_are_refused() -> None:
    book = ledger("a")
    read(book, "a", batch=3)
    book.resolve(3)
    with pytest.raises(LateReadError):
        book.start_read(2, 0, 7, 0, 1, "a")
    assert read(book, "a", batch=4) > 0


def test_release_all_requeues_every_live_set() -> None:
    book = ledger("a", "b")
    first = read(book, "a", batch=1)
    second = read(book, "b", batch=2, partition=1)
    book.agent_lost("b")
    assert dict(book.release_all().req) == {"a": [first]}
    assert second not in book.sets


# --- properties --------------------------------------------------------------------

AGENTS = ["a", "b", "c"]

event = st.one_of(
    st.tuples(
        st.just("read"),
        st.sampled_from(AGENTS),
        st.integers(0, 1),
        st.integers(0, 1),
        st.booleans(),
    ),
    st.tuples(st.just("lose"), st.sampled_from(AGENTS), st.just(0), st.just(0), st.just(False)),
)


@given(st.lists(event, max_size=25))
def test_only_the_set_every_later_read_used_is_ever_fined(
    events: list[tuple[str, str, int, int, bool]],
) -> None:
    """Whatever the reads, deaths and failed takes: at most one set per partition is
    FINed, it is the partition's last set, its holder is alive, and no later read of
    the partition used another set."""
    book = ledger(*AGENTS)
    task = 0
    reads: list[tuple[int, int]] = []  # (partition, set) of every read that got rows
    for kind, agent, partition, stage, fails in events:
        if kind == "read" and agent in book.alive:
            task += 1
            decision = book.start_read(1, partition, stage, task, task, agent)
            if decision.fresh and fails:
                book.set_void(decision.set_id)  # the take failed: no rows
                continue
            if decision.fresh:
                book.set_ready(decision.set_id, 1)
            reads.append((partition, decision.set_id))
        elif kind == "lose":
            book.agent_lost(agent)
    holders = {s.id: s.holder for s in book.sets.values() if s.state is SetState.READY}
    resolution = book.resolve(1)
    fined = [set_id for ids in resolution.fin.values() for set_id in ids]
    requeued = [set_id for ids in resolution.req.values() for set_id in ids]
    assert not set(fined) & set(requeued)
    partitions = []
    for set_id in fined:
        assert holders[set_id] in book.alive
        partition = next(p for p, s in reads if s == set_id)
        assert [s for p, s in reads if p == partition][-1] == set_id
        partitions.append(partition)
    assert len(partitions) == len(set(partitions))
    # Every set a live agent holds is answered, one way or the other.
    live = {i for i, h in holders.items() if h in book.alive}
    assert set(fined) | set(requeued) == live
