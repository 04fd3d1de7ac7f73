"""The node pages: nodes, a node, the counter, nsqlookupd's topics, and the
fault controls and timeline."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .data import LookupdInfo, NodeInfo, Snapshot
from .timeline import Event
from .views import (
    PAUSED,
    QUEUE_COLS,
    Col,
    FaultCaps,
    Page,
    button,
    channel_url,
    clock,
    e,
    node_url,
    num,
    queue_cells,
    status_badge,
    table,
    td,
    topic_url,
)

__all__ = ["counter_page", "lookup_page", "node_page", "nodes_page", "timeline_page"]


# -- nodes ----------------------------------------------------------------------


def nodes_page(snap: Snapshot, caps: FaultCaps) -> Page:
    return Page(
        "Nodes",
        {"nodes": nodes_table(snap.nodes, caps), "lookupds": lookupds_table(snap.lookupds, caps)},
    )


def _node_controls(n: NodeInfo, caps: FaultCaps, full: bool) -> str:
    """Fault buttons of an nsqd row: the Nodes page has kill/start, the Faults page all."""
    if n.index is None or not caps.kill_restart:
        return ""
    i, name = n.index, f"nsqd-{n.index}"
    if not n.up:
        return button("Start", "fault/restart-nsqd", f"Start {name} again?", node=i)
    out = button(
        "Kill",
        "fault/kill-nsqd",
        f"Kill {name} ({n.address})? Its in-memory messages are lost.",
        danger=True,
        node=i,
    )
    if not full:
        return out
    out += button(
        "Stop", "fault/stop-nsqd", f"Stop {name} cleanly (it keeps its messages)?", node=i
    )
    if caps.partition:
        out += button(
            "Partition from lookupds",
            "fault/partition-nsqd",
            f"Cut {name} off from every nsqlookupd?",
            node=i,
        )
    if caps.stall_heartbeats:
        out += button(
            "Swallow heartbeats",
            "fault/swallow_heartbeats-nsqd",
            f"Stop {name}'s heartbeats reaching its clients?",
            node=i,
        )
        out += button("Stall", "fault/stall-nsqd", f"Stall every connection of {name}?", node=i)
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
        row = (
            f'<tr data-node="{e(n.address)}" class="{"" if n.up else "is-down"}">'
            f"<td>{e(n.index) if n.index is not None else ''}</td>"
            f'<td data-k="address">{address}</td>'
            f"<td>{status_badge(n.up, n.error)}</td>"
            f'<td data-k="version">{e(n.version)}</td>'
            f'<td data-k="health" class="{health_cls if n.up else "bad"}">{health}</td>'
            f"{td('topic_count', len(n.topics))}"
            f'<td class="topics">{topics}</td>'
            f'<td class="muted">{e(n.source)}</td>'
        )
        rows.append((row, controls))
    return _controlled_table(_NODE_COLS, rows, caps, empty="no nsqd found", title="nsqd nodes")


def _controlled_table(
    cols: tuple[Col, ...], rows: list[tuple[str, str]], caps: FaultCaps, **kw: str
) -> str:
    """A table of nodes whose rows (each unclosed, with its fault controls) end
    in a Fault column when the cluster's node controls are on."""
    on = caps.kill_restart
    body = [row + (f'<td class="controls">{c}</td>' if on else "") + "</tr>" for row, c in rows]
    return table((*cols, Col("Fault")) if on else cols, body, **kw)


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
                controls = button(
                    "Kill",
                    "fault/kill-lookupd",
                    f"Kill lookupd-{lk.index} ({lk.address})?",
                    danger=True,
                    node=lk.index,
                )
            else:
                controls = button(
                    "Start",
                    "fault/restart-lookupd",
                    f"Start lookupd-{lk.index} again?",
                    node=lk.index,
                )
        registered = ", ".join(
            e(f"{n.get('broadcast_address')}:{n.get('tcp_port')}") for n in lk.nodes
        )
        row = (
            f'<tr data-lookupd="{e(lk.address)}" class="{"" if lk.up else "is-down"}">'
            f"<td>{e(lk.index)}</td><td>{e(lk.address)}</td>"
            f"<td>{status_badge(lk.up, lk.error)}</td>"
            f"{td('node_count', len(lk.nodes))}<td>{registered}</td>"
            f"{td('topic_count', len(lk.topics))}"
        )
        rows.append((row, controls))
    return _controlled_table(_LOOKUPD_COLS, rows, caps, title="nsqlookupd")


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
        f'<dt>Messages</dt><dd data-k="total_messages">{num(messages)}</dd>'
        f'<dt>Clients</dt><dd data-k="total_clients">{num(clients)}</dd></dl></div>'
    )
    rows = []
    for t in node.topics:
        name = str(t.get("topic_name"))
        rows.append(
            f'<tr data-topic="{e(name)}"><td><a href="{topic_url(name)}">{e(name)}</a>'
            f"{' ' + PAUSED if t.get('paused') else ''}</td>{queue_cells(t)}"
            f"{td('channel_count', len(t.get('channels') or []))}</tr>"
        )
        for c in t.get("channels") or []:
            cname = str(c.get("channel_name"))
            rows.append(
                f'<tr class="sub" data-topic="{e(name)}" data-channel="{e(cname)}"><td>'
                f'↳ <a href="{channel_url(name, cname)}">{e(cname)}</a>'
                f"{' ' + PAUSED if c.get('paused') else ''}</td>{queue_cells(c)}"
                f"{td('client_count', int(c.get('client_count', 0)))}</tr>"
            )
    cols = (Col("Topic / channel"), *QUEUE_COLS, Col("Channels / clients", num=True))
    return Page(
        f"nsqd {address}",
        {
            "node-summary": summary,
            "node-topics": table(cols, rows, empty="no topics", title="Topics"),
        },
        crumbs=crumbs,
    )


# -- counter and lookup -----------------------------------------------------------


def counter_page(snap: Snapshot) -> Page:
    """Messages handled by every channel of the cluster, summed (nsqadmin's counter)."""
    total = sum(c.message_count for t in snap.topics.values() for c in t.channels.values())
    rate = sum(c.rate for t in snap.topics.values() for c in t.channels.values())
    counter = (
        f'<div class="counter"><span class="big" data-k="message_count" data-v="{total}">'
        f'{num(total)}</span><span class="muted">messages processed by all channels'
        f' · <span data-k="rate">{num(round(rate, 1))}</span>/s</span></div>'
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
    proxies: dict[str, str] | None = None,
    footer: str = "",
) -> Page:
    """The fault controls (a Cluster's, then each proxy's ``proxies`` sections)
    and the timeline."""
    sections: dict[str, str] = {}
    if caps.cluster:
        sections["faults"] = fault_controls(snap, caps)
        sections["active-faults"] = active_faults(active)
    sections.update(proxies or {})
    sections["timeline"] = timeline(events)
    return Page("Faults and timeline" if caps.any else "Timeline", sections, footer=footer)


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
        heal = button("Heal", "fault/heal", f"Heal fault #{f['id']} ({f['kind']})?", fault=f["id"])
        rows.append(
            f'<tr data-fault="{e(f["id"])}"><td>#{e(f["id"])}</td><td>{e(f["kind"])}</td>'
            f"<td>{e(where)}</td><td>{heal}</td></tr>"
        )
    if not rows:
        return '<h2>Active faults</h2><p class="muted">none</p>'
    heal_all = button("Heal all", "fault/heal", "Heal every active fault?", fault="all")
    return table(
        (Col("#"), Col("Kind"), Col("Where"), Col("")), rows, title="Active faults"
    ).replace("<th></th>", f"<th>{heal_all}</th>", 1)


def timeline(events: Sequence[Event]) -> str:
    items = "".join(
        f'<li class="ev-{e(ev.kind)}"><time>{clock(ev.at)}</time>'
        f'<span class="kind">{e(ev.kind)}</span> {e(ev.text)}</li>'
        for ev in reversed(events)
    )
    body = items or '<li class="muted">nothing yet</li>'
    return f'<h2>Timeline</h2><ol class="timeline">{body}</ol>'
