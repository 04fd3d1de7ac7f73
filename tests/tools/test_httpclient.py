"""``to-http``'s HTTP/1.1 client against a scripted server: keep-alive, answers of every
framing, servers that close, stall or answer garbage.

The server is a raw TCP listener: it reads each request whole (head and
``Content-Length`` body), records it, and writes the bytes the test scripted for
that request (then closes, where the script says so), so the client meets
exactly the answers a test names, split where the test splits them.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest
import trio
import trustme
from hypothesis import given, settings
from hypothesis import strategies as st

from trionsq.tools.httpclient import Endpoint, HTTPConnection, HTTPError

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK"
HEADERS = [("User-Agent", "test"), ("Content-Type", "text/plain")]


@dataclass
class Step:
    """The answer to one request: chunks written in turn, then maybe a close."""

    chunks: list[bytes]
    close: bool = False
    #: don't answer at all (the client's timeout is tested)
    stall: bool = False


@dataclass
class Server:
    script: list[Step]
    url: str = ""
    #: (connection number, the request's raw bytes)
    requests: list[tuple[int, bytes]] = field(default_factory=list)
    connections: int = 0
    #: set when the server has closed a connection
    closed: trio.Event = field(default_factory=trio.Event)

    async def _read_request(self, stream: trio.abc.Stream, buffer: bytearray) -> bytes | None:
        while b"\r\n\r\n" not in buffer:
            data = await stream.receive_some(65536)
            if not data:
                return None
            buffer += data
        end = buffer.index(b"\r\n\r\n") + 4
        length = 0
        for line in bytes(buffer[:end]).split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(buffer) < end + length:
            data = await stream.receive_some(65536)
            if not data:
                return None
            buffer += data
        request = bytes(buffer[: end + length])
        del buffer[: end + length]
        return request

    async def handle(self, stream: trio.abc.Stream) -> None:
        self.connections += 1
        number = self.connections
        buffer = bytearray()
        try:
            await self._serve(number, stream, buffer)
        finally:
            await trio.aclose_forcefully(stream)
            self.closed.set()

    async def _serve(self, number: int, stream: trio.abc.Stream, buffer: bytearray) -> None:
        while True:
            request = await self._read_request(stream, buffer)
            if request is None:
                return
            self.requests.append((number, request))
            step = self.script.pop(0) if self.script else Step([OK])
            if step.stall:
                await trio.sleep_forever()
            for chunk in step.chunks:
                await stream.send_all(chunk)
            if step.close:
                return


@asynccontextmanager
async def serving(*script: Step, ca: trustme.CA | None = None) -> AsyncIterator[Server]:
    """Serve ``script`` on 127.0.0.1 (over TLS with a certificate of ``ca``)."""
    server = Server(list(script))
    tcp = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = tcp[0].socket.getsockname()[1]
    listeners: list[trio.abc.Listener[trio.abc.Stream]] = list(tcp)
    scheme = "http"
    if ca is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert("127.0.0.1").configure_cert(context)
        listeners = [trio.SSLListener(listener, context) for listener in tcp]
        scheme = "https"
    server.url = f"{scheme}://127.0.0.1:{port}/in?x=1"
    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, server.handle, listeners)
        yield server
        nursery.cancel_scope.cancel()


def connection(
    server: Server, request_timeout: float = 10.0, ca: trustme.CA | None = None
) -> HTTPConnection:
    context = None
    if ca is not None:
        context = ssl.create_default_context()
        ca.configure_trust(context)
    return HTTPConnection(
        Endpoint.parse(server.url),
        connect_timeout=10.0,
        request_timeout=request_timeout,
        ssl_context=context,
    )


async def test_posts_on_one_keep_alive_connection() -> None:
    async with serving() as server:
        conn = connection(server)
        for body in (b"one", b"two", b"three"):
            assert await conn.request("POST", "/in?x=1", HEADERS, body) == 200
        await conn.aclose()
    assert [number for number, _ in server.requests] == [1, 1, 1]
    _, raw = server.requests[2]
    head, _, body = raw.partition(b"\r\n\r\n")
    assert body == b"three"
    lines = head.lower().split(b"\r\n")
    assert lines[0] == b"post /in?x=1 http/1.1"
    assert set(lines[1:]) == {
        f"host: {server.url.split('/')[2]}".encode(),
        b"user-agent: test",
        b"content-type: text/plain",
        b"content-length: 5",
    }


async def test_https_keeps_its_connection_and_reads_every_framing() -> None:
    ca = trustme.CA()
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nOK\r\n0\r\n\r\n"
    eof = b"HTTP/1.1 202 Accepted\r\n\r\nuntil close"
    async with serving(Step([OK]), Step([chunked]), Step([eof], close=True), ca=ca) as server:
        conn = connection(server, ca=ca)
        assert await conn.request("POST", "/in", HEADERS, b"one") == 200
        assert await conn.request("POST", "/in", HEADERS, b"two") == 200
        assert await conn.request("POST", "/in", HEADERS, b"three") == 202
        assert not conn.connected
        assert await conn.request("POST", "/in", HEADERS, b"four") == 200
        await conn.aclose()
    assert [number for number, _ in server.requests] == [1, 1, 1, 2]
    assert server.requests[3][1].endswith(b"\r\n\r\nfour")


async def test_https_refuses_a_certificate_it_cannot_verify() -> None:
    async with serving(ca=trustme.CA()) as server:
        conn = connection(server, ca=trustme.CA())
        with pytest.raises(HTTPError, match="connect to"):
            await conn.request("POST", "/in", HEADERS, b"x")
        assert not conn.connected


async def test_get_sends_no_body_and_no_length() -> None:
    async with serving() as server:
        conn = connection(server)
        assert await conn.request("GET", "/in?q=a+b", HEADERS[:1]) == 200
        await conn.aclose()
    raw = server.requests[0][1]
    assert raw.startswith(b"GET /in?q=a+b HTTP/1.1\r\n")
    assert b"content-length" not in raw.lower()
    assert raw.endswith(b"\r\n\r\n")


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param([OK], id="length"),
        pytest.param([b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n"], id="empty"),
        pytest.param([b"HTTP/1.1 204 No Content\r\n\r\n"], id="204"),
        pytest.param(
            [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nOK\r\n0\r\n\r\n"],
            id="chunked",
        ),
        pytest.param(
            [b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK"],
            id="100-continue",
        ),
        pytest.param([bytes([b]) for b in OK], id="byte-by-byte"),
    ],
)
async def test_answers_of_every_framing_keep_the_connection(answer: list[bytes]) -> None:
    async with serving(Step(answer)) as server:
        conn = connection(server)
        status = await conn.request("POST", "/in", HEADERS, b"x")
        assert status == int(b"".join(answer).rsplit(b"HTTP/1.1 ", 1)[1][:3])
        assert conn.connected
        assert await conn.request("POST", "/in", HEADERS, b"y") == 200
        await conn.aclose()
    assert [number for number, _ in server.requests] == [1, 1]


@pytest.mark.parametrize(
    "step",
    [
        pytest.param(
            Step([b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nOK"]),
            id="connection-close",
        ),
        pytest.param(Step([b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nOK"]), id="http-1.0"),
        pytest.param(Step([b"HTTP/1.1 200 OK\r\n\r\nbody until close"], close=True), id="eof"),
        pytest.param(Step([OK + OK]), id="an-answer-too-many"),
        pytest.param(Step([b"HTTP/1.1 100 Continue\r\n\r\n" + OK + b"HTTP/1.1 2"]), id="half-more"),
    ],
)
async def test_answers_that_end_the_connection(step: Step) -> None:
    async with serving(step) as server:
        conn = connection(server)
        assert await conn.request("POST", "/in", HEADERS, b"x") == 200
        assert not conn.connected
        assert await conn.request("POST", "/in", HEADERS, b"y") == 200
        await conn.aclose()
    assert [number for number, _ in server.requests] == [1, 2]


async def test_a_reused_connection_the_server_dropped_is_tried_again() -> None:
    async with serving(Step([OK], close=True)) as server:
        conn = connection(server)
        assert await conn.request("POST", "/in", HEADERS, b"one") == 200
        assert conn.connected  # the server closes after its answer: not seen yet
        with trio.fail_after(10):
            await server.closed.wait()
        # The request meets a closed connection (an end, or a reset, as the
        # kernel has it): sent again on a new one.
        assert await conn.request("POST", "/in", HEADERS, b"two") == 200
        await conn.aclose()
    assert [number for number, _ in server.requests] == [1, 2]


async def test_a_new_connection_closed_unanswered_is_an_error() -> None:
    async with serving(Step([], close=True)) as server:
        conn = connection(server)
        with pytest.raises(HTTPError, match="closed the connection"):
            await conn.request("POST", "/in", HEADERS, b"x")
        assert not conn.connected
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    "cut",
    [
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nOK", id="body"),
        pytest.param(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nOK", id="chunks"),
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Le", id="head"),
        pytest.param(b"HTTP/1.1 100 Continue\r\n\r\n", id="after-100"),
    ],
)
async def test_an_answer_cut_short_is_an_error(cut: bytes) -> None:
    async with serving(Step([cut], close=True)) as server:
        conn = connection(server)
        with pytest.raises(HTTPError, match="mid-answer"):
            await conn.request("POST", "/in", HEADERS, b"x")
        assert not conn.connected


async def test_garbage_is_a_bad_response_and_closes() -> None:
    async with serving(Step([b"SMTP ready\r\n\r\n"])) as server:
        conn = connection(server)
        with pytest.raises(HTTPError, match="bad response"):
            await conn.request("POST", "/in", HEADERS, b"x")
        assert not conn.connected
        assert await conn.request("POST", "/in", HEADERS, b"y") == 200
        await conn.aclose()


async def test_no_answer_within_the_request_timeout() -> None:
    async with serving(Step([], stall=True)) as server:
        conn = connection(server, request_timeout=0.2)
        with trio.fail_after(10):
            with pytest.raises(HTTPError, match="timed out"):
                await conn.request("POST", "/in", HEADERS, b"x")
        assert not conn.connected


async def test_a_header_h11_refuses_sends_nothing() -> None:
    async with serving() as server:
        conn = connection(server)
        with pytest.raises(HTTPError, match="bad request"):
            await conn.request("POST", "/in", [("Bad Name", "x")], b"x")
        assert not conn.connected
    assert server.requests == []


async def test_cancelled_mid_request_closes_the_connection() -> None:
    async with serving(Step([], stall=True)) as server:
        conn = connection(server)
        with trio.move_on_after(0.1):
            await conn.request("POST", "/in", HEADERS, b"x")
        assert not conn.connected


async def test_a_big_body_is_sent_whole() -> None:
    body = bytes(range(256)) * 20_000  # more than a socket buffer takes at once
    async with serving() as server:
        conn = connection(server)
        assert await conn.request("POST", "/in", HEADERS, body) == 200
        await conn.aclose()
    assert server.requests[0][1].endswith(body)


@settings(max_examples=60, deadline=None)
@given(
    answer=st.one_of(
        st.binary(max_size=200),
        st.builds(
            lambda status, rest: b"HTTP/1.1 " + status + rest,
            st.sampled_from([b"200 OK\r\n", b"503 No\r\n", b"99 x\r\n", b"abc\r\n", b""]),
            st.binary(max_size=100),
        ),
    ),
    close=st.booleans(),
)
def test_any_answer_gives_a_status_or_an_http_error(answer: bytes, close: bool) -> None:
    """Whatever the server writes, the request ends: a status, or HTTPError."""

    async def main() -> None:
        async with serving(Step([answer], close=True)) as server:
            conn = connection(server, request_timeout=0.5)
            with trio.fail_after(10):
                try:
                    status = await conn.request("POST", "/in", HEADERS, b"x")
                except HTTPError:
                    assert not conn.connected
                else:
                    assert 200 <= status <= 999
                await conn.aclose()

    trio.run(main)
