"""Talking to an nsqlookupd under test: its TCP protocol V1, recorded, and a
normalized view of what its HTTP API shows.

:class:`V1Session` is :class:`.session.Session`'s counterpart for nsqlookupd's
protocol (magic ``"  V1"``, newline-terminated commands, every answer a
``[size][data]`` frame): it records into the target's transcript ``(name,
text)``, ``(name, "json", doc)`` or ``(name, "closed")``.

:func:`lookupd_state` is everything nsqlookupd's HTTP API shows (``/topics``,
``/channels`` and ``/lookup`` of each topic, ``/nodes``, ``/debug``), with Go's
map orders sorted away and times reduced to their type.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import trio

from trionsq.transport import parse_address

from .conftest import Target
from .normalize import Normalizer, type_only
from .session import READ_TIMEOUT, Entry

__all__ = [
    "V1Session",
    "v1_connect",
    "lookupd_state",
    "PEER",
    "identify_body",
    "debug_times",
]

MAGIC_V1 = b"  V1"

#: What an nsqd tells nsqlookupd about itself.
PEER: dict[str, Any] = {
    "broadcast_address": "127.0.0.1",
    "hostname": "peerhost",
    "tcp_port": 4150,
    "http_port": 4151,
    "version": "1.3.0",
}


def identify_body(fields: Any) -> bytes:
    """``IDENTIFY\\n`` and a size-prefixed JSON body (bytes as they are)."""
    body = fields if isinstance(fields, bytes) else json.dumps(fields).encode()
    return b"IDENTIFY\n" + struct.pack(">l", len(body)) + body


class V1Session:
    """One connection to nsqlookupd (module doc)."""

    def __init__(self, name: str, stream: trio.SocketStream, target: Target) -> None:
        self.name = name
        self.stream = stream
        self.target = target
        self.buf = bytearray()
        self.closed = False

    async def send(self, *parts: bytes) -> None:
        """Send bytes as they are (a send after the server closed is no error)."""
        try:
            await self.stream.send_all(b"".join(parts))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def _fill(self) -> bool:
        try:
            data = await self.stream.receive_some(65536)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        if not data:
            return False
        self.buf += data
        return True

    async def _frame(self) -> bytes | None:
        while len(self.buf) < 4:
            if not await self._fill():
                return None
        (size,) = struct.unpack(">l", self.buf[:4])
        while len(self.buf) < 4 + size:
            if not await self._fill():
                return None
        data = bytes(self.buf[4 : 4 + size])
        del self.buf[: 4 + size]
        return data

    def _record(self, data: bytes | None) -> Entry:
        entry: Entry
        if data is None:
            self.closed = True
            entry = (self.name, "closed")
        elif data[:1] == b"{":
            entry = (self.name, "json", json.loads(data))
        else:
            entry = (self.name, data.decode("utf-8", "backslashreplace"))
        self.target.transcript.append(entry)
        return entry

    async def read(self, n: int = 1) -> list[Entry]:
        """Read ``n`` answers (fewer, then ``closed``, if the server closes)."""
        entries: list[Entry] = []
        with trio.fail_after(READ_TIMEOUT):
            while len(entries) < n and not self.closed:
                entries.append(self._record(await self._frame()))
        return entries

    async def read_until_closed(self) -> list[Entry]:
        entries: list[Entry] = []
        with trio.fail_after(READ_TIMEOUT):
            while not self.closed:
                entries.append(self._record(await self._frame()))
        return entries

    async def command(self, line: bytes) -> list[Entry]:
        """Send one command line and read its answer."""
        await self.send(line + b"\n")
        return await self.read(1)

    async def identify(self, **fields: Any) -> list[Entry]:
        await self.send(identify_body({**PEER, **fields}))
        return await self.read(1)

    async def sync(self) -> list[Entry]:
        """``PING`` and its ``OK``: every earlier answer is read by then."""
        return await self.command(b"PING")

    async def close(self) -> None:
        self.closed = True
        await trio.aclose_forcefully(self.stream)


async def v1_connect(target: Target, name: str = "", *, magic: bool = True) -> V1Session:
    """A new connection to ``target`` (an nsqlookupd), named ``l``, ``l2``...;
    its local address shows in ``/nodes`` as ``<name:addr>``."""
    # The target keeps its sessions (open until the scenario ends, whether or
    # not the scenario still holds them: a dropped socket would close).
    opened: list[V1Session] = target.__dict__.setdefault("v1_sessions", [])
    count = len(opened) + 1
    if not name:
        name = "l" if count == 1 else f"l{count}"
    host, port = parse_address(target.tcp_address)
    stream = await trio.open_tcp_stream(host, port)
    local = stream.socket.getsockname()
    target.normalizer.alias(f"{local[0]}:{local[1]}", f"<{name}:addr>")
    session = V1Session(name, stream, target)
    opened.append(session)
    if magic:
        await session.send(MAGIC_V1)
    return session


#: Go's time.Time{}.UnixNano(): /debug's tombstoned_at of a producer never tombstoned.
GO_ZERO_TIME_NANOS = -6795364578871345152


def debug_times(n: Normalizer) -> None:
    """Normalize /debug's times: only their presence and type are compared (a
    never-set tombstone time, Go's zero time, is kept)."""
    n.key_rules["last_update"] = type_only
    n.key_rules["tombstoned_at"] = lambda v: v if v == GO_ZERO_TIME_NANOS else type_only(v)


async def lookupd_state(t: Target, *topics: str) -> dict[str, Any]:
    """What nsqlookupd's HTTP API shows (module doc); ``/lookup`` and
    ``/channels`` of the topics it lists and of ``topics``."""
    async with t.http() as http:
        listed = (await http.get("/topics")).json()["topics"]
        out: dict[str, Any] = {"topics": sorted(listed)}
        for topic in sorted({*listed, *topics}):
            r = await http.get("/lookup", params={"topic": topic})
            doc = r.json()
            if r.status_code == 200:
                doc["channels"] = sorted(doc["channels"])
                doc["producers"] = sorted(doc["producers"], key=json.dumps)
            channels = (await http.get("/channels", params={"topic": topic})).json()
            out[f"lookup {topic}"] = (r.status_code, doc)
            out[f"channels {topic}"] = sorted(channels["channels"])
        nodes = (await http.get("/nodes")).json()
        for node in nodes["producers"]:
            pairs = sorted(zip(node["topics"], node["tombstones"], strict=True))
            node["topics"] = [p[0] for p in pairs]
            node["tombstones"] = [p[1] for p in pairs]
        nodes["producers"].sort(key=json.dumps)
        out["nodes"] = nodes
        debug = (await http.get("/debug")).json()
        for producers in debug.values():
            for p in producers:
                p["last_update"] = type_only(p["last_update"])
                p["tombstoned_at"] = (
                    type_only(p["tombstoned_at"]) if p["tombstoned"] else (p["tombstoned_at"])
                )
            producers.sort(key=json.dumps)
        out["debug"] = debug
    return out
