"""The admin pages in a real browser (headless Chromium through Playwright).

Numbers on the pages are checked against each nsqd's /stats; actions are clicked
(confirmations accepted) and their effect checked through the HTTP APIs.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from .conftest import AdminEnv, RawConsumer, screenshot

pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
from playwright.sync_api import expect

TOPIC = "orders"


@pytest.fixture
def loaded(admin_env: AdminEnv) -> Iterator[AdminEnv]:
    """Topic ``orders`` on both nsqds (5 + 3 messages) with channels ``billing`` and
    ``audit``; a consumer on nsqd 0's billing holds 2 messages in flight."""
    env = admin_env
    for address in env.nsqd_http:
        env.post(address, f"/topic/create?topic={TOPIC}")
        for channel in ("billing", "audit"):
            env.post(address, f"/channel/create?topic={TOPIC}&channel={channel}")
    for i, count in ((0, 5), (1, 3)):
        body = "\n".join(f"order {n}" for n in range(count))
        env.http.post(f"http://{env.nsqd_http[i]}/mpub?topic={TOPIC}", content=body)
    consumer = RawConsumer(env.nsqd_tcp[0], TOPIC, "billing", rdy=2)
    try:
        yield env
    finally:
        consumer.close()


def channel_stats(env: AdminEnv, i: int, topic: str, channel: str) -> dict[str, Any] | None:
    for t in env.stats(i)["topics"] or []:
        if t["topic_name"] == topic:
            for c in t["channels"]:
                if c["channel_name"] == channel:
                    result: dict[str, Any] = c
                    return result
    return None


def expect_value(locator: Any, value: int) -> None:
    expect(locator).to_have_attribute("data-v", str(value))


def test_pages_show_what_stats_says(page: Any, loaded: AdminEnv) -> None:
    env = loaded
    # In-flight settles once the consumer's RDY is served; the page must then agree.
    page.goto(f"{env.url}/topics/{TOPIC}/billing")
    expect(page.locator('#clients tr[data-client] [data-k="in_flight_count"]')).to_have_attribute(
        "data-v", "2"
    )
    stats = [env.stats(0), env.stats(1)]

    # Nodes: status, version, health and topics of each nsqd.
    page.goto(f"{env.url}/nodes")
    for address, doc in zip(env.nsqd_http, stats, strict=True):
        row = page.locator(f'#nodes tr[data-node="{address}"]')
        expect(row.locator('[data-k="status"]')).to_have_text("up")
        expect(row.locator('[data-k="version"]')).to_have_text(doc["version"])
        expect(row.locator('[data-k="health"]')).to_have_text(doc["health"])
        expect_value(row.locator('[data-k="topic_count"]'), len(doc["topics"]))
    expect_value(page.locator('#lookupds [data-k="node_count"]'), 2)
    screenshot(page, "admin-nodes")

    # Topics: totals over both nodes.
    page.goto(f"{env.url}/topics")
    row = page.locator(f'#topics tr[data-topic="{TOPIC}"]')
    topic_docs = [next(t for t in d["topics"] if t["topic_name"] == TOPIC) for d in stats]
    expect_value(row.locator('[data-k="depth"]'), sum(t["depth"] for t in topic_docs))
    expect_value(row.locator('[data-k="message_count"]'), 8)
    expect_value(row.locator('[data-k="node_count"]'), 2)
    screenshot(page, "admin-topics")

    # A topic: per node, and its channels summed over the nodes.
    page.row_link = row.get_by_role("link", name=TOPIC)
    page.row_link.click()
    expect(page).to_have_url(re.compile(f"/topics/{TOPIC}$"))
    for address, t in zip(env.nsqd_http, topic_docs, strict=True):
        node_row = page.locator(f'#topic-nodes tr[data-node="{address}"]')
        expect_value(node_row.locator('[data-k="message_count"]'), t["message_count"])
    for channel in ("billing", "audit"):
        docs = [c for t in topic_docs for c in t["channels"] if c["channel_name"] == channel]
        crow = page.locator(f'#channels tr[data-channel="{channel}"]')
        for key in (
            "depth",
            "in_flight_count",
            "deferred_count",
            "requeue_count",
            "timeout_count",
            "message_count",
            "client_count",
        ):
            expect_value(crow.locator(f'[data-k="{key}"]'), sum(c[key] for c in docs))
    expect_value(page.locator('#channels tr[data-channel="billing"] [data-k="in_flight_count"]'), 2)
    screenshot(page, "admin-topic")

    # A channel: its clients as nsqd reports them.
    page.get_by_role("link", name="billing").click()
    billing = channel_stats(env, 0, TOPIC, "billing")
    assert billing is not None
    (client,) = billing["clients"]
    crow = page.locator("#clients tr[data-client]")
    expect(crow).to_have_count(1)
    expect(crow.locator('[data-k="remote_address"]')).to_have_text(client["remote_address"])
    expect(crow.locator('[data-k="user_agent"]')).to_have_text("admin-test/1.0")
    expect(crow.locator('[data-k="features"]')).to_have_text("none")
    expect_value(crow.locator('[data-k="ready_count"]'), client["ready_count"])
    expect_value(crow.locator('[data-k="in_flight_count"]'), client["in_flight_count"])
    expect_value(crow.locator('[data-k="finish_count"]'), client["finish_count"])
    expect(crow.locator('[data-k="connect_ts"]')).to_contain_text("ago")
    screenshot(page, "admin-channel")


def test_pause_and_empty_a_channel(page: Any, loaded: AdminEnv) -> None:
    env = loaded
    page.goto(f"{env.url}/topics/{TOPIC}/audit")
    summary = page.locator("#channel-summary")
    expect(summary.locator('dd[data-k="depth"]')).to_have_text("8")
    # Numbers follow nsqd without a reload.
    env.http.post(f"http://{env.nsqd_http[1]}/mpub?topic={TOPIC}", content="a\nb")
    expect(summary.locator('dd[data-k="depth"]')).to_have_text("10")
    expect(page.locator('#channel-nodes tr[data-node] [data-k="depth"]').last).to_have_attribute(
        "data-v", "5"
    )

    summary.get_by_role("button", name="Pause", exact=True).click()
    expect(page.locator("#flash")).to_contain_text(f"pause channel {TOPIC}/audit: OK")
    assert page.asked[-1] == f"Pause channel {TOPIC}/audit?"
    for i in (0, 1):
        c = channel_stats(env, i, TOPIC, "audit")
        assert c is not None and c["paused"] is True
    expect(summary.get_by_role("button", name="Unpause", exact=True)).to_be_visible()
    expect(summary.locator('[data-k="paused"]')).to_have_text("paused")

    summary.get_by_role("button", name="Empty").click()
    expect(page.locator("#flash")).to_contain_text(f"empty channel {TOPIC}/audit: OK")
    for i in (0, 1):
        c = channel_stats(env, i, TOPIC, "audit")
        assert c is not None and c["depth"] == 0
    expect(summary.locator('dd[data-k="depth"]')).to_have_text("0")
    # The other channel keeps its messages.
    billing = channel_stats(env, 1, TOPIC, "billing")
    assert billing is not None and billing["depth"] == 5

    summary.get_by_role("button", name="Unpause", exact=True).click()
    expect(summary.get_by_role("button", name="Pause", exact=True)).to_be_visible()
    c = channel_stats(env, 0, TOPIC, "audit")
    assert c is not None and c["paused"] is False


def test_kill_and_restart_a_node(page: Any, loaded: AdminEnv) -> None:
    env = loaded
    page.goto(f"{env.url}/nodes")
    row = page.locator(f'#nodes tr[data-node="{env.nsqd_http[1]}"]')
    expect(row.locator('[data-k="status"]')).to_have_text("up")

    row.get_by_role("button", name="Kill").click()
    expect(row.locator('[data-k="status"]')).to_have_text("down")
    assert page.asked[-1].startswith(f"Kill nsqd-1 ({env.nsqd_http[1]})?")
    with pytest.raises(httpx.ConnectError):
        env.stats(1)
    # nsqlookupd dropped it too, and the page says so.
    expect_value(page.locator('#lookupds [data-k="node_count"]'), 1)

    page.get_by_role("link", name=re.compile("timeline", re.I)).click()
    timeline = page.locator("#timeline")
    expect(timeline).to_contain_text(f"killed nsqd-1 ({env.nsqd_http[1]})")
    expect(timeline).to_contain_text(f"nsqd {env.nsqd_http[1]} is down")
    expect(timeline).to_contain_text("lists 1 nsqd (was 2)")
    screenshot(page, "admin-timeline")

    page.locator(f'#faults tr[data-node="{env.nsqd_http[1]}"]').get_by_role(
        "button", name="Start"
    ).click()
    expect(timeline).to_contain_text(f"nsqd {env.nsqd_http[1]} is up")
    assert env.stats(1)["health"] == "OK"
    # Killed, not stopped: what it held in memory is gone.
    assert all(t["topic_name"] != TOPIC for t in env.stats(1)["topics"])


def test_fault_controls(page: Any, loaded: AdminEnv) -> None:
    env = loaded
    # Time out the consumer's in-flight messages from the channel page.
    page.goto(f"{env.url}/topics/{TOPIC}/billing")
    summary = page.locator("#channel-summary")
    expect(summary.locator('dd[data-k="in_flight_count"]')).to_have_text("2")
    summary.get_by_role("button", name="Time out in-flight").click()
    expect(page.locator("#flash")).to_contain_text(
        f"timed out 2 in-flight message(s) of {TOPIC}/billing"
    )
    billing = channel_stats(env, 0, TOPIC, "billing")
    assert billing is not None and billing["timeout_count"] >= 2
    expect(summary.locator('dd[data-k="timeout_count"]')).not_to_have_text("0")

    # Partition nsqd 0 from the lookupds, and swallow its heartbeats.
    page.get_by_role("link", name=re.compile("timeline", re.I)).click()
    row = page.locator(f'#faults tr[data-node="{env.nsqd_http[0]}"]')
    row.get_by_role("button", name="Partition from lookupds").click()
    expect(page.locator("#flash")).to_contain_text("partitioned nsqd-0")
    row.get_by_role("button", name="Swallow heartbeats").click()
    active = page.locator("#active-faults tr[data-fault]")
    expect(active).to_have_count(2)
    expect(page.locator("#active-faults")).to_contain_text("partition")
    expect(page.locator("#active-faults")).to_contain_text("swallow_heartbeats")
    # nsqd's own /stats lists them, and so does its row.
    kinds = {f["kind"] for f in env.stats(0)["faults"]}
    assert kinds == {"partition", "swallow_heartbeats"}
    expect(row.locator('[data-k="health"]')).to_contain_text("partition")
    timeline = page.locator("#timeline")
    expect(timeline).to_contain_text(f"{TOPIC}/billing: 2 message(s) timed out")
    screenshot(page, "admin-faults")

    page.locator("#active-faults").get_by_role("button", name="Heal all").click()
    expect(active).to_have_count(0)
    assert env.stats(0)["faults"] == []
    expect(timeline).to_contain_text("healed #")


def test_create_and_delete_topic_and_channel(page: Any, admin_env: AdminEnv) -> None:
    env = admin_env
    page.goto(f"{env.url}/topics")
    page.fill('form[data-action="topic/create"] input[name="topic"]', "fresh")
    page.fill('form[data-action="topic/create"] input[name="channel"]', "first")
    page.get_by_role("button", name="Create").click()
    expect(page.locator("#flash")).to_contain_text("create topic fresh: OK")
    expect(page.locator('#topics tr[data-topic="fresh"]')).to_be_visible()
    assert page.asked[-1] == "Create topic fresh?"
    for i in (0, 1):
        assert channel_stats(env, i, "fresh", "first") is not None
    topics = env.http.get(f"http://{env.lookupd_http[0]}/topics").json()["topics"]
    assert "fresh" in topics

    page.goto(f"{env.url}/topics/fresh")
    page.fill('form[data-action="channel/create"] input[name="channel"]', "second")
    page.get_by_role("button", name="Create").click()
    expect(page.locator('#channels tr[data-channel="second"]')).to_be_visible()
    assert channel_stats(env, 0, "fresh", "second") is not None

    page.locator('#channels tr[data-channel="second"]').get_by_role("link").click()
    page.locator("#channel-summary").get_by_role("button", name="Delete").click()
    expect(page).to_have_url(re.compile("/topics/fresh$"))
    expect(page.locator('#channels tr[data-channel="first"]')).to_be_visible()
    expect(page.locator('#channels tr[data-channel="second"]')).to_have_count(0)
    assert channel_stats(env, 0, "fresh", "second") is None

    page.locator("#topic-summary").get_by_role("button", name="Delete").click()
    expect(page).to_have_url(re.compile("/topics$"))
    expect(page.locator('#topics tr[data-topic="fresh"]')).to_have_count(0)
    for i in (0, 1):
        assert all(t["topic_name"] != "fresh" for t in env.stats(i)["topics"])
    topics = env.http.get(f"http://{env.lookupd_http[0]}/topics").json()["topics"]
    assert "fresh" not in topics
