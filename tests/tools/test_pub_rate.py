"""``trionsq pub --rate N`` holds N a second while the connection carries it
(virtual time: each publish costs a round trip; no clock is read for real)."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from trionsq.tools.pub import publish_paced


async def paced(
    rate: int, round_trip: float, records: int, batch: int = 200, idle_at: int | None = None
) -> list[tuple[float, int]]:
    """(virtual time, records sent so far) after each send."""
    send_to, receive = trio.open_memory_channel[bytes](records)
    sent: list[tuple[float, int]] = []
    count = 0

    async def send(bodies: list[bytes]) -> bool:
        nonlocal count
        assert 1 <= len(bodies) <= batch
        await trio.sleep(round_trip)  # waiting for nsqd's OK
        count += len(bodies)
        sent.append((trio.current_time(), count))
        return True

    async def feed() -> None:
        async with send_to:
            for i in range(records):
                if i == idle_at:
                    await trio.sleep(10)  # stdin idle for a while
                await send_to.send(b"%d" % i)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(feed)
        nursery.start_soon(publish_paced, receive, rate, batch, send)
    return sent


@pytest.mark.parametrize(
    ("rate", "round_trip"),
    # A round trip longer than 1/N (the 5,000/10,000/20,000 measured
    # 852/1,084/9,329 msg/s: the schedule restarted after each answer), and one
    # shorter.
    [(5000, 0.0003), (10000, 0.0003), (20000, 0.001), (50000, 0.002), (500, 0.0001)],
)
async def test_the_rate_holds_whatever_the_round_trip(
    rate: int, round_trip: float, autojump_clock: trio.testing.MockClock
) -> None:
    records = rate * 2
    start = trio.current_time()
    sent = await paced(rate, round_trip, records)
    assert sent[-1][1] == records
    elapsed = sent[-1][0] - start
    assert records / elapsed == pytest.approx(rate, rel=0.02)
    # Steady: the first second holds N, not a burst then a wait.
    count = max(c for t, c in sent if t <= start + 1)
    assert count == pytest.approx(rate, rel=0.02)


async def test_an_idle_source_earns_no_burst(autojump_clock: trio.testing.MockClock) -> None:
    # 1,000/s; stdin pauses 10 s after 500 records: the next 500 still come at
    # 1,000/s after at most one batch (200) at once, not all at once for the
    # 10 s missed.
    sent = await paced(1000, 0.0001, 1000, idle_at=500)
    resumed = next(t for t, c in sent if c > 500)
    after = [(t - resumed, c - 500) for t, c in sent if t >= resumed]
    for offset, count in after:
        assert count <= 1000 * offset + 200 + 2
    assert after[-1][0] == pytest.approx(0.3, abs=0.01)
