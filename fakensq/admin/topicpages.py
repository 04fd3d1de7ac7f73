"""The topic pages: the topics, a topic, a channel (with their live charts)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from .charts import Line, line_chart
from .data import ChannelTotals, Snapshot, TopicTotals
from .history import History
from .views import (
    PAUSED,
    QUEUE_COLS,
    Col,
    FaultCaps,
    Page,
    ago,
    button,
    channel_url,
    e,
    num,
    queue_cells,
    table,
    td,
    topic_url,
)

__all__ = ["channel_page", "topic_page", "topics_page"]


# -- topics ---------------------------------------------------------------------


def topics_page(snap: Snapshot, history: History | None = None) -> Page:
    form = (
        '<form class="create" data-action="topic/create" '
        'data-confirm="Create topic {topic}?">'
        "<h2>Create a topic</h2>"
        '<input name="topic" placeholder="topic" required pattern="[.a-zA-Z0-9_\\-]+(#ephemeral)?">'
        '<input name="channel" placeholder="channel (optional)">'
        "<button>Create</button></form>"
    )
    sections = {"topics": topics_table(snap.topics.values())}
    if history is not None:
        names = [t.name for t in snap.topics.values() if not t.lookupd_only]
        sections["topics-charts"] = _charts(
            "topics", history, [(("topic", n), n) for n in names], "per topic", backlog=True
        )
    return Page("Topics", sections, footer=form)


_TOPIC_COLS = (
    Col("Topic"),
    Col("Depth", num=True),
    Col("Messages", num=True),
    Col("Msgs/s", num=True),
    Col("Channels", num=True),
    Col("Nodes", num=True),
)


def topics_table(topics: Iterable[TopicTotals]) -> str:
    rows = []
    for t in topics:
        flag = " " + PAUSED if t.paused else ""
        if t.lookupd_only:
            flag += ' <span class="badge muted">lookupd only</span>'
        rows.append(
            f'<tr data-topic="{e(t.name)}"><td><a href="{topic_url(t.name)}">{e(t.name)}</a>'
            f"{flag}</td>"
            f"{td('depth', t.depth)}{td('message_count', t.message_count)}"
            f"{td('rate', round(t.rate, 1))}{td('channel_count', len(t.channels))}"
            f"{td('node_count', len(t.per_node))}</tr>"
        )
    return table(_TOPIC_COLS, rows, empty="no topics")


def topic_page(snap: Snapshot, name: str, history: History | None = None) -> Page:
    t = snap.topics.get(name)
    crumbs = [("Topics", "topics"), (name, topic_url(name))]
    if t is None:
        return Page(
            f"Topic {name}",
            {"topic-summary": f'<p class="muted">Topic {e(name)} does not exist (any more).</p>'},
            crumbs=crumbs,
        )
    form = (
        f'<form class="create" data-action="channel/create" data-topic="{e(name)}" '
        f'data-confirm="Create channel {{channel}} in topic {e(name)}?">'
        "<h2>Create a channel</h2>"
        '<input name="channel" placeholder="channel" required>'
        "<button>Create</button></form>"
    )
    sections = {"topic-summary": topic_summary(t, snap.producers(name))}
    if history is not None:
        sections["topic-charts"] = _charts(
            "topic",
            history,
            [(("topic", name), f"{name} (topic)")]
            + [(("channel", name, c), c) for c in t.channels],
            "per channel",
        )
    sections["topic-nodes"] = topic_nodes(t)
    sections["channels"] = channels_table(t)
    return Page(f"Topic {name}", sections, footer=form, crumbs=crumbs)


def topic_summary(t: TopicTotals, producers: Sequence[str]) -> str:
    pause = (
        button("Unpause", "topic/unpause", f"Unpause topic {t.name}?", topic=t.name)
        if t.paused
        else button("Pause", "topic/pause", f"Pause topic {t.name}?", topic=t.name)
    )
    actions = (
        button(
            "Empty",
            "topic/empty",
            f"Empty topic {t.name} (drop its queued messages)?",
            topic=t.name,
        )
        + pause
        + button(
            "Delete",
            "topic/delete",
            f"Delete topic {t.name} and all its channels?",
            danger=True,
            topic=t.name,
        )
    )
    state = '<span class="badge warn" data-k="paused">paused</span>' if t.paused else ""
    return (
        f'<div class="summary"><dl><dt>Depth</dt><dd data-k="depth">{num(t.depth)}</dd>'
        f'<dt>Messages</dt><dd data-k="message_count">{num(t.message_count)}</dd>'
        f'<dt>Msgs/s</dt><dd data-k="rate">{num(round(t.rate, 1))}</dd>'
        f'<dt>Producers</dt><dd data-k="producers">{e(", ".join(producers)) or "none"}</dd>'
        f'</dl>{state}<div class="actions">{actions}</div></div>'
    )


_TOPIC_NODE_COLS = (Col("nsqd"), *QUEUE_COLS, Col("Channels", num=True), Col("Paused"))


def topic_nodes(t: TopicTotals) -> str:
    rows = [
        f'<tr data-node="{e(addr)}"><td data-k="node">{e(addr)}</td>{queue_cells(doc)}'
        f"{td('channel_count', len(doc.get('channels') or []))}"
        f'<td data-k="paused">{"paused" if doc.get("paused") else ""}</td></tr>'
        for addr, doc in t.per_node
    ]
    return table(_TOPIC_NODE_COLS, rows, empty="no nsqd holds this topic", title="Per node")


_CHANNEL_COLUMNS = (
    ("depth", "Depth"),
    ("in_flight_count", "In flight"),
    ("deferred_count", "Deferred"),
    ("requeue_count", "Requeued"),
    ("timeout_count", "Timed out"),
    ("message_count", "Messages"),
    ("client_count", "Clients"),
)


def channels_table(t: TopicTotals) -> str:
    rows = []
    for c in t.channels.values():
        flag = " " + PAUSED if c.paused else ""
        cells = "".join(td(k, getattr(c, k)) for k, _ in _CHANNEL_COLUMNS)
        rows.append(
            f'<tr data-channel="{e(c.name)}"><td><a href="{channel_url(t.name, c.name)}">'
            f"{e(c.name)}</a>{flag}</td>{cells}{td('rate', round(c.rate, 1))}</tr>"
        )
    cols = (
        Col("Channel"),
        *(Col(label, num=True) for _, label in _CHANNEL_COLUMNS),
        Col("Msgs/s", num=True),
    )
    return table(cols, rows, empty="no channels", title="Channels")


# -- charts ---------------------------------------------------------------------


def _charts(
    prefix: str,
    history: History,
    keys: Sequence[tuple[tuple[str, ...], str]],
    what: str,
    *,
    backlog: bool = False,
    in_flight: bool = False,
) -> str:
    """Message rate and depth (or backlog; and in flight) of ``keys`` over the
    last minutes."""
    now = time.time()
    series = [history.series(key, name, now=now) for key, name in keys]
    start = now - history.chart_window

    def chart(kind: str, title: str, pick: Any, unit: str = "") -> str:
        lines = [Line(s.name, pick(s)) for s in series]
        return line_chart(f"{prefix}-{kind}-chart", title, lines, start=start, end=now, unit=unit)

    charts = [chart("rate", f"Messages/s {what}".strip(), lambda s: s.rate, "/s")]
    if backlog:
        charts.append(
            chart("depth", f"Backlog (topic + channel depths) {what}".strip(), lambda s: s.backlog)
        )
    else:
        charts.append(chart("depth", f"Depth {what}".strip(), lambda s: s.depth))
    if in_flight:
        charts.append(chart("in-flight", f"In flight {what}".strip(), lambda s: s.in_flight))
    window = int(history.chart_window)
    span = f"{window // 60} minutes" if window % 60 == 0 and window >= 120 else f"{window} seconds"
    return f'<h2>Last {span}</h2><div class="charts">{"".join(charts)}</div>'


# -- a channel ------------------------------------------------------------------


def channel_page(
    snap: Snapshot, topic: str, name: str, caps: FaultCaps, history: History | None = None
) -> Page:
    crumbs = [("Topics", "topics"), (topic, topic_url(topic)), (name, channel_url(topic, name))]
    t = snap.topics.get(topic)
    c = t.channels.get(name) if t is not None else None
    if c is None:
        return Page(
            f"Channel {topic}/{name}",
            {"channel-summary": f'<p class="muted">Channel {e(name)} does not exist.</p>'},
            crumbs=crumbs,
        )
    sections = {"channel-summary": channel_summary(topic, c, caps)}
    if history is not None:
        sections["channel-charts"] = _charts(
            "channel", history, [(("channel", topic, name), name)], "", in_flight=True
        )
    sections["channel-nodes"] = channel_nodes(c)
    sections["clients"] = clients_table(c, caps)
    return Page(f"Channel {topic}/{name}", sections, crumbs=crumbs)


def channel_summary(topic: str, c: ChannelTotals, caps: FaultCaps) -> str:
    label = f"{topic}/{c.name}"
    pause = (
        button(
            "Unpause", "channel/unpause", f"Unpause channel {label}?", topic=topic, channel=c.name
        )
        if c.paused
        else button(
            "Pause", "channel/pause", f"Pause channel {label}?", topic=topic, channel=c.name
        )
    )
    actions = (
        button(
            "Empty",
            "channel/empty",
            f"Empty channel {label} (drop its queued messages)?",
            topic=topic,
            channel=c.name,
        )
        + pause
        + button(
            "Delete",
            "channel/delete",
            f"Delete channel {label}?",
            danger=True,
            topic=topic,
            channel=c.name,
        )
    )
    if caps.timeout_in_flight:
        actions += button(
            "Time out in-flight",
            "fault/timeout-in-flight",
            f"Time out every in-flight message of {label} now?",
            danger=True,
            topic=topic,
            channel=c.name,
        )
    cells = "".join(
        f'<dt>{label_}</dt><dd data-k="{k}">{num(getattr(c, k))}</dd>'
        for k, label_ in _CHANNEL_COLUMNS
    )
    state = '<span class="badge warn" data-k="paused">paused</span>' if c.paused else ""
    return f'<div class="summary"><dl>{cells}</dl>{state}<div class="actions">{actions}</div></div>'


def channel_nodes(c: ChannelTotals) -> str:
    rows = [
        f'<tr data-node="{e(addr)}"><td data-k="node">{e(addr)}</td>'
        + "".join(td(k, int(doc.get(k, 0))) for k, _ in _CHANNEL_COLUMNS)
        + f'<td data-k="paused">{"paused" if doc.get("paused") else ""}</td></tr>'
        for addr, doc in c.per_node
    ]
    cols = (
        Col("nsqd"),
        *(Col(label, num=True) for _, label in _CHANNEL_COLUMNS),
        Col("Paused"),
    )
    return table(cols, rows, title="Per node")


def _flags(client: dict[str, Any]) -> str:
    parts = []
    if client.get("tls"):
        parts.append(f"TLS {client.get('tls_version', '')}".strip())
    if client.get("snappy"):
        parts.append("snappy")
    if client.get("deflate"):
        parts.append("deflate")
    return ", ".join(parts) or "none"


_CLIENT_COLS = (
    Col("nsqd"),
    Col("Address"),
    Col("Hostname"),
    Col("User agent"),
    Col("TLS / compression"),
    Col("Ready", num=True),
    Col("In flight", num=True),
    Col("Finished", num=True),
    Col("Requeued", num=True),
    Col("Messages", num=True),
    Col("Connected"),
)


_NO_FAULTS = FaultCaps()


def clients_table(c: ChannelTotals, caps: FaultCaps = _NO_FAULTS) -> str:
    rows = []
    for addr, doc in c.per_node:
        for cl in doc.get("clients") or []:
            since = float(cl.get("connect_ts", 0))
            rows.append(
                f'<tr data-client="{e(cl.get("remote_address", ""))}">'
                f'<td data-k="node">{e(addr)}</td>'
                f'<td data-k="remote_address">{e(cl.get("remote_address", ""))}</td>'
                f'<td data-k="hostname">{e(cl.get("hostname", ""))}</td>'
                f'<td data-k="user_agent">{e(cl.get("user_agent", ""))}</td>'
                f'<td data-k="features">{e(_flags(cl))}</td>'
                f"{td('ready_count', int(cl.get('ready_count', 0)))}"
                f"{td('in_flight_count', int(cl.get('in_flight_count', 0)))}"
                f"{td('finish_count', int(cl.get('finish_count', 0)))}"
                f"{td('requeue_count', int(cl.get('requeue_count', 0)))}"
                f"{td('message_count', int(cl.get('message_count', 0)))}"
                f'<td data-k="connect_ts" title="{e(time.ctime(since))}">{ago(since)}</td>'
                + (f"<td>{_client_controls(addr, cl)}</td>" if caps.partition else "")
                + "</tr>"
            )
    cols = _CLIENT_COLS + ((Col("Fault"),) if caps.partition else ())
    return table(cols, rows, empty="no clients", title="Clients")


def _client_controls(node_address: str, client: dict[str, Any]) -> str:
    remote = str(client.get("remote_address", ""))
    return button(
        "Partition",
        "fault/partition-client",
        f"Cut client {remote} off from its nsqd ({node_address})?",
        danger=True,
        client=remote,
        node_address=node_address,
    ) + button(
        "Drop",
        "fault/drop-client",
        f"Drop client {remote}'s connection?",
        client=remote,
        node_address=node_address,
    )
