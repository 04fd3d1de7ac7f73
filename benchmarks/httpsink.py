"""A fast HTTP/1.1 endpoint that answers 200 to everything and counts requests.

The sink of ``bench_tools.py``'s ``to-http`` runs: it must never be what limits
the tool under test, so it is an :class:`asyncio.Protocol` reading requests
straight off the socket (keep-alive, pipelining, ``Content-Length`` bodies) and
writing one canned answer each; no HTTP library, whose per-request objects
would cost more than the tools' own work.  Only what the tools send is
understood (no chunked bodies).

``GET /_count`` answers the number of requests (``/_count`` excluded) and the
bytes of their bodies as ``requests bytes``; ``GET /_reset`` zeroes both.

    python benchmarks/httpsink.py    # prints the port, then serves until killed
"""

from __future__ import annotations

import asyncio
import sys

_OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nOK"


class _Counts:
    requests = 0
    body_bytes = 0


class _Sink(asyncio.Protocol):
    def __init__(self) -> None:
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        answers: list[bytes] = []
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                break
            head = bytes(buffer[:end])
            length = 0
            lower = head.lower()
            at = lower.find(b"\r\ncontent-length:")
            if at >= 0:
                stop = lower.find(b"\r\n", at + 2)
                length = int(lower[at + 17 : stop if stop >= 0 else len(lower)])
            total = end + 4 + length
            if len(buffer) < total:
                break
            del buffer[:total]
            path = head.split(b" ", 2)[1] if b" " in head else b""
            if path == b"/_count":
                text = f"{_Counts.requests} {_Counts.body_bytes}".encode()
                answers.append(
                    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(text), text)
                )
            elif path == b"/_reset":
                _Counts.requests = _Counts.body_bytes = 0
                answers.append(_OK)
            else:
                _Counts.requests += 1
                _Counts.body_bytes += length
                answers.append(_OK)
        if answers and self.transport is not None:
            self.transport.write(b"".join(answers))


async def _serve() -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Sink, "127.0.0.1", 0, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    print(port, flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(_serve())
    except KeyboardInterrupt:
        sys.exit(0)
