"""What an nsqd keeps across a clean restart: topics, channels and their messages.

A real nsqd, stopping cleanly, writes its metadata (topics, channels, paused
flags) and flushes every message it holds (queued, in flight, deferred) to its
data path; at start it reads them back.  fakensq keeps messages in memory only,
so :class:`fakensq.Cluster` does the same through :func:`save_state` (at a clean
stop) and :func:`load_state` (at start).  A killed node saves nothing: what it
held in memory is lost, as with a crashed nsqd's memory queues.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .message import Message

if TYPE_CHECKING:
    from .nsqd import NSQD

__all__ = ["STATE_FILE", "save_state", "load_state"]

#: The file, under the data path, holding a stopped node's state.
STATE_FILE = "fakensq.dat"


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
    its backend too): after the restart they are delivered again.
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
            count += len(held)
            channels.append(
                {"name": cname, "paused": ch.paused, "messages": [_encode(m) for m in held]}
            )
        queued = list(_iter_queue(topic.queue))
        count += len(queued)
        topics.append(
            {
                "name": tname,
                "paused": topic.paused,
                "channels": channels,
                "messages": [_encode(m) for m in queued],
            }
        )
    path = Path(data_path) / STATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"version": 1, "topics": topics}))
    os.replace(tmp, path)  # atomic, as nsqd's metadata write
    return count


def load_state(nsqd: NSQD, data_path: str) -> int:
    """Recreate what :func:`save_state` wrote (then remove the file: its messages
    live in memory again, and a later kill must lose them).  Returns the count."""
    path = Path(data_path) / STATE_FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return 0
    count = 0
    for tdoc in doc["topics"]:
        topic = nsqd.get_topic(tdoc["name"])
        for cdoc in tdoc["channels"]:
            ch = topic.get_channel(cdoc["name"])
            msgs = [_decode(m) for m in cdoc["messages"]]
            count += len(msgs)
            ch.queue.put_many(msgs)
            if cdoc["paused"]:
                ch.pause()
            ch.dispatch()
        msgs = [_decode(m) for m in tdoc["messages"]]
        count += len(msgs)
        topic.queue.put_many(msgs)
        if tdoc["paused"]:
            topic.pause()
    path.unlink()
    return count


def _iter_queue(queue: Any) -> list[Message]:
    # MemoryQueue keeps a deque; any queue with get/put works (drained and refilled).
    items = getattr(queue, "_items", None)
    if items is not None:
        return list(items)
    drained: list[Message] = []
    while (msg := queue.get()) is not None:
        drained.append(msg)
    queue.put_many(drained)
    return drained
