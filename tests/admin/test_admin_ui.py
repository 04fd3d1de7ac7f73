"""The admin pages in a real browser (headless Chromium through Playwright).

Numbers on the pages are checked against each nsqd's /stats; actions are clicked
(confirmations accepted) and their effect checked through the HTTP APIs.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from fakensq.admin import Admin
from fakensq.testing.proxy import FaultProxy
from fakensq.testing.threaded import BackgroundNode
from tests import reference
from tests.support.stats import channel_entry

from .conftest import AdminEnv, RawConsumer, screenshot, screenshots_wanted

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
    return channel_entry(env.stats(i), topic, channel)


def expect_value(locator: Any, value: int) -> None:
    expect(locator).to_have_attribute("data-v", str(value))


# For each body cell with text, the heading it sits under on screen: the one
# whose text overlaps the cell's text most (or, with no overlap, is nearest).
_UNDER_HEADING = """(table) => {
  const box = (el) => {
    const range = document.createRange();
    range.selectNodeContents(el);
    const rects = [...range.getClientRects()].filter((r) => r.width > 0);
    if (!rects.length) return null;
    return {l: Math.min(...rects.map((r) => r.left)), r: Math.max(...rects.map((r) => r.right))};
  };
  const heads = [...table.querySelectorAll("thead th")].map(box);
  return [...table.querySelectorAll("tbody tr")].map((tr) =>
    [...tr.children].map((cell) => {
      const b = box(cell);
      if (!b || !cell.textContent.trim() || cell.colSpan > 1) return null;
      let best = null, score = -Infinity;
      heads.forEach((h, j) => {
        if (!h) return;
        const overlap = Math.min(b.r, h.r) - Math.max(b.l, h.l);
        if (overlap > score) { score = overlap; best = j; }
      });
      return best;
    }));
}"""


def assert_cells_under_their_headings(page: Any, selector: str) -> None:
    """Every value of the table stands under its own column's heading, as a
    reader sees it (read from the laid-out page, not from the HTML)."""
    table = page.locator(selector)
    expect(table.locator("tbody tr").first).to_be_visible()
    rows = table.evaluate(_UNDER_HEADING)
    assert rows, selector
    for row in rows:
        misplaced = [(i, col) for i, col in enumerate(row) if col is not None and col != i]
        assert not misplaced, f"{selector}: cells (column, heading) {misplaced} in {row}"


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
    assert_cells_under_their_headings(page, "#nodes table")
    assert_cells_under_their_headings(page, "#lookupds table")
    screenshot(page, "admin-nodes")

    # Topics: totals over both nodes.
    page.goto(f"{env.url}/topics")
    row = page.locator(f'#topics tr[data-topic="{TOPIC}"]')
    topic_docs = [next(t for t in d["topics"] if t["topic_name"] == TOPIC) for d in stats]
    expect_value(row.locator('[data-k="depth"]'), sum(t["depth"] for t in topic_docs))
    expect_value(row.locator('[data-k="message_count"]'), 8)
    expect_value(row.locator('[data-k="node_count"]'), 2)
    assert_cells_under_their_headings(page, "#topics table")

    # A topic: per node, and its channels summed over the nodes.
    page.row_link = row.get_by_role("link", name=TOPIC)
    page.row_link.click()
    expect(page).to_have_url(re.compile(f"/topics/{TOPIC}$"))
    for address, t in zip(env.nsqd_http, topic_docs, strict=True):
        node_row = page.locator(f'#topic-nodes tr[data-node="{address}"]')
        for key in ("depth", "backend_depth", "message_count"):
            expect_value(node_row.locator(f'[data-k="{key}"]'), t[key])
        expect_value(node_row.locator('[data-k="channel_count"]'), len(t["channels"]))
    # The "Per node" table: each number under its own heading (it was shifted).
    assert_cells_under_their_headings(page, "#topic-nodes table")
    assert_cells_under_their_headings(page, "#channels table")
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
    assert_cells_under_their_headings(page, "#channel-nodes table")
    assert_cells_under_their_headings(page, "#clients table")
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
    # Killed, not stopped: the messages it held in memory are gone (nsqd keeps
    # its topics' names on disk as they are made, so the topic may come back empty).
    for t in env.stats(1)["topics"]:
        if t["topic_name"] == TOPIC:
            assert t["depth"] == 0 and all(c["depth"] == 0 for c in t["channels"])


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


def _depth_of(env: AdminEnv, topic: str, channel: str) -> int:
    return sum((channel_stats(env, i, topic, channel) or {"depth": 0})["depth"] for i in (0, 1))


def _traffic_for_the_picture(env: AdminEnv) -> None:
    """Half a minute of uneven traffic, so the docs' chart shows something
    (TRIONSQ_SCREENSHOTS=1 only: it paces messages, it waits for nothing)."""
    for tick in range(60):
        count = (3, 8, 15, 9, 4, 12)[tick % 6] * (2 if 20 <= tick < 35 else 1)
        body = "\n".join(f"m{tick}.{n}" for n in range(count))
        env.http.post(f"http://{env.nsqd_http[tick % 2]}/mpub?topic={TOPIC}", content=body)
        if tick == 40:
            env.http.post(f"http://{env.nsqd_http[0]}/channel/empty?topic={TOPIC}&channel=audit")
            env.http.post(f"http://{env.nsqd_http[1]}/channel/empty?topic={TOPIC}&channel=audit")
        time.sleep(0.5)


def test_charts_follow_the_cluster(page: Any, loaded: AdminEnv) -> None:
    env = loaded
    page.goto(f"{env.url}/topics/{TOPIC}")
    charts = page.locator("#topic-charts")
    topic_rate = charts.locator('#topic-rate-chart [data-series="orders (topic)"]')
    audit_depth = charts.locator('#topic-depth-chart [data-series="audit"]')
    expect(audit_depth).to_have_attribute("data-last", str(_depth_of(env, TOPIC, "audit")))
    # Messages arrive in bursts: the rate line rises, the depth lines follow.
    for burst in range(3):
        body = "\n".join(f"burst {burst} #{n}" for n in range(20))
        env.http.post(f"http://{env.nsqd_http[1]}/mpub?topic={TOPIC}", content=body)
        expect(audit_depth).to_have_attribute("data-last", str(_depth_of(env, TOPIC, "audit")))
    expect(topic_rate).to_have_attribute("data-peak", re.compile(r"^[1-9]"))
    expect(topic_rate.locator("polyline")).not_to_have_count(0)
    expect(charts.locator("#topic-depth-chart")).to_have_attribute(
        "data-max", re.compile(r"^[1-9]")
    )
    expect(charts.locator(".legend")).to_contain_text(["audit"])
    if screenshots_wanted():
        _traffic_for_the_picture(env)
        expect(audit_depth).to_have_attribute("data-last", str(_depth_of(env, TOPIC, "audit")))
    screenshot(page, "admin-topic")

    # A channel: its rate, depth and in flight.
    page.goto(f"{env.url}/topics/{TOPIC}/billing")
    in_flight = page.locator('#channel-in-flight-chart [data-series="billing"]')
    expect(in_flight).to_have_attribute("data-last", "2")
    billing_depth = page.locator('#channel-depth-chart [data-series="billing"]')
    expect(billing_depth).to_have_attribute("data-last", str(_depth_of(env, TOPIC, "billing")))

    # Every topic on the topics page: its rate, and its backlog (its channels' depths).
    page.goto(f"{env.url}/topics")
    expect(page.locator('#topics-rate-chart [data-series="orders"]')).to_have_attribute(
        "data-peak", re.compile(r"^[1-9]")
    )
    backlog = _depth_of(env, TOPIC, "audit") + _depth_of(env, TOPIC, "billing")
    expect(page.locator('#topics-depth-chart [data-series="orders"]')).to_have_attribute(
        "data-last", str(backlog)
    )
    screenshot(page, "admin-topics")


def test_node_counter_and_lookup_pages(page: Any, loaded: AdminEnv) -> None:
    env = loaded
    page.goto(f"{env.url}/nodes")
    page.locator(f'#nodes tr[data-node="{env.nsqd_http[0]}"]').get_by_role(
        "link", name=env.nsqd_http[0]
    ).click()
    expect(page).to_have_url(re.compile(f"/nodes/{re.escape(env.nsqd_http[0])}$"))
    stats = env.stats(0)
    summary = page.locator("#node-summary")
    expect(summary.locator('[data-k="total_messages"]')).to_have_text(
        str(sum(t["message_count"] for t in stats["topics"]))
    )
    expect(summary.locator('[data-k="total_clients"]')).to_have_text("1")
    row = page.locator(f'#node-topics tr[data-channel="billing"][data-topic="{TOPIC}"]')
    expect_value(row.locator('[data-k="client_count"]'), 1)
    assert_cells_under_their_headings(page, "#node-topics table")

    page.goto(f"{env.url}/counter")
    total = sum(
        c["message_count"] for i in (0, 1) for t in env.stats(i)["topics"] for c in t["channels"]
    )
    expect_value(page.locator('#counter [data-k="message_count"]'), total)

    # A topic only nsqlookupd knows (created through nsqadmin's API) is inactive.
    created = env.http.post(f"{env.url}/api/topics", json={"topic": "ghost"})
    assert created.json() == {"message": ""}
    page.goto(f"{env.url}/lookup")
    expect(page.locator('#lookup tr[data-topic="ghost"] [data-k="state"]')).to_have_text(
        "inactive (no producer)"
    )
    expect(page.locator(f'#lookup tr[data-topic="{TOPIC}"] [data-k="state"]')).to_have_text(
        "active"
    )


@pytest.mark.admin_options(base_path="/admin", admin_users=["alice"])
def test_base_path_and_admin_users(page: Any, loaded: AdminEnv) -> None:
    env = loaded
    assert env.url.endswith("/admin")
    page.goto(f"{env.url}/topics/{TOPIC}")
    summary = page.locator("#topic-summary")
    # Not an admin user: numbers, but no buttons, and actions are refused.
    expect(summary.locator('[data-k="message_count"]')).to_have_text("8")
    expect(summary.get_by_role("button", name="Pause", exact=True)).to_be_hidden()
    refused = env.http.post(f"{env.url}/api/action", json={"action": "topic/pause", "topic": TOPIC})
    assert (refused.status_code, refused.json()["message"]) == (403, "FORBIDDEN")
    api = env.http.post(f"{env.url}/api/topics/{TOPIC}", json={"action": "pause"})
    assert (api.status_code, api.json()) == (403, {"message": "FORBIDDEN"})

    # alice (named by --acl-http-header) may act; links and polling stay under /admin.
    page.set_extra_http_headers({"X-Forwarded-User": "alice"})
    page.reload()
    summary.get_by_role("button", name="Pause", exact=True).click()
    expect(page.locator("#flash")).to_contain_text(f"pause topic {TOPIC}: OK")
    expect(summary.locator('[data-k="paused"]')).to_have_text("paused")
    assert all(
        t["paused"] for i in (0, 1) for t in env.stats(i)["topics"] if t["topic_name"] == TOPIC
    )
    page.get_by_role("link", name="billing").click()
    expect(page).to_have_url(re.compile(f"/admin/topics/{TOPIC}/billing$"))
    expect(page.locator("#live")).to_contain_text("live ·")
    # The base path itself is the topics page, and it stays live too.
    page.goto(env.url)
    expect(page.locator(f'#topics tr[data-topic="{TOPIC}"]')).to_be_visible()
    expect(page.locator("#live")).to_contain_text("live ·")


@asynccontextmanager
async def _real_nsqd_behind_a_proxy() -> AsyncIterator[tuple[FaultProxy, Admin]]:
    async with (
        reference.open_nsqd() as nsqd,
        FaultProxy(nsqd.tcp_address) as proxy,
        Admin(
            nsqd_http_addresses=[nsqd.http_address],
            proxy_http_addresses=[str(proxy.http_address)],
            http_address="127.0.0.1:0",
            watch_interval=0.2,
        ) as admin,
    ):
        yield proxy, admin


def test_proxy_fault_buttons_on_a_real_nsqd(page: Any) -> None:
    """Clicked in the browser: the proxy's *Drop consumers* cuts a consumer of the
    real nsqd off; the form injects a stall that *Heal all* heals."""
    reference.require("nsqd")
    node: BackgroundNode[tuple[FaultProxy, Admin]] = BackgroundNode(
        _real_nsqd_behind_a_proxy, "admin-proxy"
    )
    proxy, admin = node.start()
    consumer: RawConsumer | None = None
    try:
        consumer = RawConsumer(proxy.tcp_address, TOPIC, "billing", rdy=1)
        page.goto(f"{admin.url}/timeline")
        section = page.locator("#proxy-0")
        expect(section.locator("tr[data-client] [data-k=role]")).to_have_text("consumer")
        expect(page.locator("#proxy-cannot button[disabled]")).to_have_count(5)
        section.get_by_role("button", name="Drop consumers").click()
        expect(page.locator("#flash")).to_contain_text("dropped 1 connection(s) (consumers')")
        consumer.sock.settimeout(10)
        while consumer.sock.recv(4096):  # what nsqd sent before the drop, then EOF
            pass
        expect(section.locator("tr[data-client]")).to_have_count(0)

        form = page.locator('form[data-action="fault/proxy"]')
        form.locator('select[name="action"]').select_option("fault/proxy-stall")
        form.locator('select[name="direction"]').select_option("out")
        form.get_by_role("button", name="Inject").click()
        expect(page.locator("#flash")).to_contain_text("stall #")
        expect(section.locator("tr[data-fault]")).to_have_count(1)
        assert [(f.kind, f.direction) for f in proxy.faults.active] == [("stall", "out")]
        section.get_by_role("button", name="Heal all").click()
        expect(section.locator("tr[data-fault]")).to_have_count(0)
        assert proxy.faults.active == []
        expect(page.locator("#timeline")).to_contain_text("healed 1 fault(s)")
    finally:
        if consumer is not None:
            consumer.close()
        node.stop()
