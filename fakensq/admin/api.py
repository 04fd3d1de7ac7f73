"""nsqadmin v1.3.0's HTTP API, served by fakensq's admin.

The routes, JSON and errors of nsqadmin's ``http.go``, for scripts that drive
nsqadmin::

    GET    /api/topics[?inactive=true]     GET /api/nodes       GET /api/counter
    GET    /api/topics/:topic              GET /api/nodes/:node GET /api/graphite
    GET    /api/topics/:topic/:channel     GET|PUT /config/:opt
    POST   /api/topics                     {"topic": T, "channel": C}
    POST   /api/topics/:topic[/:channel]   {"action": "pause"|"unpause"|"empty"}
    DELETE /api/topics/:topic[/:channel]
    DELETE /api/nodes/:node                {"topic": T}  (tombstone T's producer)

Answers carry ``X-NSQ-Content-Type: nsq; version=1.0``; errors are
``{"message": "..."}`` with nsqadmin's status and text.  Actions are checked
against ``--admin-user`` (``--acl-http-header`` names the user), reported to
``--notification-http-endpoint``, and ``/config`` is answered only to
``--allow-config-from-cidr``.
"""

from __future__ import annotations

import base64
import gzip
import ipaddress
import json
import logging
import socket
import time
import zlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote_plus, urlencode

import httpx
import trio

from trionsq.protocol.names import is_valid_channel_name, is_valid_topic_name

from ..golang.json import dumps as marshal
from ..http.server import Request, Response
from .clusterinfo import ClusterInfo, ErrList, Failure, Producer, TopicStats, UpstreamError
from .jsonbody import GoJSONError, decode_struct
from .options import LOG_LEVELS, AdminOptions

if TYPE_CHECKING:
    from ..http.router import Router

__all__ = ["CONFIG_READ_MAX", "NSQAdminAPI", "as_nsqadmin_sends", "respond_v1", "v1_error"]

log = logging.getLogger("fakensq.admin")

#: ``/config`` PUT bodies are read up to 1 MiB (one byte more means too big).
CONFIG_READ_MAX = 1024 * 1024 + 1


class HTTPError(Exception):
    """``http_api.Err``: answered as ``{"message": text}`` with ``status``."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


def respond_v1(data: Any, status: int = 200) -> Response:
    """``http_api.RespondV1``: strings as they are, other values as JSON."""
    headers = [("X-NSQ-Content-Type", "nsq; version=1.0")]
    if status != 200:
        body = marshal({"message": data})
        headers.append(("Content-Type", "application/json; charset=utf-8"))
    elif isinstance(data, str):
        body = data.encode()  # no Content-Type of its own: Go sniffs one (or not)
    elif data is None:
        body = b""
    else:
        body = marshal(data)
        headers.append(("Content-Type", "application/json; charset=utf-8"))
    return Response(status, body, headers)


def v1_error(status: int, text: str) -> Response:
    return respond_v1(text, status)


def as_nsqadmin_sends(request: Request, response: Response) -> Response:
    """The answer as nsqadmin's server sends it: compressed when the client takes
    gzip (or deflate), and then a body whose handler set no Content-Type gets
    none at all (Go wrote the headers before the compressed body)."""
    typed = any(k.lower() == "content-type" for k, _ in response.headers)
    encoding = ""
    for token in request.headers.get("accept-encoding", "").split(","):
        if token.strip() in ("gzip", "deflate"):
            encoding = token.strip()
            break
    if encoding:
        if encoding == "gzip":
            body = gzip.compress(response.body, mtime=0)
        else:
            packer = zlib.compressobj(wbits=-15)  # raw deflate, as Go's flate
            body = packer.compress(response.body) + packer.flush()
        headers = [*response.headers, ("Content-Encoding", encoding), ("Vary", "Accept-Encoding")]
        if not typed:
            headers.append(("Content-Type", ""))
        return Response(response.status, body, headers)
    return response  # untyped: the HTTP server sniffs a type, as Go's does


def _warn(messages: list[str]) -> str:
    return "WARNING: " + "; ".join(messages) if messages else ""


def _check(err: Exception | None, messages: list[str], what: str) -> None:
    """nsqadmin's error handling: a partial error becomes a warning, any other
    error the handler's 502."""
    if err is None:
        return
    if isinstance(err, ErrList):
        log.warning("%s", err)
        messages.append(str(err))
        return
    log.error("%s - %s", what, err)
    raise HTTPError(502, f"UPSTREAM_ERROR: {err}")


class NSQAdminAPI:
    """The handlers of nsqadmin's API over ``options`` (which ``PUT /config`` changes)."""

    def __init__(
        self,
        options: AdminOptions,
        client: httpx.AsyncClient,
        *,
        lookupds: Callable[[], list[str]],
        nsqds: Callable[[], list[str]],
        on_action: Callable[[str, str], None] | None = None,
    ) -> None:
        self.options = options
        self.ci = ClusterInfo(client)
        self.client = client
        self._lookupds = lookupds
        self._nsqds = nsqds
        self.on_action = on_action
        self._notify_send: trio.MemorySendChannel[dict[str, Any]] | None = None

    # -- plumbing -------------------------------------------------------------------

    def routes(self, router: Router, bp: Callable[[str], str]) -> None:
        """Register nsqadmin's API routes on ``router`` under the base path ``bp``."""

        def wrap(
            handler: Callable[..., Awaitable[Any]],
        ) -> Callable[[Request], Awaitable[Response]]:
            async def run(request: Request) -> Response:
                try:
                    return respond_v1(await handler(request, **request.params))
                except HTTPError as exc:
                    return v1_error(exc.status, exc.text)

            return run

        get, post, delete, put = "GET", "POST", "DELETE", "PUT"
        for method, path, handler in (
            (get, "/api/topics", self.topics),
            (get, "/api/topics/:topic", self.topic),
            (get, "/api/topics/:topic/:channel", self.channel),
            (get, "/api/nodes", self.nodes),
            (get, "/api/nodes/:node", self.node),
            (post, "/api/topics", self.create_topic_channel),
            (post, "/api/topics/:topic", self.topic_action),
            (post, "/api/topics/:topic/:channel", self.channel_action),
            (delete, "/api/nodes/:node", self.tombstone_node_for_topic),
            (delete, "/api/topics/:topic", self.delete_topic),
            (delete, "/api/topics/:topic/:channel", self.delete_channel),
            (get, "/api/counter", self.counter),
            (get, "/api/graphite", self.graphite),
            (get, "/config/:opt", self.config),
            (put, "/config/:opt", self.config),
        ):
            router.add(method, bp(path), wrap(handler))
        if self.options.proxy_graphite:
            router.add(get, bp("/render"), self.proxy_graphite)

    @property
    def lookupds(self) -> list[str]:
        return self._lookupds()

    @property
    def nsqds(self) -> list[str]:
        return self._nsqds()

    def is_admin(self, request: Request) -> bool:
        """``isAuthorizedAdminRequest``: anyone when no --admin-user is set."""
        users = self.options.admin_users
        if not users:
            return True
        return request.headers.get(self.options.acl_http_header.lower(), "") in users

    def _require_admin(self, request: Request) -> None:
        if not self.is_admin(request):
            raise HTTPError(403, "FORBIDDEN")

    # -- notifications --------------------------------------------------------------

    async def run_notifier(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """POST each admin action to --notification-http-endpoint, one at a time."""
        send, receive = trio.open_memory_channel[dict[str, Any]](1000)
        self._notify_send = send
        task_status.started()
        async with receive:
            async for action in receive:
                endpoint = self.options.notification_http_endpoint
                log.info("POSTing notification to %s", endpoint)
                try:
                    await self.client.post(
                        endpoint,
                        content=marshal(action),
                        headers={"Content-Type": "application/json"},
                    )
                except httpx.HTTPError as exc:
                    log.error("failed to POST notification - %s", exc)

    def notify(self, action: str, topic: str, channel: str, node: str, request: Request) -> None:
        if self.on_action is not None:
            self.on_action(action, f"{topic}/{channel}" if channel else topic or node)
        if not self.options.notification_http_endpoint or self._notify_send is None:
            return
        doc: dict[str, Any] = {"action": action, "topic": topic}
        if channel:
            doc["channel"] = channel
        if node:
            doc["node"] = node
        doc["timestamp"] = int(time.time())
        user = _basic_auth_user(request)
        if user:
            doc["user"] = user
        doc["remote_ip"] = request.remote_addr
        doc["user_agent"] = request.headers.get("user-agent", "")
        scheme = "https" if request.tls or request.headers.get("x-scheme") == "https" else "http"
        query = request.raw_query
        doc["url"] = f"{scheme}://{request.headers.get('host', '')}{request.path}" + (
            f"?{query}" if query else ""
        )
        doc["via"] = socket.gethostname()
        try:
            self._notify_send.send_nowait(doc)
        except trio.WouldBlock:
            log.error("dropping admin action notification (too many queued)")

    # -- reading --------------------------------------------------------------------

    async def topics(self, request: Request) -> Any:
        messages: list[str] = []
        if request.query_error:  # http_api.NewReqParams: url.ParseQuery's error
            raise HTTPError(400, request.query_error)
        params = request.query
        if self.lookupds:
            topics, err = await self.ci.lookupd_topics(self.lookupds)
        else:
            topics, err = await self.ci.nsqd_topics(self.nsqds)
        _check(err, messages, "failed to get topics")
        if (params.get("inactive") or [""])[0] == "true":
            inactive: dict[str, Any] = {}
            if self.lookupds:
                for name in topics or []:
                    producers, _ = await self.ci.lookupd_topic_producers(name, self.lookupds)
                    if not producers:
                        channels, _ = await self.ci.lookupd_topic_channels(name, self.lookupds)
                        inactive[name] = channels
            return {"topics": dict(sorted(inactive.items())), "message": _warn(messages)}
        return {"topics": topics, "message": _warn(messages)}

    async def topic(self, request: Request, topic: str) -> Any:
        messages: list[str] = []
        producers, err = await self.ci.topic_producers(topic, self.lookupds, self.nsqds)
        _check(err, messages, "failed to get topic producers")
        (stats, _), err = await self.ci.nsqd_stats(producers or [], topic, "", False)
        _check(err, messages, "failed to get topic metadata")
        total = TopicStats(topic_name=topic)
        for t in stats:
            total.add(t)
        return {**total.to_go(), "message": _warn(messages)}

    async def channel(self, request: Request, topic: str, channel: str) -> Any:
        messages: list[str] = []
        producers, err = await self.ci.topic_producers(topic, self.lookupds, self.nsqds)
        _check(err, messages, "failed to get topic producers")
        (_, channels), err = await self.ci.nsqd_stats(producers or [], topic, channel, True)
        _check(err, messages, "failed to get channel metadata")
        found = channels.get(channel)
        return {**(found.to_go() if found is not None else {}), "message": _warn(messages)}

    async def nodes(self, request: Request) -> Any:
        messages: list[str] = []
        producers, err = await self.ci.producers(self.lookupds, self.nsqds)
        _check(err, messages, "failed to get nodes")
        return {
            "nodes": None if producers is None else [p.to_go() for p in producers],
            "message": _warn(messages),
        }

    async def node(self, request: Request, node: str) -> Any:
        messages: list[str] = []
        producers, err = await self.ci.producers(self.lookupds, self.nsqds)
        _check(err, messages, "failed to get producers")
        producer = next((p for p in producers or [] if p.http_address == node), None)
        if producer is None:
            raise HTTPError(404, "NODE_NOT_FOUND")
        (stats, _), err = await self.ci.nsqd_stats([producer], "", "", True)
        if err is not None:
            log.error("failed to get nsqd stats - %s", err)
            raise HTTPError(502, f"UPSTREAM_ERROR: {err}")
        total_clients = sum(len(c.clients or []) for t in stats for c in t.channels or [])
        return {
            "node": node,
            "topics": [t.to_go() for t in stats] if stats else None,
            "total_messages": sum(t.counts["message_count"] for t in stats),
            "total_clients": total_clients,
            "message": _warn(messages),
        }

    async def counter(self, request: Request) -> Any:
        messages: list[str] = []
        producers, err = await self.ci.producers(self.lookupds, self.nsqds)
        _check(err, messages, "failed to get counter producer list")
        (_, channels), err = await self.ci.nsqd_stats(producers or [], "", "", False)
        _check(err, messages, "failed to get nsqd stats")
        stats: dict[str, dict[str, Any]] = {}
        for c in channels.values():
            for per_node in c.nodes or []:
                key = f"{c.topic_name}:{c.channel_name}:{per_node.node}"
                entry = stats.setdefault(
                    key,
                    {
                        "node": per_node.node,
                        "topic_name": c.topic_name,
                        "channel_name": c.channel_name,
                        "message_count": 0,
                    },
                )
                entry["message_count"] += per_node.counts["message_count"]
        return {"stats": dict(sorted(stats.items())), "message": _warn(messages)}

    # -- actions --------------------------------------------------------------------

    async def _producer_action(self, topic: str, uri: str, qs: str) -> Exception | None:
        """``actionHelper``: the topic's producers, then the action on each."""
        producers, err = await self.ci.topic_producers(topic, self.lookupds, self.nsqds)
        if isinstance(err, Failure):
            return err
        errors: list[BaseException] = list(err.errors) if isinstance(err, ErrList) else []
        errors += await self.ci.producers_post(producers or [], uri, qs)
        return ErrList(errors) if errors else None

    async def topic_action(self, request: Request, topic: str) -> Any:
        return await self._topic_channel_action(request, topic, "")

    async def channel_action(self, request: Request, topic: str, channel: str) -> Any:
        return await self._topic_channel_action(request, topic, channel)

    async def _topic_channel_action(self, request: Request, topic: str, channel: str) -> Any:
        messages: list[str] = []
        self._require_admin(request)
        try:
            body = decode_struct(request.body, ["action"])
        except GoJSONError as exc:
            raise HTTPError(400, str(exc)) from None
        action = body["action"]
        if action not in ("pause", "unpause", "empty"):
            raise HTTPError(400, "INVALID_ACTION")
        qs = "topic=" + quote_plus(topic)
        kind = "topic"
        if channel:
            qs += "&channel=" + quote_plus(channel)
            kind = "channel"
        err = await self._producer_action(topic, f"{kind}/{action}", qs)
        self.notify(f"{action}_{kind}", topic, channel, "", request)
        if err is not None:
            if not isinstance(err, ErrList):
                log.error("failed to %s topic/channel - %s", action, err)
                raise HTTPError(502, f"UPSTREAM_ERROR: {err}")
            log.warning("%s", err)
            messages.append(str(err))
        return {"message": _warn(messages)}

    async def create_topic_channel(self, request: Request) -> Any:
        messages: list[str] = []
        self._require_admin(request)
        try:
            body = decode_struct(request.body, ["topic", "channel"])
        except GoJSONError as exc:
            raise HTTPError(400, str(exc)) from None
        topic, channel = body["topic"], body["channel"]
        if not is_valid_topic_name(topic):
            raise HTTPError(400, "INVALID_TOPIC")
        if channel and not is_valid_channel_name(channel):
            raise HTTPError(400, "INVALID_CHANNEL")
        errors: list[BaseException] = []
        qs = "topic=" + quote_plus(topic)
        errors += await self.ci.lookupd_post(self.lookupds, "topic/create", qs)
        failure: Exception | None = None
        if channel:
            qs += "&channel=" + quote_plus(channel)
            errors += await self.ci.lookupd_post(self.lookupds, "channel/create", qs)
            producers, err = await self.ci.lookupd_topic_producers(topic, self.lookupds)
            if isinstance(err, Failure):
                failure = err
            else:
                errors += err.errors if isinstance(err, ErrList) else []
                errors += await self.ci.producers_post(producers or [], "channel/create", qs)
        if failure is not None:
            log.error("failed to create topic/channel - %s", failure)
            raise HTTPError(502, f"UPSTREAM_ERROR: {failure}")
        if errors:
            log.warning("%s", ErrList(errors))
            messages.append(str(ErrList(errors)))
        self.notify("create_topic", topic, "", "", request)
        if channel:
            self.notify("create_channel", topic, channel, "", request)
        return {"message": _warn(messages)}

    async def _delete(self, request: Request, topic: str, channel: str) -> Any:
        messages: list[str] = []
        self._require_admin(request)
        kind = "channel" if channel else "topic"
        qs = "topic=" + quote_plus(topic) + (f"&channel={quote_plus(channel)}" if channel else "")
        producers, err = await self.ci.topic_producers(topic, self.lookupds, self.nsqds)
        if isinstance(err, Failure):
            log.error("failed to delete %s - %s", kind, err)
            raise HTTPError(502, f"UPSTREAM_ERROR: {err}")
        errors: list[BaseException] = list(err.errors) if isinstance(err, ErrList) else []
        errors += await self.ci.lookupd_post(self.lookupds, f"{kind}/delete", qs)
        errors += await self.ci.producers_post(producers or [], f"{kind}/delete", qs)
        if errors:
            log.warning("%s", ErrList(errors))
            messages.append(str(ErrList(errors)))
        self.notify(f"delete_{kind}", topic, channel, "", request)
        return {"message": _warn(messages)}

    async def delete_topic(self, request: Request, topic: str) -> Any:
        return await self._delete(request, topic, "")

    async def delete_channel(self, request: Request, topic: str, channel: str) -> Any:
        return await self._delete(request, topic, channel)

    async def tombstone_node_for_topic(self, request: Request, node: str) -> Any:
        messages: list[str] = []
        self._require_admin(request)
        try:
            topic = decode_struct(request.body, ["topic"])["topic"]
        except GoJSONError:
            raise HTTPError(400, "INVALID_BODY") from None
        if not is_valid_topic_name(topic):
            raise HTTPError(400, "INVALID_TOPIC")
        errors: list[BaseException] = []
        qs = f"topic={quote_plus(topic)}&node={quote_plus(node)}"
        errors += await self.ci.lookupd_post(self.lookupds, "topic/tombstone", qs)
        producers, err = await self.ci.nsqd_producers([node])
        if isinstance(err, Failure):
            log.error("failed to tombstone node for topic - %s", err)
            raise HTTPError(502, f"UPSTREAM_ERROR: {err}")
        errors += await self.ci.producers_post(
            producers or [], "topic/delete", f"topic={quote_plus(topic)}"
        )
        if errors:
            log.warning("%s", ErrList(errors))
            messages.append(str(ErrList(errors)))
        self.notify("tombstone_topic_producer", topic, "", node, request)
        return {"message": _warn(messages)}

    # -- graphite and /config -----------------------------------------------------------

    async def graphite(self, request: Request) -> Any:
        if request.query_error:
            raise HTTPError(400, "INVALID_REQUEST")
        params = request.query
        if (params.get("metric") or [""])[0] != "rate":
            raise HTTPError(400, "INVALID_ARG_METRIC")
        if "target" not in params:
            raise HTTPError(400, "INVALID_ARG_TARGET")
        interval = int(self.options.statsd_interval)
        query = urlencode(
            sorted(
                {
                    "from": f"-{interval * 2}sec",
                    "until": f"-{interval}sec",
                    "format": "json",
                    "target": params["target"][0],
                }.items()
            )
        )
        url = f"{self.options.graphite_url}/render?{query}"
        log.info("GRAPHITE: %s", url)
        try:
            response = await self.client.get(url)
            if response.status_code != 200:
                raise ValueError(f"got response {response.status_code}")
            rate = float(response.json()[0]["datapoints"][0][0])
        except (httpx.HTTPError, ValueError, TypeError, KeyError, IndexError) as exc:
            log.error("graphite request failed - %s", exc)
            raise HTTPError(500, "INTERNAL_ERROR") from None
        if rate < 0:
            return {"rate": "N/A"}
        return {"rate": f"{rate / max(1, interval):.2f}"}

    async def proxy_graphite(self, request: Request) -> Response:
        """``--proxy-graphite``: ``/render`` forwarded to --graphite-url."""
        base = self.options.graphite_url.rstrip("/")
        query = request.raw_query
        try:
            response = await self.client.get(f"{base}/render" + (f"?{query}" if query else ""))
        except httpx.HTTPError as exc:
            log.error("http: proxy error: %s", exc)
            return Response(502, b"", [])
        headers = [(k, v) for k, v in response.headers.items() if k.lower() == "content-type"]
        return Response(response.status_code, response.content, headers)

    def _config_allowed(self, request: Request) -> None:
        cidr = self.options.allow_config_from_cidr
        if not cidr:
            return
        host = request.remote_addr.rpartition(":")[0].strip("[]")
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            log.error("failed to parse RemoteAddr %s", request.remote_addr)
            raise HTTPError(400, "INVALID_REMOTE_ADDR") from None
        network = ipaddress.ip_network(cidr, strict=False)
        if ip.version != network.version or ip not in network:
            raise HTTPError(403, "FORBIDDEN")

    async def config(self, request: Request, opt: str) -> Any:
        self._config_allowed(request)
        if request.method == "PUT":
            body = request.body
            if len(body) >= CONFIG_READ_MAX or not body:
                raise HTTPError(413, "INVALID_VALUE")
            if opt == "nsqlookupd_http_addresses":
                try:
                    addresses = json.loads(body)
                except ValueError:
                    raise HTTPError(400, "INVALID_VALUE") from None
                if addresses is not None and (
                    not isinstance(addresses, list)
                    or not all(isinstance(a, str) for a in addresses)
                ):
                    raise HTTPError(400, "INVALID_VALUE")
                self.options.nsqlookupd_http_addresses = list(addresses or [])
            elif opt == "log_level":
                level = body.decode("utf-8", "replace").lower()
                if level not in LOG_LEVELS:
                    raise HTTPError(400, "INVALID_VALUE")
                self.options.log_level = level
                logging.getLogger("fakensq").setLevel(
                    {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING}.get(
                        level, logging.ERROR
                    )
                )
            else:
                raise HTTPError(400, "INVALID_OPTION")
        found, value = self.options.config_value(opt)
        if not found:
            raise HTTPError(400, "INVALID_OPTION")
        return value


def _basic_auth_user(request: Request) -> str:
    scheme, _, encoded = request.headers.get("authorization", "").partition(" ")
    if scheme != "Basic" or not encoded:
        return ""
    try:
        decoded = base64.b64decode(encoded, validate=True).decode("utf-8", "replace")
    except ValueError:
        return ""
    user, sep, _ = decoded.partition(":")
    return user if sep else ""


__all__ += ["HTTPError", "Producer", "UpstreamError"]
