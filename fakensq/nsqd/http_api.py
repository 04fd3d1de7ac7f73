"""nsqd's HTTP API (v1.3.0), served by :mod:`fakensq.http.server`.

Routes, answers and error codes are nsqd v1.3.0's (its ``http.go`` through
``httprouter``, :mod:`fakensq.http.router`):

- 200 bodies as ``http_api.RespondV1`` writes them: strings as they are
  (``OK``), documents as JSON, nothing as an empty body; errors as
  ``{"message": "CODE"}``; every answer but ``/ping`` and ``/debug/pprof/*``
  carries ``X-NSQ-Content-Type: nsq; version=1.0``;
- the handlers' order of checks is nsqd's, so that the first error a request
  has is the one reported (a bad query string is ``INVALID_REQUEST`` before a
  missing topic; ``/pub``'s size is checked before its topic);
- the aliases older nsqds served (``/put``, ``/mput``, ``/create_topic``, ...)
  answer 404 as in v1.3.0, unless the ``legacy_http_aliases`` option asks for them;
- ``/debug/pprof/*``, ``/debug/freememory`` and ``/debug/setblockrate`` exist
  with nsqd's methods and status codes (:mod:`fakensq.http.pprof`).
"""

from __future__ import annotations

import gc
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from trionsq.protocol.frames import SIZE
from trionsq.protocol.names import is_valid_channel_name, is_valid_topic_name

from ..golang.lg import LOG_LEVELS
from ..http import pprof
from ..http.router import Router
from ..http.server import READ_ALL, HTTPServer, Request, Response
from .flags import TLS_VERSIONS, nsqd_cfg_fields
from .options import TLS_REQUIRED, VERSION
from .persist import write_metadata
from .stats import format_text_stats
from .statsd import statsd_prefix

if TYPE_CHECKING:
    from .channel import Channel
    from .node import NSQD
    from .topic import Topic

__all__ = ["NSQDHTTP", "LEGACY_ALIASES", "config_value"]

_V1_HEADER = ("X-NSQ-Content-Type", "nsq; version=1.0")
_BOOL_PARAMS = {"true": True, "1": True, "false": False, "0": False}


#: The endpoints nsqd v1.3.0 removed -> the one each stood for (served only with
#: the ``legacy_http_aliases`` option).
LEGACY_ALIASES: dict[str, str] = {
    "/put": "/pub",
    "/mput": "/mpub",
    "/create_topic": "/topic/create",
    "/delete_topic": "/topic/delete",
    "/empty_topic": "/topic/empty",
    "/pause_topic": "/topic/pause",
    "/unpause_topic": "/topic/unpause",
    "/create_channel": "/channel/create",
    "/delete_channel": "/channel/delete",
    "/empty_channel": "/channel/empty",
    "/pause_channel": "/channel/pause",
    "/unpause_channel": "/channel/unpause",
}


class HTTPError(Exception):
    """``http_api.Err``: answered as ``{"message": message}`` with ``status``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class AsJSON:
    """A value RespondV1 writes as JSON whatever it is: Go's typed nil (a nil
    ``[]string`` is ``null``, where a nil interface is an empty body)."""

    def __init__(self, value: Any) -> None:
        self.value = value


def respond_v1(status: int, data: Any = None) -> Response:
    """``http_api.RespondV1``: a 200's string or bytes as they are, ``None``
    empty, anything else JSON; an error's text as ``{"message": ...}``."""
    if status != 200:
        resp = Response.json({"message": str(data)}, status)
    elif isinstance(data, AsJSON):
        resp = Response.json(data.value)
    elif data is None:
        resp = Response(200, b"", [])
    elif isinstance(data, (str, bytes)):
        resp = Response(200, data.encode() if isinstance(data, str) else data, [])
    else:
        resp = Response.json(data)
    resp.headers.append(_V1_HEADER)
    return resp


def _plain_text(status: int, text: str) -> Response:
    # http_api.PlainText: no V1 header; the type is sniffed from the body.
    return Response(status, text.encode(), [])


Handler = Callable[[Request], Awaitable[Response]]


def _v1(handler: Callable[[Request], Awaitable[Any]]) -> Handler:
    """Decorate with ``http_api.V1``: the handler's value or HTTPError, answered."""

    async def decorated(request: Request) -> Response:
        try:
            return respond_v1(200, await handler(request))
        except HTTPError as exc:
            return respond_v1(exc.status, exc.message)

    return decorated


def _query_params(request: Request) -> dict[str, list[str]]:
    """``url.ParseQuery`` of the raw query, or INVALID_REQUEST (nsqd logs it)."""
    if request.query_error is not None:
        raise HTTPError(400, "INVALID_REQUEST")
    return request.query


def _get(params: dict[str, list[str]], name: str) -> str | None:
    """``ReqParams.Get``: the first value, None when the key is absent."""
    values = params.get(name)
    return values[0] if values else None


def _wrap_int64(value: int) -> int:
    """Go's silent int64 overflow."""
    return (value + (1 << 63)) % (1 << 64) - (1 << 63)


#: nsqd v1.3.0's routes whose handlers read the whole body (NewReqParams).
_READS_WHOLE_BODY = {
    ("GET", "/stats"),
    *(
        ("POST", f"/{kind}/{verb}")
        for kind in ("topic", "channel")
        for verb in ("delete", "empty", "pause", "unpause")
    ),
    ("POST", "/channel/create"),
    ("POST", "/debug/pprof/symbol"),
}


class NSQDHTTP:
    """The nsqd HTTP handler; ``.server`` is the :class:`HTTPServer` to run."""

    def __init__(self, nsqd: NSQD, *, tls: bool) -> None:
        self.nsqd = nsqd
        self.tls = tls
        opts = nsqd.options
        self.server = HTTPServer(
            self.handle,
            # Room for the largest body a handler reads (mpub's), plus the byte
            # that tells "too big".
            max_body_size=max(opts.max_body_size, opts.max_msg_size) + 1,
            ssl_context=nsqd.tls_context if tls else None,
            body_limit=self._body_limit,
        )
        self.router = Router(
            not_found=lambda _request: respond_v1(404, "NOT_FOUND"),
            method_not_allowed=lambda _request: respond_v1(405, "METHOD_NOT_ALLOWED"),
        )
        add = self.router.add
        add("GET", "/ping", self.ping)
        add("GET", "/info", _v1(self.info))
        add("POST", "/pub", _v1(self.pub))
        add("POST", "/mpub", _v1(self.mpub))
        add("GET", "/stats", _v1(self.stats))
        add("POST", "/topic/create", _v1(self.topic_create))
        add("POST", "/topic/delete", _v1(self.topic_delete))
        add("POST", "/topic/empty", _v1(self.topic_empty))
        add("POST", "/topic/pause", _v1(self.topic_pause))
        add("POST", "/topic/unpause", _v1(self.topic_pause))
        add("POST", "/channel/create", _v1(self.channel_create))
        add("POST", "/channel/delete", _v1(self.channel_delete))
        add("POST", "/channel/empty", _v1(self.channel_empty))
        add("POST", "/channel/pause", _v1(self.channel_pause))
        add("POST", "/channel/unpause", _v1(self.channel_pause))
        pprof.add_routes(add, index="/debug/pprof/")
        add("PUT", "/debug/setblockrate", self.set_block_rate)
        add("POST", "/debug/freememory", self.free_memory)
        add("PUT", "/config/:opt", _v1(self.config))
        add("GET", "/config/:opt", _v1(self.config))
        if opts.legacy_http_aliases:
            routes = {route.pattern: route for route in self.router.routes()}
            for alias, path in LEGACY_ALIASES.items():
                route = routes[path]
                add(route.method, alias, route.handler)

    async def handle(self, request: Request) -> Response:
        nsqd = self.nsqd
        if not self.tls and nsqd.options.tls_required == TLS_REQUIRED:
            # nsqd's HTTP listener, with --tls-required=true, answers every
            # request so (its httpServer.ServeHTTP), before routing.
            port = nsqd.https_address.rpartition(":")[2] or "0"
            body = f'{{"message": "TLS_REQUIRED", "https_port": {port}}}'.encode()
            return Response(
                403, body, [("Content-Type", "application/json; charset=utf-8"), _V1_HEADER]
            )
        return await self.router.handle(request)

    # --- helpers ---

    async def _topic_from_query(self, request: Request) -> tuple[dict[str, list[str]], Topic]:
        """getTopicFromQuery: the params and the topic, created when new (with
        the channels nsqlookupd knows of, before the answer)."""
        params = _query_params(request)
        name = _get(params, "topic")
        if name is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if not is_valid_topic_name(name):
            raise HTTPError(400, "INVALID_TOPIC")
        return params, await self.nsqd.open_topic(name)

    def _existing_topic_from_query(self, request: Request) -> tuple[Topic, str]:
        """getExistingTopicFromQuery: GetTopicChannelArgs, then the topic must exist."""
        params = _query_params(request)
        topic = _get(params, "topic")
        if topic is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if not is_valid_topic_name(topic):
            raise HTTPError(400, "INVALID_ARG_TOPIC")
        channel = _get(params, "channel")
        if channel is None:
            raise HTTPError(400, "MISSING_ARG_CHANNEL")
        if not is_valid_channel_name(channel):
            raise HTTPError(400, "INVALID_ARG_CHANNEL")
        found = self.nsqd.get_existing_topic(topic)
        if found is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        return found, channel

    def _existing_channel(self, request: Request) -> Channel:
        topic, name = self._existing_topic_from_query(request)
        channel = topic.channels.get(name)
        if channel is None:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        return channel

    def _persist_metadata(self) -> None:
        # nsqd persists its metadata right after a pause or unpause, so that a
        # node that dies keeps the flag.
        data_path = self.nsqd.options.data_path
        if data_path and self.nsqd.running:
            try:
                write_metadata(self.nsqd, data_path)
            except OSError as exc:
                raise HTTPError(500, "INTERNAL_ERROR") from exc

    @staticmethod
    def _content_length(request: Request) -> int:
        """The request's Content-Length, -1 when unknown (chunked)."""
        try:
            return int(request.headers.get("content-length", "-1"))
        except ValueError:
            return -1

    def _body_limit(self, request: Request) -> int:
        """What nsqd's handler of ``request`` reads of its body before it
        answers: /pub the largest message and one byte, /mpub the largest body
        and one, PUT /config the largest message and one (io.LimitReader), none
        where the Content-Length is refused first; the handlers that parse
        their parameters with NewReqParams all of it (io.ReadAll, unbounded in
        nsqd); the others none."""
        opts = self.nsqd.options
        path = request.path
        if opts.legacy_http_aliases:
            path = LEGACY_ALIASES.get(path, path)
        route = (request.method, path)
        if route == ("POST", "/pub"):
            too_big = self._content_length(request) > opts.max_msg_size
            return 0 if too_big else opts.max_msg_size + 1
        if route == ("POST", "/mpub"):
            too_big = self._content_length(request) > opts.max_body_size
            return 0 if too_big else opts.max_body_size + 1
        if request.method == "PUT" and path.startswith("/config/"):
            return opts.max_msg_size + 1
        if route in _READS_WHOLE_BODY:
            return READ_ALL
        return 0

    # --- handlers ---

    async def ping(self, request: Request) -> Response:
        # http_api.PlainText: no V1 header.
        nsqd = self.nsqd
        health = nsqd.health()
        return _plain_text(200 if health == "OK" else 500, health)

    async def info(self, request: Request) -> dict[str, Any]:
        nsqd = self.nsqd
        opts = nsqd.options
        return {
            "version": VERSION,
            "broadcast_address": opts.broadcast_address,
            "hostname": nsqd.hostname,
            "http_port": _port(nsqd.http_address),
            "tcp_port": _port(nsqd.tcp_address),
            "start_time": nsqd.start_time,
            "max_heartbeat_interval": round(opts.max_heartbeat_interval * 1e9),
            "max_output_buffer_size": opts.max_output_buffer_size,
            "max_output_buffer_timeout": round(opts.max_output_buffer_timeout * 1e9),
            "max_deflate_level": opts.max_deflate_level,
        }

    async def pub(self, request: Request) -> str:
        opts = self.nsqd.options
        if self._content_length(request) > opts.max_msg_size:
            raise HTTPError(413, "MSG_TOO_BIG")
        body = request.body[: opts.max_msg_size + 1]
        if len(body) > opts.max_msg_size:
            raise HTTPError(413, "MSG_TOO_BIG")
        if not body:
            raise HTTPError(400, "MSG_EMPTY")
        params, topic = await self._topic_from_query(request)
        defer = 0
        raw = _get(params, "defer")
        if raw is not None:
            try:
                ms = _go_parse_int(raw)
            except ValueError:
                raise HTTPError(400, "INVALID_DEFER") from None
            defer = _wrap_int64(ms * 1_000_000)  # time.Duration(ms) * time.Millisecond
            if defer < 0 or defer > round(opts.max_req_timeout * 1e9):
                raise HTTPError(400, "INVALID_DEFER")
        topic.put(topic.new_message(body, defer / 1e9))
        return "OK"

    async def mpub(self, request: Request) -> str:
        opts = self.nsqd.options
        if self._content_length(request) > opts.max_body_size:
            raise HTTPError(413, "BODY_TOO_BIG")
        params, topic = await self._topic_from_query(request)
        binary = False
        raw = _get(params, "binary")
        if raw is not None:
            # strconv.ParseBool; an unrecognized value counts as true (nsqd
            # logs it as deprecated).
            binary = _go_parse_bool(raw, default=True)
        if binary:
            bodies = _read_binary_mpub(request.body, opts.max_msg_size, opts.max_body_size)
        else:
            bodies = _read_text_mpub(request.body, opts.max_msg_size, opts.max_body_size)
        topic.put_many(topic.new_messages(bodies))
        return "OK"

    async def stats(self, request: Request) -> Any:
        params = _query_params(request)
        include_clients = _BOOL_PARAMS.get(_get(params, "include_clients") or "", True)
        include_mem = _BOOL_PARAMS.get(_get(params, "include_mem") or "", True)
        doc = self.nsqd.stats(
            _get(params, "topic") or "",
            _get(params, "channel") or "",
            include_clients,
            include_mem,
        )
        if _get(params, "format") == "json":
            return doc
        return format_text_stats(doc).encode()

    async def topic_create(self, request: Request) -> None:
        await self._topic_from_query(request)

    async def topic_delete(self, request: Request) -> None:
        name = _get(_query_params(request), "topic")
        if name is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if not self.nsqd.delete_topic(name):
            raise HTTPError(404, "TOPIC_NOT_FOUND")

    async def topic_empty(self, request: Request) -> None:
        name = _get(_query_params(request), "topic")
        if name is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if not is_valid_topic_name(name):
            raise HTTPError(400, "INVALID_TOPIC")
        topic = self.nsqd.get_existing_topic(name)
        if topic is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        topic.empty()

    async def topic_pause(self, request: Request) -> None:
        # Pause and unpause; nsqd tells them apart by "unpause" in the path.
        name = _get(_query_params(request), "topic")
        if name is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        topic = self.nsqd.get_existing_topic(name)
        if topic is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        if "unpause" in request.path:
            topic.unpause()
        else:
            topic.pause()
        self._persist_metadata()

    async def channel_create(self, request: Request) -> None:
        topic, channel = self._existing_topic_from_query(request)
        topic.get_channel(channel)

    async def channel_delete(self, request: Request) -> None:
        topic, channel = self._existing_topic_from_query(request)
        if not topic.delete_channel(channel):
            raise HTTPError(404, "CHANNEL_NOT_FOUND")

    async def channel_empty(self, request: Request) -> None:
        self._existing_channel(request).empty()

    async def channel_pause(self, request: Request) -> None:
        channel = self._existing_channel(request)
        if "unpause" in request.path:
            channel.unpause()
        else:
            channel.pause()
        self._persist_metadata()

    async def set_block_rate(self, request: Request) -> Response:
        # nsqd's setBlockRateHandler: strconv.Atoi of ?rate=, then a nil answer
        # that its PlainText decorator cannot write: the panic handler's 500.
        raw = request.arg("rate") or ""
        try:
            _go_parse_int(raw)
        except ValueError:
            return _plain_text(
                400, f'invalid block rate : strconv.Atoi: parsing "{raw}": invalid syntax'
            )
        return respond_v1(500, "INTERNAL_ERROR")

    async def free_memory(self, request: Request) -> Response:
        # debug.FreeOSMemory(), then the same nil answer (500) as setblockrate.
        gc.collect()
        return respond_v1(500, "INTERNAL_ERROR")

    async def config(self, request: Request) -> Any:
        opt = request.params["opt"]
        nsqd = self.nsqd
        opts = nsqd.options
        if request.method == "PUT":
            body = request.body[: opts.max_msg_size + 1]
            if not body or len(body) > opts.max_msg_size:
                raise HTTPError(413, "INVALID_VALUE")
            if opt == "nsqlookupd_tcp_addresses":
                value = _decode_string_list(body)
                if value is _INVALID:
                    raise HTTPError(400, "INVALID_VALUE")
                opts.lookupd_tcp_addresses = NilList() if value is None else value
            elif opt == "log_level":
                level = body.decode("utf-8", "replace").lower()  # lg.ParseLogLevel
                if level not in LOG_LEVELS:
                    raise HTTPError(400, "INVALID_VALUE")
                opts.log_level = level
            else:
                raise HTTPError(400, "INVALID_OPTION")
            nsqd.options_changed()
        found, value = config_value(nsqd, opt)
        if not found:
            raise HTTPError(400, "INVALID_OPTION")
        return AsJSON(None) if value is None else value


_INVALID: Any = object()


class NilList(list[str]):
    """An empty list that was Go's nil slice (``PUT`` of ``null``): shown as ``null``."""


def _decode_string_list(body: bytes) -> Any:
    """``json.Unmarshal`` into a ``[]string``: a list of strings, None for
    ``null``, else ``_INVALID``."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return _INVALID
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return _INVALID
    return value


def config_value(nsqd: NSQD, name: str) -> tuple[bool, Any]:
    """``getOptByCfgName``: the option nsqd's ``/config/<name>`` shows, as nsqd
    keeps it (durations in ns, the log level and TLS version as numbers, the
    broadcast ports and statsd prefix as resolved at start)."""
    field = nsqd_cfg_fields().get(name)
    if field is None:
        return False, None
    opts = nsqd.options
    assert field.dest is not None
    value = getattr(opts, field.dest)
    if isinstance(value, NilList):
        return True, None
    if field.dest == "data_path" and opts.data_path_shown is not None:
        return True, opts.data_path_shown
    if field.kind == "duration":
        return True, round(value * 1e9)
    if field.dest == "log_level":
        return True, LOG_LEVELS.get(str(value).lower(), 2)
    if field.dest == "tls_min_version":
        return True, TLS_VERSIONS.get(str(value).lower(), 0)
    # Broadcast ports default to the listeners' (none for a Unix socket: 0).
    if field.dest == "broadcast_tcp_port" and not value:
        return True, max(0, _port(nsqd.tcp_address))
    if field.dest == "broadcast_http_port" and not value:
        return True, max(0, _port(nsqd.http_address))
    if field.dest == "statsd_prefix" and value:
        http_port = opts.broadcast_http_port or max(0, _port(nsqd.http_address))
        return True, statsd_prefix(value, opts.broadcast_address, http_port)
    if isinstance(value, list):
        return True, list(value)
    return True, value


def _port(address: str) -> int:
    """The port of a ``host:port`` address; -1 for a Unix socket (as /info)."""
    port = address.rpartition(":")[2]
    return int(port) if port.isdigit() else -1


def _go_parse_int(raw: str) -> int:
    """strconv.ParseInt(raw, 10, 64) (and Atoi)."""
    text = raw[1:] if raw[:1] in "+-" else raw
    if not text.isdigit() or not text.isascii():
        raise ValueError(raw)
    value = int(raw)
    if not -(1 << 63) <= value < (1 << 63):
        raise ValueError(raw)
    return value


def _go_parse_bool(raw: str, *, default: bool) -> bool:
    """strconv.ParseBool, ``default`` for what it rejects."""
    if raw in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if raw in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    return default


def _read_text_mpub(body: bytes, max_msg_size: int, max_body_size: int) -> list[bytes]:
    """nsqd's newline-separated /mpub: lines read in order through a reader
    limited to max_body_size + 1 bytes, each checked as it comes (so a long line
    is MSG_TOO_BIG even in a body that is also too big); empty lines dropped."""
    limit = max_body_size + 1
    data = body[:limit]
    bodies: list[bytes] = []
    total = 0
    pos = 0
    while True:
        newline = data.find(b"\n", pos)
        end = len(data) if newline < 0 else newline + 1
        block = data[pos:end]
        total += len(block)
        if total == limit:
            raise HTTPError(413, "BODY_TOO_BIG")
        line = block[:-1] if block.endswith(b"\n") else block
        if line:  # nsqd silently drops empty messages
            if len(line) > max_msg_size:
                raise HTTPError(413, "MSG_TOO_BIG")
            bodies.append(line)
        if newline < 0:
            return bodies
        pos = end


def _read_binary_mpub(body: bytes, max_msg_size: int, max_body_size: int) -> list[bytes]:
    """nsqd's readMPUB over an HTTP body; errors are 413 with the code sans ``E_``."""
    if len(body) < 4:
        raise HTTPError(413, "BAD_BODY")
    (count,) = SIZE.unpack_from(body, 0)
    if count <= 0 or count > (max_body_size - 4) // 5:
        raise HTTPError(413, "BAD_BODY")
    offset = 4
    bodies: list[bytes] = []
    for _ in range(count):
        if len(body) < offset + 4:
            raise HTTPError(413, "BAD_MESSAGE")
        (size,) = SIZE.unpack_from(body, offset)
        offset += 4
        if size <= 0 or size > max_msg_size or len(body) < offset + size:
            raise HTTPError(413, "BAD_MESSAGE")
        bodies.append(body[offset : offset + size])
        offset += size
    return bodies
