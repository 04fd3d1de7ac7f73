"""Server-side messages, their ids, and the queue interface messages wait in.

A :class:`Message` is one copy of a published body as one topic or channel holds
it: each channel of a topic gets its own copy (same id, same timestamp), exactly
as nsqd's topic message pump makes one.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from trionsq.protocol.frames import message_frame_header

if TYPE_CHECKING:
    from .client import ClientConnection

__all__ = ["Message", "GUIDFactory", "MessageQueue", "MemoryQueue"]


class Message:
    """One message copy.  ``deferred`` is a DPUB delay in seconds (0 = none)."""

    __slots__ = (
        "attempts",
        "body",
        "client",
        "deadline",
        "deferred",
        "delivery_ts",
        "id",
        "seq",
        "timestamp",
    )

    def __init__(self, msg_id: bytes, body: bytes, timestamp: int | None = None) -> None:
        self.id = msg_id
        self.body = body
        self.timestamp = time.time_ns() if timestamp is None else timestamp
        self.attempts = 0
        self.deferred = 0.0
        # Set while in flight / deferred in a channel:
        self.client: ClientConnection | None = None
        self.delivery_ts = 0.0  # trio clock of the latest delivery
        self.deadline = 0.0  # trio clock: in-flight timeout, or deferred due time
        self.seq = 0  # identifies the current heap entry (stale entries are skipped)

    def copy(self) -> Message:
        """A copy for another channel (nsqd gives each channel its own)."""
        other = Message(self.id, self.body, self.timestamp)
        other.deferred = self.deferred
        return other

    def frame(self) -> bytes:
        """The message frame as sent to a consumer."""
        return (
            message_frame_header(self.timestamp, self.attempts, self.id, len(self.body)) + self.body
        )

    def __repr__(self) -> str:
        return f"Message(id={self.id!r}, attempts={self.attempts}, body={self.body[:32]!r})"


# nsqd's guid layout: milliseconds since its epoch, 10 bits of node id, 12 bits
# of sequence; hex encoded, 16 characters.
_TWEPOCH_MS = 1288834974657
_NODE_BITS = 10
_SEQ_BITS = 12
_SEQ_MASK = (1 << _SEQ_BITS) - 1
_U64 = 0xFFFFFFFFFFFFFFFF


class GUIDFactory:
    """Message ids as nsqd makes them: 16 lowercase hex characters.

    With a ``rng`` (a seeded run) ids do not depend on the clock: a random base
    drawn once, then a counter, so that runs repeat exactly.
    """

    def __init__(self, node_id: int, rng: random.Random | None = None) -> None:
        self.node_id = node_id % (1 << _NODE_BITS)
        self._last_ms = -1
        self._sequence = 0
        self._node_bits = self.node_id << _SEQ_BITS
        self._seeded_next: int | None = None
        if rng is not None:
            self._seeded_next = rng.getrandbits(40) << (_NODE_BITS + _SEQ_BITS)

    def new_id(self) -> bytes:
        if self._seeded_next is not None:
            value = self._seeded_next
            self._seeded_next += 1
            return b"%016x" % (value & 0xFFFFFFFFFFFFFFFF)
        now = time.time_ns() // 1_000_000 - _TWEPOCH_MS
        if now <= self._last_ms:
            # Same millisecond (or the clock stepped back): keep ids unique by
            # carrying on from the last one.
            self._sequence = (self._sequence + 1) & _SEQ_MASK
            if self._sequence == 0:
                self._last_ms += 1
            now = self._last_ms
        else:
            self._sequence = 0
            self._last_ms = now
        value = (now << (_NODE_BITS + _SEQ_BITS)) | self._node_bits | self._sequence
        return b"%016x" % (value & 0xFFFFFFFFFFFFFFFF)

    def new_ids(self, n: int) -> list[bytes]:
        """``n`` ids at once (an MPUB), in the order ``new_id`` would give them."""
        if self._seeded_next is not None or n < 8:
            return [self.new_id() for _ in range(n)]
        first = self.new_id()  # settles the millisecond and the sequence
        ms, seq = self._last_ms, self._sequence
        out = [first]
        base = self._node_bits
        shift = _NODE_BITS + _SEQ_BITS
        left = n - 1
        while left:
            # Until the sequence wraps, the next ids are the last one plus 1, 2...
            step = min(left, _SEQ_MASK - seq)
            if step:
                value = (ms << shift) | base | seq
                run = range(value + 1, value + step + 1)
                if value + step <= _U64:
                    out += [b"%016x" % v for v in run]
                else:
                    out += [b"%016x" % (v & _U64) for v in run]
                seq += step
                left -= step
            if left:  # the sequence wraps: the next millisecond
                seq = 0
                ms += 1
                out.append(b"%016x" % (((ms << shift) | base) & 0xFFFFFFFFFFFFFFFF))
                left -= 1
        self._last_ms, self._sequence = ms, seq
        return out


class MessageQueue(Protocol):
    """Where ready messages wait (a topic's, or a channel's, "memory + backend").

    The in-memory :class:`MemoryQueue` is the only one so far; a disk backend
    (nsqd's diskqueue, mem-queue-size overflow) would implement the same.
    """

    def put(self, msg: Message) -> None: ...

    def put_many(self, msgs: Iterable[Message]) -> None: ...

    def get(self) -> Message | None:
        """The oldest message, or None when empty."""

    def get_many(self, n: int) -> list[Message]:
        """Up to ``n`` of the oldest messages."""

    def clear(self) -> None:
        """Drop every message (``/topic/empty``, ``/channel/empty``)."""

    def delete(self) -> None:
        """Drop every message for good: the topic or channel is deleted."""

    def __len__(self) -> int: ...


class MemoryQueue:
    """FIFO in memory: O(1) put and get."""

    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: deque[Message] = deque()

    def put(self, msg: Message) -> None:
        self._items.append(msg)

    def put_many(self, msgs: Iterable[Message]) -> None:
        self._items.extend(msgs)

    def get(self) -> Message | None:
        return self._items.popleft() if self._items else None

    def get_many(self, n: int) -> list[Message]:
        items = self._items
        if n >= len(items):
            out = list(items)
            items.clear()
            return out
        popleft = items.popleft
        return [popleft() for _ in range(n)]

    def clear(self) -> None:
        self._items.clear()

    def delete(self) -> None:
        self._items.clear()

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)
