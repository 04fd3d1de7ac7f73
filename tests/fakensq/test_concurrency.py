"""Many producers and consumers over real TCP: every channel gets every message."""

from __future__ import annotations

import random

import trio

import fakensq
from trionsq.protocol import commands as cmds
from trionsq.protocol.frames import MessageFrame

from .helpers import RawClient


async def test_fan_out_and_distribution_under_load() -> None:
    producers, per_producer, consumers_per_channel = 20, 50, 4
    total = producers * per_producer
    received: dict[str, list[bytes]] = {"a": [], "b": []}
    async with fakensq.NSQD(tcp_address="127.0.0.1:0", http_address="") as nsqd:
        nsqd.get_topic("load").get_channel("a")
        nsqd.get_topic("load").get_channel("b")
        done = trio.Event()

        async def consume(channel: str, rdy: int) -> None:
            c = await RawClient.connect(nsqd.tcp_address)
            await c.identify(output_buffer_timeout=25)
            await c.sub("load", channel, rdy=rdy)
            while not done.is_set():
                frame = await c.read_frame()
                if isinstance(frame, MessageFrame):
                    received[channel].append(frame.body)
                    await c.send(cmds.fin(frame.id))
                    if all(len(v) == total for v in received.values()):
                        done.set()
            await c.aclose()

        async def produce(i: int) -> None:
            c = await RawClient.connect(nsqd.tcp_address)
            bodies = [b"%d-%d" % (i, j) for j in range(per_producer)]
            rng = random.Random(i)
            while bodies:
                n = rng.randint(1, 10)
                batch, bodies = bodies[:n], bodies[n:]
                await c.send(cmds.mpub("load", batch) if n > 1 else cmds.pub("load", batch[0]))
                assert await c.read_response() == b"OK"
            await c.aclose()

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                for channel in received:
                    for k in range(consumers_per_channel):
                        nursery.start_soon(consume, channel, 1 + 7 * k)
                for i in range(producers):
                    nursery.start_soon(produce, i)
                await done.wait()
                nursery.cancel_scope.cancel()
    expected = sorted(b"%d-%d" % (i, j) for i in range(producers) for j in range(per_producer))
    for bodies in received.values():
        assert sorted(bodies) == expected  # each exactly once
