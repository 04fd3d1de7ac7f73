"""RDY decisions over many connections (sans-IO), against nsqd's semantics."""

from __future__ import annotations

from random import Random

from hypothesis import given, settings
from hypothesis import strategies as st

from trionsq import BackoffState
from trionsq.rdy import RdyController, starved


def bootstrapped(max_in_flight: int, names: list[str], max_rdy: int = 2500) -> RdyController[str]:
    rdy: RdyController[str] = RdyController(max_in_flight, low_rdy_idle_timeout=10.0)
    for name in names:
        rdy.add(name, max_rdy, 0.0)
        rdy.conns[name].bootstrapping = False
    rdy.rebalance(0.0)
    return rdy


def values(rdy: RdyController[str]) -> dict[str, int]:
    return {k: c.rdy for k, c in rdy.conns.items()}


def test_new_connection_starts_at_one_then_gets_its_share() -> None:
    rdy: RdyController[str] = RdyController(100, 10.0)
    rdy.add("a", 2500, 0.0)
    assert rdy.rebalance(0.0) == ["a"]
    assert values(rdy) == {"a": 1}
    rdy.on_message("a", 0.1)
    rdy.rebalance(0.1)
    assert values(rdy) == {"a": 100}


def test_even_distribution_with_remainder() -> None:
    rdy = bootstrapped(10, ["a", "b", "c"])
    assert values(rdy) == {"a": 4, "b": 3, "c": 3}
    assert rdy.total_rdy == 10


def test_max_rdy_count_is_respected() -> None:
    rdy = bootstrapped(100, ["a", "b"], max_rdy=20)
    assert values(rdy) == {"a": 20, "b": 20}


def test_new_connection_waits_for_budget_freed_by_settling() -> None:
    rdy = bootstrapped(4, ["a"])
    for _ in range(4):
        rdy.on_message("a", 1.0)
    rdy.add("b", 2500, 1.0)
    changed = rdy.rebalance(1.0)
    # a is lowered to its new share at once, but its 4 messages in flight still
    # count: b gets nothing yet.
    assert changed == ["a"]
    assert values(rdy) == {"a": 2, "b": 0}
    rdy.on_settled("a")
    rdy.rebalance(1.1)
    assert values(rdy) == {"a": 2, "b": 1}  # 3 in flight on a + 1: b starts at 1
    rdy.on_message("b", 1.2)
    rdy.rebalance(1.2)
    assert values(rdy) == {"a": 2, "b": 1}  # b's share must wait for a to drain
    rdy.on_settled("a")
    rdy.rebalance(1.3)
    assert values(rdy) == {"a": 2, "b": 2}


def test_an_unchanged_rdy_is_not_sent_again() -> None:
    """nsqd v1 takes RDY as a cap on messages in flight (it never counts it
    down), so however many messages come, an unchanged RDY is not re-sent
    (go-nsq's rule): nothing is due, in the steady state, on any read."""
    rdy = bootstrapped(8, ["a", "b"])
    for _ in range(3):
        assert not rdy.on_messages("a", 4, 1.0)
        assert not rdy.due
        assert rdy.rebalance(1.0) == []
        for _ in range(4):
            assert not rdy.on_settled("a")
    assert values(rdy) == {"a": 4, "b": 4}


def test_rotation_when_max_in_flight_below_connection_count() -> None:
    names = ["a", "b", "c"]
    rdy = bootstrapped(1, names)
    holders = []
    now = 0.0
    for _ in range(6):
        (holder,) = [k for k, v in values(rdy).items() if v]
        holders.append(holder)
        now += 10.0
        rdy.rebalance(now)
        assert rdy.total_rdy == 1
    assert set(holders) == set(names)  # everyone got a turn
    assert holders[:3] == ["a", "b", "c"]


def test_rotation_waits_for_in_flight_of_the_previous_holder() -> None:
    rdy = bootstrapped(1, ["a", "b"])
    rdy.on_message("a", 1.0)
    rdy.rebalance(20.0)
    assert values(rdy) == {"a": 0, "b": 0}  # a's message is still in flight
    rdy.on_settled("a")
    rdy.rebalance(20.1)
    assert values(rdy) == {"a": 0, "b": 1}


def test_backoff_modes() -> None:
    rdy = bootstrapped(6, ["a", "b", "c"])
    rdy.set_mode(BackoffState.PAUSED)
    rdy.rebalance(1.0)
    assert values(rdy) == {"a": 0, "b": 0, "c": 0}
    rdy.set_mode(BackoffState.TESTING)
    rdy.rebalance(2.0)
    assert sorted(values(rdy).values()) == [0, 0, 1]
    rdy.set_mode(BackoffState.NORMAL)
    rdy.rebalance(3.0)
    assert values(rdy) == {"a": 2, "b": 2, "c": 2}


def test_starved_follows_the_guide() -> None:
    # in flight against the last RDY sent: 85% or more (and something held)
    assert not starved(0, 5)
    assert not starved(4, 5)  # 4 < 0.85 x 5
    assert starved(5, 5)
    assert not starved(2124, 2500)
    assert starved(2125, 2500)
    # RDY 0 (backoff, rotation) with a message held: nothing more comes
    assert starved(1, 0)
    assert not starved(0, 0)


def test_zero_max_in_flight_pauses_everything() -> None:
    rdy = bootstrapped(4, ["a", "b"])
    rdy.set_max_in_flight(0)
    rdy.rebalance(1.0)
    assert rdy.total_rdy == 0


events = st.lists(
    st.tuples(
        st.sampled_from(["add", "remove", "message", "settle", "tick", "pause", "test", "resume"]),
        st.integers(0, 5),
    ),
    max_size=120,
)


@given(st.integers(1, 12), st.integers(1, 6), events)
def test_invariants_under_any_event_sequence(
    max_in_flight: int, max_rdy: int, script: list[tuple[str, int]]
) -> None:
    """Whatever happens, with nsqd delivering only below each connection's RDY:
    the RDY sum and the messages in flight never exceed max_in_flight, and no
    RDY exceeds max_rdy_count."""
    rdy: RdyController[int] = RdyController(max_in_flight, low_rdy_idle_timeout=5.0)
    now = 0.0
    for event, n in script:
        now += 1.0
        if event == "add" and n not in rdy.conns:
            rdy.add(n, max_rdy, now)
        elif event == "remove":
            rdy.remove(n)
        elif event == "message" and n in rdy.conns:
            conn = rdy.conns[n]
            if conn.in_flight < conn.rdy:  # nsqd's rule
                rdy.on_message(n, now)
        elif event == "settle":
            rdy.on_settled(n)
        elif event == "tick":
            now += 10.0
        elif event in ("pause", "test", "resume"):
            mode = {"pause": BackoffState.PAUSED, "test": BackoffState.TESTING}
            rdy.set_mode(mode.get(event, BackoffState.NORMAL))
        rdy.rebalance(now)
        assert rdy.total_rdy <= max_in_flight
        assert rdy.total_in_flight <= max_in_flight
        assert sum(c.committed for c in rdy.conns.values()) <= max_in_flight
        assert all(0 <= c.rdy <= max_rdy for c in rdy.conns.values())
        if rdy.mode is BackoffState.PAUSED:
            assert rdy.total_rdy == 0
        if rdy.mode is BackoffState.TESTING:
            assert rdy.total_rdy <= 1


@given(st.integers(1, 20), st.integers(1, 8))
def test_settled_normal_state_uses_the_whole_budget(max_in_flight: int, count: int) -> None:
    rdy = bootstrapped(max_in_flight, [str(i) for i in range(count)])
    if max_in_flight >= count:
        assert rdy.total_rdy == max_in_flight
        assert max(values(rdy).values()) - min(values(rdy).values()) <= 1
    else:
        assert rdy.total_rdy == max_in_flight


@given(st.integers(0, 12), st.integers(1, 6), events)
def test_not_due_means_rebalance_decides_nothing(
    max_in_flight: int, max_rdy: int, script: list[tuple[str, int]]
) -> None:
    """The consumer skips rebalancing when the events say it is not due: that
    must never skip a decision (the skip is exact, not a heuristic)."""
    rdy: RdyController[int] = RdyController(max_in_flight, low_rdy_idle_timeout=5.0)
    now = 0.0
    for event, n in script:
        now += 1.0
        due = None
        if event == "add" and n not in rdy.conns:
            rdy.add(n, max_rdy, now)
        elif event == "remove":
            rdy.remove(n)
        elif event == "message" and n in rdy.conns:
            conn = rdy.conns[n]
            if conn.in_flight < conn.rdy:
                due = rdy.on_message(n, now)
        elif event == "settle":
            due = rdy.on_settled(n)
        elif event == "tick":
            now += 10.0
        elif event in ("pause", "test", "resume"):
            mode = {"pause": BackoffState.PAUSED, "test": BackoffState.TESTING}
            rdy.set_mode(mode.get(event, BackoffState.NORMAL))
        if due is None:
            due = rdy.due
        changed = rdy.rebalance(now)
        if not due:
            assert changed == []


@settings(max_examples=30)
@given(st.integers(1, 60), st.integers(1, 2500), st.integers(0, 2**32))
def test_many_connections_joining_and_leaving_stay_within_max_in_flight(
    count: int, max_in_flight: int, seed: int
) -> None:
    """Up to 60 connections join one by one, each gets messages as nsqd would
    send them (up to its RDY), everything is settled, and they leave in any
    order: at every step the RDY and the messages in flight stay within
    max_in_flight."""
    random = Random(seed)
    rdy: RdyController[int] = RdyController(max_in_flight, low_rdy_idle_timeout=5.0)
    now = 0.0

    def check() -> None:
        assert sum(c.committed for c in rdy.conns.values()) <= max_in_flight
        assert rdy.total_rdy <= max_in_flight

    def deliver(key: int) -> None:
        conn = rdy.conns[key]
        room = conn.rdy - conn.in_flight
        if room > 0:
            rdy.on_messages(key, random.randint(1, room), now)

    for key in range(count):
        now += 0.001
        rdy.add(key, 2500, now)
        rdy.rebalance(now)
        check()
        deliver(random.randrange(key + 1))
        rdy.rebalance(now)
        check()
    for key in rdy.conns:  # everyone's first message, then everything settled
        deliver(key)
        rdy.rebalance(now)
        check()
    for key, conn in rdy.conns.items():
        for _ in range(conn.in_flight):
            rdy.on_settled(key)
    rdy.rebalance(now)
    check()
    assert rdy.total_rdy > 0
    leaving = list(rdy.conns)
    random.shuffle(leaving)
    for key in leaving:
        deliver(next(iter(rdy.conns)))
        rdy.remove(key)
        rdy.rebalance(now)
        check()
    assert rdy.conns == {}
