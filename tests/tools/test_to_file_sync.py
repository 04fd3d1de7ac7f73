"""``to-file``'s syncs on a worker thread: what arrives during a sync waits for
the next one, and nothing is finished before the sync that made it durable."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio

from trionsq.tools import to_file
from trionsq.tools.progress import Progress
from trionsq.tools.to_file import FileLogger, FileOptions, _Archiver


@dataclass
class Conn:
    address: str
    rdy: int


@dataclass
class Stats:
    connections: dict[str, Conn]


class FakeConsumer:
    """What the archiver asks of its consumer: the RDY per nsqd, and starvation."""

    def __init__(self, rdy: int) -> None:
        self.stats = Stats({"n:1": Conn("n:1", rdy)})
        self.starved = False

    def is_starved(self) -> bool:
        return self.starved


@dataclass
class FakeMessage:
    body: bytes
    log: list[str]
    address: str = "n:1"
    answers: list[str] = field(default_factory=list)

    async def finish(self) -> None:
        self.answers.append("FIN")
        self.log.append(f"FIN {self.body.decode()}")

    async def requeue(self, delay: float | None = None, backoff: bool = True) -> None:
        self.answers.append("REQ")
        self.log.append(f"REQ {self.body.decode()}")


class GatedLogger(FileLogger):
    """A FileLogger whose syncs wait for the test's go-ahead (on their thread)."""

    def __init__(self, opts: FileOptions, log: list[str]) -> None:
        super().__init__(opts, "logs")
        self.log = log
        self.entered = threading.Event()
        self.gate = threading.Event()

    def sync(self, notify: bool = True) -> bool:
        self.entered.set()
        assert self.gate.wait(10), "the test never let the sync go on"
        bodies = " ".join(body.decode() for body in self._buffer)  # what this sync writes
        synced = super().sync(notify)
        self.log.append(f"SYNC {bodies}")
        return synced


def archiver(tmp_path: Path, log: list[str], rdy: int = 4) -> tuple[_Archiver, GatedLogger]:
    logger = GatedLogger(FileOptions(output_dir=str(tmp_path), work_dir=str(tmp_path)), log)
    progress = Progress("test", ["written", "finished", "open", "closed", "syncs"], live=False)
    return _Archiver(FakeConsumer(rdy), logger, 100, progress), logger  # type: ignore[arg-type]


def only_file(folder: Path) -> bytes:
    (path,) = folder.iterdir()
    return path.read_bytes()


async def test_messages_arriving_during_a_sync_wait_for_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(to_file, "THREADED_SYNC", 1)  # every batch on a thread
    log: list[str] = []
    arch, logger = archiver(tmp_path, log, rdy=4)
    messages = [FakeMessage(f"m{i}".encode(), log) for i in range(5)]
    async with trio.open_nursery() as nursery:
        arch._nursery = nursery
        arch._refresh_limits()
        for message in messages[:2]:  # half of the RDY: worth a sync
            arch.add(message)  # type: ignore[arg-type]
        assert arch.worth_syncing()
        arch.start_sync()
        await trio.to_thread.run_sync(logger.entered.wait)
        assert arch.syncing
        # The sync runs (blocked on its thread): these are not written meanwhile.
        for message in messages[2:]:
            arch.add(message)  # type: ignore[arg-type]
        assert [m.body for m in arch.backlog] == [b"m2", b"m3", b"m4"]
        assert not any(m.answers for m in messages)
        logger.entered.clear()
        logger.gate.set()
        await arch.wait_for_sync()
        # The first sync finished m0 and m1 only; the backlog, now written
        # (3 held >= half the RDY), is synced next, on its own.
        await arch.sync_and_finish()
    assert log == [
        "SYNC m0 m1",
        "FIN m0",
        "FIN m1",
        "SYNC m2 m3 m4",
        "FIN m2",
        "FIN m3",
        "FIN m4",
    ]
    logger.close()
    assert only_file(tmp_path) == b"m0\nm1\nm2\nm3\nm4\n"


async def test_a_failed_sync_leaves_everything_to_be_requeued(tmp_path: Path) -> None:
    log: list[str] = []
    arch, logger = archiver(tmp_path, log, rdy=100)
    logger.gate.set()
    messages = [FakeMessage(f"m{i}".encode(), log) for i in range(3)]
    async with trio.open_nursery() as nursery:
        arch._nursery = nursery
        for message in messages:
            arch.add(message)  # type: ignore[arg-type]

        def broken(notify: bool = True) -> bool:
            raise OSError("disk gone")

        logger.sync = broken  # type: ignore[method-assign]
        try:
            await arch.sync_and_finish()
        except Exception as exc:
            assert "disk gone" in str(exc)
        else:
            raise AssertionError("the sync's failure was not raised")
        await arch.requeue_pending()
    assert [m.answers for m in messages] == [["REQ"], ["REQ"], ["REQ"]]
