"""nsqds for the front ends' end-to-end tests: fakensq's, and the real v1.3.0.

``nodes`` is parametrized over both kinds (the real one skips with a reason
where its binaries are absent): :class:`tests.support.nodes.BlockingDaemons`,
whose nodes are served on a thread of their own while the test's code blocks.
``nodes.nsqd(*flags)`` starts an nsqd with the real nsqd's flags (fakensq
parses the same), which can be killed (SIGKILL) and started again on the same
ports; ``daemon`` is one with the default flags; ``stats`` reads its
``/stats`` JSON.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.support.authserver import AuthServer, running_auth_server
from tests.support.nodes import KINDS, BlockingDaemons, BlockingNode
from tests.support.stats import channel_entry, nsqd_stats, topic_entry
from trionsq import BackoffPolicy
from trionsq.transport import tcp_connector


async def own_connector(host: str, port: int) -> trio.abc.Stream:
    """A connector of one's own (a Trio stream): an asyncio Producer given one
    has the Trio Producer publish, in the loop's guest run."""
    return await tcp_connector(host, port)


#: Reconnect quickly after a restart (the default waits seconds).
FAST_RECONNECT = BackoffPolicy(base=0.05, max=0.2, multiplier=2.0, jitter=0.0)


@pytest.fixture(params=KINDS)
def nodes(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BlockingDaemons]:
    """``nodes.nsqd(*flags)``, ``nodes.nsqlookupd(*flags)``: started daemons of
    the parametrized kind, all stopped after the test."""
    made = BlockingDaemons(request.param, tmp_path)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def daemon(nodes: BlockingDaemons) -> BlockingNode:
    """One nsqd with the default flags, fakensq's or the real one."""
    return nodes.nsqd()


def registered_nsqds(
    nodes: BlockingDaemons, count: int = 2
) -> tuple[BlockingNode, list[BlockingNode]]:
    """An nsqlookupd and ``count`` nsqds registered with it."""
    lookupd = nodes.nsqlookupd()
    return lookupd, [nodes.nsqd(lookupd=lookupd) for _ in range(count)]


def stats(daemon: BlockingNode, topic: str, channel: str | None = None) -> dict[str, Any]:
    """The topic's (or channel's) entry of nsqd's /stats JSON ({} if absent)."""
    found = nsqd_stats(daemon.http_address, topic)
    entry = topic_entry(found, topic) if channel is None else channel_entry(found, topic, channel)
    return entry or {}


@pytest.fixture
def auth_server() -> Iterator[AuthServer]:
    with running_auth_server({"open-sesame": ["subscribe", "publish"]}) as server:
        yield server


@pytest.fixture
def no_threads_left() -> Iterator[None]:
    """Fails the test if a thread of the front ends outlives it (they are all
    named ``trionsq-...``: loop threads, handler threads, give-up helpers).
    Threads already running before the test are not its own: the Spark sink's
    per-process producer thread, started by a Spark test that ran earlier on
    the same xdist worker, lives until the process exits, by design."""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 5
    while True:
        left = [
            t
            for t in threading.enumerate()
            if t.name.startswith("trionsq") and t.is_alive() and t not in before
        ]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert not left, f"threads left behind: {left}"
