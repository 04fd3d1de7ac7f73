"""Messages as large as nsqd allows, against the real nsqd (and fakensq): an
nsqd run with ``--max-msg-size=4MiB`` holding a message that large is read
with the default settings, as go-nsq reads it (nsqd v1.3.0 does not say its
limit in IDENTIFY's answer, so a client cannot adapt to it); above a
``max_frame_size`` a user set lower, the message is requeued, then given up
after ``max_attempts``, with an error naming the option each time, on the one
connection: never a reconnect loop (before: ``FrameTooLarge``, the connection
dropped, nsqd's timeout, again, for ever)."""

from __future__ import annotations

import logging

import pytest

import trionsq

from ..support.waiting import wait_until
from .daemons import Daemons, consumer, publish, wait_channel

MAX_MSG_SIZE = 4 * 1024 * 1024


async def test_a_message_as_large_as_nsqd_allows_is_received_with_the_defaults(
    daemons: Daemons,
) -> None:
    nsqd = await daemons.nsqd(f"--max-msg-size={MAX_MSG_SIZE}")
    body = bytes(range(256)) * (MAX_MSG_SIZE // 256)  # exactly the limit
    await publish(nsqd, "topic", [body, b"small"])
    got: list[bytes] = []
    async with consumer([nsqd], handler=lambda m: got.append(m.body)):
        await wait_until(lambda: len(got) >= 2, step=0.01)
    assert got == [body, b"small"]
    channel = await wait_channel(nsqd, "topic", "chan", lambda c: c["in_flight_count"] == 0)
    assert channel["requeue_count"] == 0 and channel["timeout_count"] == 0


async def test_above_max_frame_size_a_message_is_requeued_then_given_up_on_one_connection(
    daemons: Daemons, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trionsq")
    nsqd = await daemons.nsqd(f"--max-msg-size={MAX_MSG_SIZE}")
    big = b"b" * (2 * 1000 * 1000)
    await publish(nsqd, "topic", [big])
    handled: list[bytes] = []
    async with consumer(
        [nsqd],
        handler=lambda m: handled.append(m.body),
        max_frame_size=1024 * 1024,
        max_attempts=2,
        default_requeue_delay=0.0,
    ) as c:
        # Requeued twice (attempts 1 and 2), then given up (attempt 3: FIN).
        channel = await wait_channel(
            nsqd,
            "topic",
            "chan",
            lambda ch: ch["depth"] == 0 and ch["in_flight_count"] == 0 and ch["requeue_count"] == 2,
        )
        assert c.stats.given_up == 1
        # The connection goes on: a message that fits comes through it.
        await publish(nsqd, "topic", [b"fits"])
        await wait_until(lambda: handled, step=0.01)
    assert handled == [b"fits"]
    assert channel["timeout_count"] == 0
    lines = [r.getMessage() for r in caplog.records]
    assert sum("subscribed to topic/chan" in line for line in lines) == 1  # no reconnect
    requeued = [line for line in lines if "more than max_frame_size=1048576" in line]
    assert len(requeued) == 3, lines
    assert "requeued" in requeued[0] and "raise max_frame_size to receive it" in requeued[0]
    assert "giving up on message" in requeued[2]


def test_the_default_limit_is_far_above_nsqds_usual_settings() -> None:
    """A documented memory bound (one frame a connection), not a guess at
    nsqd's --max-msg-size (1 MiB by default, and not told to clients)."""
    assert trionsq.Config().max_frame_size >= 64 * 1024 * 1024
