"""What hostile-peer tests share: raw HTTP exchanges, memory and thread counts.

Memory is measured in-process with :mod:`tracemalloc` (fakensq runs in the
test's process): :func:`traced_peak` gives the peak of what was allocated
while a case ran, above what was allocated when it began.
"""

from __future__ import annotations

import threading
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import h11
import trio

from trionsq.transport import parse_address

#: How long one exchange may take on a loaded machine (nothing here waits on time).
TIMEOUT = 20.0

MiB = 1024 * 1024


@dataclass
class Peak:
    """The peak traced memory of a case, in bytes above its start (set at its end)."""

    bytes: int = 0

    @property
    def mib(self) -> float:
        return self.bytes / MiB


@contextmanager
def traced_peak() -> Iterator[Peak]:
    """Trace allocations while the block runs; the peak above the start."""
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    peak = Peak()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        yield peak
        peak.bytes = tracemalloc.get_traced_memory()[1] - base
    finally:
        if started:
            tracemalloc.stop()


def thread_names() -> list[str]:
    return sorted(t.name for t in threading.enumerate())


async def connect(address: str) -> trio.SocketStream:
    host, port = parse_address(address)
    return await trio.open_tcp_stream(host, port)


def get(path: str) -> bytes:
    """A GET request's bytes."""
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


async def read_answer(stream: trio.abc.Stream, conn: h11.Connection | None = None) -> Answer:
    """One HTTP response off ``stream`` (``conn``: the client's h11 state, when
    the caller sent through it; else a GET is assumed)."""
    if conn is None:
        conn = h11.Connection(h11.CLIENT)
        conn.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
        conn.send(h11.EndOfMessage())
    status = 0
    headers: dict[str, str] = {}
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(bytes(await stream.receive_some(65536)))
            continue
        if isinstance(event, h11.Response):
            status = event.status_code
            headers = {k.decode().lower(): v.decode() for k, v in event.headers}
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
            return Answer(status, headers, bytes(body))


async def ask(address: str, request: bytes) -> Answer:
    """One request on a new connection; its answer."""
    stream = await connect(address)
    try:
        await stream.send_all(request)
        return await read_answer(stream)
    finally:
        await trio.aclose_forcefully(stream)


async def flood(stream: trio.abc.Stream, total: int, chunk: bytes) -> int:
    """Send ``chunk`` until ``total`` bytes or the server closes; bytes sent."""
    sent = 0
    try:
        while sent < total:
            await stream.send_all(chunk)
            sent += len(chunk)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    return sent


async def closed_by_peer(stream: trio.abc.Stream) -> bool:
    """Read until EOF (or a reset); True then.  Callers bound it with fail_after."""
    try:
        while await stream.receive_some(65536):
            pass
    except trio.BrokenResourceError:
        pass
    return True


async def drain(address: str, topic: str, channel: str, count: int) -> list[bytes]:
    """Subscribe, read ``count`` messages (FIN each), return their bodies; for
    outcomes where which connection got which message, in which order, is the
    scheduler's choice on both daemons (nothing of it recorded)."""
    from trionsq.protocol import commands as cmds
    from trionsq.protocol.frames import Error, FrameParser, MessageFrame

    stream = await connect(address)
    parser = FrameParser()
    bodies: list[bytes] = []
    try:
        await stream.send_all(cmds.MAGIC_V2 + cmds.sub(topic, channel) + cmds.rdy(count))
        while len(bodies) < count:
            data = await stream.receive_some(256 * 1024)
            if not data:
                raise EOFError(f"closed after {len(bodies)} of {count} messages")
            fins = []
            for frame in parser.feed(bytes(data)):
                if isinstance(frame, Error):
                    raise AssertionError(frame.data)
                if isinstance(frame, MessageFrame):
                    bodies.append(frame.body)
                    fins.append(cmds.fin(frame.id))
            if fins:
                await stream.send_all(b"".join(fins))
    finally:
        await trio.aclose_forcefully(stream)
    return bodies


async def exchange(address: str, data: bytes, *, then: bytes = b"") -> tuple[Any, ...]:
    """Send ``data`` on a new connection (the send goes on in the background:
    the server may answer, and close, before it has read it all); the first
    answer, then what becomes of the connection: ``then`` sent on it and its
    answer's status, or "closed".  Returns ``(status, headers, body, after)``
    with the headers that say what an answer is (not its date)."""
    stream = await connect(address)
    try:
        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:

                async def send() -> None:
                    with suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                        await stream.send_all(data)

                nursery.start_soon(send)
                try:
                    answer = await read_answer(stream)
                except trio.BrokenResourceError:
                    answer = Answer(0, {}, b"")
                nursery.cancel_scope.cancel()
            after: Any = "closed"
            if answer.headers.get("connection") != "close" and then:
                try:
                    await stream.send_all(then)
                    after = (await read_answer(stream)).status
                except (trio.BrokenResourceError, h11.RemoteProtocolError):
                    after = "closed"
            elif answer.headers.get("connection") == "close":
                await closed_by_peer(stream)
    finally:
        await trio.aclose_forcefully(stream)
    keep = ("content-type", "content-length", "connection", "x-nsq-content-type")
    headers = {k: v for k, v in sorted(answer.headers.items()) if k in keep}
    return answer.status, headers, answer.body, after
