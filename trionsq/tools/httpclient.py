"""A lean keep-alive HTTP/1.1 client for ``to-http``: h11 on one Trio stream.

``to-http`` sends small requests as fast as nsqd hands out messages, from
``-n`` concurrent workers; each worker owns one :class:`HTTPConnection` per
endpoint and reuses it, so no pool is shared and nothing waits for a
connection.  (A general client's pool, per-request objects and middleware cost
several times what the request itself does here; its pool also slows down
sharply with thousands of waiting requests.)  h11 does the protocol; this
module adds connecting (TCP or TLS), timeouts, keep-alive and one retry of a
reused connection that the server had already closed.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

import h11
import trio

__all__ = ["Endpoint", "HTTPConnection", "HTTPError"]

_RECEIVE_SIZE = 64 * 1024
#: request heads kept per connection (see HTTPConnection._exchange)
_HEADS = 64
_END = h11.EndOfMessage()


class HTTPError(Exception):
    """A request that got no answer (connection, timeout, protocol)."""


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


class HTTPConnection:
    """One keep-alive connection to one endpoint's host, used by one task at a time."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        connect_timeout: float,
        request_timeout: float,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self._ssl_context = ssl_context
        self._stream: trio.abc.Stream | None = None
        self._h11: h11.Connection | None = None
        #: request heads built, by (method, target, headers' id, body size)
        self._heads: dict[tuple[str, str, int, int], h11.Request] = {}
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
                stream: trio.abc.Stream = await trio.open_tcp_stream(endpoint.host, endpoint.port)
                if endpoint.scheme == "https":
                    context = self._ssl_context or ssl.create_default_context()
                    tls = trio.SSLStream(stream, context, server_hostname=endpoint.host)
                    await tls.do_handshake()
                    stream = tls
        except trio.TooSlowError:
            raise HTTPError(f"connect to {endpoint.authority}: timed out") from None
        except (OSError, trio.BrokenResourceError, ssl.SSLError) as exc:
            raise HTTPError(f"connect to {endpoint.authority}: {exc}") from None
        self._stream = stream
        self._h11 = h11.Connection(h11.CLIENT)

    async def request(
        self,
        method: str,
        target: str,
        headers: list[tuple[str, str]],
        body: bytes = b"",
    ) -> int:
        """Send one request and read its whole answer; returns the status code.

        Raises :class:`HTTPError` when there is no answer; the connection is
        then closed (the next request opens a new one).
        """
        reused = self._stream is not None
        try:
            # A plain CancelScope with a deadline (trio.fail_after's context
            # manager costs a generator per request); reaching its end means
            # the deadline cut the request off.
            with trio.CancelScope(deadline=trio.current_time() + self.request_timeout):
                if self._stream is None:
                    await self._connect()
                try:
                    return await self._exchange(method, target, headers, body)
                except _StaleConnection:
                    if not reused:
                        raise HTTPError("server closed the connection") from None
                    # The server dropped the idle connection before reading
                    # the request: once more, on a new one.
                    await self._connect()
                    return await self._exchange(method, target, headers, body)
            await self.aclose()
            raise HTTPError(f"request to {self.endpoint.authority}: timed out")
        except _StaleConnection:
            await self.aclose()
            raise HTTPError("server closed the connection") from None
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError) as exc:
            await self.aclose()
            raise HTTPError(f"request to {self.endpoint.authority}: {exc}") from None
        except h11.ProtocolError as exc:
            await self.aclose()
            raise HTTPError(f"request to {self.endpoint.authority}: bad response: {exc}") from None
        except BaseException:
            await self.aclose()  # cancelled mid-request: the connection is unusable
            raise

    async def _exchange(
        self, method: str, target: str, headers: list[tuple[str, str]], body: bytes
    ) -> int:
        stream, conn = self._stream, self._h11
        assert stream is not None and conn is not None
        # h11 validates a request's headers as it builds it: the same request
        # head (same method, target, headers and body size, as when posting
        # messages of one size) is built once and sent again.
        key = (method, target, id(headers), len(body))
        request = self._heads.get(key)
        if request is None or self._heads_of.get(id(headers)) is not headers:
            all_headers = [("Host", self.endpoint.authority), *headers]
            if method != "GET" or body:
                all_headers.append(("Content-Length", str(len(body))))
            request = h11.Request(method=method, target=target, headers=all_headers)
            if len(self._heads) >= _HEADS:
                self._heads.clear()
                self._heads_of.clear()
            self._heads[key] = request
            self._heads_of[id(headers)] = headers
        data = conn.send(request)
        if body:
            data += conn.send(h11.Data(data=body))
        data += conn.send(_END)
        try:
            await stream.send_all(data)
        except (trio.BrokenResourceError, OSError):
            raise _StaleConnection from None
        status = 0
        answered = False
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                chunk = await stream.receive_some(_RECEIVE_SIZE)
                if not chunk and not answered:
                    raise _StaleConnection
                conn.receive_data(bytes(chunk))
                continue
            answered = True
            if isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise HTTPError("server closed the connection mid-answer")
        if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
            conn.start_next_cycle()
        else:
            await self.aclose()  # the server asked to close (or HTTP/1.0)
        return status

    async def aclose(self) -> None:
        stream, self._stream, self._h11 = self._stream, None, None
        if stream is not None:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)


class _StaleConnection(Exception):
    """The server closed the connection before answering anything."""
