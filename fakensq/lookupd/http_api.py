"""nsqlookupd's HTTP API (v1.3.0), served by :mod:`fakensq.http.server`.

``/ping``, ``/info``, ``/debug``, ``/lookup``, ``/topics``, ``/channels``,
``/nodes`` (GET), ``/topic/create``, ``/topic/delete``, ``/channel/create``,
``/channel/delete``, ``/topic/tombstone`` (POST) and Go's ``/debug/pprof``
(:mod:`fakensq.http.pprof`), routed as httprouter does (:mod:`fakensq.http.router`).
Answers are plain JSON (no ``status_code``/``data`` envelope: v1.3 dropped the
Accept negotiation); errors are ``{"message": "..."}``.  The aliases older
versions served (``/create_topic``, ``/delete_topic``, ``/create_channel``,
``/delete_channel``, ``/tombstone_topic_producer``) answer 404 as in v1.3.0,
unless the ``legacy_http_aliases`` option asks for them.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any, Final

from trionsq.protocol.names import is_valid_channel_name, is_valid_topic_name

from ..http import pprof
from ..http.router import Router
from ..http.server import READ_ALL, HTTPServer, Request, Response
from ..version import VERSION
from .registry import Registration

if TYPE_CHECKING:
    from .daemon import NSQLookupd

__all__ = ["LookupdHTTP", "LEGACY_ALIASES"]

# time.Time{}.UnixNano() as Go computes it: /debug shows it for never-tombstoned producers.
_GO_ZERO_TIME_UNIX_NANO: Final = -6795364578871345152


#: The endpoints nsqlookupd v1.3.0 removed -> the one each stood for (served
#: only with ``legacy_http_aliases``).
LEGACY_ALIASES: Final = {
    "/create_topic": "/topic/create",
    "/delete_topic": "/topic/delete",
    "/create_channel": "/channel/create",
    "/delete_channel": "/channel/delete",
    "/tombstone_topic_producer": "/topic/tombstone",
}


#: nsqlookupd v1.3.0's routes whose handlers read the whole body (NewReqParams).
_READS_WHOLE_BODY = {
    ("GET", "/lookup"),
    ("GET", "/channels"),
    ("POST", "/topic/create"),
    ("POST", "/topic/delete"),
    ("POST", "/topic/tombstone"),
    ("POST", "/channel/create"),
    ("POST", "/channel/delete"),
    ("POST", "/debug/pprof/symbol"),
}


def _body_limit(request: Request) -> int:
    return READ_ALL if (request.method, request.path) in _READS_WHOLE_BODY else 0


class LookupdHTTP:
    """The nsqlookupd HTTP handler of one node; ``.server`` is the :class:`HTTPServer` to run."""

    def __init__(self, node: NSQLookupd) -> None:
        self.node = node
        # What nsqlookupd's handlers read of a body: all of it (NewReqParams),
        # or none (the server answers once the head is read).
        self.server = HTTPServer(self.handle, body_limit=_body_limit)
        self.router = Router(
            not_found=lambda _request: _v1_error(404, "NOT_FOUND"),
            method_not_allowed=lambda _request: _v1_error(405, "METHOD_NOT_ALLOWED"),
        )
        add = self.router.add
        add("GET", "/ping", self._ping)
        add("GET", "/info", self._info)
        add("GET", "/debug", self._debug)
        add("GET", "/lookup", self._lookup)
        add("GET", "/topics", self._topics)
        add("GET", "/channels", self._channels)
        add("GET", "/nodes", self._nodes)
        add("POST", "/topic/create", self._create_topic)
        add("POST", "/topic/delete", self._delete_topic)
        add("POST", "/channel/create", self._create_channel)
        add("POST", "/channel/delete", self._delete_channel)
        add("POST", "/topic/tombstone", self._tombstone_topic_producer)
        pprof.add_routes(add, index="/debug/pprof")
        if node.options.legacy_http_aliases:
            routes = {route.pattern: route for route in self.router.routes()}
            for alias, path in LEGACY_ALIASES.items():
                route = routes[path]
                add(route.method, alias, route.handler)

    async def handle(self, request: Request) -> Response:
        response = await self.router.handle(request)
        self.node.logf(
            logging.DEBUG,
            f"{response.status} {request.method} {request.path} ({request.remote_addr})",
        )
        return response

    async def _ping(self, request: Request) -> Response:
        return Response.text("OK")

    async def _info(self, request: Request) -> Response:
        return _v1({"version": VERSION})

    async def _topics(self, request: Request) -> Response:
        return _v1({"topics": self.node.topics()})

    async def _channels(self, request: Request) -> Response:
        topic = _topic_arg(request)
        if isinstance(topic, Response):
            return topic
        return _v1({"channels": self.node.channels(topic)})

    async def _lookup(self, request: Request) -> Response:
        topic = _topic_arg(request)
        if isinstance(topic, Response):
            return topic
        if not self.node.db.find_registrations("topic", topic, ""):
            return _v1_error(404, "TOPIC_NOT_FOUND")
        return _v1(
            {
                "channels": self.node.channels(topic),
                "producers": [p.to_json() for p in self.node.producers(topic)],
            }
        )

    async def _nodes(self, request: Request) -> Response:
        return _v1({"producers": self.node.nodes()})

    async def _debug(self, request: Request) -> Response:
        data: dict[str, list[dict[str, Any]]] = {}
        for reg, producers in self.node.db.items():
            key = f"{reg.category}:{reg.key}:{reg.subkey}"
            for p in producers:
                data.setdefault(key, []).append(
                    {  # a Go map: keys sorted
                        "broadcast_address": p.peer.broadcast_address,
                        "hostname": p.peer.hostname,
                        "http_port": p.peer.http_port,
                        "id": p.peer.id,
                        "last_update": self._unix_nano(p.peer.last_update),
                        "tcp_port": p.peer.tcp_port,
                        "tombstoned": p.tombstoned,
                        "tombstoned_at": self._unix_nano(p.tombstoned_at)
                        if p.tombstoned
                        else _GO_ZERO_TIME_UNIX_NANO,
                        "version": p.peer.version,
                    }
                )
        return _v1(dict(sorted(data.items())))

    def _unix_nano(self, trio_time: float) -> int:
        return math.floor((trio_time + self.node.wall_offset) * 1e9)

    async def _create_topic(self, request: Request) -> Response:
        topic = _topic_arg(request)
        if isinstance(topic, Response):
            return topic
        if not is_valid_topic_name(topic):
            return _v1_error(400, "INVALID_ARG_TOPIC")
        self.node.logf(logging.INFO, f"DB: adding topic({topic})")
        self.node.db.add_registration(Registration("topic", topic, ""))
        return _v1(None)

    async def _delete_topic(self, request: Request) -> Response:
        topic = _topic_arg(request)
        if isinstance(topic, Response):
            return topic
        for reg in self.node.db.find_registrations("channel", topic, "*"):
            self.node.logf(logging.INFO, f"DB: removing channel({reg.subkey}) from topic({topic})")
            self.node.db.remove_registration(reg)
        for reg in self.node.db.find_registrations("topic", topic, ""):
            self.node.logf(logging.INFO, f"DB: removing topic({topic})")
            self.node.db.remove_registration(reg)
        return _v1(None)

    async def _tombstone_topic_producer(self, request: Request) -> Response:
        topic = _topic_arg(request)
        if isinstance(topic, Response):
            return topic
        node = request.arg("node")
        if node is None:
            return _v1_error(400, "MISSING_ARG_NODE")
        self.node.logf(logging.INFO, f"DB: setting tombstone for producer@{node} of topic({topic})")
        for p in self.node.db.find_producers("topic", topic, ""):
            # nsqlookupd compares with "%s:%d" (no brackets, even for IPv6).
            if f"{p.peer.broadcast_address}:{p.peer.http_port}" == node:
                p.tombstone()
        return _v1(None)

    @staticmethod
    def _topic_channel_args(request: Request) -> tuple[str, str] | Response:
        topic = _topic_arg(request)
        if isinstance(topic, Response):
            return topic
        if not is_valid_topic_name(topic):
            return _v1_error(400, "INVALID_ARG_TOPIC")
        channel = request.arg("channel")
        if channel is None:
            return _v1_error(400, "MISSING_ARG_CHANNEL")
        if not is_valid_channel_name(channel):
            return _v1_error(400, "INVALID_ARG_CHANNEL")
        return topic, channel

    async def _create_channel(self, request: Request) -> Response:
        args = self._topic_channel_args(request)
        if isinstance(args, Response):
            return args
        topic, channel = args
        self.node.logf(logging.INFO, f"DB: adding channel({channel}) in topic({topic})")
        self.node.db.add_registration(Registration("channel", topic, channel))
        self.node.logf(logging.INFO, f"DB: adding topic({topic})")
        self.node.db.add_registration(Registration("topic", topic, ""))
        return _v1(None)

    async def _delete_channel(self, request: Request) -> Response:
        args = self._topic_channel_args(request)
        if isinstance(args, Response):
            return args
        topic, channel = args
        regs = self.node.db.find_registrations("channel", topic, channel)
        if not regs:
            return _v1_error(404, "CHANNEL_NOT_FOUND")
        self.node.logf(logging.INFO, f"DB: removing channel({channel}) from topic({topic})")
        for reg in regs:
            self.node.db.remove_registration(reg)
        return _v1(None)


_V1_HEADER: Final = ("X-NSQ-Content-Type", "nsq; version=1.0")


def _topic_arg(request: Request) -> str | Response:
    """The ``topic`` argument, or nsqlookupd's error for a query without one."""
    if request.query_error is not None:
        return _v1_error(400, "INVALID_REQUEST")  # http_api.NewReqParams failed
    topic = request.arg("topic")
    if topic is None:
        return _v1_error(400, "MISSING_ARG_TOPIC")
    return topic


def _v1(data: Any) -> Response:
    """A 200 as http_api.RespondV1 writes it: JSON, or an empty body for nil."""
    if data is None:
        return Response(200, b"", [_V1_HEADER])
    response = Response.json(data)
    response.headers.append(_V1_HEADER)
    return response


def _v1_error(status: int, message: str) -> Response:
    response = Response.json({"message": message}, status)
    response.headers.append(_V1_HEADER)
    return response
