"""Time on the TCP side: heartbeats, the read deadline, message timeouts and
redelivery, REQ with a delay, DPUB, TOUCH; compared between fakensq and nsqd.

Nothing here sleeps to wait for nsqd: each scenario waits for frames (a
heartbeat, a redelivered message, the connection closing) under
``trio.fail_after``, with small intervals (IDENTIFY's heartbeat_interval and
msg_timeout, ``--msg-timeout``, ``--max-req-timeout``...).  Where time itself is
the point (a TOUCH keeps a message alive), the scenario paces its commands and
reports only coarse facts (redelivered or not), far from the edges.

nsqd acts on timeouts in its queue scan (every 100 ms), which lists channels
only every 5 s from its start: a fresh channel's first timeout waits for that
refresh.  Scenarios that need timers at their own pace first wait for it
(:func:`warm_up`); the slow ones run on both daemons at once (``parallel``).
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from trionsq.protocol import commands as cmds

from ..support.waiting import poll_until
from .conftest import Conformance, Target
from .session import Session
from .tcp import node_state


async def consumer(
    t: Target, *, rdy: int = 1, topic: str = "t", channel: str = "ch", **identify: Any
) -> Session:
    c = await t.connect()
    await c.identify(feature_negotiation=True, **identify)
    await c.sub(topic, channel, rdy=rdy)
    return c


async def publish(t: Target, *commands: bytes) -> None:
    p = await t.connect("p")
    for command in commands:
        await p.call(command)
    await p.close()


async def warm_up(t: Target, c: Session) -> None:
    """Wait until nsqd's queue scan knows ``c``'s channel (its first refresh):
    a message left unfinished comes back then; it is finished."""
    await publish(t, cmds.pub("t", b"warm-up"))
    await c.read_messages(2)
    await c.send(cmds.fin(c.messages[-1].id))
    await c.sync()


# --- heartbeats and the read deadline -----------------------------------------


async def test_heartbeats_come_every_interval(conformance: Conformance) -> None:
    async def scenario(t: Target) -> None:
        c = await t.connect()
        await c.identify(feature_negotiation=True, heartbeat_interval=1000)
        for _ in range(3):
            await c.read(1)  # a heartbeat
            await c.send(cmds.nop())  # answered: the connection stays
        await c.sync()

    transcript = await conformance.nsqd(scenario, parallel=True)
    assert [e[1] for e in transcript] == ["json", "heartbeat", "heartbeat", "heartbeat", "sync"]


async def test_a_silent_client_is_closed_after_two_intervals(conformance: Conformance) -> None:
    async def scenario(t: Target) -> Any:
        c = await t.connect()
        await c.identify(feature_negotiation=True, heartbeat_interval=1000)
        start = trio.current_time()
        await c.read_until_closed(heartbeats=False)
        elapsed = trio.current_time() - start
        return 1.5 < elapsed < 6.0  # nsqd's read deadline: 2 heartbeat intervals

    _, in_time = await conformance.nsqd(scenario, parallel=True)
    assert in_time is True


async def test_a_subscribed_silent_client_is_closed(conformance: Conformance) -> None:
    # A consumer that never answers heartbeats is dropped; its message stays in flight.
    async def scenario(t: Target) -> Any:
        c = await consumer(t, heartbeat_interval=1000)
        await publish(t, cmds.pub("t", b"held"))
        await c.read_messages(1)
        await c.read_until_closed(heartbeats=False)
        return await node_state(t)

    await conformance.nsqd(scenario, parallel=True)


async def test_heartbeats_disabled_no_read_deadline(conformance: Conformance) -> None:
    # heartbeat_interval -1: no heartbeats and no read deadline (but no SUB either).
    async def scenario(t: Target) -> None:
        c = await t.connect()
        await c.identify(feature_negotiation=True, heartbeat_interval=-1)
        await c.call(cmds.pub("t", b"x"))
        await c.send(cmds.sub("t", "ch"))
        await c.read_until_closed()

    await conformance.nsqd(scenario, parallel=True)


async def test_heartbeats_keep_flowing_while_messages_do(conformance: Conformance) -> None:
    async def scenario(t: Target) -> Any:
        c = await consumer(t, heartbeat_interval=1000, rdy=10)
        await publish(t, cmds.mpub("t", [b"a", b"b", b"c"]))
        messages = await c.read_messages(3)
        for msg in messages:
            await c.send(cmds.fin(msg.id))
        # Heartbeats only: a heartbeat, answered, then another.
        heartbeats = await c.read(1)
        await c.send(cmds.nop())
        heartbeats += await c.read(1)
        return sorted(m.body for m in messages), heartbeats

    await conformance.nsqd(scenario, parallel=True)


# --- message timeouts ---------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "identify"),
    [
        (["--msg-timeout=1s"], {}),
        (["--msg-timeout=500ms"], {}),
        ([], {"msg_timeout": 1000}),
        (["--msg-timeout=10s"], {"msg_timeout": 1000}),
    ],
    ids=["flag-1s", "flag-500ms", "identify-1000", "identify-wins"],
)
async def test_an_unfinished_message_times_out_and_comes_back(
    conformance: Conformance, flags: list[str], identify: dict[str, Any]
) -> None:
    async def scenario(t: Target) -> Any:
        c = await consumer(t, **identify)
        await publish(t, cmds.pub("t", b"slow"))
        first = await c.read_messages(1)
        again = await c.read_messages(1)  # attempts 2, the same id
        await c.send(cmds.fin(first[0].id))  # the id is in flight again: FIN works
        await c.sync()
        return await node_state(t), again[0].id == first[0].id

    _, (_, same_id) = await conformance.nsqd(scenario, *flags, parallel=True)
    assert same_id is True


async def test_a_timed_out_message_cannot_be_finished(conformance: Conformance) -> None:
    # RDY 1, then RDY 0 after the delivery: the timed-out message is not
    # redelivered, so its FIN fails (nsqd no longer holds it in flight).
    async def scenario(t: Target) -> Any:
        c = await consumer(t, msg_timeout=1000)
        await publish(t, cmds.pub("t", b"late"))
        (msg,) = await c.read_messages(1)
        await c.send(cmds.rdy(0))
        await t.until(
            "/stats?format=json",
            lambda r: any(
                ch["timeout_count"] for tp in r.json()["topics"] for ch in tp["channels"]
            ),
        )
        await c.send(cmds.fin(msg.id), cmds.req(msg.id, 0), cmds.touch(msg.id))
        await c.sync()
        return await node_state(t)

    await conformance.nsqd(scenario, parallel=True)


async def test_timeouts_go_to_another_consumer(conformance: Conformance) -> None:
    async def scenario(t: Target) -> Any:
        a = await consumer(t, msg_timeout=1000)
        await publish(t, cmds.pub("t", b"only"))
        await a.read_messages(1)
        await a.send(cmds.rdy(0))
        b = await t.connect("b")
        await b.identify(feature_negotiation=True)
        await b.sub("t", "ch", rdy=1)
        (again,) = await b.read_messages(1)  # after a's msg_timeout
        await a.sync()
        await b.send(cmds.fin(again.id))
        await b.sync()
        return await node_state(t)

    await conformance.nsqd(scenario, parallel=True)


async def test_a_disconnected_consumer_s_message_times_out(conformance: Conformance) -> None:
    # nsqd leaves it in flight until msg_timeout, counts a timeout, then requeues.
    async def scenario(t: Target) -> Any:
        a = await consumer(t, msg_timeout=1000)
        await publish(t, cmds.mpub("t", [b"one", b"two"]))
        await a.read_messages(1)
        await a.close()
        before = await node_state(t)
        b = await t.connect("b")
        await b.identify(feature_negotiation=True)
        await b.sub("t", "ch", rdy=2)
        got = await b.read_messages(2)
        for msg in got:
            await b.send(cmds.fin(msg.id))
        await b.sync()
        return before, await node_state(t)

    await conformance.nsqd(scenario, parallel=True)


# --- REQ with a delay, DPUB -----------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "delay"),
    [([], 500), ([], 1000), (["--max-req-timeout=1s"], 5000), (["--max-req-timeout=1s"], 1000)],
    ids=["500ms", "1s", "clamped-to-max", "at-max"],
)
async def test_req_with_a_delay_defers(
    conformance: Conformance, flags: list[str], delay: int
) -> None:
    async def scenario(t: Target) -> Any:
        c = await consumer(t)
        await publish(t, cmds.pub("t", b"later"))
        (msg,) = await c.read_messages(1)
        await c.send(cmds.req(msg.id, delay))
        await c.sync()
        deferred = await node_state(t)
        (again,) = await c.read_messages(1)
        await c.send(cmds.fin(again.id))
        await c.sync()
        return deferred, await node_state(t)

    await conformance.nsqd(scenario, *flags, parallel=True)


async def test_req_zero_and_delayed_keep_their_order(conformance: Conformance) -> None:
    async def scenario(t: Target) -> Any:
        c = await consumer(t, rdy=3)
        await publish(t, cmds.mpub("t", [b"a", b"b", b"c"]))
        got = await c.read_messages(3)
        by_body = {m.body: m.id for m in got}
        await c.send(cmds.rdy(0))
        await c.send(cmds.req(by_body[b"a"], 700), cmds.req(by_body[b"b"], 0))
        await c.send(cmds.fin(by_body[b"c"]))
        await c.sync()
        state = await node_state(t)
        await c.send(cmds.rdy(1))
        first = await c.read_messages(1)  # b at once
        await c.send(cmds.fin(first[0].id))
        second = await c.read_messages(1)  # a after its delay
        await c.send(cmds.fin(second[0].id))
        await c.sync()
        return state, [first[0].body, second[0].body], await node_state(t)

    await conformance.nsqd(scenario, parallel=True)


@pytest.mark.parametrize("delay", [0, 300, 1000])
async def test_dpub_delivers_after_its_delay(conformance: Conformance, delay: int) -> None:
    async def scenario(t: Target) -> Any:
        c = await consumer(t)
        await publish(t, cmds.dpub("t", delay, b"deferred"))
        # (DPUB's OK comes before nsqd's topic pump hands the message to the
        # channel: beside two CPU burners the real nsqd's channel was seen
        # without it yet. Wait until it is there, within its delay.)
        state = (
            await poll_until(
                lambda: node_state(t),
                lambda state: state[0]["channels"][0]["deferred"] == 1,
                "the deferred message in the channel",
            )
            if delay >= 1000
            else None
        )
        (msg,) = await c.read_messages(1)
        await c.send(cmds.fin(msg.id))
        await c.sync()
        return state, await node_state(t)

    await conformance.nsqd(scenario, parallel=True)


async def test_dpub_before_any_channel(conformance: Conformance) -> None:
    # Published to a topic without channels, the deferred message waits in the
    # topic; a channel made later gets it, deferred from then on.
    async def scenario(t: Target) -> Any:
        await publish(t, cmds.dpub("t", 800, b"waits"), cmds.pub("t", b"now"))
        before = await node_state(t)
        c = await consumer(t, rdy=2)
        got = await c.read_messages(2)
        for msg in got:
            await c.send(cmds.fin(msg.id))
        await c.sync()
        return before, [m.body for m in got], await node_state(t)

    await conformance.nsqd(scenario, parallel=True)


async def test_dpub_to_two_channels(conformance: Conformance) -> None:
    async def scenario(t: Target) -> Any:
        a = await consumer(t, channel="a")
        b = await t.connect("b")
        await b.identify(feature_negotiation=True)
        await b.sub("t", "b", rdy=1)
        await publish(t, cmds.dpub("t", 500, b"both"))
        state = await poll_until(  # (in both channels once the topic pump ran: see above)
            lambda: node_state(t),
            lambda state: all(ch["deferred"] == 1 for ch in state[0]["channels"]),
            "the deferred message in both channels",
        )
        (ma,) = await a.read_messages(1)
        (mb,) = await b.read_messages(1)
        return state, ma.id == mb.id

    await conformance.nsqd(scenario, parallel=True)


# --- TOUCH ----------------------------------------------------------------------


async def test_touch_keeps_a_message_in_flight(conformance: Conformance) -> None:
    # msg_timeout 1 s, a TOUCH every 0.25 s for 2.5 s: never redelivered.
    async def scenario(t: Target) -> Any:
        c = await consumer(t, msg_timeout=1000)
        await warm_up(t, c)
        await publish(t, cmds.pub("t", b"kept"))
        (msg,) = await c.read_messages(1)
        for _ in range(10):
            await c.send(cmds.touch(msg.id))
            await trio.sleep(0.25)  # pacing the client's own TOUCHes
        await c.send(cmds.fin(msg.id))
        await c.sync()
        return await node_state(t)

    await conformance.nsqd(scenario, parallel=True)


async def test_touch_cannot_pass_max_msg_timeout(conformance: Conformance) -> None:
    # --max-msg-timeout=2s: TOUCHes every 0.25 s keep it only so long.
    async def scenario(t: Target) -> Any:
        c = await consumer(t, msg_timeout=1000)
        await warm_up(t, c)
        await publish(t, cmds.pub("t", b"bounded"))
        (msg,) = await c.read_messages(1)
        start = trio.current_time()
        with trio.fail_after(10):
            while len(c.messages) < 4:
                await c.send(cmds.touch(msg.id))
                await c.sync()
                await trio.sleep(0.25)  # pacing the client's own TOUCHes
        elapsed = trio.current_time() - start
        del c.transcript[:]  # how many TOUCHes it took depends on the machine
        return [m.attempts for m in c.messages], 1.7 < elapsed < 3.5

    _, (attempts, in_time) = await conformance.nsqd(scenario, "--max-msg-timeout=2s", parallel=True)
    assert attempts == [1, 2, 1, 2] and in_time is True


async def test_a_fresh_channel_s_timeouts_wait_for_the_scan(conformance: Conformance) -> None:
    # A channel made right after the start is first scanned at the refresh 5 s
    # after the start: a 1 s msg_timeout then takes about 5 s.
    async def scenario(t: Target) -> Any:
        c = await consumer(t, msg_timeout=1000)
        await publish(t, cmds.pub("t", b"x"))
        await c.read_messages(1)
        start = trio.current_time()
        await c.read_messages(1)
        late = trio.current_time() - start > 3.0
        # From then on the scan knows the channel: a timeout takes about 1 s.
        start = trio.current_time()
        await c.read_messages(1)
        prompt = trio.current_time() - start < 2.5
        return late, prompt

    _, (late, prompt) = await conformance.nsqd(scenario, parallel=True)
    assert (late, prompt) == (True, True)


async def test_req_delay_after_the_scan_knows_the_channel(conformance: Conformance) -> None:
    async def scenario(t: Target) -> Any:
        c = await consumer(t, msg_timeout=1000)
        await warm_up(t, c)
        await publish(t, cmds.pub("t", b"again"))
        (msg,) = await c.read_messages(1)
        start = trio.current_time()
        await c.send(cmds.req(msg.id, 500))
        await c.read_messages(1)
        return 0.4 < trio.current_time() - start < 1.5

    _, prompt = await conformance.nsqd(scenario, parallel=True)
    assert prompt is True
