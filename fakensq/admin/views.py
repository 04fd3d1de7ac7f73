"""Server-rendered HTML for the admin pages.

Each page is a shell around live *sections* (``<section id=... data-live>``).  The
sections are rendered here only; the page's script polls the admin server's JSON
endpoint, which returns the same sections freshly rendered, and swaps them in.  So
numbers have one renderer, and a page without JavaScript is still right when loaded.
Cells carry ``data-k`` (the /stats field they show) so tests and users can find them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any
from urllib.parse import quote

from .charts import Line, line_chart
from .data import ChannelTotals, LookupdInfo, NodeInfo, Snapshot, TopicTotals
from .history import History
from .timeline import Event

__all__ = ["Event", "FaultCaps", "Page", "render_page", "Col", "table"]


@dataclass(frozen=True)
class FaultCaps:
    """Which fault controls work here (no button is shown for one that does not)."""

    kill_restart: bool = False
    partition: bool = False
    stall_heartbeats: bool = False
    timeout_in_flight: bool = False

    @property
    def any(self) -> bool:
        return self.kill_restart or self.partition or self.stall_heartbeats


@dataclass
class Page:
    """A page's title and its live sections, by id, in order."""

    title: str
    sections: dict[str, str]
    #: Static (not refreshed) HTML after the sections: forms.
    footer: str = ""
    crumbs: Sequence[tuple[str, str]] = ()


def e(value: Any) -> str:
    return escape(str(value), quote=True)


def topic_url(topic: str) -> str:
    # Relative to the page's <base href> (nsqadmin's --base-path).
    return "topics/" + quote(topic, safe="")


def channel_url(topic: str, channel: str) -> str:
    return topic_url(topic) + "/" + quote(channel, safe="")


def _num(value: int | float) -> str:
    if isinstance(value, float):
        return f"{value:,.1f}"
    return f"{value:,}"


def _td(key: str, value: int | float) -> str:
    # data-v is the exact number (cells show it with thousands separators).
    return f'<td class="num" data-k="{key}" data-v="{value}">{_num(value)}</td>'


@dataclass(frozen=True)
class Col:
    """A table column: its heading, and whether it holds numbers.

    Numbers are right-aligned, and so is their heading: a heading and its
    cells come from the same :class:`Col`, so they cannot drift apart."""

    label: str
    num: bool = False


def table(cols: Sequence[Col], rows: Sequence[str], *, empty: str = "", title: str = "") -> str:
    """A ``<table>`` with ``cols`` as headings and ``rows`` (each ``<tr>...</tr>``
    with one cell per column); ``empty`` is shown in a row of its own when
    there are no rows."""
    head = "".join(
        f'<th class="num">{e(c.label)}</th>' if c.num else f"<th>{e(c.label)}</th>" for c in cols
    )
    body = "".join(rows)
    if not body and empty:
        body = f'<tr><td colspan="{len(cols)}" class="muted">{e(empty)}</td></tr>'
    heading = f"<h2>{e(title)}</h2>" if title else ""
    return f"{heading}<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _button(
    label: str, action: str, confirm: str, *, danger: bool = False, **data: str | int
) -> str:
    # node_address -> data-node-address, which the script reads as dataset.nodeAddress.
    attrs = "".join(f' data-{k.replace("_", "-")}="{e(v)}"' for k, v in data.items())
    cls = "danger" if danger else ""
    return (
        f'<button type="button" class="{cls}" data-action="{e(action)}"'
        f' data-confirm="{e(confirm)}"{attrs}>{e(label)}</button>'
    )


def _status(up: bool, text: str = "") -> str:
    if up:
        return '<span class="badge ok" data-k="status">up</span>'
    title = f' title="{e(text)}"' if text else ""
    return f'<span class="badge down" data-k="status"{title}>down</span>'


def _ago(ts: float) -> str:
    seconds = max(0, int(time.time() - ts))
    if seconds < 60:
        return f"{seconds}s ago"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s ago"
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m ago"


def _clock(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts)) + f".{int(ts * 1000) % 1000:03d}"


# -- nodes ----------------------------------------------------------------------


def nodes_page(snap: Snapshot, caps: FaultCaps) -> Page:
    return Page(
        "Nodes",
        {"nodes": nodes_table(snap.nodes, caps), "lookupds": lookupds_table(snap.lookupds, caps)},
    )


def node_url(address: str) -> str:
    return "nodes/" + quote(address, safe=":[]")


def _node_controls(n: NodeInfo, caps: FaultCaps, full: bool) -> str:
    """Fault buttons of an nsqd row: the Nodes page has kill/start, the Faults page all."""
    if n.index is None or not caps.kill_restart:
        return ""
    i, name = n.index, f"nsqd-{n.index}"
    if not n.up:
        return _button("Start", "fault/restart-nsqd", f"Start {name} again?", node=i)
    out = _button(
        "Kill",
        "fault/kill-nsqd",
        f"Kill {name} ({n.address})? Its in-memory messages are lost.",
        danger=True,
        node=i,
    )
    if not full:
        return out
    out += _button(
        "Stop", "fault/stop-nsqd", f"Stop {name} cleanly (it keeps its messages)?", node=i
    )
    if caps.partition:
        out += _button(
            "Partition from lookupds",
            "fault/partition-nsqd",
            f"Cut {name} off from every nsqlookupd?",
            node=i,
        )
    if caps.stall_heartbeats:
        out += _button(
            "Swallow heartbeats",
            "fault/swallow_heartbeats-nsqd",
            f"Stop {name}'s heartbeats reaching its clients?",
            node=i,
        )
        out += _button("Stall", "fault/stall-nsqd", f"Stall every connection of {name}?", node=i)
    return out


_NODE_COLS = (
    Col("#"),
    Col("nsqd (HTTP)"),
    Col("Status"),
    Col("Version"),
    Col("Health"),
    Col("Topics", num=True),
    Col("Topic names"),
    Col("Found via"),
)


def nodes_table(nodes: Sequence[NodeInfo], caps: FaultCaps, *, full: bool = False) -> str:
    rows = []
    for n in nodes:
        topics = ", ".join(
            f'<a href="{topic_url(t["topic_name"])}">{e(t["topic_name"])}</a>' for t in n.topics
        )
        health = e(n.health) if n.up else e(n.error)
        health_cls = "ok" if n.health == "OK" else "bad"
        controls = _node_controls(n, caps, full)
        # fakensq's /stats lists the faults in force on the node (real nsqd has none).
        for fault in (n.stats or {}).get("faults") or []:
            health += f' <span class="badge warn">{e(fault.get("kind", "fault"))}</span>'
        address = f'<a href="{node_url(n.address)}">{e(n.address)}</a>' if n.up else e(n.address)
        rows.append(
            f'<tr data-node="{e(n.address)}" class="{"" if n.up else "is-down"}">'
            f"<td>{e(n.index) if n.index is not None else ''}</td>"
            f'<td data-k="address">{address}</td>'
            f"<td>{_status(n.up, n.error)}</td>"
            f'<td data-k="version">{e(n.version)}</td>'
            f'<td data-k="health" class="{health_cls if n.up else "bad"}">{health}</td>'
            f"{_td('topic_count', len(n.topics))}"
            f'<td class="topics">{topics}</td>'
            f'<td class="muted">{e(n.source)}</td>'
            + (f'<td class="controls">{controls}</td>' if caps.kill_restart else "")
            + "</tr>"
        )
    cols = _NODE_COLS + ((Col("Fault"),) if caps.kill_restart else ())
    return table(cols, rows, empty="no nsqd found", title="nsqd nodes")


_LOOKUPD_COLS = (
    Col("#"),
    Col("nsqlookupd (HTTP)"),
    Col("Status"),
    Col("Nodes", num=True),
    Col("Registered nsqd (TCP)"),
    Col("Topics", num=True),
)


def lookupds_table(lookupds: Sequence[LookupdInfo], caps: FaultCaps) -> str:
    if not lookupds:
        return '<h2>nsqlookupd</h2><p class="muted">No nsqlookupd configured.</p>'
    rows = []
    for lk in lookupds:
        controls = ""
        if caps.kill_restart and lk.index is not None:
            if lk.up:
                controls = _button(
                    "Kill",
                    "fault/kill-lookupd",
                    f"Kill lookupd-{lk.index} ({lk.address})?",
                    danger=True,
                    node=lk.index,
                )
            else:
                controls = _button(
                    "Start",
                    "fault/restart-lookupd",
                    f"Start lookupd-{lk.index} again?",
                    node=lk.index,
                )
        registered = ", ".join(
            e(f"{n.get('broadcast_address')}:{n.get('tcp_port')}") for n in lk.nodes
        )
        rows.append(
            f'<tr data-lookupd="{e(lk.address)}" class="{"" if lk.up else "is-down"}">'
            f"<td>{e(lk.index)}</td><td>{e(lk.address)}</td><td>{_status(lk.up, lk.error)}</td>"
            f"{_td('node_count', len(lk.nodes))}<td>{registered}</td>"
            f"{_td('topic_count', len(lk.topics))}"
            + (f'<td class="controls">{controls}</td>' if caps.kill_restart else "")
            + "</tr>"
        )
    cols = _LOOKUPD_COLS + ((Col("Fault"),) if caps.kill_restart else ())
    return table(cols, rows, title="nsqlookupd")


def node_page(snap: Snapshot, address: str) -> Page:
    """One nsqd: its topics, their channels and clients (nsqadmin's node page)."""
    crumbs = [("Nodes", "nodes"), (address, node_url(address))]
    node = snap.node(address)
    if node is None or not node.up:
        why = f" ({node.error})" if node is not None and node.error else ""
        return Page(
            f"nsqd {address}",
            {"node-summary": f'<p class="muted">nsqd {e(address)} is not reachable{e(why)}.</p>'},
            crumbs=crumbs,
        )
    clients = sum(len(c.get("clients") or []) for t in node.topics for c in t.get("channels") or [])
    messages = sum(int(t.get("message_count", 0)) for t in node.topics)
    summary = (
        f'<div class="summary"><dl><dt>Version</dt><dd data-k="version">{e(node.version)}</dd>'
        f'<dt>Health</dt><dd data-k="health">{e(node.health)}</dd>'
        f'<dt>Topics</dt><dd data-k="topic_count">{len(node.topics)}</dd>'
        f'<dt>Messages</dt><dd data-k="total_messages">{_num(messages)}</dd>'
        f'<dt>Clients</dt><dd data-k="total_clients">{_num(clients)}</dd></dl></div>'
    )
    rows = []
    for t in node.topics:
        name = str(t.get("topic_name"))
        rows.append(
            f'<tr data-topic="{e(name)}"><td><a href="{topic_url(name)}">{e(name)}</a>'
            f"{' ' + _PAUSED if t.get('paused') else ''}</td>"
            f"{_td('depth', int(t.get('depth', 0)))}"
            f"{_td('backend_depth', int(t.get('backend_depth', 0)))}"
            f"{_td('message_count', int(t.get('message_count', 0)))}"
            f"{_td('channel_count', len(t.get('channels') or []))}</tr>"
        )
        for c in t.get("channels") or []:
            cname = str(c.get("channel_name"))
            rows.append(
                f'<tr class="sub" data-topic="{e(name)}" data-channel="{e(cname)}"><td>'
                f'↳ <a href="{channel_url(name, cname)}">{e(cname)}</a>'
                f"{' ' + _PAUSED if c.get('paused') else ''}</td>"
                f"{_td('depth', int(c.get('depth', 0)))}"
                f"{_td('backend_depth', int(c.get('backend_depth', 0)))}"
                f"{_td('message_count', int(c.get('message_count', 0)))}"
                f"{_td('client_count', int(c.get('client_count', 0)))}</tr>"
            )
    cols = (
        Col("Topic / channel"),
        Col("Depth", num=True),
        Col("Disk depth", num=True),
        Col("Messages", num=True),
        Col("Channels / clients", num=True),
    )
    return Page(
        f"nsqd {address}",
        {
            "node-summary": summary,
            "node-topics": table(cols, rows, empty="no topics", title="Topics"),
        },
        crumbs=crumbs,
    )


_PAUSED = '<span class="badge warn">paused</span>'


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
        flag = " " + _PAUSED if t.paused else ""
        if t.lookupd_only:
            flag += ' <span class="badge muted">lookupd only</span>'
        rows.append(
            f'<tr data-topic="{e(t.name)}"><td><a href="{topic_url(t.name)}">{e(t.name)}</a>'
            f"{flag}</td>"
            f"{_td('depth', t.depth)}{_td('message_count', t.message_count)}"
            f"{_td('rate', round(t.rate, 1))}{_td('channel_count', len(t.channels))}"
            f"{_td('node_count', len(t.per_node))}</tr>"
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
        _button("Unpause", "topic/unpause", f"Unpause topic {t.name}?", topic=t.name)
        if t.paused
        else _button("Pause", "topic/pause", f"Pause topic {t.name}?", topic=t.name)
    )
    actions = (
        _button(
            "Empty",
            "topic/empty",
            f"Empty topic {t.name} (drop its queued messages)?",
            topic=t.name,
        )
        + pause
        + _button(
            "Delete",
            "topic/delete",
            f"Delete topic {t.name} and all its channels?",
            danger=True,
            topic=t.name,
        )
    )
    state = '<span class="badge warn" data-k="paused">paused</span>' if t.paused else ""
    return (
        f'<div class="summary"><dl><dt>Depth</dt><dd data-k="depth">{_num(t.depth)}</dd>'
        f'<dt>Messages</dt><dd data-k="message_count">{_num(t.message_count)}</dd>'
        f'<dt>Msgs/s</dt><dd data-k="rate">{_num(round(t.rate, 1))}</dd>'
        f'<dt>Producers</dt><dd data-k="producers">{e(", ".join(producers)) or "none"}</dd>'
        f'</dl>{state}<div class="actions">{actions}</div></div>'
    )


_TOPIC_NODE_COLS = (
    Col("nsqd"),
    Col("Depth", num=True),
    Col("Disk depth", num=True),
    Col("Messages", num=True),
    Col("Channels", num=True),
    Col("Paused"),
)


def topic_nodes(t: TopicTotals) -> str:
    rows = [
        f'<tr data-node="{e(addr)}"><td data-k="node">{e(addr)}</td>'
        f"{_td('depth', int(doc.get('depth', 0)))}"
        f"{_td('backend_depth', int(doc.get('backend_depth', 0)))}"
        f"{_td('message_count', int(doc.get('message_count', 0)))}"
        f"{_td('channel_count', len(doc.get('channels') or []))}"
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
        flag = " " + _PAUSED if c.paused else ""
        cells = "".join(_td(k, getattr(c, k)) for k, _ in _CHANNEL_COLUMNS)
        rows.append(
            f'<tr data-channel="{e(c.name)}"><td><a href="{channel_url(t.name, c.name)}">'
            f"{e(c.name)}</a>{flag}</td>{cells}{_td('rate', round(c.rate, 1))}</tr>"
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
        _button(
            "Unpause", "channel/unpause", f"Unpause channel {label}?", topic=topic, channel=c.name
        )
        if c.paused
        else _button(
            "Pause", "channel/pause", f"Pause channel {label}?", topic=topic, channel=c.name
        )
    )
    actions = (
        _button(
            "Empty",
            "channel/empty",
            f"Empty channel {label} (drop its queued messages)?",
            topic=topic,
            channel=c.name,
        )
        + pause
        + _button(
            "Delete",
            "channel/delete",
            f"Delete channel {label}?",
            danger=True,
            topic=topic,
            channel=c.name,
        )
    )
    if caps.timeout_in_flight:
        actions += _button(
            "Time out in-flight",
            "fault/timeout-in-flight",
            f"Time out every in-flight message of {label} now?",
            danger=True,
            topic=topic,
            channel=c.name,
        )
    cells = "".join(
        f'<dt>{label_}</dt><dd data-k="{k}">{_num(getattr(c, k))}</dd>'
        for k, label_ in _CHANNEL_COLUMNS
    )
    state = '<span class="badge warn" data-k="paused">paused</span>' if c.paused else ""
    return f'<div class="summary"><dl>{cells}</dl>{state}<div class="actions">{actions}</div></div>'


def channel_nodes(c: ChannelTotals) -> str:
    rows = [
        f'<tr data-node="{e(addr)}"><td data-k="node">{e(addr)}</td>'
        + "".join(_td(k, int(doc.get(k, 0))) for k, _ in _CHANNEL_COLUMNS)
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


def clients_table(c: ChannelTotals, caps: FaultCaps = FaultCaps()) -> str:
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
                f"{_td('ready_count', int(cl.get('ready_count', 0)))}"
                f"{_td('in_flight_count', int(cl.get('in_flight_count', 0)))}"
                f"{_td('finish_count', int(cl.get('finish_count', 0)))}"
                f"{_td('requeue_count', int(cl.get('requeue_count', 0)))}"
                f"{_td('message_count', int(cl.get('message_count', 0)))}"
                f'<td data-k="connect_ts" title="{e(time.ctime(since))}">{_ago(since)}</td>'
                + (f"<td>{_client_controls(addr, cl)}</td>" if caps.partition else "")
                + "</tr>"
            )
    cols = _CLIENT_COLS + ((Col("Fault"),) if caps.partition else ())
    return table(cols, rows, empty="no clients", title="Clients")


def _client_controls(node_address: str, client: dict[str, Any]) -> str:
    remote = str(client.get("remote_address", ""))
    return _button(
        "Partition",
        "fault/partition-client",
        f"Cut client {remote} off from its nsqd ({node_address})?",
        danger=True,
        client=remote,
        node_address=node_address,
    ) + _button(
        "Drop",
        "fault/drop-client",
        f"Drop client {remote}'s connection?",
        client=remote,
        node_address=node_address,
    )


# -- counter and lookup -----------------------------------------------------------


def counter_page(snap: Snapshot) -> Page:
    """Messages handled by every channel of the cluster, summed (nsqadmin's counter)."""
    total = sum(c.message_count for t in snap.topics.values() for c in t.channels.values())
    rate = sum(c.rate for t in snap.topics.values() for c in t.channels.values())
    counter = (
        f'<div class="counter"><span class="big" data-k="message_count" data-v="{total}">'
        f'{_num(total)}</span><span class="muted">messages processed by all channels'
        f' · <span data-k="rate">{_num(round(rate, 1))}</span>/s</span></div>'
    )
    return Page("Counter", {"counter": counter})


def lookup_page(snap: Snapshot) -> Page:
    """What nsqlookupd knows: its topics, and those no nsqd produces (inactive)."""
    rows = []
    for lk in snap.lookupds:
        if not lk.up:
            continue
        for name in lk.topics:
            t = snap.topics.get(name)
            active = t is not None and not t.lookupd_only
            rows.append(
                f'<tr data-topic="{e(name)}"><td>{e(lk.address)}</td>'
                f'<td><a href="{topic_url(name)}">{e(name)}</a></td>'
                f'<td data-k="state">{"active" if active else "inactive (no producer)"}</td></tr>'
            )
    if not snap.lookupds:
        listing = '<p class="muted">No nsqlookupd configured.</p>'
    else:
        listing = table(
            (Col("nsqlookupd"), Col("Topic"), Col("State")), rows, empty="no topics registered"
        )
    form = (
        '<form class="create" data-action="topic/create" '
        'data-confirm="Create topic {topic}?">'
        "<h2>Create a topic / channel</h2>"
        '<input name="topic" placeholder="topic" required pattern="[.a-zA-Z0-9_\\-]+(#ephemeral)?">'
        '<input name="channel" placeholder="channel (optional)">'
        "<button>Create</button></form>"
    )
    return Page("Lookup", {"lookup": listing}, footer=form)


# -- faults and timeline --------------------------------------------------------


def timeline_page(
    snap: Snapshot,
    caps: FaultCaps,
    events: Sequence[Event],
    active: Sequence[dict[str, Any]] = (),
) -> Page:
    sections: dict[str, str] = {}
    if caps.any:
        sections["faults"] = fault_controls(snap, caps)
        sections["active-faults"] = active_faults(active)
    sections["timeline"] = timeline(events)
    return Page("Faults and timeline" if caps.any else "Timeline", sections)


def fault_controls(snap: Snapshot, caps: FaultCaps) -> str:
    rows = [nodes_table(snap.nodes, caps, full=True), lookupds_table(snap.lookupds, caps)]
    return "".join(rows).replace("<h2>nsqd nodes</h2>", "<h2>Fault controls</h2>", 1)


def active_faults(active: Sequence[dict[str, Any]]) -> str:
    """The faults in force, each with a Heal button."""
    rows = []
    for f in active:
        where = ", ".join(
            f"{k} {f[k]}" for k in ("node", "peer", "topic", "channel", "direction") if k in f
        )
        heal = _button("Heal", "fault/heal", f"Heal fault #{f['id']} ({f['kind']})?", fault=f["id"])
        rows.append(
            f'<tr data-fault="{e(f["id"])}"><td>#{e(f["id"])}</td><td>{e(f["kind"])}</td>'
            f"<td>{e(where)}</td><td>{heal}</td></tr>"
        )
    if not rows:
        return '<h2>Active faults</h2><p class="muted">none</p>'
    heal_all = _button("Heal all", "fault/heal", "Heal every active fault?", fault="all")
    return table(
        (Col("#"), Col("Kind"), Col("Where"), Col("")), rows, title="Active faults"
    ).replace("<th></th>", f"<th>{heal_all}</th>", 1)


def timeline(events: Sequence[Event]) -> str:
    items = "".join(
        f'<li class="ev-{e(ev.kind)}"><time>{_clock(ev.at)}</time>'
        f'<span class="kind">{e(ev.kind)}</span> {e(ev.text)}</li>'
        for ev in reversed(events)
    )
    body = items or '<li class="muted">nothing yet</li>'
    return f'<h2>Timeline</h2><ol class="timeline">{body}</ol>'


# -- the shell ------------------------------------------------------------------


def render_page(
    page: Page,
    *,
    nav: Sequence[tuple[str, str]],
    current: str,
    base: str = "",
    admin: bool = True,
) -> str:
    """The whole page around ``page``'s sections.  Links inside are relative to
    ``<base href>`` (nsqadmin's --base-path); without admin rights (--admin-user)
    the action buttons are hidden, as nsqadmin hides them."""
    here = ' class="here"'
    base_href = (base.rstrip("/") or "") + "/"
    current_href = base_href.rstrip("/") + (current if current != "/" else "/topics")
    links = "".join(
        f'<a href="{href}"{here if href == current_href else ""}>{e(label)}</a>'
        for label, href in nav
    )
    crumbs = " / ".join(f'<a href="{href}">{e(label)}</a>' for label, href in page.crumbs)
    sections = "".join(
        f'<section id="{e(sid)}" data-live>{html}</section>' for sid, html in page.sections.items()
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<base href="{e(base_href)}">
<title>{e(page.title)} · fakensq admin</title>
<link rel="stylesheet" href="static/admin.css">
<script src="static/admin.js" defer></script>
</head><body data-admin="{"true" if admin else "false"}">
<header><span class="brand">fakensq admin</span><nav>{links}</nav>
<span id="live" class="muted" aria-live="polite">live</span></header>
<main>
<div class="crumbs">{crumbs}</div>
<h1>{e(page.title)}</h1>
<div id="flash" role="status" hidden></div>
{sections}
{page.footer}
</main></body></html>
"""
