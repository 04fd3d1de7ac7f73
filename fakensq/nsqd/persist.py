"""What an nsqd keeps across a restart: topics, channels and their messages.

All of it lives where nsqd keeps it, in the same files:

- ``nsqd.dat``, nsqd's metadata: the non-ephemeral topics and channels with
  their paused flags (:func:`write_metadata`, nsqd's JSON layout).  It is
  rewritten each time a topic or channel comes or goes, each time one is
  paused or unpaused over HTTP, and at a clean stop; at start the node
  recreates what it lists (:func:`load_state`), so a killed node comes back
  with its topics and channels (and registers them with nsqlookupd again);
- each topic's and channel's disk queue (:mod:`fakensq.nsqd.diskqueue`): its
  messages beyond mem-queue-size, and, after a clean stop, all of them: nsqd's
  Exit writes every message it holds (queued in memory, in flight, deferred)
  after what is on disk, and syncs (:func:`save_state`).  Restarted, the node
  reads them from disk, and a kill after that loses none of them (they are
  on disk, not in memory, as in nsqd).

Ephemeral topics and channels never touch disk (a channel goes by its own
name: a non-ephemeral channel of an ephemeral topic has a disk queue, whose
files outlive the topic, as nsqd's do).  Files are written as nsqd
writes them: mode 0600 (message bodies are nobody else's), to a temporary
file fsynced before it is renamed over the old one.

One race of nsqd's is settled one way: nsqd rewrites ``nsqd.dat`` after a
deletion in a goroutine that may still see the deleted topic or channel (a
kill soon after then brings it back, empty) or not; fakensq writes the file
without it, one of the outcomes nsqd has.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trionsq.protocol.names import is_valid_channel_name, is_valid_topic_name

from .diskqueue import DiskBackedQueue, write_synced
from .options import VERSION

if TYPE_CHECKING:
    from .message import Message, MessageQueue
    from .node import NSQD

log = logging.getLogger("fakensq.nsqd")

__all__ = [
    "METADATA_FILE",
    "save_state",
    "load_state",
    "metadata",
    "write_metadata",
    "metadata_writer",
]

#: nsqd's metadata file (topics, channels, paused flags), kept up to date.
METADATA_FILE = "nsqd.dat"


def metadata(nsqd: NSQD) -> dict[str, Any]:
    """nsqd's metadata document: its non-ephemeral topics and channels, with
    their paused flags, in nsqd's JSON layout."""
    topics = []
    for topic in nsqd.topics.values():
        if topic.ephemeral:
            continue
        channels = [
            {"name": ch.name, "paused": ch.paused}
            for ch in topic.channels.values()
            if not ch.ephemeral
        ]
        topics.append({"channels": channels, "name": topic.name, "paused": topic.paused})
    return {"topics": topics, "version": VERSION}


def write_metadata(nsqd: NSQD, data_path: str) -> None:
    """Write ``nsqd.dat`` durably (mode 0600, fsynced, renamed over the old
    one), as nsqd's PersistMetadata does."""
    text = json.dumps(metadata(nsqd), separators=(",", ":"))
    write_synced(Path(data_path) / METADATA_FILE, text.encode())


def metadata_writer(nsqd: NSQD, data_path: str) -> Callable[[object], None]:
    """A registry listener that rewrites ``nsqd.dat`` at every topic or channel
    creation and deletion (nsqd's Notify with persist)."""

    def on_change(_event: object) -> None:
        try:
            write_metadata(nsqd, data_path)
        except OSError as exc:
            log.error("failed to persist metadata - %s", exc)

    return on_change


def save_state(nsqd: NSQD, data_path: str) -> int:
    """A clean stop (nsqd's Exit): ``nsqd.dat`` written, then every message of
    every non-ephemeral channel (queued, in flight, deferred: they come back
    ready) and topic written to its disk queue, which is synced and closed.
    Returns how many messages the disk queues hold."""
    write_metadata(nsqd, data_path)
    count = 0
    for topic in nsqd.topics.values():
        # (An ephemeral topic's non-ephemeral channels have disk queues too,
        # and nsqd closes every topic: their files stay, unlisted in nsqd.dat;
        # the same channel made again later reads them.)
        for ch in topic.channels.values():
            held = sorted(ch.in_flight.values(), key=lambda m: m.seq)
            held += sorted(ch.deferred.values(), key=lambda m: m.seq)
            count += _flush(ch.queue, held)
        count += _flush(topic.queue, [])
    return count


def _flush(queue: MessageQueue, extra: list[Message]) -> int:
    if not isinstance(queue, DiskBackedQueue):
        return 0  # (memory only: nothing of it is kept)
    queue.flush(extra)
    queue.close()
    return len(queue)


def _valid_name(doc: dict[str, Any], kind: str, is_valid: Callable[[str], bool]) -> str | None:
    """The name of a topic or channel ``nsqd.dat`` lists, None (logged as
    nsqd logs it) if nsqd would not create it."""
    name = doc.get("name", "")
    if is_valid(name):
        return str(name)
    log.warning("skipping creation of invalid %s %s", kind, name)
    return None


def load_state(nsqd: NSQD, data_path: str) -> int:
    """nsqd's LoadMetadata: the topics and channels ``nsqd.dat`` lists, paused
    as they were, each with its disk queue as last synced; a topic hands its
    messages to its channels only once they all exist (nsqd starts its topics
    after loading).  Returns how many messages came back."""
    try:
        doc = json.loads((Path(data_path) / METADATA_FILE).read_text())
    except FileNotFoundError:
        return 0
    except ValueError as exc:
        raise ValueError(f"failed to parse metadata - {exc}") from None
    count = 0
    for tdoc in doc.get("topics") or []:
        name = _valid_name(tdoc, "topic", is_valid_topic_name)
        if name is None:
            continue
        topic = nsqd.get_topic(name)
        topic.started = False
        if tdoc.get("paused"):
            topic.pause()
        for cdoc in tdoc.get("channels") or []:
            cname = _valid_name(cdoc, "channel", is_valid_channel_name)
            if cname is not None:
                channel = topic.get_channel(cname)
                if cdoc.get("paused"):
                    channel.pause()
                count += channel.depth()
        count += topic.depth()
        topic.start()
    return count
