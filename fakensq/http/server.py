"""A small HTTP/1.1 server on Trio, with h11 doing all of the HTTP parsing.

fakensq's nsqd and nsqlookupd serve their HTTP APIs through it.  It knows nothing
of NSQ: a handler takes a :class:`Request` and returns a :class:`Response`.
Connections are kept alive, request bodies are bounded (413 past the limit), and
malformed requests get a 400 and a closed connection, as Go's net/http does.
"""

from __future__ import annotations

import logging
import math
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote_to_bytes

import h11
import trio

from ..golang import json as gojson
from ..golang.net import accept_forever
from ..golang.tlsconfig import HandshakeError, server_handshake

__all__ = ["Request", "Response", "Handler", "HTTPServer", "BodyLimit", "READ_ALL"]

log = logging.getLogger(__name__)

# What Go's server answers, and when (tlsRecordHeaderLooksLikeHTTP), to plain
# HTTP on an HTTPS port.
_HTTP_STARTS = (b"GET /", b"HEAD ", b"POST ", b"PUT /", b"OPTIO")
_PLAIN_HTTP_ON_HTTPS = (
    b"HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n"
)

_READ_SIZE = 64 * 1024
# Go's http.DefaultMaxHeaderBytes, and the 4096 bytes its server adds: a
# request line and headers of more bytes than that get a 431.
_MAX_HEAD = 1024 * 1024 + 4096
# Go's maxPostHandlerReadBytes: what its server reads of a body a handler left
# unread, before it answers, to keep the connection; past that it closes.
_MAX_POST_HANDLER_READ = 256 * 1024


@dataclass
class Request:
    """One request, as Go's ``net/http`` gives it to a handler.

    ``path`` is unescaped (Go's ``URL.Path``); ``query`` holds the pairs Go's
    ``URL.Query()`` keeps, and ``query_error`` is the error ``url.ParseQuery``
    reports for the raw query (a bad escape, a semicolon), or ``None``.
    ``body`` stops after the server's ``max_body_size`` (Go's handlers read
    through a ``LimitReader`` of their own bound).  ``params`` are the route's
    ``:name`` segments (:mod:`fakensq.http.router`).  ``peer_gone`` is set when the
    client closes its end while the handler runs (Go's ``r.Context().Done()``):
    a handler that waits (a profile) stops then; the others answer as usual.
    """

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes
    remote_addr: str
    tls: bool = False
    raw_query: str = ""
    query_error: str | None = None
    params: dict[str, str] = field(default_factory=dict)
    peer_gone: trio.Event = field(default_factory=trio.Event)

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
        """``obj`` as Go's ``json.Marshal`` writes it (:mod:`fakensq.golang.json`)."""
        return cls(status, gojson.dumps(obj), [("Content-Type", "application/json; charset=utf-8")])

    @classmethod
    def text(cls, text: str | bytes, status: int = 200) -> Response:
        body = text.encode() if isinstance(text, str) else text
        return cls(status, body, [("Content-Type", "text/plain; charset=utf-8")])


Handler = Callable[[Request], Awaitable[Response]]
#: How much of a request's body its handler reads (given the request's head):
#: a number of bytes, or :data:`READ_ALL`.
BodyLimit = Callable[[Request], int]
#: A handler that reads the whole body, however long (Go's io.ReadAll, as
#: nsqd's NewReqParams does): the server reads it to its end before the
#: handler runs, keeping max_body_size bytes of it.
READ_ALL = -1


class HTTPServer:
    """Serves ``handler`` on one listener; start it with ``nursery.start(server.serve, ...)``."""

    def __init__(
        self,
        handler: Handler,
        *,
        max_body_size: int = 5 * 1024 * 1024,
        ssl_context: ssl.SSLContext | None = None,
        server_name: str | None = None,
        body_limit: BodyLimit | None = None,
    ) -> None:
        self.handler = handler
        self.max_body_size = max_body_size
        #: What of a body the handler for a request reads before it answers
        #: (Go's handlers read through an io.LimitReader, or not at all: then
        #: 0, or all of it: READ_ALL); the server reads that much, runs the
        #: handler, then treats the rest as Go's does (:meth:`_finish_body`).
        #: Default: READ_ALL.
        self.body_limit = body_limit
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
        sockname = listeners[0].socket.getsockname()
        self.address = (sockname[0], sockname[1])
        await self.serve_listeners(list(listeners), task_status=task_status)

    async def serve_listeners(
        self,
        listeners: list[trio.abc.Listener[trio.SocketStream]],
        *,
        task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve on listeners already open (TCP or Unix sockets) until cancelled;
        they are closed at the end."""
        try:
            async with trio.open_nursery() as nursery:
                for listener in listeners:
                    nursery.start_soon(
                        accept_forever, listener, self.handle_stream, nursery, _accept_failed
                    )
                task_status.started(self.address or ("", 0))
        finally:
            for listener in listeners:
                await trio.aclose_forcefully(listener)

    async def handle_stream(self, stream: trio.abc.Stream) -> None:
        """Serve HTTP on one connected stream until either side closes it."""
        remote = _remote_addr(stream)
        tls = False
        if self.ssl_context is not None:
            try:
                # (a refused client gets the alert Go would send, not a bare EOF;
                # Go's server has no handshake deadline)
                stream = await server_handshake(stream, self.ssl_context, limit=math.inf)
            except HandshakeError as exc:
                if exc.head.startswith(_HTTP_STARTS):
                    # Go's answer to plain HTTP on its HTTPS port.
                    with trio.move_on_after(1):
                        try:
                            await stream.send_all(_PLAIN_HTTP_ON_HTTPS)
                        except (trio.BrokenResourceError, trio.ClosedResourceError):
                            pass
                await trio.aclose_forcefully(stream)
                return
            tls = True
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=2 * _MAX_HEAD)
        try:
            while True:
                try:
                    read = await self._read_request(stream, conn, remote, tls)
                except BadRequest as exc:
                    await stream.send_all(exc.raw_response())
                    await _close_write_and_wait(stream)
                    return
                if read is None:
                    return
                request, unread = read
                if request.method == "OPTIONS" and request.path == "*":
                    # Go's server answers "OPTIONS *" itself.
                    response = Response(200, b"", [])
                else:
                    response = await self._handle(stream, conn, request, watch=unread is None)
                if unread is not None:
                    # (h11 adds "Connection: close" when the body is left unread)
                    await self._finish_body(stream, conn, unread)
                if request.method == "CONNECT":
                    # Go's server closes a connection after a CONNECT it answered.
                    response.headers.append(("Connection", "close"))
                await self._send(stream, conn, response, head=request.method == "HEAD")
                if request.peer_gone.is_set():
                    return  # (the client closed its end: no next request)
                if conn.their_state is h11.SEND_BODY:
                    # A body left unread: what follows is none of ours.
                    await _close_write_and_wait(stream)
                    return
                if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                    return
                try:
                    conn.start_next_cycle()
                except h11.LocalProtocolError:
                    return
        except (
            trio.BrokenResourceError,
            trio.ClosedResourceError,
            h11.LocalProtocolError,
            _CloseAfterResponse,
        ):
            return
        except ssl.SSLError as exc:
            log.debug("TLS error from %s: %s", remote, exc)
        finally:
            await trio.aclose_forcefully(stream)

    async def _handle(
        self, stream: trio.abc.Stream, conn: h11.Connection, request: Request, *, watch: bool
    ) -> Response:
        """The handler's answer, the peer watched meanwhile.

        As Go's server does once a request is read, one read waits in the
        background: EOF (or a broken connection) sets ``request.peer_gone``;
        bytes (a pipelined request) go to h11 for the next cycle and the watch
        ends there, as Go's stops at the first byte.
        """

        async def watch_peer() -> None:
            try:
                data = await stream.receive_some(_READ_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError):
                data = b""
            if data:
                conn.receive_data(bytes(data))
            else:
                request.peer_gone.set()

        async with trio.open_nursery() as nursery:
            if watch:  # (Go's starts once the body is read: never, for a body left unread)
                nursery.start_soon(watch_peer)
            try:
                return await self.handler(request)
            except Exception:
                log.exception("HTTP handler failed for %s %s", request.method, request.path)
                return Response.json({"message": "INTERNAL_ERROR"}, 500)
            finally:
                nursery.cancel_scope.cancel()

    async def _receive(self, stream: trio.abc.Stream, conn: h11.Connection) -> bool:
        """Feed h11 one read; False at EOF or a broken connection while no
        request has begun (h11 is told of the EOF either way)."""
        try:
            data = await stream.receive_some(_READ_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        if not data and conn.their_state is h11.IDLE:
            return False
        conn.receive_data(bytes(data))
        return True

    async def _next_event(self, stream: trio.abc.Stream, conn: h11.Connection) -> Any:
        """h11's next event, reading as it needs (ConnectionClosed at EOF or a
        broken connection)."""
        while True:
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            if not await self._receive(stream, conn):
                return h11.ConnectionClosed()

    async def _read_head(self, stream: trio.abc.Stream, conn: h11.Connection) -> Any:
        """The request's head (or ConnectionClosed), its size bounded as Go
        bounds it: more than _MAX_HEAD bytes of request line and headers (the
        blank line included) get a 431, however the bytes were cut."""
        held = len(conn.trailing_data[0])  # (bytes of it already here: pipelined)
        fed = 0
        while True:
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                if isinstance(event, h11.Request):
                    if held + fed - len(conn.trailing_data[0]) > _MAX_HEAD:
                        raise BadRequest("431 Request Header Fields Too Large")
                return event
            if len(conn.trailing_data[0]) > _MAX_HEAD:
                raise BadRequest("431 Request Header Fields Too Large")
            before = len(conn.trailing_data[0])
            if not await self._receive(stream, conn):
                return h11.ConnectionClosed()
            fed += len(conn.trailing_data[0]) - before

    async def _read_request(
        self, stream: trio.abc.Stream, conn: h11.Connection, remote: str, tls: bool
    ) -> tuple[Request, int | None] | None:
        """The next request, and None when its body was read whole, else how
        much of it is left (-1: unknown, chunked); None when the client has
        gone.  Raises :class:`BadRequest` for a request Go's server would
        refuse.  The body is read as far as the handler reads it
        (:attr:`body_limit`), as Go's server runs a handler once the head is
        read."""
        try:
            head = await self._read_head(stream, conn)
        except h11.RemoteProtocolError as exc:
            raise BadRequest.from_h11(exc) from None
        if not isinstance(head, h11.Request):
            return None
        request = _build_request(head, b"", remote, tls)
        limit = READ_ALL if self.body_limit is None else self.body_limit(request)
        # Read up to ``stop`` before the handler runs; keep ``keep`` of it.
        stop = math.inf if limit == READ_ALL else limit
        keep = self.max_body_size if limit == READ_ALL else limit
        body = bytearray()
        while True:
            try:
                if len(body) >= stop:
                    # The handler's share is here: what h11 holds already,
                    # without reading more (the end of the body, maybe).
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        length = request.headers.get("content-length", "")
                        request.body = bytes(body)
                        return request, int(length) - len(body) if length.isdigit() else -1
                else:
                    event = await self._next_event(stream, conn)
            except h11.RemoteProtocolError as exc:
                raise BadRequest.from_h11(exc) from None
            if isinstance(event, h11.Data):
                # Keep what the handler reads; the rest is dropped, as Go's
                # server discards an unread body.
                room = keep - len(body)
                if room > 0:
                    body += event.data[:room]
            elif isinstance(event, h11.EndOfMessage):
                request.body = bytes(body)
                return request, None
            else:  # ConnectionClosed: gone in the middle of the body
                return None

    async def _finish_body(self, stream: trio.abc.Stream, conn: h11.Connection, left: int) -> None:
        """What Go's server does with a body its handler left unread, before
        it answers: more than _MAX_POST_HANDLER_READ left (by Content-Length),
        nothing; else it reads and drops up to that much more, and the
        connection goes on if the body ended there.  Otherwise h11 still
        expects the body, and the answer closes the connection."""
        if left >= _MAX_POST_HANDLER_READ:
            return
        budget = _MAX_POST_HANDLER_READ + 1
        while budget > 0:
            try:
                event = await self._next_event(stream, conn)
            except h11.RemoteProtocolError:
                return
            if isinstance(event, h11.Data):
                budget -= len(event.data)
            else:
                return  # the end of the body (or of the connection)

    async def _send(
        self, stream: trio.abc.Stream, conn: h11.Connection, response: Response, head: bool
    ) -> None:
        headers = [(k, v) for k, v in response.headers]
        names = {k.lower() for k, _ in headers}
        if "content-type" not in names and response.body:
            # Go sniffs the type of a body written without one; none for no body.
            headers.append(("Content-Type", _sniff(response.body)))
        # An empty Content-Type means "send none" (Go sends none for a body
        # written through a compressing writer after the headers).
        headers = [(k, v) for k, v in headers if v or k.lower() != "content-type"]
        headers.append(("Content-Length", str(len(response.body))))
        headers.append(("Date", formatdate(usegmt=True)))
        if self.server_name:
            headers.append(("Server", self.server_name))
        if conn.their_state is h11.ERROR or conn.their_state is h11.SEND_BODY:
            headers.append(("Connection", "close"))
        # The reason phrase Go's net/http sends ("404 Not Found"): Go clients show it.
        reason = _REASONS.get(response.status, b"")
        if conn.their_http_version == b"1.0":
            # Go answers an HTTP/1.0 request in HTTP/1.0, with no Connection
            # header, and closes; h11 would answer in 1.1 with one.
            lines = [f"HTTP/1.0 {response.status} {reason.decode()}"]
            lines += [f"{name}: {value}" for name, value in headers]
            data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
            await stream.send_all(data + (b"" if head else response.body))
            raise _CloseAfterResponse()
        out = conn.send(h11.Response(status_code=response.status, headers=headers, reason=reason))
        if not head and response.body:
            out += conn.send(h11.Data(data=response.body))
        out += conn.send(h11.EndOfMessage())
        await stream.send_all(out)


#: Go's rstAvoidanceDelay: how long its server waits, its sending side shut,
#: before it closes a connection whose peer may still be sending.
_RST_AVOIDANCE_DELAY = 0.5


async def _close_write_and_wait(stream: trio.abc.Stream) -> None:
    """Go's closeWriteAndWait: shut the sending side after an answer to a
    peer that may still be sending (a refused head, a body left unread), and
    give the peer a moment to read it; closing at once with its bytes unread
    resets the connection, and the peer loses the answer.  What it sends
    meanwhile is read and dropped."""
    if not isinstance(stream, trio.SocketStream):
        return
    try:
        await stream.send_eof()
        with trio.move_on_after(_RST_AVOIDANCE_DELAY):
            while await stream.receive_some(_READ_SIZE):
                pass
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass


class _CloseAfterResponse(Exception):
    """The response is written; close the connection."""


class BadRequest(Exception):
    """A request Go's server refuses before any handler sees it; it writes a
    bare answer (no Date, no length) and closes the connection."""

    def __init__(self, status: str = "400 Bad Request", detail: str = "") -> None:
        super().__init__(status)
        self.status = status
        self.detail = detail

    @classmethod
    def from_h11(cls, exc: h11.RemoteProtocolError) -> BadRequest:
        text = str(exc).lower()
        if exc.error_status_hint == 431 or "too long" in text or "too large" in text:
            return cls("431 Request Header Fields Too Large")
        if "host" in text:
            return cls(detail="missing required Host header")
        return cls()

    def raw_response(self) -> bytes:
        text = self.status + (f": {self.detail}" if self.detail else "")
        return (
            f"HTTP/1.1 {text}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Connection: close\r\n\r\n{text}"
        ).encode()


def _build_request(head: h11.Request, body: bytes, remote: str, tls: bool) -> Request:
    target = head.target.decode("latin-1")
    raw_path, _, raw_query = target.partition("?")
    if "://" in raw_path:  # an absolute-form target: keep its path
        raw_path = "/" + raw_path.split("://", 1)[1].partition("/")[2]
    elif not raw_path.startswith("/") and raw_path != "*":
        raise BadRequest()
    try:
        path = _go_unescape(raw_path, plus=False)
    except ValueError:
        raise BadRequest() from None
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in head.headers}
    query, query_error = parse_go_query(raw_query)
    return Request(
        method=head.method.decode("ascii", "replace"),
        path=path,
        query=query,
        headers=headers,
        body=body,
        remote_addr=remote,
        tls=tls,
        raw_query=raw_query,
        query_error=query_error,
    )


_HEX = set("0123456789abcdefABCDEF")


def _go_unescape(text: str, *, plus: bool) -> str:
    """url.PathUnescape (``plus`` False) or url.QueryUnescape; ValueError (Go's
    message) on a bad ``%`` escape.  Invalid UTF-8 stays as surrogate escapes."""
    i = text.find("%")
    while i >= 0:
        escape = text[i + 1 : i + 3]
        if len(escape) < 2 or not set(escape) <= _HEX:
            raise ValueError(f'invalid URL escape "{text[i : i + 3]}"')
        i = text.find("%", i + 3)
    if plus:
        text = text.replace("+", " ")
    return unquote_to_bytes(text).decode("utf-8", "surrogateescape")


def parse_go_query(raw: str) -> tuple[dict[str, list[str]], str | None]:
    """Go's ``url.ParseQuery``: the pairs it keeps, and its first error.

    Pairs are split on ``&``; a pair holding ``;`` or a bad escape is dropped
    (and reported), as Go does since 1.17.
    """
    query: dict[str, list[str]] = {}
    error: str | None = None
    for pair in raw.split("&"):
        if not pair:
            continue
        if ";" in pair:
            error = error or "invalid semicolon separator in query"
            continue
        key, _, value = pair.partition("=")
        try:
            key = _go_unescape(key, plus=True)
            value = _go_unescape(value, plus=True)
        except ValueError as exc:
            error = error or str(exc)
            continue
        query.setdefault(key, []).append(value)
    return query, error


_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}


def _sniff(body: bytes) -> str:
    """Go's DetectContentType for the bodies fakensq writes without a type."""
    head = body[:512].lstrip(b"\t\n\x0c\r ")
    if head[:1] == b"<" and head[:14].lower().startswith((b"<!doctype html", b"<html", b"<a ")):
        return "text/html; charset=utf-8"
    if b"\x00" in body[:512]:
        return "application/octet-stream"
    return "text/plain; charset=utf-8"


def _accept_failed(exc: OSError) -> None:
    log.warning("accept failed: %s", exc)


def _remote_addr(stream: trio.abc.Stream) -> str:
    sock = getattr(stream, "socket", None)
    if sock is None:
        return "127.0.0.1:0"
    try:
        peer = sock.getpeername()
    except OSError:
        return "127.0.0.1:0"
    if not isinstance(peer, tuple):
        return "@"  # a Unix socket's client, as Go names it
    return f"{peer[0]}:{peer[1]}"
