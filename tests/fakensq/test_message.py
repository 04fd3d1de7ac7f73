"""Message ids and the in-memory queue."""

from __future__ import annotations

import random

from fakensq.nsqd.message import GUIDFactory, MemoryQueue, Message


def test_ids_are_hex_unique_and_increasing() -> None:
    guids = GUIDFactory(node_id=5)
    ids = [guids.new_id() for _ in range(5000)] + guids.new_ids(10000) + [guids.new_id()]
    assert all(len(i) == 16 and int(i, 16) >= 0 for i in ids)
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    assert all((int(i, 16) >> 12) & 0x3FF == 5 for i in ids)


def test_seeded_ids_repeat() -> None:
    a = GUIDFactory(1, random.Random(3))
    b = GUIDFactory(1, random.Random(3))
    assert a.new_ids(20) == b.new_ids(20)


def test_memory_queue() -> None:
    q = MemoryQueue()
    msgs = [Message(b"%016d" % i, b"x") for i in range(5)]
    q.put_many(msgs)
    assert q.get() is msgs[0]
    assert q.get_many(2) == msgs[1:3]
    assert q.get_many(10) == msgs[3:]
    assert q.get() is None and len(q) == 0
