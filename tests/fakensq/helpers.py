"""A raw protocol client for tests, built from trionsq.protocol's encoders."""

from __future__ import annotations

import json
from typing import Any

import trio
import trio.testing

from trionsq.protocol import commands as cmds
from trionsq.protocol.codecs import (
    Decoder,
    DeflateDecoder,
    DeflateEncoder,
    Encoder,
    SnappyDecoder,
    SnappyEncoder,
)
from trionsq.protocol.frames import Error, Frame, FrameParser, MessageFrame, Response
from trionsq.transport import parse_address


class RawClient:
    """Speaks V2 over a stream; frames come back parsed."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.parser = FrameParser()
        self.frames: list[Frame] = []
        self.encoder: Encoder | None = None
        self.decoder: Decoder | None = None
        self.closed = False

    @classmethod
    async def connect(cls, address: str, magic: bool = True) -> RawClient:
        host, port = parse_address(address)
        client = cls(await trio.open_tcp_stream(host, port))
        if magic:
            await client.send(cmds.MAGIC_V2)
        return client

    async def send(self, data: bytes) -> None:
        if self.encoder is not None:
            data = self.encoder.encode(data)
        await self.stream.send_all(data)

    async def _fill(self) -> None:
        data = await self.stream.receive_some(65536)
        if not data:
            self.closed = True
            raise EOFError("connection closed")
        if self.decoder is not None:
            data = self.decoder.decode(bytes(data))
        self.frames.extend(self.parser.feed(bytes(data)))

    async def read_frame(self, skip_heartbeats: bool = True) -> Frame:
        while True:
            while not self.frames:
                await self._fill()
            frame = self.frames.pop(0)
            if skip_heartbeats and isinstance(frame, Response) and frame.is_heartbeat:
                continue
            return frame

    async def read_response(self) -> bytes:
        frame = await self.read_frame()
        assert isinstance(frame, Response), frame
        return frame.data

    async def read_error(self) -> bytes:
        frame = await self.read_frame()
        assert isinstance(frame, Error), frame
        return frame.data

    async def read_message(self) -> MessageFrame:
        frame = await self.read_frame()
        assert isinstance(frame, MessageFrame), frame
        return frame

    async def expect_closed(self) -> None:
        """Everything until EOF must be heartbeats."""
        while True:
            try:
                frame = await self.read_frame()
            except (EOFError, trio.BrokenResourceError):
                return
            raise AssertionError(f"unexpected frame before close: {frame}")

    async def identify(self, **data: Any) -> Any:
        data.setdefault("feature_negotiation", True)
        await self.send(cmds.identify(data))
        reply = await self.read_response()
        if reply == b"OK":
            return reply
        doc = json.loads(reply)
        if doc.get("snappy"):
            self.encoder, self.decoder = SnappyEncoder(), SnappyDecoder()
            pending = b"".join(_frame_bytes(f) for f in self.frames)
            assert not pending and not self.parser.buffered
            assert await self.read_response() == b"OK"
        elif doc.get("deflate"):
            self.encoder, self.decoder = DeflateEncoder(doc["deflate_level"]), DeflateDecoder()
            assert await self.read_response() == b"OK"
        return doc

    async def sub(self, topic: str, channel: str, rdy: int | None = None) -> None:
        await self.send(cmds.sub(topic, channel))
        assert await self.read_response() == b"OK"
        if rdy is not None:
            await self.send(cmds.rdy(rdy))

    async def pub(self, topic: str, body: bytes) -> None:
        await self.send(cmds.pub(topic, body))
        assert await self.read_response() == b"OK"

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)


def _frame_bytes(frame: Frame) -> bytes:
    return b"x"


async def memory_client(nsqd: Any, nursery: trio.Nursery, magic: bool = True) -> RawClient:
    """A client on an in-memory stream served by ``nsqd.handle_stream``."""
    server_side, client_side = trio.testing.memory_stream_pair()
    nursery.start_soon(nsqd.handle_stream, server_side)
    client = RawClient(client_side)
    if magic:
        await client.send(cmds.MAGIC_V2)
    return client
