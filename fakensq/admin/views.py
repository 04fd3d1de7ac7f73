"""Server-rendered HTML for the admin pages: the shell and the pieces pages share.

Each page is a shell around live *sections* (``<section id=... data-live>``).  The
sections are rendered by :mod:`.topicpages` and :mod:`.nodepages` only; the page's
script polls the admin server's JSON endpoint, which returns the same sections
freshly rendered, and swaps them in.  So numbers have one renderer, and a page
without JavaScript is still right when loaded.  Cells carry ``data-k`` (the /stats
field they show) and ``data-v`` (the exact number) so tests and users can find them;
tables are built from :class:`Col` definitions, so a heading and its cells align.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import Any
from urllib.parse import quote

__all__ = [
    "PAUSED",
    "QUEUE_COLS",
    "Col",
    "FaultCaps",
    "Page",
    "ago",
    "button",
    "channel_url",
    "clock",
    "e",
    "node_url",
    "num",
    "queue_cells",
    "render_page",
    "status_badge",
    "table",
    "td",
    "topic_url",
]


@dataclass(frozen=True)
class FaultCaps:
    """Which fault controls work here (no button is shown for one that does not)."""

    kill_restart: bool = False
    partition: bool = False
    stall_heartbeats: bool = False
    timeout_in_flight: bool = False
    #: fakensq proxies' buttons (the wire's faults, in front of a real nsqd)
    proxy: bool = False

    @property
    def cluster(self) -> bool:
        """Whether an in-process Cluster's controls are on."""
        return self.kill_restart or self.partition or self.stall_heartbeats

    @property
    def any(self) -> bool:
        return self.cluster or self.proxy


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


def num(value: int | float) -> str:
    if isinstance(value, float):
        return f"{value:,.1f}"
    return f"{value:,}"


def td(key: str, value: int | float) -> str:
    # data-v is the exact number (cells show it with thousands separators).
    return f'<td class="num" data-k="{key}" data-v="{value}">{num(value)}</td>'


@dataclass(frozen=True)
class Col:
    """A table column: its heading, and whether it holds numbers.

    Numbers are right-aligned, and so is their heading: a heading and its
    cells come from the same :class:`Col`, so they cannot drift apart."""

    label: str
    num: bool = False


#: A topic's or channel's queue on one node: what it holds (in all, on disk)
#: and what it took in; :func:`queue_cells` fills them.
QUEUE_COLS = (Col("Depth", num=True), Col("Disk depth", num=True), Col("Messages", num=True))


def queue_cells(doc: dict[str, Any]) -> str:
    """The :data:`QUEUE_COLS` cells of a topic's or channel's ``/stats`` document."""
    return "".join(
        td(key, int(doc.get(key, 0))) for key in ("depth", "backend_depth", "message_count")
    )


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


def button(
    label: str, action: str, confirm: str, *, danger: bool = False, **data: str | int
) -> str:
    # node_address -> data-node-address, which the script reads as dataset.nodeAddress.
    attrs = "".join(f' data-{k.replace("_", "-")}="{e(v)}"' for k, v in data.items())
    cls = "danger" if danger else ""
    return (
        f'<button type="button" class="{cls}" data-action="{e(action)}"'
        f' data-confirm="{e(confirm)}"{attrs}>{e(label)}</button>'
    )


def status_badge(up: bool, text: str = "") -> str:
    if up:
        return '<span class="badge ok" data-k="status">up</span>'
    title = f' title="{e(text)}"' if text else ""
    return f'<span class="badge down" data-k="status"{title}>down</span>'


def ago(ts: float) -> str:
    seconds = max(0, int(time.time() - ts))
    if seconds < 60:
        return f"{seconds}s ago"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s ago"
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m ago"


def clock(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts)) + f".{int(ts * 1000) % 1000:03d}"


def node_url(address: str) -> str:
    return "nodes/" + quote(address, safe=":[]")


PAUSED = '<span class="badge warn">paused</span>'


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
