"""Whatever a server sends, the client never crashes its caller's nursery."""

from __future__ import annotations

import struct

import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

import trionsq

from ..support.waiting import wait_until
from .minisrv import MiniNSQD

frame_types = st.sampled_from([0, 1, 2, 3, 0xFFFFFFFF])


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    """Byte soup, or frames that are almost right."""
    kind = draw(st.sampled_from(["raw", "frame", "message"]))
    if kind == "raw":
        return draw(st.binary(max_size=64))
    if kind == "frame":
        data = draw(st.binary(max_size=40))
        size = draw(st.one_of(st.just(len(data) + 4), st.integers(-5, 100)))
        return struct.pack(">lL", size, draw(frame_types)) + data
    body = draw(st.binary(max_size=20))
    header = struct.pack(">qH", draw(st.integers(0, 2**62)), draw(st.integers(0, 65535)))
    msg_id = draw(st.binary(min_size=0, max_size=20))
    data = header + msg_id + body
    return struct.pack(">lL", len(data) + 4, 2) + data


@settings(max_examples=60)
@given(st.lists(frames(), min_size=1, max_size=5))
def test_consumer_survives_anything_the_server_sends(chunks: list[bytes]) -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            node = MiniNSQD(nursery)
            handled: list[bytes] = []
            async with trionsq.Consumer(
                "topic",
                "chan",
                nsqd_tcp_addresses=["nsqd:4150"],
                connector=node.connector,
                handler=lambda m: handled.append(m.body),
                max_in_flight=10,
                close_timeout=1.0,
                heartbeat_interval=2.0,
                read_timeout=5.0,  # a frame cut short is noticed here
            ) as consumer:
                await consumer.wait_connected()
                server = node.live[0]
                for chunk in chunks:
                    try:
                        await server.send(chunk)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        break  # the client hung up on the garbage so far
                await trio.sleep(1)
                # Still alive: after a reconnect if the bytes were not acceptable.
                await wait_until(lambda: consumer.connections == ["nsqd:4150"], limit=60, step=0.1)
                node.put(b"still works")
                await wait_until(lambda: b"still works" in handled, limit=60, step=0.1)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


@settings(max_examples=40)
@given(st.binary(min_size=1, max_size=80))
def test_handshake_garbage_is_a_typed_error(garbage: bytes) -> None:
    async def main() -> None:
        async def connector(host: str, port: int) -> trio.abc.Stream:
            client, server = trio.testing.memory_stream_pair()
            await server.send_all(garbage)
            await server.aclose()
            return client

        config = trionsq.Config(connector=connector, connect_timeout=5.0)
        try:
            conn = await trionsq.Connection.open("nsqd:4150", config)
        except trionsq.NSQError:
            return
        await conn.aclose()  # garbage that happens to be a valid IDENTIFY reply

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
