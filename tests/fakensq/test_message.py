"""Message ids and the in-memory queue."""

from __future__ import annotations

import random

import pytest

from fakensq.nsqd import message
from fakensq.nsqd.message import GUIDFactory, MemoryQueue, Message


def test_ids_are_hex_unique_and_increasing() -> None:
    guids = GUIDFactory(node_id=5)
    ids = [guids.new_id() for _ in range(5000)] + guids.new_ids(10000) + [guids.new_id()]
    assert all(len(i) == 16 and int(i, 16) >= 0 for i in ids)
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    assert all((int(i, 16) >> 12) & 0x3FF == 5 for i in ids)


@pytest.mark.parametrize("n", [8, 100, 5000, 9000])
@pytest.mark.parametrize("seq", [0, 1, 4092, 4095])
@pytest.mark.parametrize("ms", [5, 1 << 41, (1 << 42) - 1])
def test_a_batch_of_ids_is_new_id_one_by_one(
    monkeypatch: pytest.MonkeyPatch, n: int, seq: int, ms: int
) -> None:
    """new_ids (an MPUB's) computes runs of ids at once: the same ids as
    new_id would give, across sequence wraps and 64-bit overflow."""
    batch, single = GUIDFactory(node_id=7), GUIDFactory(node_id=7)
    for guids in (batch, single):
        guids._last_ms, guids._sequence = ms, seq
    # The clock stands still: every id is made in the same millisecond.
    monkeypatch.setattr(message.time, "time_ns", lambda: (ms + message._TWEPOCH_MS) * 1_000_000)
    assert batch.new_ids(n) == [single.new_id() for _ in range(n)]
    assert (batch._last_ms, batch._sequence) == (single._last_ms, single._sequence)


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
