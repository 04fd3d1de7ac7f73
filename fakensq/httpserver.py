"""A small HTTP/1.1 server on Trio, with h11 doing all of the HTTP parsing.

fakensq's nsqd and nsqlookupd serve their HTTP APIs through it.  It knows nothing
of NSQ: a handler takes a :class:`Request` and returns a :class:`Response`.
Connections are kept alive, request bodies are bounded (413 past the limit), and
malformed requests get a 400 and a closed connection, as Go's net/http does.
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any
from urllib.parse import parse_qs, urlsplit

import h11
import trio

__all__ = ["Request", "Response", "Handler", "HTTPServer"]

log = logging.getLogger(__name__)

_READ_SIZE = 64 * 1024
_MAX_HEADER_SIZE = 1024 * 1024  # Go's http.DefaultMaxHeaderBytes


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes
    remote_addr: str
    tls: bool = False

    def arg(self, name: str, default: str | None = None) -> str | None:
        """The first value of query parameter ``name`` (Go's ``Query().Get``)."""
        values = self.query.get(name)
        return values[0] if values else default

    def has_arg(self, name: str) -> bool:
        return name in self.query


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def json(cls, obj: Any, status: int = 200) -> Response:
        body = json.dumps(obj, separators=(",", ":")).encode()
        return cls(status, body, [("Content-Type", "application/json; charset=utf-8")])

    @classmethod
    def text(cls, text: str | bytes, status: int = 200) -> Response:
        body = text.encode() if isinstance(text, str) else text
        return cls(status, body, [("Content-Type", "text/plain; charset=utf-8")])


Handler = Callable[[Request], Awaitable[Response]]


class HTTPServer:
    """Serves ``handler`` on one listener; start it with ``nursery.start(server.serve, ...)``."""

    def __init__(
        self,
        handler: Handler,
        *,
        max_body_size: int = 5 * 1024 * 1024,
        ssl_context: ssl.SSLContext | None = None,
        server_name: str | None = None,
    ) -> None:
        self.handler = handler
        self.max_body_size = max_body_size
        self.ssl_context = ssl_context
        self.server_name = server_name
        self.address: tuple[str, int] | None = None

    async def serve(
        self,
        host: str,
        port: int,
        *,
        task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen on ``host:port`` (port 0 picks a free one) and serve until cancelled.

        ``task_status.started`` is called once listening, with the bound address.
        """
        listeners = await trio.open_tcp_listeners(port, host=host)
        try:
            sockname = listeners[0].socket.getsockname()
            self.address = (sockname[0], sockname[1])
            async with trio.open_nursery() as nursery:
                for listener in listeners:
                    nursery.start_soon(self._accept_loop, listener, nursery)
                task_status.started(self.address)
        finally:
            for listener in listeners:
                await trio.aclose_forcefully(listener)

    async def _accept_loop(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:  # EMFILE and friends: back off, keep serving
                log.warning("accept failed: %s", exc)
                await trio.sleep(0.01)
                continue
            nursery.start_soon(self.handle_stream, stream)

    async def handle_stream(self, stream: trio.abc.Stream) -> None:
        """Serve HTTP on one connected stream until either side closes it."""
        remote = _remote_addr(stream)
        tls = False
        if self.ssl_context is not None:
            stream = trio.SSLStream(stream, self.ssl_context, server_side=True)
            tls = True
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_HEADER_SIZE)
        try:
            while True:
                request = await self._read_request(stream, conn, remote, tls)
                if request is None:
                    return
                if isinstance(request, Response):
                    await self._send(stream, conn, request, head=False)
                    return
                try:
                    response = await self.handler(request)
                except Exception:
                    log.exception("HTTP handler failed for %s %s", request.method, request.path)
                    response = Response.json({"message": "INTERNAL_ERROR"}, 500)
                await self._send(stream, conn, response, head=request.method == "HEAD")
                if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                    return
                try:
                    conn.start_next_cycle()
                except h11.LocalProtocolError:
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.LocalProtocolError):
            return
        except ssl.SSLError as exc:
            log.debug("TLS error from %s: %s", remote, exc)
        finally:
            await trio.aclose_forcefully(stream)

    async def _read_request(
        self, stream: trio.abc.Stream, conn: h11.Connection, remote: str, tls: bool
    ) -> Request | Response | None:
        """The next request, a Response to send before closing (bad request), or
        None when the client has gone."""
        head: h11.Request | None = None
        body = bytearray()
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    return Response.text(f"400 Bad Request: {exc}", exc.error_status_hint)
                return None
            if event is h11.NEED_DATA:
                try:
                    data = await stream.receive_some(_READ_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return None
                conn.receive_data(bytes(data))
                if not data and conn.their_state is h11.IDLE:
                    return None
                continue
            if isinstance(event, h11.Request):
                head = event
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > self.max_body_size:
                    return Response.json({"message": "MSG_TOO_BIG"}, 413)
            elif isinstance(event, h11.EndOfMessage):
                assert head is not None
                return _build_request(head, bytes(body), remote, tls)
            elif isinstance(event, h11.ConnectionClosed):
                return None

    async def _send(
        self, stream: trio.abc.Stream, conn: h11.Connection, response: Response, head: bool
    ) -> None:
        headers = [(k, v) for k, v in response.headers]
        names = {k.lower() for k, _ in headers}
        if "content-type" not in names:
            headers.append(("Content-Type", "text/plain; charset=utf-8"))
        headers.append(("Content-Length", str(len(response.body))))
        headers.append(("Date", formatdate(usegmt=True)))
        if self.server_name:
            headers.append(("Server", self.server_name))
        if conn.their_state is h11.ERROR or conn.their_state is h11.SEND_BODY:
            headers.append(("Connection", "close"))
        out = conn.send(h11.Response(status_code=response.status, headers=headers))
        if not head and response.body:
            out += conn.send(h11.Data(data=response.body))
        out += conn.send(h11.EndOfMessage())
        await stream.send_all(out)


def _build_request(head: h11.Request, body: bytes, remote: str, tls: bool) -> Request:
    target = head.target.decode("latin-1")
    parts = urlsplit(target)
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in head.headers}
    return Request(
        method=head.method.decode("ascii", "replace"),
        path=parts.path or "/",
        query=parse_qs(parts.query, keep_blank_values=True),
        headers=headers,
        body=body,
        remote_addr=remote,
        tls=tls,
    )


def _remote_addr(stream: trio.abc.Stream) -> str:
    sock = getattr(stream, "socket", None)
    if sock is None:
        return "127.0.0.1:0"
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return "127.0.0.1:0"
    return f"{host}:{port}"
