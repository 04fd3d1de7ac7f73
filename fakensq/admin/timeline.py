"""The admin's timeline: faults and actions taken, and the effects seen.

Effects come from two places, so that none is lost to the timing of a poll:

- a fault that has a known effect reports it itself, from the counters read
  just before and just after it (``time out in-flight`` → "orders/billing: 2
  message(s) timed out"; ``kill`` → "nsqd ... is down"), and raises the marks the
  poller compares against, so the poller does not report it again;
- the poller (:meth:`Timeline.observe`, fed every ``watch_interval``) reports
  what changed since what the timeline last knew: nodes going down or up,
  nsqlookupd's registrations, topics and channels appearing, pausing, clients
  coming and going, and messages timing out on their own.

Every fault bumps :attr:`Timeline.epoch`; a snapshot carries the epoch at which
it started, and an observation older than what a fault has since set is
ignored (a poll that began before a kill must not report the node "up" after
the kill reported it down).  Counters are per node and only move forward, so a
late or failed read of one node never makes its counts look like new timeouts;
a node whose read merely timed out keeps its last known state.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .data import Snapshot

__all__ = ["Event", "Timeline", "TIMELINE_SIZE"]

#: Timeline entries kept.
TIMELINE_SIZE = 500


@dataclass(frozen=True)
class Event:
    """One timeline entry: a fault or action taken, or an effect observed."""

    at: float
    kind: str  # "fault", "action" or "effect"
    text: str


@dataclass
class _Node:
    up: bool
    error: str = ""
    health: str = ""
    start_time: int = 0
    stats: dict[str, Any] | None = None
    #: The epoch of the fault that last set this state (observations from
    #: snapshots started before it are stale).
    epoch: int = 0


@dataclass
class _Mark:
    """The timeouts of one channel on one node that the timeline has accounted for."""

    count: int
    epoch: int = 0


@dataclass
class _View:
    """Topics → (paused, channels → (paused, clients)), summed over the nodes."""

    topics: dict[str, tuple[bool, dict[str, tuple[bool, int]]]] = field(default_factory=dict)


class Timeline:
    """Events, newest last, and what the timeline believes about the cluster."""

    def __init__(self, size: int = TIMELINE_SIZE) -> None:
        self.events: deque[Event] = deque(maxlen=size)
        self.epoch = 0
        self._nodes: dict[str, _Node] = {}
        self._lookupds: dict[str, tuple[bool, int]] = {}
        self._lookupd_epochs: dict[str, int] = {}
        self._marks: dict[tuple[str, str, str], _Mark] = {}
        self._view: _View | None = None
        self._pending: list[Event] | None = None

    def record(self, kind: str, text: str) -> None:
        """Add an entry (an effect of a fault in progress waits for the fault's own)."""
        event = Event(time.time(), kind, text)
        if self._pending is not None and kind == "effect":
            self._pending.append(event)
        else:
            self.events.append(event)

    def texts(self) -> list[str]:
        return [e.text for e in self.events]

    # -- what faults tell it ------------------------------------------------------

    def begin_fault(self) -> int:
        """A fault is about to act: observations started before now are stale, and
        the effects it reports wait for :meth:`end_fault`."""
        self.epoch += 1
        self._pending = []
        return self.epoch

    def end_fault(self, text: str) -> None:
        """The fault is done: its entry, then the effects it reported."""
        pending, self._pending = self._pending or [], None
        self.record("fault", text)
        self.events.extend(pending)

    def lookupd_state(self, address: str, up: bool) -> None:
        """A fault made nsqlookupd ``address`` go up or down: report it now."""
        before = self._lookupds.get(address)
        if before is None or before[0] != up:
            self.record("effect", f"nsqlookupd {address} is {'up' if up else 'down'}")
        self._lookupds[address] = (up, 0)  # a restarted lookupd starts empty
        self._lookupd_epochs[address] = self.epoch

    def node_state(self, address: str, up: bool, error: str = "") -> None:
        """A fault made nsqd ``address`` go up or down: report it now."""
        node = self._nodes.get(address)
        if node is None or node.up != up:
            self.record("effect", _node_text(address, up, error))
        self._nodes[address] = _Node(up, error, epoch=self.epoch)
        # A node that stopped takes its counters with it.
        for key in [k for k in self._marks if k[0] == address]:
            del self._marks[key]

    def timeouts(self, counts: dict[tuple[str, str, str], tuple[int, int]]) -> None:
        """A fault timed messages out: ``(node, topic, channel) → (before, after)``
        timeout counts, read around the fault.  Reported now, per channel."""
        per_channel: dict[tuple[str, str], int] = {}
        for key, (before, after) in counts.items():
            mark = self._marks.get(key)
            self._marks[key] = _Mark(max(after, mark.count if mark else 0), self.epoch)
            if after > before:
                label = key[1:]
                per_channel[label] = per_channel.get(label, 0) + after - before
        for (topic, channel), n in sorted(per_channel.items()):
            self.record("effect", f"channel {topic}/{channel}: {n} message(s) timed out")

    # -- what the poller sees -------------------------------------------------------

    def observe(self, snap: Snapshot, epoch: int) -> None:
        """Record what changed, from ``snap`` (started at ``epoch``)."""
        timed_out: dict[tuple[str, str], int] = {}
        for n in snap.nodes:
            known = self._nodes.get(n.address)
            if known is not None and known.epoch > epoch:
                continue  # a fault has said more recent things about this node
            if not n.up and n.error == "timed out" and known is not None:
                continue  # slow, not gone: keep what we knew
            if known is None:
                if not n.up and n.source == "seen before":
                    continue
                self._nodes[n.address] = known = _Node(n.up, n.error, n.health, epoch=epoch)
                if not n.up:
                    self.record("effect", _node_text(n.address, False, n.error))
            elif known.up != n.up:
                self.record("effect", _node_text(n.address, n.up, n.error))
            elif n.up and known.health and n.health != known.health:
                self.record("effect", f"nsqd {n.address} health: {n.health}")
            start = int((n.stats or {}).get("start_time") or 0)
            restarted = n.up and known.start_time not in (0, start)
            if not n.up or restarted:
                for key in [k for k in self._marks if k[0] == n.address]:
                    del self._marks[key]
            known.up, known.error, known.health = n.up, n.error, n.health if n.up else ""
            known.start_time = start if n.up else 0
            known.stats = n.stats if n.up else None
            if n.up:
                self._count_timeouts(n.address, n.topics, epoch, timed_out)
        for (topic, channel), count in sorted(timed_out.items()):
            self.record("effect", f"channel {topic}/{channel}: {count} message(s) timed out")

        for lk in snap.lookupds:
            if self._lookupd_epochs.get(lk.address, 0) > epoch:
                continue
            before = self._lookupds.get(lk.address)
            now = (lk.up, len(lk.nodes))
            if before is not None:
                if before[0] != lk.up:
                    self.record("effect", f"nsqlookupd {lk.address} is {'up' if lk.up else 'down'}")
                elif lk.up and before[1] != now[1]:
                    self.record(
                        "effect", f"nsqlookupd {lk.address} lists {now[1]} nsqd (was {before[1]})"
                    )
            self._lookupds[lk.address] = now

        view = self._summarize(lk_topics for lk in snap.lookupds for lk_topics in lk.topics)
        if self._view is not None:
            for text in _view_changes(self._view, view):
                self.record("effect", text)
        self._view = view

    def _count_timeouts(
        self,
        address: str,
        topics: Iterable[dict[str, Any]],
        epoch: int,
        out: dict[tuple[str, str], int],
    ) -> None:
        for t in topics:
            for c in t.get("channels") or []:
                key = (address, str(t.get("topic_name")), str(c.get("channel_name")))
                count = int(c.get("timeout_count") or 0)
                mark = self._marks.get(key)
                if mark is None:
                    self._marks[key] = _Mark(count, epoch)
                elif count > mark.count:
                    out[key[1:]] = out.get(key[1:], 0) + count - mark.count
                    self._marks[key] = _Mark(count, epoch)
                elif count < mark.count and epoch >= mark.epoch:
                    self._marks[key] = _Mark(count, epoch)  # the counter went back: reset

    def _summarize(self, lookupd_topics: Iterable[str]) -> _View:
        view = _View()
        for node in self._nodes.values():
            if not node.up or node.stats is None:
                continue
            for t in node.stats.get("topics") or []:
                name = str(t.get("topic_name"))
                paused, channels = view.topics.get(name, (False, {}))
                for c in t.get("channels") or []:
                    cname = str(c.get("channel_name"))
                    cpaused, clients = channels.get(cname, (False, 0))
                    channels[cname] = (
                        cpaused or bool(c.get("paused")),
                        clients + int(c.get("client_count") or 0),
                    )
                view.topics[name] = (paused or bool(t.get("paused")), channels)
        for name in lookupd_topics:
            view.topics.setdefault(name, (False, {}))
        return view


def _node_text(address: str, up: bool, error: str) -> str:
    if up:
        return f"nsqd {address} is up"
    return f"nsqd {address} is down" + (f" ({error})" if error else "")


def _view_changes(old: _View, new: _View) -> list[str]:
    out: list[str] = []
    for name in sorted(new.topics.keys() - old.topics.keys()):
        out.append(f"topic {name} appeared")
    for name in sorted(old.topics.keys() - new.topics.keys()):
        out.append(f"topic {name} is gone")
    for name, (paused, channels) in sorted(new.topics.items()):
        if name not in old.topics:
            continue
        was_paused, old_channels = old.topics[name]
        if paused != was_paused:
            out.append(f"topic {name} {'paused' if paused else 'unpaused'}")
        for cname, (cpaused, clients) in sorted(channels.items()):
            label = f"channel {name}/{cname}"
            if cname not in old_channels:
                out.append(f"{label} appeared")
                continue
            was, old_clients = old_channels[cname]
            if cpaused != was:
                out.append(f"{label} {'paused' if cpaused else 'unpaused'}")
            if clients != old_clients:
                out.append(f"{label}: {clients} client(s) (was {old_clients})")
        for cname in sorted(old_channels.keys() - channels.keys()):
            out.append(f"channel {name}/{cname} is gone")
    return out
