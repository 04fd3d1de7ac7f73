"""What an nsqd keeps, case by case: fakensq's nsqd and nsqd v1.3.0 side by
side (``durable.Run``), each case one finding of ``test_durability``'s
stateful test or of issue 26, with fakensq's outcome stated (so that the
case fails on a fakensq that loses the data, with or without the real
binary) and compared with the real nsqd's where there is one."""

from __future__ import annotations

import os
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

import fakensq
from fakensq.nsqd.persist import METADATA_FILE

from .. import reference
from .conftest import Conformance, _diff
from .durable import SENTINEL, Run


@asynccontextmanager
async def side_by_side(tmp_path: Path, *flags: str) -> AsyncIterator[Run]:
    async with trio.open_nursery() as nursery:
        run = Run(nursery, tmp_path, list(flags), reference.binary("nsqd") is not None)
        try:
            await run.start()
            yield run
        finally:
            with trio.CancelScope(shield=True):
                await run.close()
        nursery.cancel_scope.cancel()


async def held(run: Run, fake_expected: Any) -> None:
    """fakensq holds ``fake_expected`` (``durable.view``, without the sentinel
    topic), and the real nsqd, if there is one, the same."""
    views = [[t for t in v if t[0] != SENTINEL] for v in await run.settle()]
    assert views[0] == fake_expected, _diff(views[0], fake_expected, "expected")
    if len(views) > 1:
        assert views[1] == views[0], "fakensq and the real nsqd differ:\n" + _diff(*views)


async def post(run: Run, path: str) -> None:
    for status, text in await run.each(lambda d: d.post(run.http, path)):
        assert status == 200, f"{path}: {status} {text}"


def skip_without_real(run: Run, conformance: Conformance) -> None:
    if run.real is None:
        # (kept for -rs: pytest-trio loses a skip's reason, the fixture has it)
        conformance.skip_reason = f"fakensq ran it; no real nsqd: {reference.skip_reason()}"
        pytest.skip(conformance.skip_reason)


def bodies(a: int, b: int) -> list[bytes]:
    return [b"m%d" % i for i in range(a, b)]


async def publish(run: Run, topic: str, msgs: list[bytes], how: str = "mpub") -> None:
    await run.publish(topic, msgs, how)


async def test_what_a_restart_loaded_survives_the_next_kill(
    tmp_path: Path, conformance: Conformance
) -> None:
    # Issue 26: 30,000 messages (10,000 in memory), a clean stop, a start, a
    # kill: nsqd had 30,000 again, fakensq 20,000 (it kept what it loaded
    # in memory).  nsqd's clean stop writes its memory to disk, and a start
    # reads it from there: a kill then loses none of it.  (Scaled down.)
    async with side_by_side(tmp_path, "--mem-queue-size=100") as run:
        for i in range(3):
            await publish(run, "t", bodies(i * 100, i * 100 + 100))
        await held(run, [("t", False, 300, 200, [])])
        await run.stop(kill=False)
        await held(run, [("t", False, 300, 300, [])])
        await run.stop(kill=True)
        await held(run, [("t", False, 300, 300, [])])
        await post(run, "/channel/create?topic=t&channel=c")
        got = await run.drain("t", "c", 300)
        assert got[0] == sorted(bodies(0, 300)) and got[-1] == got[0]
        skip_without_real(run, conformance)


async def test_names_that_contain_another_queues_name(
    tmp_path: Path, conformance: Conformance
) -> None:
    # Issue 26: topic foo.diskqueue.1 with 5 messages on disk, then topic foo
    # made, a restart: fakensq had deleted the other topic's files (its
    # pattern foo.diskqueue.*.dat matched them), and emptying or deleting
    # foo did the same.  nsqd removes files by their exact names.
    async with side_by_side(tmp_path, "--mem-queue-size=0", "--sync-every=1") as run:
        await publish(run, "foo.diskqueue.1", bodies(0, 5))
        await post(run, "/topic/create?topic=foo")
        await publish(run, "foo", bodies(5, 6))
        await post(run, "/topic/empty?topic=foo")
        await post(run, "/topic/delete?topic=foo")
        await held(run, [("foo.diskqueue.1", False, 5, 5, [])])
        # The same for channels: t:c's files are a prefix of t:c.diskqueue.1's.
        await post(run, "/channel/create?topic=foo.diskqueue.1&channel=c.diskqueue.1")
        for path in ("create", "empty", "delete"):
            await post(run, f"/channel/{path}?topic=foo.diskqueue.1&channel=c")
        kept = [("foo.diskqueue.1", False, 0, 0, [("c.diskqueue.1", False, 5, 5, 0, 0)])]
        await held(run, kept)
        await run.stop(kill=False)
        await held(run, kept)
        await run.stop(kill=True)
        await held(run, kept)
        got = await run.drain("foo.diskqueue.1", "c.diskqueue.1", 5)
        assert got[0] == bodies(0, 5) and got[-1] == got[0]
        skip_without_real(run, conformance)


def files(folder: Path) -> list[tuple[str, str]]:
    """The names and modes of the files in a data path (not the real nsqd's log)."""
    return sorted(
        (p.name, oct(stat.S_IMODE(p.stat().st_mode)))
        for p in folder.iterdir()
        if not p.name.endswith(".log")
    )


async def test_files_are_the_owners_alone_and_named_as_nsqds(
    tmp_path: Path, conformance: Conformance
) -> None:
    # Issue 26: fakensq's files were 0644 (every body readable by any local
    # user); nsqd makes nsqd.dat, its data files and meta files 0600.  The
    # names are compared too: after an empty, go-diskqueue goes on in the
    # next file number.
    async with side_by_side(tmp_path, "--mem-queue-size=1", "--sync-every=1") as run:
        await publish(run, "t", bodies(0, 3))
        await post(run, "/topic/empty?topic=t")
        await publish(run, "t", bodies(3, 6))
        await post(run, "/channel/create?topic=t&channel=c")
        await publish(run, "t", bodies(6, 9))
        await run.stop(kill=False)
        await held(run, [("t", False, 0, 0, [("c", False, 6, 6, 0, 0)])])
        fake = files(run.fake.data)
        assert {mode for _, mode in fake} == {"0o600"}, fake
        assert ("t.diskqueue.000001.dat", "0o600") in fake, fake
        if run.real is not None:
            real = files(run.real.data)
            assert fake == real, "fakensq and the real nsqd differ:\n" + _diff(fake, real)
        skip_without_real(run, conformance)


async def test_files_are_synced_before_they_are_renamed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 26: fakensq renamed nsqd.dat over the old one without an fsync
    # (a crash of the machine could leave it empty); nsqd's writeSyncFile and
    # go-diskqueue's persistMetaData fsync the temporary file first.
    synced: set[str] = set()
    renamed: list[tuple[str, bool]] = []
    fsync, replace = os.fsync, os.replace

    def record_fsync(fd: int) -> None:
        synced.add(os.readlink(f"/proc/self/fd/{fd}"))
        fsync(fd)

    def record_replace(src: Any, dst: Any) -> None:
        renamed.append((Path(dst).name, str(Path(src).resolve()) in synced))
        replace(src, dst)

    monkeypatch.setattr(os, "fsync", record_fsync)
    monkeypatch.setattr(os, "replace", record_replace)
    async with fakensq.NSQD(
        tcp_address="", http_address="", data_path=str(tmp_path), mem_queue_size=0, sync_every=1
    ) as nsqd:
        topic = nsqd.get_topic("t")
        topic.get_channel("c")
        topic.put(topic.new_message(b"x"))
    names = {name for name, _ in renamed}
    assert {METADATA_FILE, "t.diskqueue.meta.dat", "t:c.diskqueue.meta.dat"} <= names, renamed
    assert all(was_synced for _, was_synced in renamed), renamed


async def test_memory_takes_messages_while_older_ones_wait_on_disk(
    tmp_path: Path, conformance: Conformance
) -> None:
    # Found by test_durability: nsqd puts a message in memory whenever memory
    # has room, even while older ones wait on disk (a select on its buffered
    # channel); fakensq wrote it to disk behind them (to keep them in
    # order): a kill then kept it, where nsqd loses it.
    async with side_by_side(tmp_path, "--mem-queue-size=2", "--sync-every=1") as run:
        await post(run, "/topic/create?topic=t")
        await post(run, "/channel/create?topic=t&channel=c")
        await publish(run, "t", bodies(0, 3), "pub")  # 0, 1 in memory, 2 on disk
        await run.drain("t", "c", 1)  # (nsqd takes it from memory or disk: chance)
        await publish(run, "t", bodies(3, 4), "pub")  # to memory: it has room
        await held(run, [("t", False, 0, 0, [("c", False, 3, 1, 0, 0)])])
        await run.stop(kill=True)
        await held(run, [("t", False, 0, 0, [("c", False, 1, 1, 0, 0)])])
        skip_without_real(run, conformance)


async def test_a_channel_of_an_ephemeral_topic_has_a_disk_queue(
    tmp_path: Path, conformance: Conformance
) -> None:
    # Found by test_durability: nsqd gives a channel a disk queue unless the
    # channel's own name ends in #ephemeral, even in an ephemeral topic; the
    # topic is not in nsqd.dat, but the channel's files stay, and the same
    # channel made again reads them.
    async with side_by_side(tmp_path, "--mem-queue-size=1", "--sync-every=1") as run:
        await post(run, "/topic/create?topic=e%23ephemeral")
        await post(run, "/channel/create?topic=e%23ephemeral&channel=c")
        await publish(run, "e#ephemeral", bodies(0, 2), "pub")
        await held(run, [("e#ephemeral", False, 0, 0, [("c", False, 2, 1, 0, 0)])])
        await run.stop(kill=False)
        await held(run, [])
        await post(run, "/topic/create?topic=e%23ephemeral")
        await post(run, "/channel/create?topic=e%23ephemeral&channel=c")
        await held(run, [("e#ephemeral", False, 0, 0, [("c", False, 2, 2, 0, 0)])])
        await post(run, "/channel/delete?topic=e%23ephemeral&channel=c")
        await held(run, [])
        assert not [name for name, _ in files(run.fake.data) if name.startswith("e#")]
        skip_without_real(run, conformance)


async def test_in_flight_and_deferred_messages_go_to_disk_at_a_clean_stop(
    tmp_path: Path, conformance: Conformance
) -> None:
    # nsqd's clean stop writes a channel's in-flight and deferred messages to
    # its disk queue too (they come back ready): a kill after the restart
    # keeps them.  Killed without the clean stop, they are lost.
    flags = ("--mem-queue-size=10", "--sync-every=1", "--msg-timeout=10m")
    async with side_by_side(tmp_path, *flags) as run:
        await post(run, "/topic/create?topic=t")
        await post(run, "/channel/create?topic=t&channel=c")
        await publish(run, "t", bodies(0, 3))
        await publish(run, "t", bodies(3, 4), "dpub")
        got = await run.hold("t", "c", 2)
        assert got[0] == bodies(0, 2) and got[-1] == got[0]
        await held(run, [("t", False, 0, 0, [("c", False, 1, 0, 2, 1)])])
        await run.stop(kill=True)
        await held(run, [("t", False, 0, 0, [("c", False, 0, 0, 0, 0)])])
        await publish(run, "t", bodies(4, 7))
        await publish(run, "t", bodies(7, 8), "dpub")
        await run.hold("t", "c", 2)
        await run.stop(kill=False)
        await held(run, [("t", False, 0, 0, [("c", False, 4, 4, 0, 0)])])
        await run.stop(kill=True)
        await held(run, [("t", False, 0, 0, [("c", False, 4, 4, 0, 0)])])
        got = await run.drain("t", "c", 4)
        assert got[0] == bodies(4, 8) and got[-1] == got[0]
        skip_without_real(run, conformance)
