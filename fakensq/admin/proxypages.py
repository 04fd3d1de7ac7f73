"""The Faults page's section for ``fakensq proxy``: each proxy's fault buttons,
the connections it relays (each with its own buttons), the faults in force with
Heal buttons, and, greyed, the faults only fakensq's own nsqd can do."""

from __future__ import annotations

from collections.abc import Sequence

from ..faultkinds import KINDS, WIRE_KINDS
from .proxycontrols import INSIDE_NSQD, INSIDE_REASON, ProxyState
from .views import Col, button, e, table

__all__ = ["proxy_forms", "proxy_sections"]

#: The proxy-wide buttons' variants where a kind has more than one, or needs a
#: parameter: label, confirmation, parameters.
_VARIANTS: dict[str, tuple[tuple[str, str, dict[str, str]], ...]] = {
    "drop": (
        ("Drop consumers", "Drop every consumer's connection?", {"role": "consumer"}),
        ("Drop producers", "Drop every producer's connection?", {"role": "producer"}),
        ("Drop all", "Drop every connection?", {}),
    ),
    "delay": (("Delay 0.5s", "Hold every write for 0.5 s?", {"seconds": "0.5"}),),
}
#: The proxy-wide buttons, one or more per wire kind: label, kind, confirmation,
#: parameters.
_BUTTONS: tuple[tuple[str, str, str, dict[str, str]], ...] = tuple(
    (label, kind, confirm, params)
    for kind in WIRE_KINDS
    for label, confirm, params in _VARIANTS.get(
        kind, ((KINDS[kind].label, f"{KINDS[kind].label}: {KINDS[kind].summary}?", {}),)
    )
)
#: The buttons of one relayed connection.
_PER_CONNECTION = (("Drop", "drop"), ("Stall", "stall"), ("Partition", "partition"))


def proxy_sections(states: Sequence[ProxyState]) -> dict[str, str]:
    """The page sections (by id) of the proxies, in order."""
    sections: dict[str, str] = {}
    for i, state in enumerate(states):
        sections[f"proxy-{i}"] = _proxy(i, state)
    if states:
        sections["proxy-cannot"] = _cannot()
    return sections


def _proxy(i: int, state: ProxyState) -> str:
    head = f'<h2>Fault proxy <span data-k="proxy">{e(state.address)}</span>'
    if not state.up:
        return (
            head + ' <span class="badge down">down</span></h2>'
            f'<p class="muted" data-k="proxy-error">not reachable: {e(state.error)}</p>'
        )
    head += (
        f' <span class="muted">clients at {e(state.tcp_address)} → nsqd {e(state.upstream)}'
        "</span></h2>"
    )
    buttons = "".join(
        button(
            label,
            f"fault/proxy-{kind}",
            f"{state.address}: {confirm}",
            danger=KINDS[kind].redelivers,
            proxy=i,
            **params,
        )
        for label, kind, confirm, params in _BUTTONS
    )
    return (
        head
        + f'<div class="controls" data-proxy="{i}">{buttons}</div>'
        + _connections(i, state)
        + _active(i, state)
    )


def proxy_forms(addresses: Sequence[str]) -> str:
    """A form per proxy for any wire fault with its parameters (a client, a role,
    a direction...): the page's footer, which is not re-rendered every second, so
    what is typed stays while the proxy's connections and faults change."""
    return "".join(
        f"<h2>Inject a fault through proxy {e(address)}</h2>{_form(i)}"
        for i, address in enumerate(addresses)
    )


def _form(i: int) -> str:
    # The form's own data-action is replaced by the chosen kind (the script
    # sends the form's fields over its data-* attributes).
    kinds = "".join(f'<option value="fault/proxy-{k}">{e(k)}</option>' for k in WIRE_KINDS)
    return (
        f'<form class="create" data-action="fault/proxy" data-proxy="{i}" '
        'data-confirm="Inject this fault?">'
        f'<select name="action">{kinds}</select>'
        '<input name="client" placeholder="client (host:port, client_id; any)">'
        '<select name="role"><option value="">any role</option>'
        "<option>consumer</option><option>producer</option></select>"
        '<select name="direction"><option value="">both ways</option>'
        "<option>in</option><option>out</option></select>"
        '<input name="seconds" placeholder="seconds (delay)" size="8">'
        "<button>Inject</button></form>"
    )


def _connections(i: int, state: ProxyState) -> str:
    rows = []
    for c in state.connections:
        peer = str(c.get("peer", ""))
        buttons = "".join(
            button(label, f"fault/proxy-{kind}", f"{label} {peer}?", proxy=i, client=peer)
            for label, kind in _PER_CONNECTION
        )
        opaque = "TLS/compressed: frame faults pass over it" if c.get("opaque") else ""
        rows.append(
            f'<tr data-client="{e(peer)}"><td>{e(peer)}</td><td>{e(c.get("client_id") or "")}</td>'
            f'<td>{e(c.get("hostname") or "")}</td><td data-k="role">{e(c.get("role", ""))}</td>'
            f'<td class="muted">{e(opaque)}</td><td class="controls">{buttons}</td></tr>'
        )
    cols = (Col("Client"), Col("client_id"), Col("Hostname"), Col("Role"), Col(""), Col("Fault"))
    return table(cols, rows, empty="no connections relayed now", title="Connections relayed")


def _active(i: int, state: ProxyState) -> str:
    rows = []
    for f in state.faults:
        where = ", ".join(
            f"{k} {f[k]}" for k in ("peer", "role", "direction", "seconds", "remaining") if k in f
        )
        heal = button(
            "Heal",
            "fault/proxy-heal",
            f"Heal fault #{f['id']} ({f['kind']})?",
            proxy=i,
            fault=f["id"],
        )
        rows.append(
            f'<tr data-fault="{e(f["id"])}"><td>#{e(f["id"])}</td><td>{e(f["kind"])}</td>'
            f"<td>{e(where)}</td><td>{heal}</td></tr>"
        )
    if not rows:
        return '<h3>Active faults</h3><p class="muted" data-k="proxy-faults">none</p>'
    heal_all = button(
        "Heal all", "fault/proxy-heal", "Heal every fault of this proxy?", proxy=i, fault="all"
    )
    return table(
        (Col("#"), Col("Kind"), Col("Where"), Col("")), rows, title="Active faults"
    ).replace("<th></th>", f"<th>{heal_all}</th>", 1)


def _cannot() -> str:
    greyed = "".join(
        f'<button type="button" disabled title="{e(label)} {e(INSIDE_REASON)}"'
        f' data-cannot="{e(kind)}">{e(label)}</button>'
        for label, kind in INSIDE_NSQD
    )
    return (
        "<h3>Not through a proxy</h3>"
        f'<div class="controls">{greyed}</div><p class="muted">Each {e(INSIDE_REASON)}.</p>'
    )
