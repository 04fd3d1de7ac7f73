"""The HTTP publish helpers, against fakensq's nsqd HTTP API."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

import fakensq
import trionsq
from trionsq.http import http_multi_publish, http_publish

from ..support.waiting import wait_until

NSQD: Any = getattr(fakensq, "NSQD", None)
pytestmark = pytest.mark.skipif(NSQD is None, reason="fakensq.NSQD is not available")


async def test_http_publish_and_multi_publish() -> None:
    async with NSQD(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0") as nsqd:
        await http_publish(nsqd.http_address, "topic", b"via http")
        await http_multi_publish(nsqd.http_address, "topic", [b"a\nb", b"c"])
        async with httpx.AsyncClient() as client:
            await http_publish(nsqd.http_address, "topic", b"deferred", defer=0.1, client=client)
        got: list[bytes] = []
        async with trionsq.Consumer(
            "topic",
            "chan",
            nsqd_tcp_addresses=[nsqd.tcp_address],
            handler=lambda m: got.append(m.body),
            max_in_flight=4,
        ):
            await wait_until(lambda: len(got) == 4, limit=10)
    assert sorted(got) == [b"a\nb", b"c", b"deferred", b"via http"]


async def test_http_errors_are_typed() -> None:
    async with NSQD(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0") as nsqd:
        with pytest.raises(trionsq.BadTopicError) as info:
            await http_publish(nsqd.http_address, "bad topic!", b"x")
        assert "INVALID_TOPIC" in str(info.value)
        with pytest.raises(ValueError):
            await http_publish(nsqd.http_address, "topic", b"x", defer=-1)
