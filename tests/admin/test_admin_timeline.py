"""The timeline records every effect, whenever the admin's polls happen to run.

A fault's own effects come from the counters read around it; the poller only
adds what it sees change, and a poll that started before a fault (or whose read
of a node failed or timed out) cannot undo or repeat what the fault reported.
"""

from __future__ import annotations

from typing import Any

import httpx
import trio

from fakensq import Cluster
from fakensq.admin import Admin
from fakensq.admin.data import LookupdInfo, NodeInfo, Snapshot
from fakensq.admin.timeline import Timeline
from tests.support.waiting import wait_until

from .conftest import AsyncRawConsumer

A, B = "127.0.0.1:4151", "127.0.0.1:4251"


def node(
    address: str,
    *,
    timeouts: int = 0,
    up: bool = True,
    error: str = "",
    start: int = 100,
    clients: int = 0,
    paused: bool = False,
) -> NodeInfo:
    stats: dict[str, Any] = {
        "start_time": start,
        "topics": [
            {
                "topic_name": "orders",
                "paused": False,
                "channels": [
                    {
                        "channel_name": "billing",
                        "timeout_count": timeouts,
                        "client_count": clients,
                        "paused": paused,
                    }
                ],
            }
        ],
    }
    return NodeInfo(
        address,
        up=up,
        error=error,
        health="OK" if up else "",
        stats=stats if up else None,
        source="cluster",
    )


def snap(*nodes: NodeInfo, lookupd_nodes: int = 2) -> Snapshot:
    lookupd = LookupdInfo("127.0.0.1:4161", up=True, nodes=[{}] * lookupd_nodes)
    return Snapshot(0.0, list(nodes), [lookupd], {})


def effects(timeline: Timeline) -> list[str]:
    return [e.text for e in timeline.events if e.kind == "effect"]


def test_a_faults_timeouts_are_recorded_with_the_fault_without_any_poll() -> None:
    timeline = Timeline()
    timeline.observe(snap(node(A), node(B)), timeline.epoch)
    timeline.begin_fault()
    timeline.timeouts({(A, "orders", "billing"): (0, 2), (B, "orders", "billing"): (0, 0)})
    timeline.end_fault("timed out 2 in-flight message(s) of orders/billing")
    assert [(e.kind, e.text) for e in timeline.events] == [
        ("fault", "timed out 2 in-flight message(s) of orders/billing"),
        ("effect", "channel orders/billing: 2 message(s) timed out"),
    ]
    # Polls after it, late or early, started before or after: no second report.
    timeline.observe(snap(node(A), node(B)), epoch=0)  # a stale read (count 0)
    timeline.observe(snap(node(A, timeouts=2), node(B)), timeline.epoch)
    timeline.observe(snap(node(A, timeouts=2), node(B)), timeline.epoch)
    assert effects(timeline) == ["channel orders/billing: 2 message(s) timed out"]
    # Timeouts of their own, later, are the poller's to report.
    timeline.observe(snap(node(A, timeouts=5), node(B, timeouts=1)), timeline.epoch)
    assert effects(timeline)[-1] == "channel orders/billing: 4 message(s) timed out"


def test_the_fault_is_recorded_even_when_no_poll_ever_saw_the_channel() -> None:
    timeline = Timeline()
    timeline.begin_fault()
    timeline.timeouts({(A, "orders", "billing"): (3, 5)})
    timeline.end_fault("timed out")
    assert effects(timeline) == ["channel orders/billing: 2 message(s) timed out"]
    timeline.observe(snap(node(A, timeouts=5)), timeline.epoch)
    assert effects(timeline) == ["channel orders/billing: 2 message(s) timed out"]


def test_a_slow_or_failed_read_of_a_node_invents_nothing() -> None:
    timeline = Timeline()
    timeline.observe(snap(node(A, timeouts=3), node(B)), timeline.epoch)
    # nsqd A's read timed out (a busy machine): no "down", no "up", no timeouts.
    timeline.observe(snap(node(A, up=False, error="timed out"), node(B)), timeline.epoch)
    timeline.observe(snap(node(A, timeouts=3), node(B)), timeline.epoch)
    assert effects(timeline) == []
    # Timeouts that happened while it was unread are counted once it is read.
    timeline.observe(snap(node(A, up=False, error="timed out"), node(B)), timeline.epoch)
    timeline.observe(snap(node(A, timeouts=4), node(B)), timeline.epoch)
    assert effects(timeline) == ["channel orders/billing: 1 message(s) timed out"]


def test_a_poll_that_began_before_a_kill_does_not_bring_the_node_back() -> None:
    timeline = Timeline()
    timeline.observe(snap(node(A), node(B)), timeline.epoch)
    started = timeline.epoch  # a poll starts...
    timeline.begin_fault()  # ... a kill happens while it reads ...
    timeline.node_state(B, False, "killed")
    timeline.end_fault("killed nsqd-1")
    timeline.observe(snap(node(A), node(B)), started)  # ... and it still saw B up
    assert effects(timeline) == [f"nsqd {B} is down (killed)"]
    timeline.observe(snap(node(A), node(B, up=False, error="connection refused")), timeline.epoch)
    assert effects(timeline) == [f"nsqd {B} is down (killed)"]
    timeline.begin_fault()
    timeline.node_state(B, True)
    timeline.end_fault("started nsqd-1")
    timeline.observe(snap(node(A), node(B, start=200)), timeline.epoch)
    assert effects(timeline)[-1] == f"nsqd {B} is up"


def test_a_restarted_nodes_counters_start_again() -> None:
    timeline = Timeline()
    timeline.observe(snap(node(A, timeouts=7)), timeline.epoch)
    timeline.observe(snap(node(A, timeouts=0, start=200)), timeline.epoch)
    timeline.observe(snap(node(A, timeouts=2, start=200)), timeline.epoch)
    assert effects(timeline) == ["channel orders/billing: 2 message(s) timed out"]


def test_what_the_poller_reports() -> None:
    timeline = Timeline()
    timeline.observe(snap(node(A), node(B)), timeline.epoch)
    timeline.observe(snap(node(A, clients=1, paused=True), node(B)), timeline.epoch)
    timeline.observe(
        snap(
            node(A, clients=1, paused=True),
            node(B, up=False, error="connection refused"),
            lookupd_nodes=1,
        ),
        timeline.epoch,
    )
    assert effects(timeline) == [
        "channel orders/billing paused",
        "channel orders/billing: 1 client(s) (was 0)",
        f"nsqd {B} is down (connection refused)",
        "nsqlookupd 127.0.0.1:4161 lists 1 nsqd (was 2)",
    ]


async def test_time_out_in_flight_with_no_poll_at_all() -> None:
    """The admin's poller is as late as can be (it never polls again): the
    timeline still gets the fault's effect, from the counters around it."""
    async with (
        Cluster(nsqd=1, lookupd=0) as cluster,
        Admin(cluster=cluster, http_address="127.0.0.1:0", watch_interval=3600) as admin,
        httpx.AsyncClient(base_url=admin.url) as http,
    ):
        nsqd_http = cluster.nsqd_http_addresses[0]
        await http.post(f"http://{nsqd_http}/topic/create?topic=orders")
        await http.post(f"http://{nsqd_http}/channel/create?topic=orders&channel=billing")
        await http.post(f"http://{nsqd_http}/mpub?topic=orders", content=b"a\nb\nc")
        consumer = await AsyncRawConsumer.connect(
            cluster.nsqd_tcp_addresses[0], "orders", "billing", rdy=2
        )
        try:
            channel = cluster.nsqd(0).topics["orders"].channels["billing"]
            with trio.fail_after(20):
                await wait_until(lambda: len(channel.in_flight) == 2)
            done = await http.post(
                "/api/action",
                json={"action": "fault/timeout-in-flight", "topic": "orders", "channel": "billing"},
            )
            assert done.json() == {
                "ok": True,
                "message": "timed out 2 in-flight message(s) of orders/billing",
            }
            texts = admin.timeline.texts()
            fault = texts.index("timed out 2 in-flight message(s) of orders/billing")
            assert texts[fault + 1] == "channel orders/billing: 2 message(s) timed out"
        finally:
            await consumer.aclose()
