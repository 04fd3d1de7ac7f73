"""What an nsqd keeps across a restart: topics, channels and their messages.

A real nsqd, stopping cleanly, writes its metadata (topics, channels, paused
flags) and flushes every message it holds (queued, in flight, deferred) to its
data path; at start it reads them back.  An :class:`fakensq.NSQD` with a
``data_path`` does the same (its ``run`` calls :func:`load_state` at start and
:func:`save_state` at a clean stop; :class:`fakensq.Cluster` relies on that).
Ephemeral topics and channels never touch disk.

nsqd also rewrites its metadata file, ``nsqd.dat``, each time a topic or
channel comes or goes and each time one is paused or unpaused over HTTP: a
killed nsqd comes back with its topics and channels (and registers them with
nsqlookupd again), only the messages it held in memory are lost.  fakensq
writes the same file, in nsqd's format (:func:`write_metadata`), and a node
started without a clean stop's state recreates what it lists.

Messages that overflowed to disk (:mod:`fakensq.diskqueue`) stay in their
segment files; the state file keeps their read/write positions.
"""

from __future__ import annotations

import base64
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trionsq.protocol.names import is_valid_channel_name, is_valid_topic_name

from .message import Message
from .options import VERSION

if TYPE_CHECKING:
    from .node import NSQD

log = logging.getLogger("fakensq.nsqd")

__all__ = [
    "STATE_FILE",
    "METADATA_FILE",
    "save_state",
    "load_state",
    "metadata",
    "write_metadata",
    "metadata_writer",
]

#: The file, under the data path, holding a stopped node's state.
STATE_FILE = "fakensq.dat"
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
    """Write ``nsqd.dat`` atomically (a temporary file renamed over it), as nsqd's
    PersistMetadata does."""
    path = Path(data_path) / METADATA_FILE
    tmp = path.with_name(f"{METADATA_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(metadata(nsqd), separators=(",", ":")))
    os.replace(tmp, path)


def metadata_writer(nsqd: NSQD, data_path: str) -> Callable[[object], None]:
    """A registry listener that rewrites ``nsqd.dat`` at every topic or channel
    creation and deletion (nsqd's Notify with persist)."""

    def on_change(_event: object) -> None:
        try:
            write_metadata(nsqd, data_path)
        except OSError as exc:
            log.error("failed to persist metadata - %s", exc)

    return on_change


def _encode(msg: Message) -> list[Any]:
    return [
        msg.id.decode("latin-1"),
        base64.b64encode(msg.body).decode(),
        msg.timestamp,
        msg.attempts,
    ]


def _decode(doc: list[Any]) -> Message:
    msg = Message(doc[0].encode("latin-1"), base64.b64decode(doc[1]), doc[2])
    msg.attempts = doc[3]
    return msg


def save_state(nsqd: NSQD, data_path: str) -> int:
    """Write every topic, channel and message of ``nsqd``; returns the message count.

    In-flight and deferred messages are saved as ready ones (nsqd flushes them to
    its backend too): after the restart they are delivered again.  Disk-backed
    queues are closed: call this once, when the node stops.
    """
    topics = []
    count = 0
    for tname in sorted(nsqd.topics):
        topic = nsqd.topics[tname]
        if topic.ephemeral:
            continue
        channels = []
        for cname in sorted(topic.channels):
            ch = topic.channels[cname]
            if ch.ephemeral:
                continue
            held = list(_iter_queue(ch.queue))
            held += sorted(ch.in_flight.values(), key=lambda m: m.seq)
            held += sorted(ch.deferred.values(), key=lambda m: m.seq)
            count += len(held) + _backend_depth(ch.queue)
            channels.append(
                {
                    "name": cname,
                    "paused": ch.paused,
                    "messages": [_encode(m) for m in held],
                    "backend": _close_backend(ch.queue),
                }
            )
        queued = list(_iter_queue(topic.queue))
        count += len(queued) + _backend_depth(topic.queue)
        topics.append(
            {
                "name": tname,
                "paused": topic.paused,
                "channels": channels,
                "messages": [_encode(m) for m in queued],
                "backend": _close_backend(topic.queue),
            }
        )
    path = Path(data_path) / STATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"version": 2, "topics": topics}))
    os.replace(tmp, path)  # atomic, as nsqd's metadata write
    return count


def load_state(nsqd: NSQD, data_path: str) -> int:
    """Recreate what :func:`save_state` wrote (then remove the file: its messages
    live in memory again, and a later kill must lose them), or, after a kill,
    the topics and channels ``nsqd.dat`` lists.  Returns the message count."""
    path = Path(data_path) / STATE_FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        _load_metadata(nsqd, data_path)
        return 0
    count = 0
    # Read by nsqd.new_queue: disk-backed queues resume from their segment files.
    nsqd.restored_backends = {}
    for tdoc in doc["topics"]:
        for cdoc in tdoc["channels"]:
            if cdoc.get("backend"):
                nsqd.restored_backends[(tdoc["name"], cdoc["name"])] = cdoc["backend"]
        if tdoc.get("backend"):
            nsqd.restored_backends[(tdoc["name"], None)] = tdoc["backend"]
    try:
        for tdoc in doc["topics"]:
            # Paused first, so that restoring channels does not drain the topic
            # before its own messages are back.
            topic = nsqd.get_topic(tdoc["name"])
            topic.paused = True
            for cdoc in tdoc["channels"]:
                ch = topic.get_channel(cdoc["name"])
                msgs = [_decode(m) for m in cdoc["messages"]]
                count += len(msgs) + _backend_depth(ch.queue)
                _put_front(ch.queue, msgs)
                if cdoc["paused"]:
                    ch.pause()
                ch.dispatch()
            msgs = [_decode(m) for m in tdoc["messages"]]
            count += len(msgs) + _backend_depth(topic.queue)
            _put_front(topic.queue, msgs)
            if tdoc["paused"]:
                topic.pause()
            else:
                topic.unpause()
    finally:
        nsqd.restored_backends = {}
    path.unlink()
    return count


def _load_metadata(nsqd: NSQD, data_path: str) -> None:
    """nsqd's LoadMetadata: topics and channels (empty), paused as they were."""
    try:
        doc = json.loads((Path(data_path) / METADATA_FILE).read_text())
    except FileNotFoundError:
        return
    except ValueError as exc:
        raise ValueError(f"failed to parse metadata - {exc}") from None
    for tdoc in doc.get("topics") or []:
        name = tdoc.get("name", "")
        if not is_valid_topic_name(name):
            log.warning("skipping creation of invalid topic %s", name)
            continue
        topic = nsqd.get_topic(name)
        for cdoc in tdoc.get("channels") or []:
            cname = cdoc.get("name", "")
            if not is_valid_channel_name(cname):
                log.warning("skipping creation of invalid channel %s", cname)
                continue
            channel = topic.get_channel(cname)
            if cdoc.get("paused"):
                channel.pause()
        if tdoc.get("paused"):
            topic.pause()


def _backend_depth(queue: Any) -> int:
    return int(getattr(queue, "backend_depth", 0))


def _close_backend(queue: Any) -> dict[str, Any] | None:
    close = getattr(queue, "close", None)
    return close() if close is not None else None


def _put_front(queue: Any, msgs: list[Message]) -> None:
    # Saved memory messages are older than what is on disk: before it.
    put_front = getattr(queue, "put_front", None)
    if put_front is not None:
        put_front(msgs)
    else:
        queue.put_many(msgs)


def _iter_queue(queue: Any) -> list[Message]:
    # MemoryQueue keeps a deque, a DiskBackedQueue its memory part (the disk part
    # stays in its files); any other queue with get/put is drained and refilled.
    memory = getattr(queue, "memory_messages", None)
    if memory is not None:
        return list(memory())
    items = getattr(queue, "_items", None)
    if items is not None:
        return list(items)
    drained: list[Message] = []
    while (msg := queue.get()) is not None:
        drained.append(msg)
    queue.put_many(drained)
    return drained
