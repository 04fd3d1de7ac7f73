"""The admin web server: nsqadmin's HTTP API, the pages, fault controls.

::

    async with Admin(lookupd_http_addresses=["127.0.0.1:4161"]) as admin:
        print(admin.url)          # http://127.0.0.1:4171

    async with fakensq.Cluster(nsqd=2) as cluster, Admin(cluster=cluster) as admin:
        ...                        # the same, plus kill/restart buttons and a timeline

Everything is read and done through nsqd's and nsqlookupd's HTTP APIs, as
nsqadmin does, so it works against real daemons too; only the fault controls
need the in-process :class:`fakensq.Cluster`, or, for the faults of the wire
in front of a real nsqd, ``fakensq proxy``'s HTTP API::

    async with Admin(nsqd_http_addresses=[...], proxy_http_addresses=[proxy.http_address]):
        ...                        # the Faults page has the proxy's buttons
"""

from __future__ import annotations

import json
import logging
import mimetypes
import os
import re
import ssl
import time
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

import httpx
import trio

from trionsq.tools.flags import format_duration

from ..http.router import Router
from ..http.server import READ_ALL, HTTPServer, Request, Response
from ..serving import ServingNode
from . import nodepages, topicpages, views
from .actions import ActionError, PageActions
from .api import CONFIG_READ_MAX, NSQAdminAPI, as_nsqadmin_sends, v1_error
from .clusterhandle import InProcessCluster
from .data import Reader, Snapshot
from .faultcontrols import FaultControls
from .history import CHART_WINDOW, History
from .options import AdminOptions, OptionsError, go_file_error, normalize_base_path
from .proxycontrols import ProxyControls
from .proxypages import proxy_forms, proxy_sections
from .timeline import Event, Timeline
from .views import FaultCaps

__all__ = ["Admin", "ActionError", "WATCH_INTERVAL", "client_tls_context"]

log = logging.getLogger("fakensq.admin")

#: How often the admin reads the cluster (timeline, charts).
WATCH_INTERVAL = 0.5

_OWN_ASSETS = ("admin.js", "admin.css")
# The action routes: /api/topics[/:topic[/:channel]] and /api/nodes/:node.
_API_TOPICS = re.compile(r"/api/topics(/[^/]+){0,2}")
_API_NODE = re.compile(r"/api/nodes/[^/]+")


def _static(name: str, dev_dir: str) -> bytes | None:
    """A static asset: from --dev-static-dir when given, else the package's."""
    if "/" in name or name in ("", ".", ".."):
        return None
    if dev_dir:
        try:
            with open(os.path.join(dev_dir, name), "rb") as f:
                return f.read()
        except OSError:
            return None
    if name not in _OWN_ASSETS:
        return None
    return resources.files(__package__).joinpath("static", name).read_bytes()


def _split_host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port or 0)


def client_tls_context(options: AdminOptions) -> ssl.SSLContext | bool:
    """The HTTP client's TLS settings (--http-client-tls-*), as nsqadmin builds them."""
    if not (
        options.http_client_tls_root_ca_file
        or options.http_client_tls_cert
        or options.http_client_tls_insecure_skip_verify
    ):
        return True
    context = ssl.create_default_context()
    if options.http_client_tls_insecure_skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    ca_file = options.http_client_tls_root_ca_file
    if ca_file:
        try:
            with open(ca_file, "rb") as f:
                pem = f.read()
        except OSError as exc:
            raise OptionsError(
                f"failed to read TLS root CA file {ca_file} - {go_file_error(ca_file, exc)}"
            ) from None
        try:
            context.load_verify_locations(cadata=pem.decode("ascii", "replace"))
        except (ssl.SSLError, ValueError):
            raise OptionsError(f"failed to AppendCertsFromPEM {ca_file}") from None
    if options.http_client_tls_cert:
        try:
            context.load_cert_chain(options.http_client_tls_cert, options.http_client_tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise OptionsError(
                f"failed to LoadX509KeyPair {options.http_client_tls_cert}, "
                f"{options.http_client_tls_key} - {exc}"
            ) from None
    return context


class Admin(ServingNode):
    """The admin server; an async context manager, or run ``serve`` in a nursery.

    ``options`` are nsqadmin's (:class:`AdminOptions`, what ``fakensq admin``'s
    flags set); ``lookupd_http_addresses``, ``nsqd_http_addresses`` and
    ``http_address`` override theirs.  Without ``options`` it listens on
    ``127.0.0.1:4171`` (the command line, as nsqadmin, on every interface).
    With ``cluster`` (a running :class:`fakensq.Cluster`) its nodes are read and
    the fault controls are on.  With ``proxy_http_addresses`` (``fakensq proxy``s'
    HTTP addresses, or the options') the Faults page has their buttons.  The
    cluster is read every ``watch_interval`` seconds for the timeline and the
    charts, which show the last ``chart_window`` seconds.
    """

    def __init__(
        self,
        *,
        options: AdminOptions | None = None,
        lookupd_http_addresses: Sequence[str] = (),
        nsqd_http_addresses: Sequence[str] = (),
        cluster: InProcessCluster | None = None,
        proxy_http_addresses: Sequence[str] = (),
        http_address: str | None = None,
        watch_interval: float = WATCH_INTERVAL,
        chart_window: float = CHART_WINDOW,
    ) -> None:
        opts = (
            options.replace()
            if options is not None
            else AdminOptions(http_address="127.0.0.1:4171")
        )
        if lookupd_http_addresses:
            opts.nsqlookupd_http_addresses = list(lookupd_http_addresses)
        if nsqd_http_addresses:
            opts.nsqd_http_addresses = list(nsqd_http_addresses)
        if proxy_http_addresses:
            opts.proxy_http_addresses = list(proxy_http_addresses)
        if http_address is not None:
            opts.http_address = http_address
        opts.base_path = normalize_base_path(opts.base_path)
        self.options = opts
        self.cluster = cluster
        self.watch_interval = watch_interval
        self.timeline = Timeline()
        self.history = History(chart_window=chart_window)
        # No Server header: nsqadmin (Go's net/http) sends none.
        self.server = HTTPServer(self.handle, body_limit=self._body_limit)
        self.api: NSQAdminAPI | None = None
        self.actions: PageActions | None = None
        #: The fault controls (with a cluster only).
        self.faults = FaultControls(cluster, self.timeline) if cluster is not None else None
        #: The fault proxies' controls (with proxy HTTP addresses only).
        self.proxies = (
            ProxyControls(opts.proxy_http_addresses) if opts.proxy_http_addresses else None
        )
        self._client: httpx.AsyncClient | None = None
        self._reader: Reader | None = None
        self._router: Router | None = None
        self.latest: Snapshot | None = None

    # -- running ------------------------------------------------------------------

    @property
    def listen_address(self) -> str:
        """``host:port`` the server listens on."""
        if self.server.address is None:
            raise RuntimeError("the admin server is not running")
        host, port = self.server.address
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    @property
    def url(self) -> str:
        """``http://host:port[base path]`` of the running server (every interface
        is reached through loopback)."""
        if self.server.address is None:
            raise RuntimeError("the admin server is not running")
        host, port = self.server.address
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
        base = "" if self.options.base_path == "/" else self.options.base_path
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}{base}"

    @property
    def events(self) -> Sequence[Event]:
        """The timeline's entries, oldest first."""
        return self.timeline.events

    @property
    def lookupd_http_addresses(self) -> list[str]:
        """The nsqlookupds nsqadmin reads (the cluster's, with a cluster)."""
        if self.cluster is not None:
            return list(self.cluster.lookupd_http_addresses)
        return self.options.nsqlookupd_http_addresses

    @property
    def nsqd_http_addresses(self) -> list[str]:
        """The nsqds nsqadmin reads directly (a cluster without nsqlookupd: its nsqds)."""
        if self.cluster is not None:
            return (
                []
                if self.cluster.lookupd_http_addresses
                else list(self.cluster.nsqd_http_addresses)
            )
        return self.options.nsqd_http_addresses

    @property
    def caps(self) -> FaultCaps:
        """The fault controls that work: all of a Cluster's with one; a proxy's
        (on its own section) with proxies."""
        on = self.cluster is not None
        return FaultCaps(on, on, on, on, proxy=self.proxies is not None)

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; ``task_status.started`` gets the URL."""
        if self.cluster is None:
            # nsqadmin refuses both kinds of address at once; here the pages read
            # both, and the API, as nsqadmin's code does, prefers the lookupds.
            both = self.options.nsqd_http_addresses and self.options.nsqlookupd_http_addresses
            self.options.replace(
                nsqd_http_addresses=[] if both else self.options.nsqd_http_addresses
            ).validate()
        host, port = _split_host_port(self.options.http_address)
        timeout = httpx.Timeout(
            self.options.http_client_request_timeout,
            connect=self.options.http_client_connect_timeout,
        )
        async with (
            httpx.AsyncClient(timeout=timeout, verify=client_tls_context(self.options)) as client,
            trio.open_nursery() as nursery,
        ):
            self._client = client
            self._reader = Reader(client)
            self.api = NSQAdminAPI(
                self.options,
                client,
                lookupds=lambda: self.lookupd_http_addresses,
                nsqds=lambda: self.nsqd_http_addresses,
                on_action=self._on_api_action,
            )
            self.actions = PageActions(client, self.snapshot, lambda: self.lookupd_http_addresses)
            self._router = self._routes(self.api)
            await nursery.start(self.api.run_notifier)
            await nursery.start(self.server.serve, host, port)
            log.info("HTTP: listening on %s", self.listen_address)
            nursery.start_soon(self._watch)
            task_status.started(self.url)

    # -- reading ------------------------------------------------------------------

    async def snapshot(self) -> Snapshot:
        """The cluster as it is now (read afresh through the HTTP APIs)."""
        assert self._reader is not None
        if self.proxies is not None and self._client is not None:
            await self.proxies.refresh(self._client)
        cluster_nsqds = self.cluster.nsqd_http_addresses if self.cluster is not None else []
        return await self._reader.snapshot(
            self.lookupd_http_addresses,
            self.options.nsqd_http_addresses if self.cluster is None else [],
            cluster_nsqds=cluster_nsqds,
        )

    def record(self, kind: str, text: str) -> None:
        """Add a timeline entry."""
        self.timeline.record(kind, text)

    async def _watch(self) -> None:
        """Read the cluster every ``watch_interval``: the timeline and the charts."""
        while True:
            epoch = self.timeline.epoch
            try:
                snap = await self.snapshot()
            except Exception:  # a bug here must not take the pages down
                log.exception("admin watcher failed")
            else:
                self.timeline.observe(snap, epoch)
                self.history.add(snap)
                self.latest = snap
            await trio.sleep(self.watch_interval)

    # -- HTTP -----------------------------------------------------------------------

    def _bp(self, path: str) -> str:
        base = self.options.base_path.rstrip("/")
        return (base + path) if path != "/" else (base or "/")

    def _body_limit(self, request: Request) -> int:
        """What nsqadmin's handler of ``request`` reads of its body before it
        answers (found with the real one): the JSON of an action and the
        parameters of GET /api/topics (NewReqParams) all of it, PUT /config
        its limit, the others none."""
        base = self.options.base_path.rstrip("/")
        path = request.path[len(base) :] if request.path.startswith(base + "/") else ""
        if (request.method, path) in (("GET", "/api/topics"), ("POST", "/api/action")):
            return READ_ALL
        if request.method == "POST" and _API_TOPICS.fullmatch(path):
            return READ_ALL
        if request.method == "DELETE" and _API_NODE.fullmatch(path):
            return READ_ALL
        if request.method == "PUT" and path.startswith("/config/"):
            return CONFIG_READ_MAX
        return 0

    _PAGES = (
        "/topics",
        "/topics/:topic",
        "/topics/:topic/:channel",
        "/nodes",
        "/nodes/:node",
        "/counter",
        "/lookup",
        "/timeline",
    )

    def _routes(self, api: NSQAdminAPI) -> Router:
        router = Router(
            not_found=lambda request: v1_error(404, "NOT_FOUND"),
            method_not_allowed=lambda request: v1_error(405, "METHOD_NOT_ALLOWED"),
        )
        bp = self._bp
        router.add("GET", bp("/ping"), self._ping)
        router.add("GET", bp("/"), self._page)
        for page in self._PAGES:
            router.add("GET", bp(page), self._page)
            # Each page's JSON twin, which its script polls.
            router.add("GET", bp("/api/live" + page), self._live)
        router.add("GET", bp("/static/:asset"), self._asset)
        router.add("GET", bp("/fonts/:asset"), self._asset)
        router.add("POST", bp("/api/action"), self._action)
        api.routes(router, bp)
        return router

    async def handle(self, request: Request) -> Response:
        """Route one request (logged as nsqadmin logs them)."""
        assert self._router is not None
        started = time.perf_counter()
        response = as_nsqadmin_sends(request, await self._router.handle(request))
        log.info(
            "%d %s %s (%s) %s",
            response.status,
            request.method,
            request.path + (f"?{request.raw_query}" if request.raw_query else ""),
            request.remote_addr,
            format_duration(time.perf_counter() - started),
        )
        return response

    async def _ping(self, request: Request) -> Response:
        return Response(200, b"OK")  # Go sniffs its type

    async def _asset(self, request: Request) -> Response:
        name = request.params["asset"]
        body = _static(name, self.options.dev_static_dir)
        if body is None:
            return Response(404, b"NOT_FOUND")  # PlainText: Go sniffs its type
        ctype, _ = mimetypes.guess_type(name)
        if ctype is not None and (ctype.startswith("text/") or ctype.endswith("javascript")):
            ctype += "; charset=utf-8"
        headers = [("Cache-Control", "no-cache")]
        if ctype:
            headers.append(("Content-Type", ctype))
        return Response(200, body, headers)

    def _page_path(self, request: Request) -> str:
        base = self.options.base_path.rstrip("/")
        path = request.path  # already unescaped, as Go's URL.Path
        if base and path.startswith(base):
            path = path[len(base) :]
        return path or "/"

    async def _page(self, request: Request) -> Response:
        path = self._page_path(request)
        build = self._page_builder(path)
        if build is None:
            return v1_error(404, "NOT_FOUND")
        page = build(await self.snapshot())
        html = views.render_page(
            page,
            nav=self._nav(),
            current=path,
            base=self._bp("/").rstrip("/"),
            admin=self.api is not None and self.api.is_admin(request),
        )
        return Response(200, html.encode(), [("Content-Type", "text/html; charset=utf-8")])

    async def _live(self, request: Request) -> Response:
        path = self._page_path(request)[len("/api/live") :]
        build = self._page_builder(path)
        if build is None:
            return v1_error(404, "NOT_FOUND")
        page = build(await self.snapshot())
        return Response.json({"title": page.title, "sections": page.sections})

    def _nav(self) -> list[tuple[str, str]]:
        bp = self._bp
        return [
            ("Topics", bp("/topics")),
            ("Nodes", bp("/nodes")),
            ("Counter", bp("/counter")),
            ("Lookup", bp("/lookup")),
            ("Faults & timeline" if self.caps.any else "Timeline", bp("/timeline")),
        ]

    def _page_builder(self, path: str) -> Callable[[Snapshot], views.Page] | None:
        parts = path.strip("/").split("/") if path.strip("/") else []
        caps = self.caps
        history = self.history
        if parts == [] or parts == ["topics"]:
            return lambda s: topicpages.topics_page(s, history)
        if parts == ["nodes"]:
            return lambda s: nodepages.nodes_page(s, caps)
        if len(parts) == 2 and parts[0] == "nodes":
            return lambda s: nodepages.node_page(s, parts[1])
        if parts == ["counter"]:
            return nodepages.counter_page
        if parts == ["lookup"]:
            return nodepages.lookup_page
        if parts == ["timeline"]:
            return lambda s: nodepages.timeline_page(
                s,
                caps,
                list(self.timeline.events),
                self.faults.active() if self.faults else [],
                proxy_sections(self.proxies.states) if self.proxies else {},
                proxy_forms(self.proxies.addresses) if self.proxies else "",
            )
        if len(parts) == 2 and parts[0] == "topics":
            return lambda s: topicpages.topic_page(s, parts[1], history)
        if len(parts) == 3 and parts[0] == "topics":
            return lambda s: topicpages.channel_page(s, parts[1], parts[2], caps, history)
        return None

    # -- actions ------------------------------------------------------------------

    def _on_api_action(self, action: str, what: str) -> None:
        self.timeline.record("action", f"{action.replace('_', ' ')} {what} (API)")

    async def _action(self, request: Request) -> Response:
        try:
            args = json.loads(request.body or b"{}")
            if not isinstance(args, dict):
                raise ValueError("not an object")
        except ValueError:
            return Response.json({"ok": False, "message": "the body must be a JSON object"}, 400)
        if self.api is not None and not self.api.is_admin(request):
            return Response.json({"ok": False, "message": "FORBIDDEN"}, 403)
        action = str(args.get("action", ""))
        fault = action.startswith("fault/")
        if fault:
            self.timeline.begin_fault()
        message = f"{action} failed"
        try:
            if fault:
                verb = action[len("fault/") :]
                if verb.startswith("proxy-") and self.proxies is not None:
                    assert self._client is not None
                    ok, message = await self.proxies.do(self._client, verb, args)
                elif verb.startswith("proxy-"):
                    raise ActionError("proxy faults need --proxy-http-address")
                elif self.faults is None:
                    raise ActionError("fault controls need an in-process fakensq Cluster")
                else:
                    ok, message = await self.faults.do(verb, args)
            else:
                assert self.actions is not None
                ok, message = await self.actions.act(action, args)
        except ActionError as exc:
            message = str(exc)
            return Response.json({"ok": False, "message": message}, 400)
        finally:
            if fault:
                self.timeline.end_fault(message)
        if not fault:
            self.record("action", message)
            kind, _, verb = action.partition("/")
            if self.api is not None and ok:
                self.api.notify(
                    f"{verb}_{kind}",
                    str(args.get("topic") or ""),
                    str(args.get("channel") or "") if kind == "channel" else "",
                    "",
                    request,
                )
        result: dict[str, Any] = {"ok": ok, "message": message}
        if ok and action == "topic/delete":
            result["redirect"] = self._bp("/topics")
        elif ok and action == "channel/delete":
            result["redirect"] = self._bp("/" + views.topic_url(str(args.get("topic"))))
        return Response.json(result, 200 if ok else 502)
