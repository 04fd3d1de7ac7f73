"""What a killed nsqd keeps, compared: fakensq's node and nsqd v1.3.0 (SIGKILL).

nsqd keeps messages beyond ``--mem-queue-size`` in its disk queues
(go-diskqueue), whose positions are recorded at each *sync*: every
``--sync-every`` reads and writes, and on a ``--sync-timeout`` ticker.  A killed
nsqd comes back with what the last sync recorded; what it held in memory is
lost.  Each scenario publishes, waits for a sync where it needs one (by
reading the queue's meta file, the same file in both: never a fixed sleep),
kills the node, starts it again on the same data, and records ``/stats`` and
what a consumer then gets (up to a marker published after the restart, and
at least the depth /stats shows).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from trionsq.protocol import commands as cmds

from .. import reference
from ..support.nodes import Nsqd, open_daemons
from ..support.waiting import poll_until
from .conftest import _diff
from .normalize import Normalizer
from .session import READ_TIMEOUT, Session, Transcript


def synced_depth(data: Path, queue: str) -> int | None:
    """The depth the queue's meta file recorded (None: never synced)."""
    try:
        return int((data / f"{queue}.diskqueue.meta.dat").read_text().split("\n")[0])
    except (OSError, ValueError):
        return None


async def wait_synced(node: Nsqd, queue: str, depth: int) -> None:
    async def read() -> int | None:
        if node.fake is not None:
            node.fake.catch_up_disk_syncs()  # (its tickers run when looked at)
        return synced_depth(node.data_path, queue)

    await poll_until(read, lambda synced: synced == depth, f"{queue}'s sync of depth {depth}")


async def publish(node: Nsqd, name: str, bodies: list[bytes]) -> None:
    p = await Session.connect(node.tcp_address, name, Transcript(), Normalizer())
    for body in bodies:
        await p.call(cmds.pub("t", body))
    await p.close()


async def consume(node: Nsqd, n: int) -> None:
    """A consumer of t/ch reads and FINs ``n`` messages, then leaves (RDY 0
    before the FINs: nsqd sends no more, and reads no more from disk)."""
    c = await Session.connect(node.tcp_address, "c", Transcript(), Normalizer())
    await c.sub("t", "ch", rdy=n)
    msgs = await c.read_messages(n)
    # A TOUCH of an id never given out fails after the FINs: they are done.
    await c.send(cmds.rdy(0), *(cmds.fin(m.id) for m in msgs), cmds.touch(b"0" * 16))
    with trio.fail_after(READ_TIMEOUT):
        (answer,) = await c.read(1)
    assert str(answer[1]).startswith("E_TOUCH_FAILED"), answer
    await c.close()


def depths(stats: Any) -> Any:
    return [
        (
            t["topic_name"],
            t["depth"],
            t["backend_depth"],
            [(c["channel_name"], c["depth"], c["backend_depth"]) for c in t["channels"]],
        )
        for t in stats["topics"]
    ]


async def scenario(kind: str, data: Path, flags: list[str], plan: list[Any]) -> Any:
    outcome: list[Any] = []
    async with open_daemons(kind, data) as daemons, httpx.AsyncClient(timeout=10) as http:
        node = await daemons.nsqd(*flags)
        for step in plan:
            if step[0] == "channel":
                await http.post(f"http://{node.http_address}/topic/create?topic=t")
                await http.post(f"http://{node.http_address}/channel/create?topic=t&channel=ch")
            elif step[0] == "pub":
                await publish(node, "p", step[1])
            elif step[0] == "synced":
                await wait_synced(node, step[1], step[2])
            elif step[0] == "consume":
                await consume(node, step[1])
        stats = (await http.get(f"http://{node.http_address}/stats?format=json")).json()
        outcome.append(("before", depths(stats)))
        await node.kill()
        await node.start()
        stats = (await http.get(f"http://{node.http_address}/stats?format=json")).json()
        outcome.append(("after", depths(stats)))
        depth = sum(ch["depth"] for t in stats["topics"] for ch in t["channels"])
        c = await Session.connect(node.tcp_address, "c", Transcript(), Normalizer())
        await c.sub("t", "ch", rdy=100)
        await publish(node, "p", [b"marker"])
        got = []
        with trio.fail_after(READ_TIMEOUT):
            # (nsqd reads memory and disk in no fixed order: the marker may
            # come first when it fits in memory; the order is not compared.)
            while b"marker" not in got or len(got) <= depth:
                (msg,) = await c.read_messages(1)
                got.append(msg.body)
                await c.send(cmds.fin(msg.id))
        outcome.append(("consumed", sorted(got)))
        await c.close()
    return outcome


def bodies(a: int, b: int) -> list[bytes]:
    return [b"m%d" % i for i in range(a, b)]


CASES: dict[str, tuple[list[str], list[Any]]] = {
    # Every write synced: all of it comes back.
    "disk_synced": (
        ["--mem-queue-size=0", "--sync-every=1"],
        [("pub", bodies(0, 5)), ("synced", "t", 5)],
    ),
    # Never synced (no --sync-every reached, the ticker an hour away): all lost.
    "disk_never_synced": (["--mem-queue-size=0", "--sync-timeout=1h"], [("pub", bodies(0, 5))]),
    # Memory first: what stayed in memory is lost, what went to disk comes back.
    "memory_lost_disk_kept": (
        ["--mem-queue-size=2", "--sync-every=1"],
        [("channel",), ("pub", bodies(0, 5)), ("synced", "t:ch", 3)],
    ),
    # Written after the last sync: the meta file is behind the data file; the
    # depth comes back as recorded, the reader salvages the rest.
    "stale_meta_salvaged": (
        ["--mem-queue-size=0", "--sync-every=5", "--sync-timeout=1h"],
        [("pub", bodies(0, 5)), ("synced", "t", 5), ("pub", bodies(5, 8))],
    ),
    # Read (and finished) since the last sync: the meta file still has them,
    # so they come back and are delivered again.
    "read_since_sync_again": (
        ["--mem-queue-size=0", "--sync-every=4", "--sync-timeout=1h"],
        [("channel",), ("pub", bodies(0, 4)), ("synced", "t:ch", 4), ("consume", 2)],
    ),
    # The ticker syncs what --sync-every did not reach.
    "ticker_synced": (
        ["--mem-queue-size=0", "--sync-timeout=200ms"],
        [("pub", bodies(0, 4)), ("synced", "t", 4)],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_a_killed_nsqd_keeps_what_its_disk_queue_synced(tmp_path: Path, case: str) -> None:
    flags, plan = CASES[case]
    fake = await scenario("fakensq", tmp_path / "fakensq", flags, plan)
    if reference.binary("nsqd") is None:
        pytest.skip(f"fakensq ran it; no real nsqd: {reference.skip_reason()}")
    real = await scenario("real", tmp_path / "real", flags, plan)
    if fake != real:
        pytest.fail("fakensq and the real nsqd differ:\n" + _diff(fake, real), pytrace=False)
