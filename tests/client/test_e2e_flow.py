"""The consumer's duties across several nsqds, on fakensq and on the real daemons:
discovery through nsqlookupd as nsqds come and go, RDY spread and rotation
(checked from nsqd's side: ``/stats`` ready counts), backoff, and nsqds stopped
or killed mid-stream and restarted.
"""

from __future__ import annotations

import pytest
import trio

import trionsq

from ..support.waiting import poll_until, wait_until
from .daemons import (
    Daemons,
    Nsqd,
    Nsqlookupd,
    consumer,
    nothing_in_flight,
    publish,
    wait_channel,
)

#: Quick reconnects to a configured nsqd that went away.
FAST_RECONNECT = trionsq.BackoffPolicy(base=0.1, max=0.5, multiplier=2.0)


async def snapshot(nsqds: list[Nsqd]) -> list[int]:
    """Every nsqd's summed client RDY for the channel, queried in parallel."""
    values = [0] * len(nsqds)

    async def ask(index: int) -> None:
        channel = await nsqds[index].channel("topic", "chan")
        if channel is not None:
            values[index] = sum(int(c["ready_count"]) for c in channel["clients"])

    async with trio.open_nursery() as nursery:
        for index in range(len(nsqds)):
            nursery.start_soon(ask, index)
    return values


async def stable_snapshot(nsqds: list[Nsqd]) -> list[int] | None:
    """The nsqds' RDY when two snapshots in a row agree (else None): the nsqds
    answer one by one, so a single snapshot could mix RDY from before and
    after a move of RDY between them."""
    first = await snapshot(nsqds)
    second = await snapshot(nsqds)
    return second if first == second else None


# --- discovery ---


async def test_lookupd_discovery_as_nsqds_come_and_go(daemons: Daemons) -> None:
    lookupd = await daemons.nsqlookupd()
    a = await daemons.nsqd(lookupd=lookupd)
    b = await daemons.nsqd(lookupd=lookupd)
    await publish(a, "topic", [b"a-%d" % i for i in range(5)])
    await publish(b, "topic", [b"b-%d" % i for i in range(5)])
    await wait_until_listed(lookupd, [a, b])
    got: list[bytes] = []
    async with trionsq.Consumer(
        "topic",
        "chan",
        lookupd_http_addresses=[lookupd.http_address],
        lookupd_poll_interval=0.2,
        handler=lambda m: got.append(m.body),
        max_in_flight=10,
    ) as c:
        await wait_until(lambda: len(got) == 10)
        assert c.connections == sorted([a.tcp_address, b.tcp_address])

        # One more comes: found at the next poll.
        third = await daemons.nsqd(lookupd=lookupd)
        await publish(third, "topic", [b"c-%d" % i for i in range(5)])
        await wait_until(lambda: len(got) == 15)
        assert c.connections == sorted([a.tcp_address, b.tcp_address, third.tcp_address])

        # One goes: it unregisters, the consumer lets it go.
        await b.stop()
        await wait_until_listed(lookupd, [a, third])
        await wait_until(lambda: c.connections == sorted([a.tcp_address, third.tcp_address]))

        # It comes back (its topic restored from its data path): found again.
        await b.start()
        await wait_until_listed(lookupd, [a, b, third])
        await publish(b, "topic", [b"b-again"])
        await wait_until(lambda: len(got) == 16)
        assert b.tcp_address in c.connections
    assert sorted(got) == sorted(
        [*(b"%s-%d" % (n, i) for n in (b"a", b"b", b"c") for i in range(5)), b"b-again"]
    )


async def wait_until_listed(lookupd: Nsqlookupd, nsqds: list[Nsqd]) -> None:
    """Until nsqlookupd lists exactly ``nsqds`` for the topic (polled: the
    registrations come over another connection)."""
    expected = sorted(n.tcp_address for n in nsqds)
    await poll_until(
        lambda: lookupd.producers("topic"),
        lambda listed: listed == expected,
        f"{lookupd} to list {expected} for the topic",
        limit=20,
        step=0.02,
    )


# --- RDY ---


@pytest.mark.parametrize(
    ("connections", "max_in_flight"),
    [(4, 2), (3, 7)],
    ids=["fewer-max-in-flight-than-nsqds", "uneven-shares"],
)
async def test_rdy_never_exceeds_max_in_flight_and_no_nsqd_starves(
    daemons: Daemons, connections: int, max_in_flight: int
) -> None:
    nsqds = [await daemons.nsqd() for _ in range(connections)]
    per_nsqd = 12
    for index, nsqd in enumerate(nsqds):
        await publish(nsqd, "topic", [b"%d-%d" % (index, i) for i in range(per_nsqd)])
    got: list[trionsq.Message] = []
    in_handler = 0
    peak = 0

    async def handler(message: trionsq.Message) -> None:
        nonlocal in_handler, peak
        in_handler += 1
        peak = max(peak, in_handler)
        await trio.sleep(0.05)
        in_handler -= 1
        got.append(message)

    snapshots: list[list[int]] = []
    async with consumer(
        nsqds, handler=handler, max_in_flight=max_in_flight, low_rdy_idle_timeout=0.3
    ) as c:
        with trio.fail_after(60):
            while len(got) < connections * per_nsqd:
                single = await snapshot(nsqds)
                # Each nsqd alone never sees more than max_in_flight...
                assert max(single) <= max_in_flight, single
                # ...nor do all of them together, at any one time.
                together = await stable_snapshot(nsqds)
                if together is not None:
                    assert sum(together) <= max_in_flight, together
                    snapshots.append(together)
                assert c.stats.rdy <= max_in_flight
                await trio.sleep(0.02)
    assert peak <= max_in_flight
    assert snapshots, "no two snapshots in a row agreed: nothing was checked"
    # No starvation: every nsqd was drained, every message handled once.
    assert sorted(m.body for m in got) == sorted(
        b"%d-%d" % (n, i) for n in range(connections) for i in range(per_nsqd)
    )
    for nsqd in nsqds:
        channel = await nothing_in_flight(nsqd, "topic", "chan")
        assert channel["depth"] == 0 and channel["timeout_count"] == 0
    if max_in_flight >= connections:
        # Spread: the shares (2, 2, 3 of 7) were in place at some point.
        assert any(sorted(s) == [2, 2, 3] for s in snapshots), snapshots


# --- backoff ---


async def test_backoff_entered_and_left_with_several_nsqds(daemons: Daemons) -> None:
    nsqds = [await daemons.nsqd() for _ in range(3)]
    for index, nsqd in enumerate(nsqds):
        await publish(nsqd, "topic", [b"%d-%d" % (index, i) for i in range(10)])
    failing = True
    done: list[bytes] = []
    states: set[str] = set()

    def handler(message: trionsq.Message) -> None:
        if failing:
            raise RuntimeError("downstream is down")
        done.append(message.body)

    policy = trionsq.BackoffPolicy(base=0.2, max=0.8, multiplier=2.0, jitter=0.0)
    async with consumer(
        nsqds,
        handler=handler,
        backoff=policy,
        default_requeue_delay=0.0,
        max_attempts=0,
        max_in_flight=6,
        low_rdy_idle_timeout=0.3,
    ) as c:
        await wait_until(lambda: c.stats.backoff_state == "paused")
        # Paused: RDY 0 at every nsqd (a test of the waters between pauses
        # gives one of them RDY 1 for a moment).
        with trio.fail_after(30):
            while await stable_snapshot(nsqds) != [0, 0, 0]:
                states.add(c.stats.backoff_state)
        assert c.stats.backoff_level >= 1
        failing = False
        with trio.fail_after(60):
            while len(done) < 30 or c.stats.backoff_state != "normal":
                states.add(c.stats.backoff_state)
                await trio.sleep(0.01)
        assert c.stats.backoff_level == 0
        # Left: every nsqd back at its share of max_in_flight.
        with trio.fail_after(30):
            while await stable_snapshot(nsqds) != [2, 2, 2]:
                pass
    assert "testing" in states or c.stats.backoff_level == 0
    assert sorted(done) == sorted(b"%d-%d" % (n, i) for n in range(3) for i in range(10))
    for nsqd in nsqds:
        channel = await nothing_in_flight(nsqd, "topic", "chan")
        assert channel["depth"] == 0 and channel["deferred_count"] == 0


# --- an nsqd going down mid-stream ---


@pytest.mark.parametrize("how", ["stop", "kill"])
async def test_nsqd_down_mid_stream_and_back(daemons: Daemons, how: str) -> None:
    # Everything on disk, synced at once: a SIGKILL loses only what was in
    # flight (nsqd keeps that in memory); a SIGTERM saves that too.
    down = await daemons.nsqd("--mem-queue-size=0", "--sync-every=1")
    steady = await daemons.nsqd()
    down_bodies = [b"down-%d" % i for i in range(200)]
    steady_bodies = [b"steady-%d" % i for i in range(50)]
    await publish(down, "topic", down_bodies)
    await publish(steady, "topic", steady_bodies)
    got: list[trionsq.Message] = []

    async def handler(message: trionsq.Message) -> None:
        await trio.sleep(0.002)
        got.append(message)

    async with consumer(
        [down, steady],
        handler=handler,
        max_in_flight=8,
        reconnect_backoff=FAST_RECONNECT,
    ) as c:
        await wait_until(lambda: sum(m.address == down.tcp_address for m in got) >= 40)
        await (down.stop() if how == "stop" else down.kill())
        await wait_until(lambda: c.connections == [steady.tcp_address])
        before = len(got)
        await down.start()
        await wait_until(lambda: down.tcp_address in c.connections)
        # Everything the restarted nsqd still holds is delivered (and finished).
        await wait_channel(
            down,
            "topic",
            "chan",
            lambda ch: ch["depth"] == 0 and ch["in_flight_count"] == 0,
            limit=60,
        )
        await wait_until(lambda: sum(m.address == steady.tcp_address for m in got) >= 50)
    after = [m for m in got[before:] if m.address == down.tcp_address]
    bodies = {m.body for m in got}
    assert bodies <= set(down_bodies) | set(steady_bodies)
    assert set(steady_bodies) <= bodies
    if how == "stop":
        # A clean stop saves what was queued and in flight: nothing is lost.
        assert set(down_bodies) <= bodies
        assert after, "the restarted nsqd delivered nothing"
    channel = await nothing_in_flight(steady, "topic", "chan")
    assert channel["depth"] == 0 and channel["timeout_count"] == 0
