"""The admin web server: pages, their JSON feed, nsqadmin's actions, fault controls.

::

    async with Admin(lookupd_http_addresses=["127.0.0.1:4161"]) as admin:
        print(admin.url)          # http://127.0.0.1:4171

    async with fakensq.Cluster(nsqd=2) as cluster, Admin(cluster=cluster) as admin:
        ...                        # the same, plus kill/restart buttons and a timeline

Everything is read and done through nsqd's and nsqlookupd's HTTP APIs, as
nsqadmin does, so it works against real daemons too; only the fault controls
need the in-process :class:`fakensq.Cluster`.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from importlib import resources
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

import httpx
import trio

from ..httpserver import HTTPServer, Request, Response
from . import views
from .data import REQUEST_TIMEOUT, Reader, Snapshot
from .views import Event, FaultCaps

if TYPE_CHECKING:
    from ..cluster import Cluster

__all__ = ["Admin", "ActionError"]

log = logging.getLogger(__name__)

#: How often the timeline's watcher reads the cluster.
WATCH_INTERVAL = 0.5
#: Timeline entries kept.
TIMELINE_SIZE = 500

_STATIC = {
    "/static/admin.js": ("admin.js", "text/javascript; charset=utf-8"),
    "/static/admin.css": ("admin.css", "text/css; charset=utf-8"),
}


@functools.cache
def _static(name: str) -> bytes:
    # Read once: a few kilobytes of package data, not worth a thread per request.
    return resources.files(__package__).joinpath("static", name).read_bytes()


class ActionError(Exception):
    """An action that cannot be done (bad arguments, nothing to do it on)."""


def _split_host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port or 0)


class Admin:
    """The admin server; an async context manager, or run ``serve`` in a nursery.

    ``lookupd_http_addresses`` and ``nsqd_http_addresses`` are what nsqadmin's
    ``--lookupd-http-address`` and ``--nsqd-http-address`` are.  With ``cluster``
    (a running :class:`fakensq.Cluster`), its nodes are read (those flags are not
    needed) and the fault controls are on.
    """

    def __init__(
        self,
        *,
        lookupd_http_addresses: Sequence[str] = (),
        nsqd_http_addresses: Sequence[str] = (),
        cluster: Cluster | None = None,
        http_address: str = "127.0.0.1:4171",
        watch_interval: float = WATCH_INTERVAL,
    ) -> None:
        self._lookupds = list(lookupd_http_addresses)
        self._nsqds = list(nsqd_http_addresses)
        self.cluster = cluster
        self.http_address = http_address
        self.watch_interval = watch_interval
        self.events: deque[Event] = deque(maxlen=TIMELINE_SIZE)
        self.server = HTTPServer(self.handle, server_name="fakensq-admin")
        self._client: httpx.AsyncClient | None = None
        self._reader: Reader | None = None
        self._last: Snapshot | None = None
        self._cm: Any = None
        self._nursery: trio.Nursery | None = None

    # -- running ------------------------------------------------------------------

    @property
    def url(self) -> str:
        """``http://host:port`` of the running server."""
        if self.server.address is None:
            raise RuntimeError("the admin server is not running")
        host, port = self.server.address
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}"

    @property
    def lookupd_http_addresses(self) -> list[str]:
        if self.cluster is not None:
            return self.cluster.lookupd_http_addresses
        return self._lookupds

    @property
    def nsqd_http_addresses(self) -> list[str]:
        return self._nsqds

    @property
    def caps(self) -> FaultCaps:
        """The fault controls that work: all of them with a Cluster, none without."""
        on = self.cluster is not None
        return FaultCaps(on, on, on, on)

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; ``task_status.started`` gets the URL."""
        host, port = _split_host_port(self.http_address)
        async with httpx.AsyncClient() as client, trio.open_nursery() as nursery:
            self._client = client
            self._reader = Reader(client)
            await nursery.start(self.server.serve, host, port)
            nursery.start_soon(self._watch)
            task_status.started(self.url)

    async def __aenter__(self) -> Admin:
        self._cm = trio.open_nursery()
        self._nursery = await self._cm.__aenter__()
        try:
            await self._nursery.start(self.serve)
        except BaseException:
            self._nursery.cancel_scope.cancel()
            await self._cm.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()
        await self._cm.__aexit__(None, None, None)

    # -- reading ------------------------------------------------------------------

    async def snapshot(self) -> Snapshot:
        """The cluster as it is now (read afresh through the HTTP APIs)."""
        assert self._reader is not None
        cluster_nsqds = self.cluster.nsqd_http_addresses if self.cluster is not None else []
        snap = await self._reader.snapshot(
            self.lookupd_http_addresses, self._nsqds, cluster_nsqds=cluster_nsqds
        )
        return snap

    def record(self, kind: str, text: str) -> None:
        """Add a timeline entry."""
        self.events.append(Event(time.time(), kind, text))

    async def _watch(self) -> None:
        """Read the cluster every ``watch_interval`` and put what changed on the timeline."""
        while True:
            try:
                snap = await self.snapshot()
            except Exception:  # a bug here must not take the pages down
                log.exception("admin watcher failed")
            else:
                if self._last is not None:
                    for text in _changes(self._last, snap):
                        self.record("effect", text)
                self._last = snap
            await trio.sleep(self.watch_interval)

    # -- HTTP -----------------------------------------------------------------------

    async def handle(self, request: Request) -> Response:
        """Route one request: static files, pages, their JSON twins, actions."""
        path = request.path
        if path in _STATIC:
            name, ctype = _STATIC[path]
            body = _static(name)
            return Response(200, body, [("Content-Type", ctype), ("Cache-Control", "no-cache")])
        if path == "/ping":
            return Response.text("OK")
        if path == "/":
            return Response(302, b"", [("Location", "/nodes")])
        if path == "/api/action":
            if request.method != "POST":
                return Response.json({"message": "METHOD_NOT_ALLOWED"}, 405)
            return await self._action(request)
        live = path.startswith("/api/live/")
        page_path = "/" + path[len("/api/live/") :] if live else path
        if request.method not in ("GET", "HEAD"):
            return Response.json({"message": "METHOD_NOT_ALLOWED"}, 405)
        build = self._page_builder(page_path)
        if build is None:
            return Response(404, b"<h1>404 not found</h1>", [("Content-Type", "text/html")])
        page = build(await self.snapshot())
        if live:
            return Response.json({"title": page.title, "sections": page.sections})
        html = views.render_page(page, nav=self._nav(), current=page_path)
        return Response(200, html.encode(), [("Content-Type", "text/html; charset=utf-8")])

    def _nav(self) -> list[tuple[str, str]]:
        caps = self.caps
        return [
            ("Nodes", "/nodes"),
            ("Topics", "/topics"),
            ("Faults & timeline" if caps.any else "Timeline", "/timeline"),
        ]

    def _page_builder(self, path: str) -> Callable[[Snapshot], views.Page] | None:
        parts = [unquote(p) for p in path.strip("/").split("/")]
        caps = self.caps
        if parts == ["nodes"]:
            return lambda s: views.nodes_page(s, caps)
        if parts == ["timeline"]:
            return lambda s: views.timeline_page(s, caps, list(self.events), self.active_faults())
        if parts == ["topics"]:
            return views.topics_page
        if len(parts) == 2 and parts[0] == "topics":
            return lambda s: views.topic_page(s, parts[1])
        if len(parts) == 3 and parts[0] == "topics":
            return lambda s: views.channel_page(s, parts[1], parts[2], caps)
        return None

    # -- actions ------------------------------------------------------------------

    async def _action(self, request: Request) -> Response:
        try:
            args = json.loads(request.body or b"{}")
            if not isinstance(args, dict):
                raise ValueError("not an object")
        except ValueError:
            return Response.json({"ok": False, "message": "the body must be a JSON object"}, 400)
        action = str(args.get("action", ""))
        try:
            ok, message = await self.act(action, args)
        except ActionError as exc:
            return Response.json({"ok": False, "message": str(exc)}, 400)
        self.record("fault" if action.startswith("fault/") else "action", message)
        result: dict[str, Any] = {"ok": ok, "message": message}
        if ok and action == "topic/delete":
            result["redirect"] = "/topics"
        elif ok and action == "channel/delete":
            result["redirect"] = views.topic_url(str(args.get("topic")))
        return Response.json(result, 200 if ok else 502)

    async def act(self, action: str, args: dict[str, Any]) -> tuple[bool, str]:
        """Do ``action`` (``topic/pause``, ``fault/kill-nsqd``...); (all went well, what
        happened).  Raises :class:`ActionError` for a request that makes no sense."""
        if action.startswith("fault/"):
            return await self._fault(action[len("fault/") :], args)
        kind, _, verb = action.partition("/")
        if kind not in ("topic", "channel") or verb not in (
            "create",
            "delete",
            "empty",
            "pause",
            "unpause",
        ):
            raise ActionError(f"unknown action {action!r}")
        topic = str(args.get("topic") or "")
        channel = str(args.get("channel") or "")
        if not topic:
            raise ActionError("no topic given")
        if kind == "channel" and not channel:
            raise ActionError("no channel given")
        if kind == "topic" and verb == "create" and channel:
            # nsqadmin's create form makes the topic and, optionally, a channel in it.
            ok1, m1 = await self.act("topic/create", {"topic": topic})
            ok2, m2 = await self.act("channel/create", {"topic": topic, "channel": channel})
            return ok1 and ok2, f"{m1}; {m2}"

        query = "topic=" + quote(topic, safe="")
        if kind == "channel":
            query += "&channel=" + quote(channel, safe="")
        targets: list[str] = []
        if verb in ("create", "delete"):
            # As nsqadmin: lookupds first (registrations), then the producers.
            targets += [f"http://{a}/{kind}/{verb}?{query}" for a in self.lookupd_http_addresses]
        snap = await self.snapshot()
        producers = snap.producers(topic)
        if not producers and kind == "topic" and verb == "create":
            # A new topic has no producer yet: make it on every live nsqd, so that
            # it is somewhere (nsqadmin would only register it with nsqlookupd).
            producers = [n.address for n in snap.nodes if n.up]
        targets += [f"http://{a}/{kind}/{verb}?{query}" for a in producers]
        if not targets:
            raise ActionError(f"no nsqd or nsqlookupd holds topic {topic}")
        results = await self._post_all(targets)
        failed = [f"{where}: {why}" for where, why in results if why != "OK"]
        what = f"{verb} {kind} {topic}" + (f"/{channel}" if channel else "")
        done = [where for where, why in results if why == "OK"]
        message = f"{what}: OK on {', '.join(done) or 'nothing'}"
        if failed:
            message += "; FAILED on " + ", ".join(failed)
        return not failed, message

    async def _post_all(self, urls: Sequence[str]) -> list[tuple[str, str]]:
        results: list[tuple[str, str]] = [("", "")] * len(urls)
        assert self._client is not None
        client = self._client

        async def post(i: int, url: str) -> None:
            where = url.split("/")[2]
            try:
                response = await client.post(url, timeout=REQUEST_TIMEOUT)
            except httpx.HTTPError as exc:
                results[i] = (where, type(exc).__name__)
                return
            if response.is_success:
                results[i] = (where, "OK")
            else:
                try:
                    why = str(response.json().get("message"))
                except ValueError:
                    why = response.text.strip()
                results[i] = (where, f"HTTP {response.status_code} {why}")

        async with trio.open_nursery() as nursery:
            for i, url in enumerate(urls):
                nursery.start_soon(post, i, url)
        return results

    async def _fault(self, verb: str, args: dict[str, Any]) -> tuple[bool, str]:
        """A fault through ``cluster.faults`` (:mod:`fakensq.faults`); nodes are named
        ``nsqd-N``/``lookupd-N`` there, the page sends the index or the HTTP address."""
        cluster = self.cluster
        if cluster is None:
            raise ActionError("fault controls need an in-process fakensq Cluster")
        faults = cluster.faults
        if verb == "heal":
            wanted = str(args.get("fault", ""))
            healed = [f for f in list(faults.active) if wanted in ("all", str(f.id))]
            if not healed:
                raise ActionError(f"no active fault {wanted!r}")
            for fault in healed:
                fault.heal()
            return True, "healed " + ", ".join(_describe_fault(f.describe()) for f in healed)
        if verb == "timeout-in-flight":
            topic, channel = str(args.get("topic", "")), str(args.get("channel", ""))
            if not topic or not channel:
                raise ActionError("no topic or channel given")
            count = faults.time_out_in_flight(topic=topic, channel=channel)
            return True, f"timed out {count} in-flight message(s) of {topic}/{channel}"
        if verb in ("partition-client", "drop-client"):
            client = str(args.get("client", ""))
            node = cluster.node_name_at(str(args.get("nodeAddress", "")))
            if not client or not node.startswith("nsqd-"):
                raise ActionError("no client or nsqd given")
            if verb == "drop-client":
                count = await faults.drop(node=node, client=client)
                return True, f"dropped {count} connection(s) of client {client} on {node}"
            faults.partition(node, client)
            return True, f"partitioned client {client} from {node}"

        kind, _, target = verb.rpartition("-")
        addresses = {"nsqd": cluster.nsqd_http_addresses, "lookupd": cluster.lookupd_http_addresses}
        if target not in addresses:
            raise ActionError(f"unknown fault {verb!r}")
        try:
            index = int(args.get("node", -1))
        except (TypeError, ValueError):
            raise ActionError("node must be a number") from None
        if not 0 <= index < len(addresses[target]):
            raise ActionError(f"no node {index}")
        name = f"{target}-{index}"
        where = f"{name} ({addresses[target][index]})"
        try:
            if kind == "kill":
                await faults.kill(name)
                return True, f"killed {where}"
            if kind == "stop":
                await faults.stop(name)
                return True, f"stopped {where}"
            if kind == "restart":
                await faults.start(name)
                return True, f"started {where}"
        except (RuntimeError, OSError, ValueError, trio.TooSlowError) as exc:
            return False, f"{kind} {where} failed: {exc or type(exc).__name__}"
        if target != "nsqd":
            raise ActionError(f"unknown fault {verb!r}")
        if kind == "partition":
            lookupds = [f"lookupd-{j}" for j in range(len(cluster.lookupd_http_addresses))]
            for lookupd in lookupds:
                faults.partition(name, lookupd)
            return True, f"partitioned {where} from {', '.join(lookupds) or 'no lookupd'}"
        if kind == "swallow_heartbeats":
            faults.swallow_heartbeats(node=name)
            return True, f"{where}: heartbeats to its clients swallowed"
        if kind == "stall":
            faults.stall(node=name)
            return True, f"stalled every connection of {where}"
        raise ActionError(f"unknown fault {verb!r}")

    def active_faults(self) -> list[dict[str, Any]]:
        """The faults in force (``cluster.faults.active``), described."""
        if self.cluster is None:
            return []
        return [f.describe() for f in self.cluster.faults.active]


def _describe_fault(doc: dict[str, Any]) -> str:
    where = " ".join(
        f"{k}={doc[k]}" for k in ("node", "peer", "topic", "channel", "direction") if k in doc
    )
    return f"#{doc['id']} {doc['kind']} {where}".strip()


def _changes(old: Snapshot, new: Snapshot) -> list[str]:
    """What a user would want on the timeline between two snapshots."""
    out: list[str] = []
    old_nodes = {n.address: n for n in old.nodes}
    for n in new.nodes:
        before = old_nodes.get(n.address)
        was_up = before.up if before is not None else False
        if n.up != was_up:
            out.append(
                f"nsqd {n.address} is {'up' if n.up else 'down'}"
                + ("" if n.up else f" ({n.error})")
            )
        elif before is not None and n.up and n.health != before.health:
            out.append(f"nsqd {n.address} health: {n.health}")
    old_lk = {lk.address: lk for lk in old.lookupds}
    for lk in new.lookupds:
        prev = old_lk.get(lk.address)
        if prev is None:
            continue
        if lk.up != prev.up:
            out.append(f"nsqlookupd {lk.address} is {'up' if lk.up else 'down'}")
        elif lk.up and len(lk.nodes) != len(prev.nodes):
            out.append(
                f"nsqlookupd {lk.address} lists {len(lk.nodes)} nsqd (was {len(prev.nodes)})"
            )
    for name in new.topics.keys() - old.topics.keys():
        out.append(f"topic {name} appeared")
    for name in old.topics.keys() - new.topics.keys():
        out.append(f"topic {name} is gone")
    for name, t in new.topics.items():
        before_t = old.topics.get(name)
        if before_t is None:
            continue
        if t.paused != before_t.paused:
            out.append(f"topic {name} {'paused' if t.paused else 'unpaused'}")
        for cname, c in t.channels.items():
            prev_c = before_t.channels.get(cname)
            label = f"channel {name}/{cname}"
            if prev_c is None:
                out.append(f"{label} appeared")
                continue
            if c.paused != prev_c.paused:
                out.append(f"{label} {'paused' if c.paused else 'unpaused'}")
            if c.timeout_count > prev_c.timeout_count:
                out.append(
                    f"{label}: {c.timeout_count - prev_c.timeout_count} message(s) timed out"
                )
            if c.client_count != prev_c.client_count:
                out.append(f"{label}: {c.client_count} client(s) (was {prev_c.client_count})")
        for cname in before_t.channels.keys() - t.channels.keys():
            out.append(f"channel {name}/{cname} is gone")
    return out
