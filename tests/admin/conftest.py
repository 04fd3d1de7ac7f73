"""Fixtures for the admin UI tests: headless Chromium driven by Playwright, and a
fakensq cluster with its admin server, served from a background thread.

Chromium comes from Debian's ``chromium`` package (Playwright's own browser
download is not used): when it is missing and we are root with apt-get, it is
installed once per session; the browser tests skip only where that is impossible.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from fakensq import Cluster
from fakensq.admin import Admin
from fakensq.admin.options import AdminOptions
from fakensq.testing.threaded import BackgroundNode

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "docs" / "images"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "admin_options(**options): nsqadmin options for the admin_env fixture"
    )


# tryfirst: pytest-xdist's own hook (on each worker) reads the xdist_group marks
# to give grouped tests one worker; run after it, the marks came too late and
# every worker started its own copy.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # One pytest-xdist worker runs the browser tests: one Chromium (and at most
    # one apt-get installing it), not one per worker.
    ui = Path(__file__).parent / "test_admin_ui.py"
    for item in items:
        if item.path == ui:
            item.add_marker(pytest.mark.xdist_group("admin-ui"))


def _install_chromium() -> str:
    """Install Debian's chromium if we can; the reason we could not, or ""."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return f"{CHROMIUM} is missing and we are not root to apt-get install it"
    apt = shutil.which("apt-get")
    if apt is None:
        return f"{CHROMIUM} is missing and there is no apt-get to install it"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for args in ([apt, "update"], [apt, "install", "-y", "--no-install-recommends", "chromium"]):
        done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            return f"{' '.join(args)} failed: {done.stderr.strip()[-300:]}"
    return ""


@pytest.fixture(scope="session")
def chromium_path() -> str:
    if not os.path.exists(CHROMIUM):
        reason = _install_chromium()
        if reason or not os.path.exists(CHROMIUM):
            pytest.skip(f"no Chromium for the browser tests: {reason or 'install did not work'}")
    return CHROMIUM


# Module-scoped: the browser (and Playwright's event loop) is gone before the
# rest of the suite runs, whatever it does with asyncio.
@pytest.fixture(scope="module")
def browser(chromium_path: str) -> Iterator[Any]:
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed (pip install playwright)"
    )
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=chromium_path, args=CHROMIUM_ARGS, headless=True
        )
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="module")
def _shared_page(browser: Any) -> Iterator[Any]:
    # One tab for the module's tests: a new context and page cost ~1 s each time.
    context = browser.new_context(viewport={"width": 1366, "height": 820})
    page = context.new_page()
    # Every action asks window.confirm(); the test says yes, and keeps what was asked.
    page.asked = []

    def on_dialog(dialog: Any) -> None:
        page.asked.append(dialog.message)
        dialog.accept()

    page.on("dialog", on_dialog)
    # Waits are on conditions; a busy machine only makes them longer.
    page.set_default_timeout(30_000)
    sync_api = pytest.importorskip("playwright.sync_api")
    sync_api.expect.set_options(timeout=30_000)
    try:
        yield page
    finally:
        context.close()


@pytest.fixture
def page(_shared_page: Any) -> Iterator[Any]:
    """The module's browser tab, with its confirmations log emptied."""
    _shared_page.asked.clear()
    try:
        yield _shared_page
    finally:
        # Leave the page before its admin server stops, so it stops polling it.
        _shared_page.goto("about:blank")
        _shared_page.set_extra_http_headers({})


def screenshots_wanted() -> bool:
    """TRIONSQ_SCREENSHOTS=1: the tests also take the docs' images."""
    return os.environ.get("TRIONSQ_SCREENSHOTS") == "1"


def screenshot(page: Any, name: str) -> None:
    """Save docs/images/<name>.png when TRIONSQ_SCREENSHOTS=1 (the docs' images)."""
    if screenshots_wanted():
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


@dataclass
class AdminEnv:
    """A running cluster and its admin server (both on the background thread)."""

    node: BackgroundNode[tuple[Cluster, Admin]]
    url: str
    nsqd_http: list[str]
    nsqd_tcp: list[str]
    lookupd_http: list[str]
    http: httpx.Client

    def stats(self, i: int) -> dict[str, Any]:
        r = self.http.get(f"http://{self.nsqd_http[i]}/stats?format=json")
        r.raise_for_status()
        doc: dict[str, Any] = r.json()
        return doc

    def post(self, address: str, path: str) -> None:
        self.http.post(f"http://{address}{path}").raise_for_status()

    def call(self, method: str, *args: Any) -> Any:
        """Run a Cluster coroutine method on the cluster's thread."""
        cluster = self.node.node[0]
        return self.node.call(getattr(cluster, method), *args)


@asynccontextmanager
async def _cluster_with_admin(
    data_root: str, options: AdminOptions | None
) -> AsyncIterator[tuple[Cluster, Admin]]:
    async with (
        Cluster(nsqd=2, lookupd=1, data_root=data_root) as cluster,
        Admin(
            cluster=cluster,
            options=options,
            http_address="127.0.0.1:0",
            watch_interval=0.2,
            chart_window=60,
        ) as admin,
    ):
        yield cluster, admin


@pytest.fixture
def admin_env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AdminEnv]:
    """A 2-nsqd cluster and its admin, in a background thread.  A test marked
    ``@pytest.mark.admin_options(base_path=..., admin_users=[...])`` gets an admin
    with those nsqadmin options."""
    marker = request.node.get_closest_marker("admin_options")
    options = AdminOptions(**marker.kwargs) if marker is not None else None
    node: BackgroundNode[tuple[Cluster, Admin]] = BackgroundNode(
        lambda: _cluster_with_admin(str(tmp_path), options), "fakensq-admin-cluster"
    )
    cluster, admin = node.start()
    try:
        with httpx.Client(timeout=5.0) as http:
            yield AdminEnv(
                node,
                admin.url,
                list(cluster.nsqd_http_addresses),
                list(cluster.nsqd_tcp_addresses),
                list(cluster.lookupd_http_addresses),
                http,
            )
    finally:
        node.stop()


class RawConsumer:
    """A minimal blocking NSQ consumer that never FINs: its messages stay in flight."""

    def __init__(self, tcp_address: str, topic: str, channel: str, rdy: int) -> None:
        host, _, port = tcp_address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=5)
        self.sock.sendall(b"  V2")
        body = json.dumps(
            {"client_id": "admin-test", "hostname": "test-host", "user_agent": "admin-test/1.0"}
        ).encode()
        self.sock.sendall(b"IDENTIFY\n" + struct.pack(">l", len(body)) + body)
        self._frame()
        self.sock.sendall(f"SUB {topic} {channel}\n".encode())
        self._frame()
        self.sock.sendall(f"RDY {rdy}\n".encode())

    def _frame(self) -> bytes:
        size = struct.unpack(">l", self._read(4))[0]
        return self._read(size)

    def _read(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("nsqd closed the connection")
            data += chunk
        return data

    def close(self) -> None:
        self.sock.close()


class AsyncRawConsumer:
    """The same consumer over a Trio stream, for daemons served by the test's own
    event loop (fakensq in-process) as well as real ones."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self._buffer = b""

    @classmethod
    async def connect(
        cls,
        tcp_address: str,
        topic: str,
        channel: str,
        rdy: int,
        *,
        user_agent: str = "admin-test/1.0",
    ) -> AsyncRawConsumer:
        host, _, port = tcp_address.rpartition(":")
        self = cls(await trio.open_tcp_stream(host, int(port)))
        body = json.dumps(
            {"client_id": "admin-test", "hostname": "test-host", "user_agent": user_agent}
        ).encode()
        await self.stream.send_all(b"  V2IDENTIFY\n" + struct.pack(">l", len(body)) + body)
        await self._frame()
        await self.stream.send_all(f"SUB {topic} {channel}\n".encode())
        await self._frame()
        await self.stream.send_all(f"RDY {rdy}\n".encode())
        return self

    async def _frame(self) -> bytes:
        size = struct.unpack(">l", await self._read(4))[0]
        return await self._read(size)

    async def _read(self, n: int) -> bytes:
        while len(self._buffer) < n:
            chunk = await self.stream.receive_some(65536)
            if not chunk:
                raise ConnectionError("nsqd closed the connection")
            self._buffer += chunk
        data, self._buffer = self._buffer[:n], self._buffer[n:]
        return data

    async def finish(self, count: int) -> None:
        """Take ``count`` messages and FIN each (answering heartbeats meanwhile)."""
        done = 0
        while done < count:
            frame = await self._frame()
            kind, payload = struct.unpack(">l", frame[:4])[0], frame[4:]
            if kind == 0 and payload == b"_heartbeat_":
                await self.stream.send_all(b"NOP\n")
            elif kind == 2:  # a message: timestamp, attempts, id, body
                await self.stream.send_all(b"FIN " + payload[10:26] + b"\n")
                done += 1

    async def aclose(self) -> None:
        await self.stream.aclose()
