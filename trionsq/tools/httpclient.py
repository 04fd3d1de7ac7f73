"""A lean keep-alive HTTP/1.1 client for ``to-http``: h11 and httptools on one Trio stream.

``to-http`` sends small requests as fast as nsqd hands out messages, from
``-n`` concurrent workers; each worker owns one :class:`HTTPConnection` per
endpoint and reuses it, so no pool is shared and nothing waits for a
connection.  (A general client's pool, per-request objects and middleware cost
several times what the request itself does here; its pool also slows down
sharply with thousands of waiting requests.)

The protocol is the libraries': h11 checks and writes a request's head (once
per distinct head: posting messages of one size sends the same head again),
and httptools (llhttp, Node's parser, in C) reads the answers, where h11's
pure-Python parser and state machine cost more than all the rest of a request.
This module adds connecting (TCP or TLS), timeouts, keep-alive and one retry
of a reused connection that the server had already closed.

A plain TCP connection is driven on its socket directly (:class:`_PlainSocket`):
Trio's ``SocketStream`` tries every receive before waiting (an exception per
request, the answer never being there yet) and yields to the scheduler after
every send, which together cost more than the request's own bytes.
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

import httptools
import trio

from .common import reason

__all__ = ["Endpoint", "HTTPConnection", "HTTPError"]

_RECEIVE_SIZE = 64 * 1024
#: request heads kept per connection (see HTTPConnection._head)
_HEADS = 64


class HTTPError(Exception):
    """A request that got no answer (connection, timeout, protocol)."""


class _PlainSocket:
    """A connected non-blocking TCP socket, as the two calls the client needs.

    A send is written at once (the socket buffer takes a request whole; only
    when it does not is there a wait), and is no scheduling point: the receive
    that follows it waits.  A receive waits for the socket to be readable first,
    since after a request the answer is never there yet.  Both raise OSError as
    the socket does; a closed connection reads as ``b""``.
    """

    __slots__ = ("sock",)

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    async def send_all(self, data: bytes) -> None:
        sock = self.sock
        try:
            sent = sock.send(data)
        except BlockingIOError:
            sent = 0
        if sent == len(data):
            return  # the usual case: taken whole, no view to slice
        view = memoryview(data)[sent:]
        while view:
            await trio.lowlevel.wait_writable(sock)
            try:
                sent = sock.send(view)
            except BlockingIOError:
                sent = 0
            view = view[sent:]

    async def receive_some(self, max_bytes: int) -> bytes:
        sock = self.sock
        while True:
            await trio.lowlevel.wait_readable(sock)
            try:
                return sock.recv(max_bytes)
            except BlockingIOError:
                continue  # woken for nothing

    def close(self) -> None:
        trio.lowlevel.notify_closing(self.sock)
        self.sock.close()


@dataclass(frozen=True)
class Endpoint:
    """Where requests go: scheme, host, port and the request target."""

    url: str
    scheme: str
    host: str
    port: int
    target: str  # path and query, as sent on the request line
    authority: str  # the Host header

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        """Parse an ``http://`` or ``https://`` URL (raises ValueError)."""
        parts: SplitResult = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https"):
            raise ValueError(f"unsupported protocol scheme {parts.scheme!r}")
        host = parts.hostname
        if not host:
            raise ValueError("no host in URL")
        port = parts.port or (443 if scheme == "https" else 80)  # raises on a bad port
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        authority = parts.netloc.rpartition("@")[2]
        return cls(url, scheme, host, port, target, authority)

    def with_target(self, target: str) -> Endpoint:
        return Endpoint(self.url, self.scheme, self.host, self.port, target, self.authority)


class _Answer:
    """What httptools reports of the answers on one connection (its callbacks).

    ``status`` is set when a final answer (not 1xx) is complete, with
    ``keep_alive`` as the server and the HTTP version allow; ``head_status`` as
    soon as an answer's head is read, and ``framed`` if the head gave the
    body's length or chunks (an answer without either ends when the server
    closes).  Bytes after the final answer (an answer nobody asked for) set
    ``extra``: the connection is not reused then.
    """

    __slots__ = ("extra", "framed", "head_status", "keep_alive", "parser", "status")

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status: int | None = None
        self.head_status: int | None = None
        self.framed = False
        self.keep_alive = False
        self.extra = False

    def on_message_begin(self) -> None:
        if self.status is not None:
            self.extra = True
        self.framed = False

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) in (14, 17) and name.lower() in (b"content-length", b"transfer-encoding"):
            self.framed = True

    def on_headers_complete(self) -> None:
        self.head_status = self.parser.get_status_code()

    def on_message_complete(self) -> None:
        status = self.parser.get_status_code()
        if status >= 200 and self.status is None:
            self.status = status
            self.keep_alive = self.parser.should_keep_alive()


class HTTPConnection:
    """One keep-alive connection to one endpoint's host, used by one task at a time."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        connect_timeout: float,
        request_timeout: float | None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """``request_timeout`` bounds each :meth:`request` (connecting included);
        None leaves timing requests out to the caller (``to-http`` cancels the
        requests that outlive it from one task)."""
        self.endpoint = endpoint
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self._ssl_context = ssl_context
        self._stream: trio.abc.Stream | _PlainSocket | None = None
        self._answer: _Answer | None = None
        #: request heads written, by (method, target, headers' id, body size)
        self._heads: dict[tuple[str, str, int, int], bytes] = {}
        #: the header lists those ids belong to (an id is reused once freed)
        self._heads_of: dict[int, list[tuple[str, str]]] = {}

    @property
    def connected(self) -> bool:
        """Whether a connection is open (the next request reuses it)."""
        return self._stream is not None

    async def _connect(self) -> None:
        endpoint = self.endpoint
        try:
            with trio.fail_after(self.connect_timeout):
                tcp = await trio.open_tcp_stream(endpoint.host, endpoint.port)  # TCP_NODELAY
                stream: trio.abc.Stream | _PlainSocket
                if endpoint.scheme == "https":
                    context = self._ssl_context or ssl.create_default_context()
                    # https_compatible: an end without TLS's close_notify is an
                    # end (HTTPS servers often close so; a body until the end
                    # is complete then, as browsers and Go take it).
                    tls = trio.SSLStream(
                        tcp, context, server_hostname=endpoint.host, https_compatible=True
                    )
                    await tls.do_handshake()
                    stream = tls
                else:
                    plain = socket.socket(fileno=tcp.socket.detach())
                    plain.setblocking(False)
                    stream = _PlainSocket(plain)
        except trio.TooSlowError:
            raise HTTPError(f"connect to {endpoint.authority}: timed out") from None
        except (OSError, trio.BrokenResourceError, ssl.SSLError) as exc:
            raise HTTPError(f"connect to {endpoint.authority}: {reason(exc)}") from None
        self._stream = stream
        self._answer = _Answer()

    async def request(
        self,
        method: str,
        target: str,
        headers: list[tuple[str, str]],
        body: bytes = b"",
    ) -> int:
        """Send one request and read its whole answer; returns the status code.

        Raises :class:`HTTPError` when there is no answer; the connection is
        then closed (the next request opens a new one), or before anything
        is sent for a method, target or header h11 refuses.
        """
        head = self._head(method, target, headers, len(body))
        data = head + body if body else head
        try:
            if self.request_timeout is None:
                return await self._send(data)
            # A plain CancelScope with a deadline (trio.fail_after's context
            # manager costs a generator per request); reaching its end means
            # the deadline cut the request off.
            with trio.CancelScope(deadline=trio.current_time() + self.request_timeout):
                return await self._send(data)
            await self.aclose()
            raise HTTPError(f"request to {self.endpoint.authority}: timed out")
        except _StaleConnection:
            await self.aclose()
            raise HTTPError("server closed the connection") from None
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError) as exc:
            await self.aclose()
            raise HTTPError(f"request to {self.endpoint.authority}: {exc}") from None
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            await self.aclose()
            raise HTTPError(f"request to {self.endpoint.authority}: bad response: {exc}") from None
        except BaseException:
            await self.aclose()  # cancelled mid-request: the connection is unusable
            raise

    async def _send(self, data: bytes) -> int:
        reused = self._stream is not None
        if not reused:
            await self._connect()
        try:
            return await self._exchange(data)
        except _StaleConnection:
            if not reused:
                raise HTTPError("server closed the connection") from None
            # The server dropped the idle connection before reading the
            # request: once more, on a new one.
            await self._connect()
            return await self._exchange(data)

    def _head(self, method: str, target: str, headers: list[tuple[str, str]], size: int) -> bytes:
        """The request's head, as h11 writes it (checking every part)."""
        key = (method, target, id(headers), size)
        head = self._heads.get(key)
        if head is not None and self._heads_of.get(id(headers)) is headers:
            return head
        # Imported here, by the first head written: a few ms less of the
        # start-up that every run of the tool pays.
        import h11

        all_headers = [("Host", self.endpoint.authority), *headers]
        if method != "GET" or size:
            all_headers.append(("Content-Length", str(size)))
        try:
            head = h11.Connection(h11.CLIENT).send(
                h11.Request(method=method, target=target, headers=all_headers)
            )
        except h11.LocalProtocolError as exc:
            raise HTTPError(f"bad request: {exc}") from None
        assert head is not None
        if len(self._heads) >= _HEADS:
            self._heads.clear()
            self._heads_of.clear()
        self._heads[key] = head
        self._heads_of[id(headers)] = headers
        return head

    async def _exchange(self, data: bytes) -> int:
        stream, answer = self._stream, self._answer
        assert stream is not None and answer is not None
        try:
            await stream.send_all(data)
        except (trio.BrokenResourceError, OSError):
            raise _StaleConnection from None
        answer.status = answer.head_status = None
        feed = answer.parser.feed_data
        answered = False
        while answer.status is None:
            try:
                chunk = await stream.receive_some(_RECEIVE_SIZE)
            except (OSError, trio.BrokenResourceError):
                if answered:
                    raise
                # Reset before answering: a server that had closed the idle
                # connection resets it when the request comes (or had closed
                # it with the request unread).
                raise _StaleConnection from None
            if not chunk:
                if not answered:
                    raise _StaleConnection
                head_status = answer.head_status
                if head_status is not None and head_status >= 200 and not answer.framed:
                    # An answer without a length: its body ended with the connection.
                    await self.aclose()
                    return head_status
                raise HTTPError("server closed the connection mid-answer")
            answered = True
            feed(chunk)
        if not answer.keep_alive or answer.extra:
            await self.aclose()  # the server asked to close (or HTTP/1.0)
        return answer.status

    async def aclose(self) -> None:
        stream, self._stream, self._answer = self._stream, None, None
        if isinstance(stream, _PlainSocket):
            stream.close()
        elif stream is not None:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)


class _StaleConnection(Exception):
    """The server closed the connection before answering anything."""
