"""The admin web server: nsqadmin's HTTP API, the pages, fault controls.

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

import gzip
import logging
import mimetypes
import os
import ssl
import time
import zlib
from collections.abc import Callable, Sequence
from importlib import resources
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx
import trio

from ..flags import format_go_duration
from ..httpserver import HTTPServer, Request, Response
from ..router import Router
from . import views
from .api import NSQAdminAPI, respond_v1, v1_error
from .data import Reader, Snapshot
from .history import CHART_WINDOW, History
from .jsonbody import GoJSONError
from .options import AdminOptions, OptionsError, go_file_error, normalize_base_path
from .timeline import Event, Timeline
from .views import FaultCaps

if TYPE_CHECKING:
    from ..cluster import Cluster

__all__ = ["Admin", "ActionError", "WATCH_INTERVAL", "client_tls_context"]

log = logging.getLogger("fakensq.admin")

#: How often the admin reads the cluster (timeline, charts).
WATCH_INTERVAL = 0.5

_OWN_ASSETS = ("admin.js", "admin.css")


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


class ActionError(Exception):
    """An action that cannot be done (bad arguments, nothing to do it on)."""


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


class Admin:
    """The admin server; an async context manager, or run ``serve`` in a nursery.

    ``options`` are nsqadmin's (:class:`AdminOptions`, what ``fakensq admin``'s
    flags set); ``lookupd_http_addresses``, ``nsqd_http_addresses`` and
    ``http_address`` override theirs.  Without ``options`` it listens on
    ``127.0.0.1:4171`` (the command line, as nsqadmin, on every interface).
    With ``cluster`` (a running :class:`fakensq.Cluster`) its nodes are read and
    the fault controls are on.  The cluster is read every ``watch_interval``
    seconds for the timeline and the charts, which show the last
    ``chart_window`` seconds.
    """

    def __init__(
        self,
        *,
        options: AdminOptions | None = None,
        lookupd_http_addresses: Sequence[str] = (),
        nsqd_http_addresses: Sequence[str] = (),
        cluster: Cluster | None = None,
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
        if http_address is not None:
            opts.http_address = http_address
        opts.base_path = normalize_base_path(opts.base_path)
        self.options = opts
        self.cluster = cluster
        self.watch_interval = watch_interval
        self.timeline = Timeline()
        self.history = History(chart_window=chart_window)
        self.server = HTTPServer(self.handle, server_name="fakensq-admin")
        self.api: NSQAdminAPI | None = None
        self._client: httpx.AsyncClient | None = None
        self._reader: Reader | None = None
        self._router: Router | None = None
        self._cm: Any = None
        self._nursery: trio.Nursery | None = None
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
        """The fault controls that work: all of them with a Cluster, none without."""
        on = self.cluster is not None
        return FaultCaps(on, on, on, on)

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
            self._router = self._routes(self.api)
            await nursery.start(self.api.run_notifier)
            await nursery.start(self.server.serve, host, port)
            log.info("HTTP: listening on %s", self.listen_address)
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
        response = _as_go_sends(request, await self._router.handle(request))
        log.info(
            "%d %s %s (%s) %s",
            response.status,
            request.method,
            request.path + (f"?{request.raw_query}" if request.raw_query else ""),
            request.remote_addr,
            format_go_duration(time.perf_counter() - started),
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
            return lambda s: views.topics_page(s, history)
        if parts == ["nodes"]:
            return lambda s: views.nodes_page(s, caps)
        if len(parts) == 2 and parts[0] == "nodes":
            return lambda s: views.node_page(s, parts[1])
        if parts == ["counter"]:
            return views.counter_page
        if parts == ["lookup"]:
            return views.lookup_page
        if parts == ["timeline"]:
            return lambda s: views.timeline_page(
                s, caps, list(self.timeline.events), self.active_faults()
            )
        if len(parts) == 2 and parts[0] == "topics":
            return lambda s: views.topic_page(s, parts[1], history)
        if len(parts) == 3 and parts[0] == "topics":
            return lambda s: views.channel_page(s, parts[1], parts[2], caps, history)
        return None

    # -- actions ------------------------------------------------------------------

    def _on_api_action(self, action: str, what: str) -> None:
        self.timeline.record("action", f"{action.replace('_', ' ')} {what} (API)")

    async def _action(self, request: Request) -> Response:
        import json

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
            ok, message = await self.act(action, args)
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
                response = await client.post(url)
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

    def _timeout_counts(self, topic: str, channel: str) -> dict[tuple[str, str, str], int]:
        """Each live nsqd's timeout count of ``topic/channel``, read in-process."""
        assert self.cluster is not None
        counts: dict[tuple[str, str, str], int] = {}
        for i, address in enumerate(self.cluster.nsqd_http_addresses):
            try:
                nsqd = self.cluster.nsqd(i)
            except RuntimeError:
                continue
            t = nsqd.topics.get(topic)
            ch = t.channels.get(channel) if t is not None else None
            if ch is not None:
                counts[(address, topic, channel)] = ch.timeout_count
        return counts

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
            # The effect comes from the counters around the fault itself, not from
            # whichever poll happens to come next.
            before = self._timeout_counts(topic, channel)
            count = faults.time_out_in_flight(topic=topic, channel=channel)
            after = self._timeout_counts(topic, channel)
            self.timeline.timeouts({k: (before.get(k, 0), n) for k, n in after.items()})
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
        address = addresses[target][index]
        where = f"{name} ({address})"
        try:
            if kind == "kill":
                await faults.kill(name)
                self._report_state(target, address, False, "killed")
                return True, f"killed {where}"
            if kind == "stop":
                await faults.stop(name)
                self._report_state(target, address, False, "stopped")
                return True, f"stopped {where}"
            if kind == "restart":
                await faults.start(name)
                self._report_state(target, address, True, "")
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

    def _report_state(self, target: str, address: str, up: bool, why: str) -> None:
        """A fault's known effect on a node, on the timeline now."""
        if target == "nsqd":
            self.timeline.node_state(address, up, why)
        else:
            self.timeline.lookupd_state(address, up)

    def active_faults(self) -> list[dict[str, Any]]:
        """The faults in force (``cluster.faults.active``), described."""
        if self.cluster is None:
            return []
        return [f.describe() for f in self.cluster.faults.active]


def _as_go_sends(request: Request, response: Response) -> Response:
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
    if not typed:
        sniffed = "text/plain; charset=utf-8" if response.body else ""
        return Response(
            response.status, response.body, [*response.headers, ("Content-Type", sniffed)]
        )
    return response


def _describe_fault(doc: dict[str, Any]) -> str:
    where = " ".join(
        f"{k}={doc[k]}" for k in ("node", "peer", "topic", "channel", "direction") if k in doc
    )
    return f"#{doc['id']} {doc['kind']} {where}".strip()


__all__ += ["GoJSONError", "respond_v1"]
