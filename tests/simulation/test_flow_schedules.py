"""Fault schedules placed by the message flow (fakensq.testing.flow), the
``--nsq-faults-only`` lists that name their faults, and the delta debugging
that shrinks a failing test's faults (fakensq.testing.pytest_replay.ddmin)."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fakensq.faultkinds import KINDS, kinds_for
from fakensq.testing.flow import (
    Anchor,
    FlowFault,
    draw_flow_schedule,
    format_only,
    ordinal,
    parse_only,
)
from fakensq.testing.pytest_replay import ddmin


def test_the_same_seed_draws_the_same_schedule() -> None:
    for seed in range(50):
        first = draw_flow_schedule(random.Random(seed))
        assert first == draw_flow_schedule(random.Random(seed))
        assert [f.id for f in first] == list(range(1, len(first) + 1))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    seed=st.integers(0, 2**32),
    level=st.sampled_from(["safe", "harsh", "lossy"]),
    horizon=st.integers(1, 100),
    redeliveries=st.integers(0, 4),
    real=st.booleans(),
)
def test_draws_keep_to_the_level_horizon_and_redelivery_budget(
    seed: int, level: str, horizon: int, redeliveries: int, real: bool
) -> None:
    needs = ("wire", "nodes") if real else ("wire", "nsqd", "nodes")
    schedule = draw_flow_schedule(
        random.Random(seed),
        rate=6,
        level=level,  # type: ignore[arg-type]
        horizon=horizon,
        redeliveries=redeliveries,
        needs=needs,
    )
    for fault in schedule:
        assert fault.kind in kinds_for(level)  # type: ignore[arg-type]
        assert KINDS[fault.kind].needs in needs
        assert 1 <= fault.anchor.count <= horizon
        assert fault.kind != "lookupd_outage"  # no nsqlookupd in the fixture
        if level == "safe":
            # Nothing that harms a producer: at a publish, only what slows it.
            assert fault.anchor.on_consumer or fault.kind in ("delay", "stall")
        if KINDS[fault.kind].lasting:
            assert fault.duration > 0
    assert sum(f.redelivers for f in schedule) <= redeliveries


def test_points_spread_over_the_flow_early_ones_as_often_as_late_ones() -> None:
    # The faults drawn by weight, after the three of the classes (within
    # the first quarter: test_every_default_schedule_holds_one_fault_...).
    counts = [
        f.anchor.count for seed in range(400) for f in draw_flow_schedule(random.Random(seed))[3:]
    ]
    early = sum(c <= 6 for c in counts) / len(counts)
    assert 0.35 < early < 0.65, early  # log-uniform over 1..40: about half in 1..6
    assert max(counts) == 40


def core_of(schedule: Sequence[FlowFault]) -> dict[str, FlowFault]:
    """A schedule's faults that reveal a class of bug each, by class."""
    found = {}
    for fault in schedule:
        if fault.kind == "drop" and fault.withhold:
            found.setdefault("lost on its way", fault)
        elif fault.kind in ("drop", "time_out") and fault.anchor.event == "fin":
            found.setdefault("handled, FIN never read", fault)
        elif fault.holds_answer:
            found.setdefault("a late answer", fault)
    return found


@pytest.mark.parametrize("real", [False, True])
def test_every_default_schedule_holds_one_fault_for_each_class_of_bug(real: bool) -> None:
    # A message lost on its way, one handled whose FIN is never read, a
    # publish's answer held back (at a message published, and again at a
    # publish command): each within the first quarter of the horizon, so
    # that the flow of a test of 10 messages reaches it.
    needs = ("wire", "nodes") if real else ("wire", "nsqd", "nodes")
    sizes, redelivering_kinds = [], set()
    for seed in range(300):
        schedule = draw_flow_schedule(random.Random(seed), needs=needs)  # type: ignore[arg-type]
        core = core_of(schedule)
        assert set(core) == {"lost on its way", "handled, FIN never read", "a late answer"}
        assert all(f.anchor.count <= 10 for f in core.values()), schedule
        late = core["a late answer"]
        assert late.direction == "out" and 2 <= late.again <= 10  # and after a first batch
        assert sum(f.redelivers for f in schedule) <= 3
        redelivering_kinds.add(core["handled, FIN never read"].kind)
        sizes.append(len(schedule))
    assert redelivering_kinds == ({"drop"} if real else {"drop", "time_out"})
    assert 3.6 < sum(sizes) / len(sizes) < 4.4  # the mean stays the rate (4)


def test_a_rate_below_the_classes_or_fewer_kinds_draw_fewer() -> None:
    for seed in range(100):
        assert not draw_flow_schedule(random.Random(seed), rate=0)
        few = draw_flow_schedule(random.Random(seed), rate=1)  # a Poisson count, mean 1
        first = few[: min(len(few), 3)]  # the classes' faults first
        assert set(core_of(first).values()) == set(first)
        stalls = draw_flow_schedule(random.Random(seed), kinds=["stall"], rate=1)
        assert len(stalls) == 1 and stalls[0].holds_answer and stalls[0].again >= 2
        only = draw_flow_schedule(random.Random(seed), kinds=["time_out"])
        assert {f.kind for f in only} <= {"time_out"}


def test_a_fault_says_where_it_strikes() -> None:
    fault = FlowFault(2, "drop", Anchor("fin", 12))
    assert fault.describe() == (
        "drop nsqd-0, the consumer's connection, at the 12th FIN (before nsqd reads it)"
    )
    stall = FlowFault(1, "stall", Anchor("published", 3), duration=0.25, direction="out")
    assert stall.describe() == (
        "stall nsqd-0, the producer's connection, at the publish of the 3rd message "
        "(before nsqd reads it) until a publish, 0.25 x msg_timeout at most "
        "direction=out"
    )
    assert stall.holds_answer
    assert stall.to_dict() == {
        "id": 1, "kind": "stall", "event": "published", "count": 3, "duration": 0.25,
        "direction": "out",
    }  # fmt: skip
    assert repr(fault) == (
        "FlowFault(id=2, kind='drop', anchor=Anchor(event='fin', count=12), node=0, "
        "lookupd=0, duration=0.0, seconds=0.0, direction='both', rounds=1, gap=0, "
        "withhold=False, again=0)"
    )
    assert not FlowFault(1, "stall", Anchor("fin", 3), duration=0.25).holds_answer
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 111)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "111th"
    ]  # fmt: skip
    with pytest.raises(ValueError, match="unknown fault 'meteor'"):
        FlowFault(1, "meteor", Anchor("fin", 1))
    with pytest.raises(ValueError, match="anchors count from 1"):
        FlowFault(1, "drop", Anchor("fin", 0))


def test_only_lists() -> None:
    assert parse_only("nsqd-0:2, nsqd-0:5,nsq_cluster:1") == {
        "nsqd-0": frozenset({2, 5}),
        "nsq_cluster": frozenset({1}),
    }
    assert parse_only("none") == {}
    assert format_only([("nsqd-0", 5), ("nsqd-0", 2), ("nsqd-0", 2)]) == "nsqd-0:2,nsqd-0:5"
    assert format_only([]) == "none"
    for bad in ("nsqd-0", "nsqd-0:x", ":3", "nsqd-0:0", ""):
        with pytest.raises(ValueError, match="--nsq-faults-only wants LABEL:N"):
            parse_only(bad)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    items=st.lists(st.integers(0, 30), min_size=1, max_size=12, unique=True),
    data=st.data(),
)
def test_ddmin_finds_a_one_minimal_failing_subset(items: list[int], data: st.DataObject) -> None:
    # The test "fails" when the subset holds all of a few culprits.
    culprits = set(data.draw(st.lists(st.sampled_from(items), min_size=1, max_size=3)))
    tried: list[list[int]] = []

    def fails(subset: list[int]) -> bool:
        tried.append(subset)
        return culprits <= set(subset)

    found = ddmin(items, fails)
    assert set(found) == culprits  # here, the one smallest failing subset
    assert len(tried) == len({tuple(t) for t in tried})  # none tried twice
