"""Helpers for the nsqlookupd tests: a raw TCP V1 client and a running lookupd."""

from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import trio

from fakensq.golang.net import split_host_port
from fakensq.lookupd.daemon import NSQLookupd


class V1Client:
    """Speaks nsqlookupd's TCP protocol byte by byte, as an nsqd would."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buf = bytearray()

    @classmethod
    async def connect(cls, address: str, magic: bytes = b"  V1") -> V1Client:
        host, port = split_host_port(address)
        stream = await trio.open_tcp_stream(host, port)
        client = cls(stream)
        if magic:
            await stream.send_all(magic)
        return client

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def read_response(self) -> bytes | None:
        """One ``[size][data]`` answer, or None when the server closed."""
        while len(self.buf) < 4:
            chunk = await self.stream.receive_some(4096)
            if not chunk:
                return None
            self.buf += chunk
        (size,) = struct.unpack(">l", self.buf[:4])
        while len(self.buf) < 4 + size:
            chunk = await self.stream.receive_some(4096)
            if not chunk:
                return None
            self.buf += chunk
        data = bytes(self.buf[4 : 4 + size])
        del self.buf[: 4 + size]
        return data

    async def command(self, line: str) -> bytes | None:
        await self.send(line.encode() + b"\n")
        return await self.read_response()

    async def identify(self, **fields: Any) -> bytes | None:
        body = {
            "broadcast_address": "127.0.0.1",
            "hostname": "testhost",
            "tcp_port": 4150,
            "http_port": 4151,
            "version": "1.3.0",
        }
        body.update(fields)
        raw = json.dumps(body).encode()
        await self.send(b"IDENTIFY\n" + struct.pack(">l", len(raw)) + raw)
        return await self.read_response()

    async def closed(self) -> bool:
        """True once the server has closed the connection (EOF)."""
        with trio.fail_after(5):
            while True:
                try:
                    chunk = await self.stream.receive_some(4096)
                except trio.BrokenResourceError:  # reset: closed with our bytes unread
                    return True
                if not chunk:
                    return True
                self.buf += chunk

    async def aclose(self) -> None:
        await self.stream.aclose()


@pytest.fixture
async def lookupd() -> AsyncIterator[NSQLookupd]:
    async with NSQLookupd(broadcast_address="lookupd.test") as node:
        yield node


@pytest.fixture
async def http(lookupd: NSQLookupd) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=f"http://{lookupd.http_address}") as client:
        yield client


async def registered_client(lookupd: NSQLookupd, *registrations: str, **fields: Any) -> V1Client:
    """A connected, identified producer with ``REGISTER`` lines sent."""
    client = await V1Client.connect(lookupd.tcp_address)
    assert (await client.identify(**fields)) is not None
    for reg in registrations:
        assert await client.command(f"REGISTER {reg}") == b"OK"
    return client
