"""A minimal raw-socket NSQ client: the baseline the benchmarks compare against.

No connection object, no RDY logic, no handler tasks: a Trio TCP stream, the
protocol core's encoders, and FrameParser.  It is what "as fast as Python can
talk NSQ" looks like, so trionsq's figures are reported as a ratio to it.
"""

from __future__ import annotations

import trio

from trionsq.protocol import MAGIC_V2, FrameParser, MessageFrame, Response
from trionsq.protocol import commands as cmd


async def connect(address: str) -> tuple[trio.SocketStream, FrameParser]:
    host, port = address.rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    await stream.send_all(MAGIC_V2)
    return stream, FrameParser()


async def expect_ok(stream: trio.SocketStream, parser: FrameParser, count: int = 1) -> None:
    got = 0
    while got < count:
        for frame in parser.feed(await stream.receive_some(65536)):
            if isinstance(frame, Response) and frame.is_heartbeat:
                await stream.send_all(cmd.nop())
                continue
            if frame != Response(b"OK"):
                raise RuntimeError(f"expected OK, got {frame!r}")
            got += 1


async def publish_sequential(address: str, topic: str, bodies: list[bytes]) -> None:
    """PUB, wait for OK, repeat: one round trip a message."""
    stream, parser = await connect(address)
    async with stream:
        for body in bodies:
            await stream.send_all(cmd.pub(topic, body))
            await expect_ok(stream, parser)


async def publish_mpub(address: str, topic: str, bodies: list[bytes], batch: int) -> None:
    stream, parser = await connect(address)
    async with stream:
        for start in range(0, len(bodies), batch):
            await stream.send_all(cmd.mpub(topic, bodies[start : start + batch]))
            await expect_ok(stream, parser)


async def consume(address: str, topic: str, channel: str, count: int, rdy: int = 2500) -> None:
    """SUB, RDY, and FIN every message, writing the FINs of one read together."""
    stream, parser = await connect(address)
    async with stream:
        await stream.send_all(cmd.sub(topic, channel))
        await expect_ok(stream, parser)
        await stream.send_all(cmd.rdy(rdy))
        received = 0
        while received < count:
            out = []
            for frame in parser.feed(await stream.receive_some(256 * 1024)):
                if isinstance(frame, MessageFrame):
                    out.append(cmd.fin(frame.id))
                    received += 1
                elif isinstance(frame, Response) and frame.is_heartbeat:
                    out.append(cmd.nop())
            if out:
                await stream.send_all(b"".join(out))
