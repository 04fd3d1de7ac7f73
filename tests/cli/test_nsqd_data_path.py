"""``fakensq nsqd --data-path``: SIGTERM writes every message to disk, the next
start reads them back."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx

from .conftest import Daemon


async def _start(data_path: Path) -> tuple[Daemon, str]:
    d = await Daemon.fakensq(
        "nsqd",
        "--tcp-address=127.0.0.1:0",
        "--http-address=127.0.0.1:0",
        f"--data-path={data_path}",
        "--mem-queue-size=2",  # some of the messages on disk too
    )
    return d, (await d.listening("TCP", "HTTP"))["HTTP"]


async def test_sigterm_then_restart_keeps_the_messages(tmp_path: Path) -> None:
    d, http = await _start(tmp_path)
    try:
        async with httpx.AsyncClient() as client:
            for path in ("topic/create?topic=t", "channel/create?topic=t&channel=ch"):
                r = await client.post(f"http://{http}/{path}")
                assert r.status_code == 200
            r = await client.post(f"http://{http}/mpub?topic=t", content=b"m0\nm1\nm2\nm3\nm4")
            assert r.status_code == 200
        assert await d.stop(signal.SIGTERM) == 0
    finally:
        d.kill()
    d, http = await _start(tmp_path)
    try:
        async with httpx.AsyncClient() as client:
            doc = (await client.get(f"http://{http}/stats?format=json")).json()
        (topic,) = doc["topics"]
        (channel,) = topic["channels"]
        assert (topic["topic_name"], channel["channel_name"]) == ("t", "ch")
        # All on disk now: nsqd's clean stop writes the memory part after it.
        assert (channel["depth"], channel["backend_depth"]) == (5, 5)
        assert await d.stop(signal.SIGTERM) == 0
    finally:
        d.kill()
