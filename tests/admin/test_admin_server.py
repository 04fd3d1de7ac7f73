"""The admin server without a browser: against plain daemons (as against real
nsqd and nsqlookupd, no Cluster), its action errors, and its command line."""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import Any

import httpx
import pytest
import trio

from fakensq import NSQD, Cluster, NSQLookupd
from fakensq.admin import Admin
from fakensq.cli.nsqadmin import admin_main

from .conftest import AdminEnv, RawConsumer


async def test_reads_plain_daemons_without_fault_controls() -> None:
    async with (
        NSQLookupd(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0") as lookupd,
        NSQD(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0") as nsqd,
        Admin(
            lookupd_http_addresses=[lookupd.http_address],
            nsqd_http_addresses=[nsqd.http_address],
            http_address="127.0.0.1:0",
        ) as admin,
        httpx.AsyncClient(base_url=admin.url) as http,
    ):
        await http.post(f"http://{nsqd.http_address}/pub?topic=plain", content=b"x")
        nodes = (await http.get("/api/live/nodes")).json()["sections"]
        assert f'data-node="{nsqd.http_address}"' in nodes["nodes"]
        assert "data-action" not in nodes["nodes"]  # no Cluster: no fault buttons
        page = await http.get("/timeline")
        assert "<title>Timeline" in page.text and "Faults" not in page.text

        fault = await http.post("/api/action", json={"action": "fault/kill-nsqd", "node": 0})
        assert fault.status_code == 400
        assert "Cluster" in fault.json()["message"]

        paused = await http.post("/api/action", json={"action": "topic/pause", "topic": "plain"})
        assert paused.json() == {
            "ok": True,
            "message": f"pause topic plain: OK on {nsqd.http_address}",
        }
        assert nsqd.stats()["topics"][0]["paused"] is True


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"action": "topic/frobnicate", "topic": "t"}, 400, "unknown action"),
        ({"action": "channel/pause", "topic": "t"}, 400, "no channel given"),
        ({"action": "topic/pause"}, 400, "no topic given"),
        ({"action": "topic/pause", "topic": "missing"}, 400, "no nsqd or nsqlookupd holds"),
        ({"action": "fault/kill-nsqd", "node": 7}, 400, "no node 7"),
        ({"action": "fault/explode", "node": 0}, 400, "unknown fault"),
        ([1, 2], 400, "JSON object"),
    ],
)
async def test_bad_actions_are_refused(body: Any, status: int, message: str) -> None:
    async with (
        Cluster(nsqd=1, lookupd=0) as cluster,
        Admin(cluster=cluster, http_address="127.0.0.1:0") as admin,
        httpx.AsyncClient(base_url=admin.url) as http,
    ):
        response = await http.post("/api/action", json=body)
        assert response.status_code == status
        assert message in response.json()["message"]
        assert (await http.get("/api/action")).status_code == 405
        assert (await http.get("/no/such/page/here")).status_code == 404


async def test_an_action_failing_on_a_node_is_reported() -> None:
    async with (
        Cluster(nsqd=1, lookupd=1) as cluster,
        Admin(cluster=cluster, http_address="127.0.0.1:0") as admin,
        httpx.AsyncClient(base_url=admin.url) as http,
    ):
        nsqd_http = cluster.nsqd_http_addresses[0]
        await http.post(f"http://{nsqd_http}/topic/create?topic=t")
        # The channel exists on no nsqd: the node answers 404 and the page says so.
        done = await http.post(
            "/api/action", json={"action": "channel/empty", "topic": "t", "channel": "nope"}
        )
        assert done.status_code == 502
        result = done.json()
        assert result["ok"] is False
        assert f"FAILED on {nsqd_http}: HTTP 404 CHANNEL_NOT_FOUND" in result["message"]
        assert any("FAILED" in ev.text for ev in admin.events)


def test_admin_command_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert admin_main(["-h"]) == 0
    assert "-lookupd-http-address" in capsys.readouterr().err
    assert admin_main([]) == 1  # nsqadmin: FATAL, exit 1
    assert "--nsqd-http-address or --lookupd-http-address required" in capsys.readouterr().err
    assert admin_main(["--no-such-flag"]) == 2


def test_cluster_command_serves_the_admin() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "fakensq", "cluster", "-admin-http-address", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Reading its stdout blocks: a watchdog kills a command that hangs.
    watchdog = threading.Timer(30, proc.kill)
    watchdog.start()
    try:
        assert proc.stdout is not None
        url = ""
        for line in proc.stdout:  # ends at "ready", or when the command exits
            if line.startswith("ADMIN_URL="):
                url = line.strip().partition("=")[2]
            if line.startswith("ready"):
                break
        assert url, proc.stderr.read() if proc.stderr else ""
        page = httpx.get(f"{url}/nodes", timeout=10)
        assert page.status_code == 200 and "Kill" in page.text
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        watchdog.cancel()
    assert proc.returncode == 0


async def test_admin_command_runs_until_signalled() -> None:
    """As nsqadmin: it logs where it listens on stderr, and leaves on SIGTERM."""
    async with NSQLookupd(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0") as lookupd:
        proc = await trio.lowlevel.open_process(
            [
                sys.executable,
                "-m",
                "fakensq",
                "admin",
                "--lookupd-http-address",
                lookupd.http_address,
                "--http-address",
                "127.0.0.1:0",
            ],
            stderr=subprocess.PIPE,
        )
        assert proc.stderr is not None
        with trio.fail_after(20):
            err = b""
            while b"HTTP: listening on " not in err or not err.endswith(b"\n"):
                chunk = await proc.stderr.receive_some(1024)
                assert chunk, err
                err += chunk
            address = err.decode().split("HTTP: listening on ")[1].split()[0]
            async with httpx.AsyncClient() as http:
                page = await http.get(f"http://{address}/nodes")
            assert page.status_code == 200
            assert lookupd.http_address in page.text
            proc.terminate()
            assert await proc.wait() == 0
            while chunk := await proc.stderr.receive_some(1024):
                err += chunk
        assert f"HTTP: closing {address}" in err.decode()


def test_client_faults(admin_env: AdminEnv) -> None:
    env = admin_env
    env.post(env.nsqd_http[0], "/topic/create?topic=t")
    consumer = RawConsumer(env.nsqd_tcp[0], "t", "c", rdy=1)
    try:
        client = env.stats(0)["topics"][0]["channels"][0]["clients"][0]["remote_address"]
        page = env.http.get(f"{env.url}/topics/t/c").text
        assert f'data-client="{client}"' in page and 'data-action="fault/drop-client"' in page

        def act(**body: Any) -> dict[str, Any]:
            result: dict[str, Any] = env.http.post(f"{env.url}/api/action", json=body).json()
            return result

        args = {"client": client, "nodeAddress": env.nsqd_http[0]}
        assert act(action="fault/partition-client", **args) == {
            "ok": True,
            "message": f"partitioned client {client} from nsqd-0",
        }
        assert [f["kind"] for f in env.stats(0)["faults"]] == ["partition"]
        assert act(action="fault/heal", fault="all")["ok"]
        assert act(action="fault/drop-client", **args)["message"].startswith(
            f"dropped 1 connection(s) of client {client}"
        )
        assert act(action="fault/heal", fault="all") == {
            "ok": False,
            "message": "no active fault 'all'",
        }
    finally:
        consumer.close()


def test_chromium_install_says_why_it_cannot(monkeypatch: pytest.MonkeyPatch) -> None:
    from . import conftest

    monkeypatch.setattr(conftest.os, "geteuid", lambda: 1000)
    assert "not root" in conftest._install_chromium()
    monkeypatch.setattr(conftest.os, "geteuid", lambda: 0)
    monkeypatch.setattr(conftest.shutil, "which", lambda name: None)
    assert "no apt-get" in conftest._install_chromium()
