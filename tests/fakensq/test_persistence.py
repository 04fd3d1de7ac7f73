"""An NSQD with a data path keeps its state across a clean restart, and queues
beyond mem-queue-size on disk (fakensq.nsqd.persist, fakensq.nsqd.diskqueue)."""

from __future__ import annotations

import tempfile
from collections import deque
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

import fakensq
from fakensq.nsqd.diskqueue import DiskBackedQueue
from fakensq.nsqd.message import Message, MessageQueue
from trionsq.protocol import commands as cmds

from ..support.waiting import wait_until
from .helpers import RawClient


def drain(queue: MessageQueue) -> list[bytes]:
    return [m.body for m in queue.get_many(1_000_000)]


def segments(data_path: Path) -> list[Path]:
    """Channel t:ch's diskqueue files (a sync helper: a few small calls)."""
    return sorted(data_path.glob("t:ch.diskqueue.[0-9]*.dat"))


def node(data_path: Path, **options: Any) -> fakensq.NSQD:
    return fakensq.NSQD(
        tcp_address="127.0.0.1:0", http_address="", data_path=str(data_path), **options
    )


async def test_clean_stop_keeps_queued_in_flight_deferred_and_metadata(tmp_path: Path) -> None:
    async with node(tmp_path) as nsqd:
        with trio.fail_after(5):
            consumer = await RawClient.connect(nsqd.tcp_address)
            await consumer.identify()
            await consumer.sub("t", "ch", rdy=2)
            producer = await RawClient.connect(nsqd.tcp_address)
            for body in (b"a", b"b", b"c", b"d"):
                await producer.pub("t", body)
            await producer.send(cmds.dpub("t", 3_600_000, b"later"))
            assert await producer.read_response() == b"OK"
            in_flight = {(await consumer.read_message()).body for _ in range(2)}
            assert in_flight == {b"a", b"b"}
        topic = nsqd.get_topic("t")
        topic.get_channel("paused").pause()
        topic.get_channel("gone#ephemeral")
        nsqd.get_topic("waiting").put(nsqd.get_topic("waiting").new_message(b"w"))
        nsqd.get_topic("eph#ephemeral").put(nsqd.get_topic("eph#ephemeral").new_message(b"x"))
        nsqd.get_topic("paused-topic").pause()
        await consumer.aclose()
        await producer.aclose()

    async with node(tmp_path) as nsqd:
        assert sorted(nsqd.topics) == ["paused-topic", "t", "waiting"]
        topic = nsqd.topics["t"]
        assert sorted(topic.channels) == ["ch", "paused"]
        assert topic.channels["paused"].paused and nsqd.topics["paused-topic"].paused
        # In flight and deferred come back queued (nsqd flushes them to its backend).
        assert sorted(drain(topic.channels["ch"].queue)) == [b"a", b"b", b"c", b"d", b"later"]
        assert topic.channels["paused"].depth() == 0  # created after the publishes
        assert drain(nsqd.topics["waiting"].queue) == [b"w"]
    # Restored and consumed: nothing comes back a second time.
    async with node(tmp_path) as nsqd:
        assert nsqd.topics["waiting"].depth() == 0


async def test_cancelled_run_saves_and_kill_keeps_only_metadata(tmp_path: Path) -> None:
    async with trio.open_nursery() as inner:
        nsqd = node(tmp_path)
        await inner.start(nsqd.run)
        nsqd.get_topic("t").put(nsqd.get_topic("t").new_message(b"kept"))
        inner.cancel_scope.cancel()
    async with node(tmp_path) as again:
        assert drain(again.topics["t"].queue) == [b"kept"]
        again.get_topic("t").put(again.get_topic("t").new_message(b"lost"))
        again.get_topic("t").get_channel("c")
        again.persist_on_stop = False  # as Cluster.kill_nsqd: a killed nsqd
    async with node(tmp_path) as last:
        # nsqd.dat kept the topics and channels (as a killed nsqd's does), not
        # the messages held in memory.
        assert sorted(last.topics) == ["t"] and sorted(last.topics["t"].channels) == ["c"]
        assert last.topics["t"].depth() == 0


async def test_overflow_to_disk_in_order_with_stats(tmp_path: Path) -> None:
    async with node(tmp_path, mem_queue_size=3) as nsqd:
        channel = nsqd.get_topic("t").get_channel("ch")
        for i in range(10):
            nsqd.topics["t"].put(nsqd.topics["t"].new_message(b"%d" % i))
        stats = nsqd.stats()["topics"][0]["channels"][0]
        assert (stats["depth"], stats["backend_depth"]) == (10, 7)
        assert isinstance(channel.queue, DiskBackedQueue)
        assert channel.queue.segment(0).exists()
        assert drain(channel.queue) == [b"%d" % i for i in range(10)]
        assert not channel.queue and channel.depth() == 0
        # (As go-diskqueue: a file goes once read and written past, not sooner.)
        assert channel.queue.segment(0).exists()


async def test_topic_overflow_drains_to_a_new_channel(tmp_path: Path) -> None:
    async with node(tmp_path, mem_queue_size=2) as nsqd:
        topic = nsqd.get_topic("t")
        for i in range(5):
            topic.put(topic.new_message(b"%d" % i))
        stats = nsqd.stats()["topics"][0]
        assert (stats["depth"], stats["backend_depth"]) == (5, 3)
        channel = topic.get_channel("ch")
        assert topic.depth() == 0
        assert drain(channel.queue) == [b"0", b"1", b"2", b"3", b"4"]


async def test_mem_queue_size_zero_and_file_rolling(tmp_path: Path) -> None:
    async with node(tmp_path, mem_queue_size=0, max_bytes_per_file=100) as nsqd:
        channel = nsqd.get_topic("t").get_channel("ch")
        bodies = [b"x" * 40 + b"%d" % i for i in range(6)]
        for body in bodies:
            nsqd.topics["t"].put(nsqd.topics["t"].new_message(body))
        assert channel.depth() == 6
        assert nsqd.stats()["topics"][0]["channels"][0]["backend_depth"] == 6
        files = segments(tmp_path)
        assert len(files) == 3  # 70-byte records, rolled at 100 bytes
        msg = channel.queue.get()
        assert msg is not None and msg.body == bodies[0]
        assert drain(channel.queue) == bodies[1:]


async def test_a_clean_restart_keeps_everything_on_disk_in_nsqds_order(tmp_path: Path) -> None:
    async with node(tmp_path, mem_queue_size=2, max_bytes_per_file=64) as nsqd:
        channel = nsqd.get_topic("t").get_channel("ch")
        for i in range(8):
            nsqd.topics["t"].put(nsqd.topics["t"].new_message(b"%d" % i))
        assert channel.queue.get() is not None  # 0 taken: memory then disk
    async with node(tmp_path, mem_queue_size=2, max_bytes_per_file=64) as nsqd:
        channel = nsqd.topics["t"].channels["ch"]
        # nsqd's flush wrote the memory part (1) after the disk part (2-7):
        # all of it is on disk now, and read in that order.
        stats = nsqd.stats()["topics"][0]["channels"][0]
        assert (stats["depth"], stats["backend_depth"]) == (7, 7)
        assert drain(channel.queue) == [b"%d" % i for i in (2, 3, 4, 5, 6, 7, 1)]


async def test_a_queue_killed_before_its_first_sync_comes_back_empty(tmp_path: Path) -> None:
    # Killed before its disk queue's first sync (no --sync-every reached, no
    # --sync-timeout tick): as nsqd, what it wrote is lost: with no meta file
    # the queue starts at the beginning of its first file, and writes over it
    # (go-diskqueue removes no file it has no record of).
    async with node(tmp_path, mem_queue_size=0, sync_timeout=3600.0) as nsqd:
        nsqd.get_topic("t").get_channel("ch")
        nsqd.topics["t"].put(nsqd.topics["t"].new_message(b"lost, and longer"))
        nsqd.persist_on_stop = False
    assert segments(tmp_path)
    async with node(tmp_path, mem_queue_size=0) as nsqd:
        channel = nsqd.get_topic("t").get_channel("ch")
        assert channel.depth() == 0
        nsqd.topics["t"].put(nsqd.topics["t"].new_message(b"new"))
        assert drain(channel.queue) == [b"new"]


async def test_consumer_gets_overflowed_messages(tmp_path: Path) -> None:
    async with node(tmp_path, mem_queue_size=1) as nsqd:
        with trio.fail_after(5):
            producer = await RawClient.connect(nsqd.tcp_address)
            await producer.send(cmds.mpub("t", [b"%d" % i for i in range(20)]))
            assert await producer.read_response() == b"OK"
            consumer = await RawClient.connect(nsqd.tcp_address)
            await consumer.identify()
            await consumer.sub("t", "ch", rdy=5)
            got = []
            for _ in range(20):
                msg = await consumer.read_message()
                got.append(msg.body)
                await consumer.send(cmds.fin(msg.id))
            assert got == [b"%d" % i for i in range(20)]
            await wait_until(lambda: nsqd.topics["t"].channels["ch"].depth() == 0)
            await consumer.aclose()
            await producer.aclose()


def test_disk_queue_encoding_is_nsqds() -> None:
    from fakensq.nsqd.diskqueue import decode_message, encode_message

    msg = Message(b"0123456789abcdef", b"body", 1_700_000_000_000_000_000)
    msg.attempts = 3
    data = encode_message(msg)
    assert data[:8] == (1_700_000_000_000_000_000).to_bytes(8, "big")
    assert data[8:10] == b"\x00\x03" and data[10:26] == b"0123456789abcdef"
    back = decode_message(data)
    assert (back.id, back.body, back.timestamp, back.attempts) == (
        msg.id,
        msg.body,
        msg.timestamp,
        3,
    )


async def test_deleting_a_channel_or_topic_removes_its_disk_queue(tmp_path: Path) -> None:
    async with node(tmp_path, mem_queue_size=0) as nsqd:
        topic = nsqd.get_topic("t")
        topic.get_channel("ch")
        topic.put(topic.new_message(b"x"))
        assert segments(tmp_path)
        topic.delete_channel("ch")
        assert not segments(tmp_path)
        topic.put(topic.new_message(b"y"))  # no channel: the topic's own disk queue
        assert topic_segments(tmp_path)
        nsqd.delete_topic("t")
        assert not topic_segments(tmp_path)


def topic_segments(data_path: Path) -> list[Path]:
    return sorted(data_path.glob("t.diskqueue.[0-9]*.dat"))


async def test_a_crash_keeps_only_metadata(tmp_path: Path) -> None:
    class Boom(Exception):
        pass

    async def crash() -> None:
        raise Boom

    nsqd = node(tmp_path)
    with pytest.raises(BaseExceptionGroup) as info:
        async with trio.open_nursery() as nursery:
            await nursery.start(nsqd.run)
            nsqd.get_topic("t").put(nsqd.get_topic("t").new_message(b"x"))
            assert nsqd._nursery is not None
            nsqd._nursery.start_soon(crash)
    assert info.group_contains(Boom)
    async with node(tmp_path) as again:
        # The topic, from nsqd.dat; not its message.
        assert sorted(again.topics) == ["t"] and again.topics["t"].depth() == 0


@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["put", "get", "get_many", "reopen"]), st.integers(0, 6)),
        max_size=40,
    ),
    mem_size=st.integers(0, 4),
    max_bytes=st.sampled_from([1, 60, 200, 10_000]),
)
def test_disk_queue_is_a_fifo(ops: list[tuple[str, int]], mem_size: int, max_bytes: int) -> None:
    """Any interleaving: a plain FIFO, oldest first, memory and disk alike;
    across a clean close and reopen (a restart), in nsqd's order."""
    with tempfile.TemporaryDirectory() as directory:

        def make() -> DiskBackedQueue:
            return DiskBackedQueue(directory, "q", mem_size=mem_size, max_bytes_per_file=max_bytes)

        queue = make()
        model: deque[bytes] = deque()
        n = 0
        for op, k in ops:
            if op == "put":
                msgs = [Message(b"%016d" % (n + i), b"m%d" % (n + i)) for i in range(k)]
                n += k
                queue.put_many(msgs)
                model.extend(m.body for m in msgs)
            elif op == "get":
                msg = queue.get()
                assert (msg.body if msg else None) == (model.popleft() if model else None)
            elif op == "get_many":
                got = [m.body for m in queue.get_many(k)]
                assert got == [model.popleft() for _ in range(min(k, len(model)))]
            else:
                # A clean stop and start: nsqd's flush writes the memory part
                # after what is on disk, so that is the order from then on.
                memory = [m.body for m in queue.memory_messages()]
                on_disk = [b for b in model if b not in set(memory)]
                queue.flush()
                queue.close()
                queue = make()
                model = deque(on_disk + memory)
            assert len(queue) == len(model)
        assert [m.body for m in queue.get_many(1000)] == list(model)
