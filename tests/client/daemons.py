"""The client's end-to-end tests run against fakensq's nsqd and nsqlookupd and
against the real NSQ v1.3.0 binaries: the ``daemons`` fixture is
parametrized over both kinds (``real`` skips with the reason where the
binaries are absent) and makes nodes configured with the real daemons'
command-line flags (:mod:`tests.support.nodes`)::

    async def test_something(daemons: Daemons) -> None:
        lookupd = await daemons.nsqlookupd()
        nsqd = await daemons.nsqd("--msg-timeout=2s", lookupd=lookupd)
        ...
        await nsqd.kill()      # SIGKILL (fakensq: stops without saving anything)
        await nsqd.start()     # again, same ports, same data path

Here too: the helpers the end-to-end tests share (a consumer of the nodes,
publishing, waiting for a channel's counters).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio

from ..support.nodes import KINDS, Daemons, Nsqd, Nsqlookupd
from ..support.waiting import poll

if TYPE_CHECKING:
    import trionsq

__all__ = ["Daemons", "Nsqd", "Nsqlookupd", "consumer", "daemons", "publish", "wait_channel"]


@pytest.fixture(params=KINDS)
async def daemons(
    request: pytest.FixtureRequest, nursery: trio.Nursery, tmp_path: Path
) -> AsyncIterator[Daemons]:
    """Nodes of one kind (``fakensq`` or ``real``), all stopped after the test."""
    made = Daemons(request.param, nursery, tmp_path)
    try:
        yield made
    finally:
        await made.close()


# --- helpers the end-to-end tests share ---


def consumer(nsqds: list[Nsqd], **options: Any) -> trionsq.Consumer:
    """A Consumer of ``topic``/``chan`` on these nsqds."""
    import trionsq

    return trionsq.Consumer(
        "topic", "chan", nsqd_tcp_addresses=[n.tcp_address for n in nsqds], **options
    )


async def publish(nsqd: Nsqd, topic: str, bodies: list[bytes], **options: Any) -> None:
    """MPUB ``bodies`` (in batches) to ``nsqd``."""
    import trionsq

    async with trionsq.Producer([nsqd.tcp_address], **options) as producer:
        for start in range(0, len(bodies), 500):
            await producer.multi_publish(topic, bodies[start : start + 500])


async def wait_channel(
    nsqd: Nsqd,
    topic: str,
    channel: str,
    predicate: Callable[[dict[str, Any]], bool],
    limit: float = 20.0,
) -> dict[str, Any]:
    """Poll ``/stats`` until the channel exists and ``predicate(channel)``; returns it.

    Fails with what it saw last (no channel at all, or its counters), so that
    a failure tells "never subscribed" from "something stayed in flight"."""
    found = await poll(
        lambda: nsqd.channel(topic, channel),
        lambda c: c is not None and predicate(c),
        limit=limit,
        step=0.02,
    )
    if found is None:
        raise AssertionError(f"{nsqd}: no channel {topic}/{channel} after {limit}s")
    if not predicate(found):
        counters = {k: v for k, v in found.items() if k != "clients"}
        raise AssertionError(f"{nsqd}: {topic}/{channel} still {counters} after {limit}s")
    return found


async def nothing_in_flight(nsqd: Nsqd, topic: str, channel: str) -> dict[str, Any]:
    """Wait until nothing of the channel is in flight (REQs written just before
    need a moment to be read); returns the channel's stats.  Messages nobody
    answered would stay in flight until msg_timeout, so tests that use this
    leave nsqd's default (60 s) or longer."""
    return await wait_channel(nsqd, topic, channel, lambda c: c["in_flight_count"] == 0)


async def ready_counts(nsqd: Nsqd, topic: str, channel: str) -> list[int]:
    """RDY of every client of the channel, as nsqd sees it."""
    found = await nsqd.channel(topic, channel)
    return [] if found is None else [int(c["ready_count"]) for c in found["clients"]]
