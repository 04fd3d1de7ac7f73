"""nsqd's HTTP API (v1.3), served by :mod:`fakensq.httpserver`.

Responses follow nsqd's ``http_api.RespondV1``: 200 bodies as they are (``OK``,
JSON documents, or empty), errors as ``{"message": "CODE"}`` with the status,
and an ``X-NSQ-Content-Type: nsq; version=1.0`` header.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from trionsq.protocol.names import is_valid_channel_name, is_valid_topic_name

from .httpserver import HTTPServer, Request, Response
from .options import TLS_REQUIRED, VERSION
from .stats import format_text_stats

if TYPE_CHECKING:
    from .nsqd import NSQD

__all__ = ["NSQDHTTP"]

_V1_HEADER = ("X-NSQ-Content-Type", "nsq; version=1.0")
_BOOL_PARAMS = {"true": True, "1": True, "false": False, "0": False}


#: Deprecated endpoint -> current one, as listed in NSQ's HTTP API docs.
_DEPRECATED_ALIASES: dict[str, str] = {
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
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _ok(data: Any = None) -> Response:
    """RespondV1 with 200: strings as text, None empty, anything else JSON."""
    if data is None:
        resp = Response(200, b"", [])
    elif isinstance(data, (str, bytes)):
        resp = Response.text(data)
    else:
        resp = Response.json(data)
    resp.headers.append(_V1_HEADER)
    return resp


def _error(status: int, message: str) -> Response:
    resp = Response.json({"message": message}, status)
    resp.headers.append(_V1_HEADER)
    return resp


Route = Callable[[Request], Awaitable[Response]]


class NSQDHTTP:
    """The nsqd HTTP handler; ``.server`` is the :class:`HTTPServer` to run."""

    def __init__(self, nsqd: NSQD, *, tls: bool) -> None:
        self.nsqd = nsqd
        self.tls = tls
        opts = nsqd.options
        self.server = HTTPServer(
            self.handle,
            max_body_size=max(opts.max_body_size, opts.max_msg_size) + 1,
            ssl_context=nsqd.tls_context if tls else None,
        )
        self.routes: dict[str, dict[str, Route]] = {
            "/ping": {"GET": self.ping},
            "/info": {"GET": self.info},
            "/pub": {"POST": self.pub},
            "/mpub": {"POST": self.mpub},
            "/stats": {"GET": self.stats},
            "/topic/create": {"POST": self.topic_create},
            "/topic/delete": {"POST": self.topic_delete},
            "/topic/empty": {"POST": self.topic_empty},
            "/topic/pause": {"POST": self.topic_pause},
            "/topic/unpause": {"POST": self.topic_unpause},
            "/channel/create": {"POST": self.channel_create},
            "/channel/delete": {"POST": self.channel_delete},
            "/channel/empty": {"POST": self.channel_empty},
            "/channel/pause": {"POST": self.channel_pause},
            "/channel/unpause": {"POST": self.channel_unpause},
        }
        # The deprecated names NSQ's documentation still lists (nsqd v1.3 dropped
        # them; clients and scripts written against the docs use them).
        for alias, path in _DEPRECATED_ALIASES.items():
            self.routes[alias] = self.routes[path]

    async def handle(self, request: Request) -> Response:
        nsqd = self.nsqd
        if not self.tls and nsqd.options.tls_required == TLS_REQUIRED:
            port = nsqd.https_address.rpartition(":")[2] or "0"
            body = f'{{"message": "TLS_REQUIRED", "https_port": {port}}}'.encode()
            return Response(
                403, body, [("Content-Type", "application/json; charset=utf-8"), _V1_HEADER]
            )
        path = request.path
        if path.startswith("/config/") and path.count("/") == 2:
            methods: dict[str, Route] = {"GET": self.config, "PUT": self.config}
        else:
            found = self.routes.get(path)
            if found is None:
                return _error(404, "NOT_FOUND")
            methods = found
        route = methods.get(request.method)
        if route is None:
            # httprouter: OPTIONS answers the allowed methods, anything else
            # (HEAD included: no automatic GET fallback) is a 405.
            allow = ", ".join(sorted({*methods, "OPTIONS"}))
            if request.method == "OPTIONS":
                return Response(200, b"", [("Allow", allow)])
            resp = _error(405, "METHOD_NOT_ALLOWED")
            resp.headers.append(("Allow", allow))
            return resp
        try:
            return await route(request)
        except HTTPError as exc:
            return _error(exc.status, exc.message)

    # --- helpers ---

    def _topic_from_query(self, request: Request) -> str:
        """getTopicFromQuery: the topic name (the caller creates the topic)."""
        if not request.has_arg("topic"):
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        name = request.arg("topic") or ""
        if not is_valid_topic_name(name):
            raise HTTPError(400, "INVALID_TOPIC")
        return name

    def _topic_channel_args(self, request: Request) -> tuple[str, str]:
        """http_api.GetTopicChannelArgs, then the topic must exist."""
        topic = request.arg("topic")
        if topic is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if not is_valid_topic_name(topic):
            raise HTTPError(400, "INVALID_ARG_TOPIC")
        channel = request.arg("channel")
        if channel is None:
            raise HTTPError(400, "MISSING_ARG_CHANNEL")
        if not is_valid_channel_name(channel):
            raise HTTPError(400, "INVALID_ARG_CHANNEL")
        if self.nsqd.get_existing_topic(topic) is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        return topic, channel

    # --- handlers ---

    async def ping(self, request: Request) -> Response:
        health = self.nsqd.health()
        return Response.text(health, 200 if health == "OK" else 500)

    async def info(self, request: Request) -> Response:
        nsqd = self.nsqd
        opts = nsqd.options
        return _ok(
            {
                "version": VERSION,
                "broadcast_address": opts.broadcast_address,
                "hostname": nsqd.hostname,
                "http_port": int(nsqd.http_address.rpartition(":")[2] or -1),
                "tcp_port": int(nsqd.tcp_address.rpartition(":")[2] or -1),
                "start_time": nsqd.start_time,
                "max_heartbeat_interval": round(opts.max_heartbeat_interval * 1e9),
                "max_output_buffer_size": opts.max_output_buffer_size,
                "max_output_buffer_timeout": round(opts.max_output_buffer_timeout * 1e9),
                "max_deflate_level": opts.max_deflate_level,
            }
        )

    async def pub(self, request: Request) -> Response:
        opts = self.nsqd.options
        body = request.body
        if len(body) > opts.max_msg_size:
            raise HTTPError(413, "MSG_TOO_BIG")
        if not body:
            raise HTTPError(400, "MSG_EMPTY")
        name = self._topic_from_query(request)
        topic = self.nsqd.get_topic(name)
        defer = 0.0
        if request.has_arg("defer"):
            raw = request.arg("defer") or ""
            try:
                ms = _go_parse_int(raw)
            except ValueError:
                raise HTTPError(400, "INVALID_DEFER") from None
            defer = ms / 1000
            if ms < 0 or defer > opts.max_req_timeout:
                raise HTTPError(400, "INVALID_DEFER")
        topic.put(topic.new_message(body, defer))
        return _ok("OK")

    async def mpub(self, request: Request) -> Response:
        opts = self.nsqd.options
        if len(request.body) > opts.max_body_size:
            raise HTTPError(413, "BODY_TOO_BIG")
        name = self._topic_from_query(request)
        topic = self.nsqd.get_topic(name)
        binary = False
        if request.has_arg("binary"):
            # an unrecognized value counts as true (deprecated, nsqd logs a warning)
            binary = _BOOL_PARAMS.get(request.arg("binary") or "", True)
        if binary:
            bodies = _read_binary_mpub(request.body, opts.max_msg_size, opts.max_body_size)
        else:
            bodies = []
            for line in request.body.split(b"\n"):
                if not line:
                    continue  # nsqd silently drops empty messages
                if len(line) > opts.max_msg_size:
                    raise HTTPError(413, "MSG_TOO_BIG")
                bodies.append(line)
        topic.put_many(topic.new_messages(bodies))
        return _ok("OK")

    async def stats(self, request: Request) -> Response:
        include_clients = _BOOL_PARAMS.get(request.arg("include_clients") or "", True)
        include_mem = _BOOL_PARAMS.get(request.arg("include_mem") or "", True)
        doc = self.nsqd.stats(
            request.arg("topic") or "",
            request.arg("channel") or "",
            include_clients,
            include_mem,
        )
        if request.arg("format") == "json":
            return _ok(doc)
        return _ok(format_text_stats(doc))

    async def topic_create(self, request: Request) -> Response:
        self.nsqd.get_topic(self._topic_from_query(request))
        return _ok()

    async def topic_delete(self, request: Request) -> Response:
        name = request.arg("topic")
        if name is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if not self.nsqd.delete_topic(name):
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        return _ok()

    def _existing_topic(self, request: Request, validate: bool = True) -> Any:
        name = request.arg("topic")
        if name is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if validate and not is_valid_topic_name(name):
            raise HTTPError(400, "INVALID_TOPIC")
        topic = self.nsqd.get_existing_topic(name)
        if topic is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        return topic

    async def topic_empty(self, request: Request) -> Response:
        self._existing_topic(request).empty()
        return _ok()

    async def topic_pause(self, request: Request) -> Response:
        self._existing_topic(request, validate=False).pause()
        return _ok()

    async def topic_unpause(self, request: Request) -> Response:
        self._existing_topic(request, validate=False).unpause()
        return _ok()

    async def channel_create(self, request: Request) -> Response:
        topic, channel = self._topic_channel_args(request)
        self.nsqd.topics[topic].get_channel(channel)
        return _ok()

    def _existing_channel(self, request: Request) -> Any:
        topic, name = self._topic_channel_args(request)
        channel = self.nsqd.topics[topic].channels.get(name)
        if channel is None:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        return channel

    async def channel_delete(self, request: Request) -> Response:
        topic, name = self._topic_channel_args(request)
        if not self.nsqd.topics[topic].delete_channel(name):
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        return _ok()

    async def channel_empty(self, request: Request) -> Response:
        self._existing_channel(request).empty()
        return _ok()

    async def channel_pause(self, request: Request) -> Response:
        self._existing_channel(request).pause()
        return _ok()

    async def channel_unpause(self, request: Request) -> Response:
        self._existing_channel(request).unpause()
        return _ok()

    async def config(self, request: Request) -> Response:
        opt = unquote(request.path[len("/config/") :])
        opts = self.nsqd.options
        if request.method == "PUT":
            body = request.body
            if not body or len(body) > opts.max_msg_size:
                raise HTTPError(413, "INVALID_VALUE")
            if opt == "nsqlookupd_tcp_addresses":
                try:
                    value = json.loads(body)
                except ValueError:
                    raise HTTPError(400, "INVALID_VALUE") from None
                if value is not None and (
                    not isinstance(value, list) or not all(isinstance(v, str) for v in value)
                ):
                    raise HTTPError(400, "INVALID_VALUE")
                opts.lookupd_tcp_addresses = list(value or [])
            elif opt == "log_level":
                level = body.decode("utf-8", "replace").strip().lower()
                if level not in _LOG_LEVELS:
                    raise HTTPError(400, "INVALID_VALUE")
                opts.log_level = level
            else:
                raise HTTPError(400, "INVALID_OPTION")
            self.nsqd._options_changed()
        found, value = _option_by_cfg_name(opts, opt)
        if not found:
            raise HTTPError(400, "INVALID_OPTION")
        # RespondV1 sends a string as it is, anything else as JSON.
        return _ok(value)


# nsqd's cfg names that differ from fakensq's field names.
_CFG_ALIASES = {"nsqlookupd_tcp_addresses": "lookupd_tcp_addresses"}
# Durations are time.Duration in Go: JSON numbers of nanoseconds.
_DURATIONS = {
    "http_client_connect_timeout",
    "http_client_request_timeout",
    "sync_timeout",
    "queue_scan_interval",
    "queue_scan_refresh_interval",
    "msg_timeout",
    "max_msg_timeout",
    "max_req_timeout",
    "client_timeout",
    "max_heartbeat_interval",
    "max_output_buffer_timeout",
    "min_output_buffer_timeout",
    "output_buffer_timeout",
    "statsd_interval",
    "e2e_processing_latency_window_time",
}


_LOG_LEVELS = {"debug": 1, "info": 2, "warn": 3, "error": 4, "fatal": 5}


def _option_by_cfg_name(opts: Any, name: str) -> tuple[bool, Any]:
    field = _CFG_ALIASES.get(name, name)
    if field.startswith("_") or field in ("seed",) or not hasattr(opts, field):
        return False, None
    value = getattr(opts, field)
    if callable(value):
        return False, None
    if field in _DURATIONS:
        return True, round(value * 1e9)
    if field == "log_level":  # lg.LogLevel is an int in Go's JSON
        return True, _LOG_LEVELS.get(str(value).lower(), 2)
    return True, value


def _go_parse_int(raw: str) -> int:
    """strconv.ParseInt(raw, 10, 64)."""
    text = raw[1:] if raw[:1] in "+-" else raw
    if not text.isdigit() or not text.isascii():
        raise ValueError(raw)
    value = int(raw)
    if not -(1 << 63) <= value < (1 << 63):
        raise ValueError(raw)
    return value


def _read_binary_mpub(body: bytes, max_msg_size: int, max_body_size: int) -> list[bytes]:
    """nsqd's readMPUB over an HTTP body; errors are 413 with the code sans ``E_``."""
    if len(body) < 4:
        raise HTTPError(413, "BAD_BODY")
    (count,) = struct.unpack_from(">l", body, 0)
    if count <= 0 or count > (max_body_size - 4) // 5:
        raise HTTPError(413, "BAD_BODY")
    offset = 4
    bodies: list[bytes] = []
    for _ in range(count):
        if len(body) < offset + 4:
            raise HTTPError(413, "BAD_MESSAGE")
        (size,) = struct.unpack_from(">l", body, offset)
        offset += 4
        if size <= 0 or size > max_msg_size or len(body) < offset + size:
            raise HTTPError(413, "BAD_MESSAGE")
        bodies.append(body[offset : offset + size])
        offset += size
    return bodies
