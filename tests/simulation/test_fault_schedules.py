"""Fault schedules, their player, lone nsqds restarted in place, the hypothesis
strategies and the at-least-once checker (fakensq.testing.schedule, faultplayer,
restartable, strategies, atleastonce)."""

from __future__ import annotations

import random
import statistics
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

import trionsq
from fakensq import NSQD
from fakensq.testing.atleastonce import (
    AtLeastOnceChecker,
    AtLeastOnceError,
    ClientEnv,
    check_at_least_once,
    run_at_least_once,
)
from fakensq.testing.faultplayer import FaultPlayer
from fakensq.testing.faults import Faults
from fakensq.testing.restartable import RestartableNSQD
from fakensq.testing.schedule import (
    KINDS,
    FaultEvent,
    FaultSchedule,
    draw_schedule,
    kinds_for,
    parse_kinds,
    parse_level,
    seed_for,
)
from fakensq.testing.simulation import SimCluster
from fakensq.testing.strategies import fault_events, fault_schedules

# -- schedules -----------------------------------------------------------------


def test_a_seed_draws_the_same_schedule() -> None:
    def draw(seed: int) -> FaultSchedule:
        return draw_schedule(random.Random(seed), rate=6, nsqd=2, lookupd=2)

    assert draw(1) == draw(1) != draw(2)
    assert [e.at for e in draw(1)] == sorted(e.at for e in draw(1))


def test_seed_for_is_stable_across_processes() -> None:
    # sha256-based, not hash(): the value is fixed for ever.
    assert seed_for(7, "test_x.py::test_y") == seed_for(7, "test_x.py::test_y")
    assert seed_for(7, "test_x.py::test_y") == 869520641542579084
    assert seed_for(7, "a") != seed_for(8, "a") != seed_for(7, "b")


def test_levels_budget_and_rate() -> None:
    rng = random.Random(0)
    counts = []
    for _ in range(400):
        schedule = draw_schedule(rng, rate=4, horizon=3.0, nsqd=3, lookupd=1)
        counts.append(len(schedule))
        assert schedule.redeliveries <= 3
        for event in schedule:
            assert event.kind in kinds_for("safe") and not event.everyone
            assert 0 <= event.at <= 3.0 and 0 <= event.node < 3
            assert event.level == "safe"
    assert 3.0 < statistics.mean(counts) < 4.5  # the redelivery budget trims a little
    lossy = [draw_schedule(rng, rate=8, level="lossy") for _ in range(100)]
    assert {e.kind for s in lossy for e in s} == set(KINDS)
    only = draw_schedule(rng, rate=20, kinds=["delay"], redeliveries=0)
    assert len(only) > 5 and {e.kind for e in only} == {"delay"}
    assert draw_schedule(rng, rate=20, kinds=["drop"], redeliveries=2).redeliveries == 2
    assert draw_schedule(rng, rate=0) == FaultSchedule()


def test_bad_names_and_values() -> None:
    with pytest.raises(ValueError, match="unknown fault level 'nasty'"):
        parse_level("nasty")
    with pytest.raises(ValueError, match="unknown fault 'meteor'"):
        parse_kinds(["drop", "meteor"])
    with pytest.raises(ValueError, match="unknown fault 'meteor'"):
        FaultEvent(1.0, "meteor")
    with pytest.raises(ValueError, match="negative"):
        FaultEvent(-1.0, "drop")


def test_schedules_round_trip_and_describe() -> None:
    schedule = FaultSchedule(
        (
            FaultEvent(2.5, "stall", 1, duration=3.0, direction="in"),
            FaultEvent(1.0, "requeue_storm", rounds=2, interval=0.5),
        )
    )
    assert [e.kind for e in schedule] == ["requeue_storm", "stall"]
    assert FaultSchedule.from_list(schedule.to_list()) == schedule
    assert schedule.to_list()[0] == {
        "at": 1.0,
        "kind": "requeue_storm",
        "rounds": 2,
        "interval": 0.5,
    }
    assert schedule.describe().splitlines() == [
        "   1.000s  requeue_storm nsqd-0 2 rounds 0.5s apart",
        "   2.500s  stall nsqd-1 direction=in for 3s",
    ]
    assert schedule.end == 5.5 and schedule.redeliveries == 2
    # The repr lists the fields as the constructor takes them (the shared
    # parameters of FaultParams come after the event's own positional ones).
    assert repr(schedule[1]) == (
        "FaultEvent(at=2.5, kind='stall', node=1, duration=3.0, seconds=0.0, "
        "direction='in', rounds=1, interval=0.0, everyone=False)"
    )
    # The parameters after node are keyword-only: a positional one fails loudly.
    with pytest.raises(TypeError, match="positional"):
        FaultEvent(1.0, "delay", 0, 2.0)  # type: ignore[call-arg]


# -- hypothesis strategies -------------------------------------------------------


@settings(max_examples=200)
@given(fault_schedules(nsqd=2, lookupd=1, horizon=60.0, redeliveries=2))
def test_strategy_schedules_keep_their_bounds(schedule: FaultSchedule) -> None:
    assert schedule.redeliveries <= 2 and len(schedule) <= 6
    for event in schedule:
        assert event.kind in kinds_for("safe")
        assert 0 <= event.at <= 60.0 and event.duration <= 15.0
        assert event.node < (1 if event.kind == "lookupd_outage" else 2)


@given(fault_events(level="harsh", kinds=["drop", "partition", "fail_publishes"], lookupd=0))
def test_strategy_events_of_chosen_kinds(event: FaultEvent) -> None:
    assert event.kind in ("drop", "partition", "fail_publishes")


def test_strategies_shrink_to_early_simple_faults() -> None:
    found = find(
        fault_schedules(nsqd=3),
        lambda s: any(e.kind == "restart" for e in s) and len(s) >= 2,
        settings=settings(database=None, max_examples=2000),
    )
    assert found == FaultSchedule((FaultEvent(0.0, "drop"), FaultEvent(0.0, "restart")))


# -- the player, on a simulated cluster -----------------------------------------


async def test_every_safe_fault_and_no_message_lost(
    autojump_clock: trio.testing.MockClock,
) -> None:
    schedule = FaultSchedule(
        (
            FaultEvent(10, "time_out"),
            FaultEvent(20, "drop", 1),
            FaultEvent(30, "delay", seconds=0.5, duration=10),
            FaultEvent(45, "stall", 1, duration=20, direction="out"),
            FaultEvent(70, "swallow_heartbeats", duration=40),
            FaultEvent(80, "lookupd_outage", duration=30),
            FaultEvent(120, "restart", 1),
            FaultEvent(150, "requeue_storm", rounds=2, interval=5),
        )
    )
    handled: list[bytes] = []

    async def billing(env: ClientEnv) -> None:
        async def handle(message: trionsq.Message) -> None:
            await trio.sleep(8)
            handled.append(message.body)

        options = env.trionsq_options()
        async with trionsq.Consumer(
            env.topic,
            env.channel,
            handler=handle,
            max_in_flight=4,
            lookupd_poll_interval=15,
            **options,
        ):
            await trio.sleep_forever()

    report = await run_at_least_once(
        schedule, {"billing": billing}, nsqd=2, messages=30, max_in_flight={"billing": 4}
    )
    assert report.ok, report.describe()
    assert set(handled) == {b"m%03d" % i for i in range(30)}
    outcomes = {m.event.kind: m.outcome for m in report.met}
    assert set(outcomes) == {e.kind for e in schedule}
    assert outcomes["restart"].startswith("stopped cleanly and started again")
    assert outcomes["lookupd_outage"] == "down 30s"
    assert any(d.attempts > 1 for d in report.checker.deliveries)  # redeliveries happened


async def test_a_safe_restart_waits_for_producers(autojump_clock: trio.testing.MockClock) -> None:
    async with SimCluster(seed=1) as cluster:
        schedule = FaultSchedule((FaultEvent(1, "restart"), FaultEvent(30, "restart")))
        player = FaultPlayer(schedule, cluster.faults, restart_wait=15)
        async with trio.open_nursery() as nursery:
            await nursery.start(player.run)
            async with trionsq.Producer(
                nsqd_tcp_addresses=cluster.nsqd_tcp_addresses, connector=cluster.connector
            ) as producer:
                for i in range(
                    40
                ):  # connected for 40 s, publishing each second (past 1+15 s, before 30+15 s)
                    await producer.publish("t", b"%d" % i)
                    await trio.sleep(1)
        first, second = sorted(player.met, key=lambda m: m.at)
        assert first.outcome == "skipped: a producer stayed connected for 15s"
        assert second.at == 30 and second.outcome.startswith("stopped cleanly and started again")
        assert "once no producer was connected" in second.outcome
        assert cluster.nsqd(0).get_topic("t").depth() == 40  # every publish acknowledged and kept


async def test_roles_spare_producers(autojump_clock: trio.testing.MockClock) -> None:
    async with SimCluster(seed=1) as cluster:
        async with (
            trionsq.Producer(
                nsqd_tcp_addresses=cluster.nsqd_tcp_addresses, connector=cluster.connector_for("p")
            ) as producer,
            trionsq.Consumer(
                "t",
                "c",
                nsqd_tcp_addresses=cluster.nsqd_tcp_addresses,
                connector=cluster.connector_for("c"),
            ) as consumer,
        ):
            await producer.publish("t", b"1")
            await (await consumer.__anext__()).finish()
            faults = cluster.faults
            assert [s.role for s in faults.connections()] == ["producer", "consumer"]
            stall = faults.stall(role="consumer")
            await producer.publish("t", b"2")  # not stalled
            assert cluster.nsqd(0).stats()["faults"][0]["role"] == "consumer"
            stall.heal()
            assert await faults.drop(role="consumer") == 1
            await producer.publish("t", b"3")  # its connection survived
            assert [s.role for s in faults.connections(role="producer")] == ["producer"]


# -- a lone nsqd restarted in place ------------------------------------------------


async def test_a_lone_nsqd_restarts_in_place(tmp_path: Path) -> None:
    nsqd = NSQD(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0", data_path=str(tmp_path))
    async with RestartableNSQD(nsqd, name="nsqd-3") as node:
        faults = Faults(node)
        faults.attach_nsqd(node.name, nsqd)
        address = nsqd.tcp_address
        async with trionsq.Producer(nsqd_tcp_addresses=[address]) as producer:
            await producer.multi_publish("t", [b"a", b"b"])
        nsqd.get_topic("t").get_channel("c")
        await faults.restart("nsqd-3")
        assert node.generation == 2 and nsqd.tcp_address == address
        assert nsqd.get_topic("t").channels["c"].depth() == 2  # kept
        async with trionsq.Producer(nsqd_tcp_addresses=[address]) as producer:
            await producer.publish("t", b"c")  # the same port serves again
        await faults.restart("nsqd-3", kill=True)
        # As with kill -9: a and b, on disk since the clean stop, are kept; c,
        # in memory, is lost.
        assert nsqd.get_topic("t").channels["c"].depth() == 2
        with pytest.raises(ValueError, match="no node 'nsqd-0'"):
            await faults.stop("nsqd-0")


# -- the at-least-once checker ---------------------------------------------------------


def frame(t: float, node: str, peer: str, **fields: Any) -> dict[str, Any]:
    return {"t": t, "event": "frame", "node": node, "peer": peer, **fields}


def message(t: float, peer: str, msg_id: str, attempts: int = 1, body: str = "x") -> dict[str, Any]:
    return frame(
        t, "nsqd-0", peer, dir="out", frame="message", id=msg_id, attempts=attempts, body=body
    )


def command(t: float, peer: str, cmd: str, **extra: Any) -> dict[str, Any]:
    return frame(t, "nsqd-0", peer, dir="in", cmd=cmd, **extra)


def test_checker_sees_an_early_redelivery_and_a_late_one_is_fine() -> None:
    checker = AtLeastOnceChecker(msg_timeout=60)
    checker.feed(
        [
            {"t": 0, "event": "published", "node": "nsqd-0", "body": "x"},
            message(1, "a:1", "id1"),
            message(30, "b:2", "id1", attempts=2),  # in flight at a:1 until 61
        ]
    )
    assert checker.violations == [
        "30.000s nsqd-0: 'x' handed to b:2 while in flight at a:1 until 61.000s (since 1.000s)"
    ]
    late = AtLeastOnceChecker(msg_timeout=60)
    late.feed(
        [message(1, "a:1", "id1"), command(50, "a:1", "TOUCH id1"), message(100, "b:2", "id1", 2)]
    )
    assert late.violations == [
        "100.000s nsqd-0: 'x' handed to b:2 while in flight at a:1 until 110.000s (since 1.000s)"
    ]
    fine = AtLeastOnceChecker(msg_timeout=60)
    fine.feed(
        [
            command(0, "a:1", "IDENTIFY", msg_timeout=5000),
            message(1, "a:1", "id1"),
            message(6.1, "b:2", "id1", attempts=2),  # a:1 asked for 5 s
            {
                "t": 7,
                "event": "time_out_in_flight",
                "node": "nsqd-0",
                "messages": [["nsqd-0", "id1", 2]],
            },
            message(7, "a:1", "id1", attempts=3),
            command(8, "a:1", "FIN id1"),
        ]
    )
    assert fine.violations == [] and fine.finished == {"x"}


def test_checker_counts_only_fins_that_held() -> None:
    checker = AtLeastOnceChecker(msg_timeout=60)
    checker.feed(
        [
            {"t": 0, "event": "published", "node": "nsqd-0", "body": "x"},
            {"t": 0, "event": "published", "node": "nsqd-0", "body": "y"},
            message(1, "a:1", "id1", body="x"),
            message(1, "a:1", "id2", body="y"),
            command(2, "a:1", "FIN id1"),
            command(70, "a:1", "FIN id2"),  # too late: refused
            frame(
                70,
                "nsqd-0",
                "a:1",
                dir="out",
                frame="error",
                data="E_FIN_FAILED FIN id2 failed ID not in flight",
            ),
        ]
    )
    assert checker.finished == {"x"} and checker.unfinished() == ["y"]
    checker.feed(checker_events_kill := [])  # nothing new: nothing changes
    assert checker_events_kill == []


def test_checker_rdy_over_max_in_flight_and_kills() -> None:
    checker = AtLeastOnceChecker(max_in_flight={"c": 3})
    events = [
        {"t": 0, "event": "connect", "node": "nsqd-0", "peer": "c:1"},
        {"t": 0, "event": "connect", "node": "nsqd-1", "peer": "c:2"},
        frame(1, "nsqd-0", "c:1", dir="in", cmd="RDY 2"),
        frame(1, "nsqd-1", "c:2", dir="in", cmd="RDY 1"),
        {"t": 2, "event": "eof", "node": "nsqd-1", "peer": "c:2"},
        frame(3, "nsqd-0", "c:1", dir="in", cmd="RDY 3"),  # fine: c:2 is gone
        {"t": 4, "event": "connect", "node": "nsqd-1", "peer": "c:3"},
        frame(4, "nsqd-1", "c:3", dir="in", cmd="RDY 1"),  # 3 + 1 > 3
        {"t": 5, "event": "published", "node": "nsqd-1", "body": "z"},
        {"t": 6, "event": "kill", "node": "nsqd-1"},
    ]
    checker.feed(events)
    assert checker.violations == ["4.000s c: RDY 4 over its connections > max_in_flight 3"]
    assert checker.unfinished() == [] and checker.unfinished(allow_lost=False) == ["z"]


# -- check_at_least_once: a user's consumer under faults ------------------------------


def consumer_adding_to(totals: list[int], *, dedupe: bool) -> Any:
    async def billing(env: ClientEnv) -> None:
        seen: set[bytes] = set()

        async def handle(message: trionsq.Message) -> None:
            await trio.sleep(4)
            if dedupe and message.body in seen:
                return
            seen.add(message.body)
            totals[0] += int(message.body[1:])

        async with trionsq.Consumer(
            env.topic, env.channel, handler=handle, max_in_flight=3, **env.trionsq_options()
        ):
            await trio.sleep_forever()

    return billing


def test_the_helper_finds_a_double_count_and_shrinks_it() -> None:
    failures: list[FaultSchedule] = []
    # Few messages and the kinds that redeliver or hold frames: each example is
    # a whole simulated run (about 0.3 s of CPU).
    run = {"nsqd": 2, "messages": 8, "publish_over": 4.0, "max_in_flight": {"billing": 3}}

    @settings(
        max_examples=25,
        deadline=None,
        database=None,
        phases=[Phase.generate, Phase.shrink],  # no "explain": it reruns the examples
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
    )
    @given(fault_schedules(nsqd=2, horizon=30.0, max_faults=4, kinds=["drop", "time_out", "delay"]))
    def check(schedule: FaultSchedule) -> None:
        totals = [0]
        check_at_least_once(schedule, {"billing": consumer_adding_to(totals, dedupe=False)}, **run)
        if totals[0] != sum(range(8)):
            failures.append(schedule)
            raise AssertionError(f"total {totals[0]}")

    with pytest.raises(AssertionError, match="total"):
        check()
    shrunk = failures[-1]
    assert len(shrunk) == 1 and shrunk[0].redelivers == 1, shrunk
    # The fixed consumer passes under the same schedule, and it replays.
    totals = [0]
    check_at_least_once(shrunk, {"billing": consumer_adding_to(totals, dedupe=True)}, **run)
    assert totals[0] == sum(range(8))


def test_the_helper_reports_unfinished_messages() -> None:
    async def forgetful(env: ClientEnv) -> None:
        options = env.trionsq_options()
        async with trionsq.Consumer(env.topic, env.channel, max_attempts=0, **options) as consumer:
            async for message in consumer:
                if message.body != b"m007":  # the bug: m007 is never answered
                    await message.finish()

    with pytest.raises(AtLeastOnceError) as info:
        check_at_least_once(FaultSchedule(), {"c": forgetful}, messages=10, deadline=600)
    text = str(info.value)
    assert "never finished (1 of 10): 'm007'" in text
    assert "FaultSchedule.from_list([])" in text


@settings(max_examples=3, deadline=None)
@given(st.integers(0, 2))
def test_the_helper_is_deterministic(seed: int) -> None:
    runs = []
    for _ in range(2):
        totals = [0]
        schedule = FaultSchedule((FaultEvent(5, "time_out"), FaultEvent(9, "drop")))
        report = check_at_least_once(
            schedule,
            {"b": consumer_adding_to(totals, dedupe=True)},
            seed=seed,
            max_in_flight={"b": 3},
        )
        runs.append((report.trace, report.finished_at))
    assert runs[0] == runs[1]
