"""An nsqd that stops and comes back, with an nsqlookupd of the same kind:
killed (SIGKILL) or stopped (SIGTERM), restarted on the same ports and data
path, compared between fakensq and NSQ v1.3.0: which topics, channels, pause
flags and messages it has again, and what nsqlookupd shows once it registered
again (readers that find nsqd through nsqlookupd depend on both: ansq's
``test_restore_connection`` did)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from .. import reference
from ..support.nodes import Nsqd, open_daemons
from ..support.waiting import poll_until
from .conftest import Target, _diff
from .lookupd import debug_times, lookupd_state
from .normalize import Normalizer


@asynccontextmanager
async def pair(kind: str, tmp: Path, normalizer: Normalizer) -> AsyncIterator[tuple[Nsqd, Target]]:
    """An nsqlookupd and an nsqd registered with it, both of ``kind``."""
    async with open_daemons(kind, tmp) as daemons:
        lookupd = await daemons.nsqlookupd()
        nsqd = await daemons.nsqd(lookupd=lookupd)
        yield nsqd, Target(kind, lookupd.tcp_address, lookupd.http_address, normalizer)


async def _wait(http: httpx.AsyncClient, url: str, ok: Any) -> None:
    await poll_until(
        lambda: http.get(url), lambda r: r.status_code == 200 and ok(r.json()), f"GET {url}"
    )


def _view(stats: Any) -> Any:
    return [
        (
            t["topic_name"],
            t["paused"],
            t["depth"],
            [(c["channel_name"], c["paused"], c["depth"]) for c in t["channels"]],
        )
        for t in stats["topics"] or []
    ]


async def scenario(kind: str, tmp: Path, *, kill: bool) -> Any:
    normalizer = Normalizer()
    debug_times(normalizer)
    normalizer.key_rules["remote_address"] = lambda v: "<nsqd's address>"
    normalizer.key_rules["id"] = lambda v: "<nsqd's address>"
    async with (
        pair(kind, tmp, normalizer) as (node, lookupd),
        httpx.AsyncClient(timeout=10) as http,
    ):
        for address, role in ((node.tcp_address, "nsqd:tcp"), (node.http_address, "nsqd:http")):
            normalizer.alias(int(address.rpartition(":")[2]), f"<{role}_port>")
        base = f"http://{node.http_address}"
        for path in (
            "/topic/create?topic=t",
            "/channel/create?topic=t&channel=c",
            "/channel/create?topic=t&channel=held",
            "/channel/pause?topic=t&channel=held",
            "/channel/create?topic=t&channel=gone%23ephemeral",
            "/topic/create?topic=p",
            "/topic/pause?topic=p",
        ):
            assert (await http.post(base + path)).status_code == 200, path
        assert (await http.post(base + "/mpub?topic=t", content=b"one\ntwo")).status_code == 200
        lookupd_url = f"http://{lookupd.http_address}"
        await _wait(http, f"{lookupd_url}/lookup?topic=p", lambda doc: doc["producers"])
        await node.stop(kill=kill)
        await _wait(http, f"{lookupd_url}/nodes", lambda doc: not doc["producers"])
        gone = await lookupd_state(lookupd, "t", "p")
        await node.start()
        await _wait(http, f"{lookupd_url}/lookup?topic=t", lambda doc: doc["producers"])
        await _wait(http, f"{lookupd_url}/lookup?topic=p", lambda doc: doc["producers"])
        back = _view((await http.get(base + "/stats?format=json")).json())
        registered = await lookupd_state(lookupd, "t", "p")
        await node.stop()
        return normalizer((gone, back, registered))


@pytest.mark.parametrize("kill", [True, False], ids=["SIGKILL", "SIGTERM"])
async def test_nsqd_restart_with_lookupd(tmp_path: Path, kill: bool) -> None:
    (tmp_path / "fakensq").mkdir()
    fake = await scenario("fakensq", tmp_path / "fakensq", kill=kill)
    if reference.binary("nsqd") is None or reference.binary("nsqlookupd") is None:
        pytest.skip(f"fakensq ran it; no real daemons: {reference.skip_reason()}")
    (tmp_path / "real").mkdir()
    real = await scenario("real", tmp_path / "real", kill=kill)
    if fake != real:
        pytest.fail("fakensq and the real daemons differ:\n" + _diff(fake, real), pytrace=False)
