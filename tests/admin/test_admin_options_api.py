"""nsqadmin's options as its API shows them, beside the real nsqadmin v1.3.0.

Each test starts the real nsqadmin and ``fakensq admin`` with the same flags
over one fakensq cluster and compares their answers: ``--admin-user`` and
``--acl-http-header``, ``--allow-config-from-cidr``, ``--base-path``,
``--notification-http-endpoint``, ``--graphite-url`` and ``--proxy-graphite``
(against a small graphite stand-in), ``--dev-static-dir``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from fakensq import NSQD, Cluster
from fakensq.admin import Admin
from fakensq.cli.nsqadmin import admin_flagset, admin_options_from_flags
from fakensq.http.server import HTTPServer, Request, Response
from fakensq.nsqd.options import TLS_REQUIRED, NSQDOptions
from tests import reference

from ..support.tls import Pki
from ..support.waiting import wait_until
from .test_admin_api import answer


@dataclass
class Recorder:
    """A little HTTP server: what it was sent, and a canned answer."""

    requests: list[Request] = field(default_factory=list)
    status: int = 200
    body: bytes = b""
    address: str = ""

    async def handle(self, request: Request) -> Response:
        self.requests.append(request)
        return Response(self.status, self.body, [("Content-Type", "application/json")])


@asynccontextmanager
async def recorder() -> AsyncIterator[Recorder]:
    rec = Recorder()
    server = HTTPServer(rec.handle)
    async with trio.open_nursery() as nursery:
        host, port = await nursery.start(server.serve, "127.0.0.1", 0)
        rec.address = f"{host}:{port}"
        yield rec
        nursery.cancel_scope.cancel()


@dataclass
class Admins:
    real: str
    fake: str
    http: httpx.AsyncClient

    async def both(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[Any, Any]:
        real = await self.http.request(method, self.real + path, content=body, headers=headers)
        fake = await self.http.request(method, self.fake + path, content=body, headers=headers)
        return answer(real), answer(fake)

    async def same(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        real, fake = await self.both(method, path, body, headers)
        assert fake == real, f"{method} {path}"
        return real


@asynccontextmanager
async def admins(stack: AsyncExitStack, flags: Sequence[str]) -> AsyncIterator[Admins]:
    """The real nsqadmin and fakensq's, with ``flags``, over one fakensq cluster
    (topic ``orders`` with channel ``billing``)."""
    reference.require("nsqadmin")
    cluster = await stack.enter_async_context(Cluster(nsqd=1, lookupd=1))
    http = await stack.enter_async_context(httpx.AsyncClient(timeout=10))
    nsqd = cluster.nsqd_http_addresses[0]
    await http.post(f"http://{nsqd}/topic/create?topic=orders")
    await http.post(f"http://{nsqd}/channel/create?topic=orders&channel=billing")
    lookupd = cluster.lookupd(0)
    with trio.fail_after(20):
        await lookupd.wait_until(lambda: bool(lookupd.channels("orders")))
    argv = [f"--lookupd-http-address={cluster.lookupd_http_addresses[0]}", *flags]
    real = await stack.enter_async_context(reference.open_nsqadmin(*argv))
    values, _ = admin_flagset().parse(argv)
    options = admin_options_from_flags(values)
    fake = await stack.enter_async_context(
        Admin(options=options, http_address="127.0.0.1:0", watch_interval=60)
    )
    base = "" if options.base_path == "/" else options.base_path.rstrip("/")
    yield Admins(f"http://{real.http_address}{base}", fake.url, http)


async def test_admin_users_and_the_acl_header() -> None:
    async with AsyncExitStack() as stack:
        flags = ["--admin-user=alice", "--admin-user=bob", "--acl-http-header=X-User"]
        pair = await stack.enter_async_context(admins(stack, flags))
        pause = json.dumps({"action": "pause"}).encode()
        for who in ({}, {"X-User": "mallory"}, {"X-Forwarded-User": "alice"}):
            await pair.same("POST", "/api/topics/orders/billing", pause, who)
            await pair.same("POST", "/api/topics", b'{"topic":"x"}', who)
            await pair.same("DELETE", "/api/topics/orders/billing", None, who)
            await pair.same("DELETE", "/api/nodes/127.0.0.1:1", b'{"topic":"x"}', who)
        await pair.same("GET", "/api/topics/orders/billing")  # reading is for anyone
        await pair.same("POST", "/api/topics/orders/billing", pause, {"X-User": "bob"})
        await pair.same("GET", "/api/topics/orders/billing")
        await pair.same("POST", "/api/topics/orders/billing", b"x", {"X-User": "alice"})


@pytest.mark.parametrize("cidr", ["10.0.0.0/8", "", "::1/128", "127.0.0.1/32"])
async def test_config_only_from_the_allowed_cidr(cidr: str) -> None:
    async with AsyncExitStack() as stack:
        pair = await stack.enter_async_context(admins(stack, [f"--allow-config-from-cidr={cidr}"]))
        await pair.same("GET", "/config/log_level")
        await pair.same("PUT", "/config/log_level", b"warn")
        await pair.same("GET", "/config/allow_config_from_cidr")


async def test_base_path() -> None:
    async with AsyncExitStack() as stack:
        pair = await stack.enter_async_context(admins(stack, ["--base-path=/ops/nsq/"]))
        for path in ("/api/topics", "/api/topics/orders", "/ping", "/config/base_path"):
            await pair.same("GET", path)
        await pair.same("GET", "/api/topics/")  # redirected under the base path
        real_root, fake_root = pair.real.split("/ops")[0], pair.fake.split("/ops")[0]
        for path in ("/api/topics", "/ping", "/ops"):
            real = answer(await pair.http.get(real_root + path))
            fake = answer(await pair.http.get(fake_root + path))
            assert fake[:2] == real[:2], path
        # The pages are there too (nsqadmin's are its own single-page app).
        for path in ("", "/topics", "/topics/orders", "/nodes", "/counter", "/lookup"):
            real = await pair.http.get(pair.real + path)
            fake = await pair.http.get(pair.fake + path)
            assert (fake.status_code, real.status_code) == (200, 200), path
            assert fake.headers["content-type"].startswith("text/html")


async def test_notifications_of_admin_actions() -> None:
    async with AsyncExitStack() as stack:
        sink = await stack.enter_async_context(recorder())
        flags = [f"--notification-http-endpoint=http://{sink.address}/notify"]
        pair = await stack.enter_async_context(admins(stack, flags))
        auth = {
            "Authorization": "Basic " + base64.b64encode(b"carol:secret").decode(),
            "User-Agent": "ops-script/2.0",
        }
        actions = [
            ("POST", "/api/topics/orders/billing?from=test", b'{"action":"pause"}'),
            ("POST", "/api/topics/orders", b'{"action":"empty"}'),
            ("POST", "/api/topics", b'{"topic":"fresh","channel":"first"}'),
            ("DELETE", "/api/topics/orders/billing", None),
            # Refused, or failed before acting: no notice.
            ("DELETE", "/api/nodes/127.0.0.1:1", b'{"topic":"orders"}'),
            ("POST", "/api/topics/orders", b'{"action":"frob"}'),
        ]
        notices: list[list[dict[str, Any]]] = []
        for side in (pair.real, pair.fake):
            sink.requests.clear()
            for method, path, body in actions:
                await pair.http.request(method, side + path, content=body, headers=auth)
            # sent by another process
            await wait_until(lambda: len(sink.requests) >= 5, limit=20, step=0.01)
            notices.append([_normalized(r) for r in sink.requests])
        real, fake = notices
        assert sorted(fake, key=json.dumps) == sorted(real, key=json.dumps)
        assert {n["action"] for n in real} == {
            "pause_channel",
            "empty_topic",
            "create_topic",
            "create_channel",
            "delete_channel",
        }


def _normalized(request: Request) -> dict[str, Any]:
    assert request.method == "POST"
    assert request.headers["content-type"] == "application/json"
    doc: dict[str, Any] = json.loads(request.body)
    assert isinstance(doc.pop("timestamp"), int)
    doc["remote_ip"] = doc["remote_ip"].rpartition(":")[0]  # the client's port varies
    doc["url"] = doc["url"].split("/", 3)[3]  # each admin has its own host:port
    return doc


async def test_graphite_rates_and_proxy(tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        graphite = await stack.enter_async_context(recorder())
        flags = [
            f"--graphite-url=http://{graphite.address}",
            "--statsd-interval=30s",
            "--proxy-graphite",
        ]
        pair = await stack.enter_async_context(admins(stack, flags))
        path = "/api/graphite?metric=rate&target=sumSeries(nsq.*.topic.orders.message_count)"
        for datapoints, status in (([[120.0, 1]], 200), ([[-1, 1]], 200), ([[None, 1]], 200)):
            graphite.body = json.dumps([{"target": "t", "datapoints": datapoints}]).encode()
            graphite.status = status
            graphite.requests.clear()
            await pair.same("GET", path)
            real_query, fake_query = (r.query for r in graphite.requests)
            assert fake_query == real_query
            assert real_query["from"] == ["-60sec"] and real_query["until"] == ["-30sec"]
        graphite.status = 500
        await pair.same("GET", path)
        graphite.status, graphite.body = 200, b"not json"
        await pair.same("GET", path)
        await pair.same("GET", "/api/graphite?metric=rate")
        # --proxy-graphite: /render goes to graphite as it came.
        graphite.body = b'[{"target":"x","datapoints":[[1,2]]}]'
        graphite.requests.clear()
        await pair.same("GET", "/render?target=x&format=json")
        assert [r.raw_query for r in graphite.requests] == ["target=x&format=json"] * 2


async def test_dev_static_dir(tmp_path: Path) -> None:
    (tmp_path / "extra.js").write_text("console.log('dev');\n")
    (tmp_path / "style.css").write_text("body { color: red; }\n")
    async with AsyncExitStack() as stack:
        pair = await stack.enter_async_context(admins(stack, [f"--dev-static-dir={tmp_path}"]))
        for name in ("extra.js", "style.css", "missing.js"):
            real, fake = await pair.both("GET", f"/static/{name}")
            assert (fake[0], fake[-1]) == (real[0], real[-1]), name
            assert fake[2].split(";")[0] == real[2].split(";")[0], name


async def test_an_nsqd_that_requires_tls_is_asked_over_https(pki: Pki) -> None:
    """nsqd --tls-required answers plain HTTP with 403 and its HTTPS port; both
    admins ask again over HTTPS, trusting --http-client-tls-root-ca-file."""
    reference.require("nsqadmin")
    cert, key, root = pki.cert, pki.key, pki.ca_file
    options = NSQDOptions(
        tcp_address="127.0.0.1:0",
        http_address="127.0.0.1:0",
        https_address="127.0.0.1:0",
        tls_cert=str(cert),
        tls_key=str(key),
        tls_required=TLS_REQUIRED,
        broadcast_address="127.0.0.1",
    )
    async with AsyncExitStack() as stack:
        nsqd = await stack.enter_async_context(NSQD(options=options))
        http = await stack.enter_async_context(httpx.AsyncClient(timeout=10, verify=False))
        await http.post(f"https://{nsqd.https_address}/topic/create?topic=secure")
        argv = [
            f"--nsqd-http-address={nsqd.http_address}",
            f"--http-client-tls-root-ca-file={root}",
        ]
        real = await stack.enter_async_context(reference.open_nsqadmin(*argv))
        values, _ = admin_flagset().parse(argv)
        fake = await stack.enter_async_context(
            Admin(
                options=admin_options_from_flags(values),
                http_address="127.0.0.1:0",
                watch_interval=60,
            )
        )
        pair = Admins(f"http://{real.http_address}", fake.url, http)
        for path in ("/api/topics", "/api/nodes", "/api/topics/secure", "/api/counter"):
            status = (await pair.same("GET", path))[0]
            assert status == 200, path
        await pair.same("GET", f"/api/nodes/{nsqd.http_address}")
        done = await pair.same("POST", "/api/topics/secure", b'{"action":"pause"}')
        assert done[0] == 200
        assert nsqd.topics["secure"].paused
        # Without the CA, neither trusts nsqd's certificate, and both say so alike.
        untrusting = [f"--nsqd-http-address={nsqd.http_address}"]
        real = await stack.enter_async_context(reference.open_nsqadmin(*untrusting))
        fake = await stack.enter_async_context(
            Admin(nsqd_http_addresses=[nsqd.http_address], http_address="127.0.0.1:0")
        )
        pair = Admins(f"http://{real.http_address}", fake.url, http)
        for path in ("/api/topics", "/api/nodes", "/api/topics/secure"):
            assert (await pair.same("GET", path))[0] == 502, path
