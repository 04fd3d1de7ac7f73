"""A new topic gets the channels nsqlookupd knows of before it fans out (nsqd's
GetTopic), so every channel receives what is published to another node."""

from __future__ import annotations

import trio

import fakensq

from ..support.waiting import wait_until
from .helpers import memory_client


async def test_new_topic_precreates_channels_from_lookupd(nursery: trio.Nursery) -> None:
    async with fakensq.NSQLookupd(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0") as lookupd:
        opts = {"lookupd_tcp_addresses": [lookupd.tcp_address], "http_address": "127.0.0.1:0"}
        async with fakensq.NSQD(tcp_address="127.0.0.1:0", **opts) as a:
            async with fakensq.NSQD(tcp_address="127.0.0.1:0", **opts) as b:
                with trio.fail_after(10):
                    topic = a.get_topic("orders")
                    topic.get_channel("billing")
                    topic.get_channel("shipping")
                    topic.get_channel("tmp#ephemeral")
                    # registrations reach the lookupd asynchronously
                    await wait_until(lambda: len(lookupd.channels("orders")) >= 3, step=0.01)

                    c = await memory_client(b, nursery)
                    await c.pub("orders", b"first")
                    await wait_until(lambda: b.topics["orders"].started, step=0.01)
                    got = b.topics["orders"].channels
                    assert sorted(got) == ["billing", "shipping"]
                    assert all(ch.depth() == 1 for ch in got.values())
                    assert b.topics["orders"].depth() == 0
