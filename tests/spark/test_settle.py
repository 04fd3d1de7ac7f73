"""When planning says "no batch": only once every agent has settled.

A ``Trigger.AvailableNow`` query ends on the first "no batch", so a quiet spell
that only means "the FINs of the last batch have not reached nsqd yet, nor its
refill the agents" (a loaded machine) must not count.  On virtual time.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.testing

from trionsq.consumer import ConnectionStats
from trionsq.spark import _framing as framing
from trionsq.spark import coordinator as coordinator_module
from trionsq.spark._executor import ExecutorIdentity
from trionsq.spark._link import Link
from trionsq.spark._options import parse_source_options
from trionsq.spark._secure import QueryKeys
from trionsq.spark.agent import COORDINATOR_LIMITS, Agent, QueryRun
from trionsq.spark.coordinator import LINK_LIMITS, RESOLVE_CHUNK, AgentInfo, Coordinator

OPTIONS = parse_source_options(
    {
        "topic": "events",
        "channel": "spark",
        "nsqd_tcp_addresses": "127.0.0.1:4150",
        "max_batch_wait": "0.5",
    }
)


def linked_agent(coordinator: Coordinator) -> AgentInfo:
    stream, _ = trio.testing.memory_stream_pair()
    link = Link(stream, LINK_LIMITS)
    agent = AgentInfo("a#1", "0", "127.0.0.1", 1, ("127.0.0.1", 1), link, slots=1)
    coordinator.agents[agent.id] = agent
    return agent


async def test_no_batch_waits_for_every_agent_to_settle(autojump_clock: Any) -> None:
    coordinator = Coordinator(OPTIONS)
    agent = linked_agent(coordinator)
    answers: list[tuple[float, int]] = []
    async with trio.open_nursery() as nursery:

        async def plan() -> None:
            end = await coordinator.latest(0, None)
            answers.append((trio.current_time(), end))

        began = trio.current_time()
        nursery.start_soon(plan)
        await trio.sleep(5)
        assert answers == []  # nothing held, but the agent has not settled
        header = {"op": "status", "buffered": 0, "slots": 1, "settled": True}
        coordinator._dispatch(agent, header, nursery)
    assert answers == [(began + 5, 0)]  # no batch, once it has


async def test_messages_arriving_before_the_agent_settles_make_a_batch(
    autojump_clock: Any,
) -> None:
    coordinator = Coordinator(OPTIONS)
    agent = linked_agent(coordinator)
    async with trio.open_nursery() as nursery:
        answers: list[int] = []

        async def plan() -> None:
            answers.append(await coordinator.latest(0, None))

        nursery.start_soon(plan)
        await trio.sleep(2)  # the FINs' refill comes late
        coordinator._dispatch(agent, {"op": "status", "buffered": 7, "slots": 1}, nursery)
    assert answers == [1]


async def test_an_agent_settles_a_quiet_spell_after_its_last_fins(autojump_clock: Any) -> None:
    identity = ExecutorIdentity("0", "127.0.0.1", 1, 1)
    keys = QueryKeys("token", "cert", "key")  # never loaded: no connection is made
    run = QueryRun(Agent(identity, "unused", None), keys, ("127.0.0.1", 1), OPTIONS)
    assert run.settled()  # never did anything
    await run._resolve({"op": "resolve", "fin": [], "req": []})
    assert not run.settled()
    await trio.sleep(0.4)
    assert not run.settled()
    await trio.sleep(0.2)
    assert run.settled()


def test_a_full_resolve_frame_is_within_the_agents_limit() -> None:
    biggest = {"op": "resolve", "fin": [2**62] * RESOLVE_CHUNK, "req": [2**62] * RESOLVE_CHUNK}
    head, _ = framing.encode({**biggest, "id": 2**62})
    assert len(head) < COORDINATOR_LIMITS.header


async def test_a_big_commit_reaches_an_agent_in_several_frames(
    autojump_clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """However many sets a commit FINs, they go in frames of RESOLVE_CHUNK ids."""
    monkeypatch.setattr(coordinator_module, "RESOLVE_CHUNK", 100)
    coordinator = Coordinator(OPTIONS)
    ours, theirs = trio.testing.memory_stream_pair()
    agent = AgentInfo("a#1", "0", "127.0.0.1", 1, ("127.0.0.1", 1), Link(ours, LINK_LIMITS))
    coordinator.agents[agent.id] = agent
    coordinator.ledger.agent_joined(agent.id)
    sets = []
    for partition in range(250):
        decision = coordinator.ledger.start_read(1, partition, 1, 0, partition, agent.id)
        coordinator.ledger.set_ready(decision.set_id, 1)
        sets.append(decision.set_id)
    fined: list[int] = []

    async def the_agent() -> None:
        # What an agent reads its coordinator with, and answers.
        receive = framing.FrameReceiver(theirs, COORDINATOR_LIMITS)
        while len(fined) < len(sets):
            header, _ = await receive()
            assert len(header["fin"]) <= 100
            fined.extend(header["fin"])
            await framing.send(theirs, {"re": header["id"], "finished": len(header["fin"])})

    async def the_coordinators_reader() -> None:
        while True:
            agent.link.deliver((await agent.link.receive())[0])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(the_agent)
        nursery.start_soon(the_coordinators_reader)
        await coordinator.commit(1)
        nursery.cancel_scope.cancel()
    assert sorted(fined) == sorted(sets)
    assert coordinator.stats.finished == 250


async def test_an_agent_says_it_settled_the_moment_it_does(autojump_clock: Any) -> None:
    """Not at the next poll after it: the end of an AvailableNow query waits for
    this word (the status loop polled every max_batch_wait / 4, which added up
    to 0.125 s to every such query's end)."""
    identity = ExecutorIdentity("0", "127.0.0.1", 1, 1)
    keys = QueryKeys("token", "cert", "key")  # never loaded: no connection is made
    run = QueryRun(Agent(identity, "unused", None), keys, ("127.0.0.1", 1), OPTIONS)
    ours, theirs = trio.testing.memory_stream_pair()
    statuses: list[tuple[float, bool]] = []

    async def the_coordinator() -> None:
        receive = framing.FrameReceiver(theirs, LINK_LIMITS)
        while True:
            header, _ = await receive()
            statuses.append((trio.current_time(), header["settled"]))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(the_coordinator)
        nursery.start_soon(run._status_loop, Link(ours, COORDINATOR_LIMITS))
        await trio.sleep(0.01)  # off the poll's grid
        fins_out = trio.current_time()
        await run._resolve({"op": "resolve", "fin": [], "req": []})
        await trio.sleep(2)
        nursery.cancel_scope.cancel()
    after = [(at, settled) for at, settled in statuses if at > fins_out]
    assert after[0][1] is False
    first_settled = next(at for at, settled in after if settled)
    assert first_settled == pytest.approx(fins_out + OPTIONS.max_batch_wait, abs=1e-6)


class _Slot:
    """What settling reads of a slot: its buffer, times, and its consumers'
    connections (RDY and messages in flight)."""

    def __init__(self, in_flight: int, rdy: int) -> None:
        self.buffer: list[object] = []
        self.busy = False
        self.last_arrival = self.started_at = trio.current_time()
        self.budget_raised = -math.inf
        connection = ConnectionStats("127.0.0.1:4150", rdy, in_flight, 2500)
        stats = SimpleNamespace(connections={connection.address: connection})
        self.consumers = [SimpleNamespace(stats=stats)]


def _run_with(slot: _Slot) -> QueryRun:
    identity = ExecutorIdentity("0", "127.0.0.1", 1, 1)
    keys = QueryKeys("token", "cert", "key")  # never loaded: no connection is made
    run = QueryRun(Agent(identity, "unused", None), keys, ("127.0.0.1", 1), OPTIONS)
    run.slots = [slot]  # type: ignore[list-item]
    return run


async def _resolve_in(run: QueryRun, header: dict[str, Any]) -> None:
    async with trio.open_nursery() as nursery:
        run._nursery = nursery
        await run._resolve(header)


async def test_fins_that_free_no_room_do_not_restart_the_quiet_spell(autojump_clock: Any) -> None:
    """Every connection had room since the last arrival: nsqd could send all
    along, so its silence since then counts (the end of an AvailableNow query
    no longer waits max_batch_wait after the last batch's FINs)."""
    run = _run_with(_Slot(in_flight=1200, rdy=2500))
    arrival = trio.current_time()
    await trio.sleep(0.3)
    await _resolve_in(run, {"op": "resolve", "fin": [], "req": []})
    assert run.settles_at() == pytest.approx(arrival + OPTIONS.max_batch_wait)
    await trio.sleep(0.2)
    assert run.settled()


async def test_fins_that_free_room_start_the_quiet_spell(autojump_clock: Any) -> None:
    """A connection held its whole RDY count: nsqd may have more for it, sent
    once the FINs reach it, so the quiet spell counts from the FINs."""
    run = _run_with(_Slot(in_flight=2500, rdy=2500))
    await trio.sleep(0.3)
    fins = trio.current_time()
    await _resolve_in(run, {"op": "resolve", "fin": [], "req": []})
    assert not run.settled()
    assert run.settles_at() == pytest.approx(fins + OPTIONS.max_batch_wait)


async def test_requeues_always_start_the_quiet_spell(autojump_clock: Any) -> None:
    """REQ gives nsqd messages to send again: wait for them whatever the room."""
    run = _run_with(_Slot(in_flight=10, rdy=2500))
    await trio.sleep(0.3)
    requeued = trio.current_time()
    await _resolve_in(run, {"op": "resolve", "fin": [], "req": [12345]})
    assert run.settles_at() == pytest.approx(requeued + OPTIONS.max_batch_wait)


async def test_an_nsqd_without_a_connection_counts_as_waiting(autojump_clock: Any) -> None:
    """A configured nsqd with no connection up may hold anything: FINs count."""
    run = _run_with(_Slot(in_flight=0, rdy=2500))
    connection = ConnectionStats("127.0.0.1:4151", 2500, 0, 2500)
    slot = run.slots[0]
    slot.consumers[0].stats.connections = {connection.address: connection}  # type: ignore[attr-defined]
    assert run.nsqd_may_wait()  # 127.0.0.1:4150, the option's, is not connected


async def test_available_now_ends_as_soon_as_every_agent_has_settled(
    autojump_clock: Any,
) -> None:
    """A query that goes on waits max_batch_wait for messages before "no batch"
    (an idle channel is not polled in a busy loop); AvailableNow's last "no
    batch" ends the query, and comes as soon as every agent has settled."""
    coordinator = Coordinator(OPTIONS)
    agent = linked_agent(coordinator)
    agent.settled = True
    began = trio.current_time()
    assert await coordinator.latest(0, None, ending=True) == 0
    assert trio.current_time() == began
    assert await coordinator.latest(0, None) == 0
    assert trio.current_time() == pytest.approx(began + OPTIONS.max_batch_wait)
