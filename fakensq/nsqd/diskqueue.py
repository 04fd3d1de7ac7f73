"""A topic's or channel's queue with nsqd's mem-queue-size overflow to disk.

nsqd keeps up to ``--mem-queue-size`` ready messages of a topic or channel in
memory; each message that finds the memory full goes to its *diskqueue*
(go-diskqueue: append-only segment files under ``--data-path``, rolled at
``--max-bytes-per-file``).  :class:`DiskBackedQueue` puts each message where
nsqd would (memory while it has room, even when older messages wait on disk),
so that a kill loses exactly what nsqd's loses.  One difference on purpose:
nsqd reads memory and disk in no fixed order (its message pump selects on
both, and Go's select picks either when both are ready); this queue hands
messages out oldest first (each remembers when it was put), so tests can rely
on order.  Given a :attr:`DiskBackedQueue.select` (a seeded ``random.Random``:
the node's ``select_order``), it picks as nsqd does: memory or disk at random
when both hold messages, so a message requeued into memory may go out before
older ones on disk.

At a clean stop (:meth:`flush`, :meth:`close`) what is in memory is written
after what is on disk, as nsqd's flush does: after a restart everything is
read from disk, in that order.

Files, as go-diskqueue names them: ``<name>.diskqueue.000000.dat`` and
following, where ``<name>`` is the topic name, or ``<topic>:<channel>`` for a
channel; files are made, opened and removed by their exact names only (a
pattern would also match another queue's: topic ``t``'s
``t.diskqueue.*.dat`` matches topic ``t.diskqueue.0``'s files).  Each
record is a 4-byte big-endian length and the message in nsqd's backend
encoding (8-byte timestamp, 2-byte attempts, 16-byte id, body).  The read
and write positions and the depth are in ``<name>.diskqueue.meta.dat``, in
go-diskqueue's text format, rewritten at each *sync* (the data file is
fsynced first; the meta file is written to a temporary file, fsynced and
renamed over it).  Every file is made with mode 0600, as nsqd's.

What survives a kill is what go-diskqueue's last sync recorded (measured on
nsqd v1.3.0, SIGKILL):

- a sync comes every ``sync_every`` reads and writes (``--sync-every``), when
  the reader or writer moves to another file, at a clean close, and on the
  queue's own ``sync_timeout`` ticker (``--sync-timeout``, 2 s) when anything
  was read or written since the last one (:meth:`tick`: the ticks due run
  at the next read or write, and when the node is killed);
- killed before its first sync, a queue comes back empty (no meta file: it
  starts at the beginning of file 0, writing over what is there);
- killed after it, the queue comes back at the recorded positions: messages
  read since are read again, and when the data file is longer than the
  recorded write position, writes go on in a new file while the reader
  salvages the old one to its end (the depth, as recorded, may then be short:
  it is reset to 0 when the reader reaches the end, as go-diskqueue does);
- emptied (``/topic/empty``, ``/channel/empty``), a queue removes its files
  from the read file to the write file and its meta file, and goes on in the
  next file number, without a sync: killed before the next one, it starts
  again at file 0;
- what was in memory (up to mem-queue-size, in flight, deferred) is lost.

File I/O is synchronous: records are small and written in batches, and the
whole point is determinism in tests, not throughput.
"""

from __future__ import annotations

import logging
import math
import os
import random
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO

from trionsq.protocol.frames import MESSAGE_HEADER, SIZE

from .message import Message

__all__ = ["DiskBackedQueue", "encode_message", "decode_message", "FILE_MODE"]

log = logging.getLogger("fakensq.nsqd")

#: The mode of every file nsqd (and go-diskqueue) makes: the owner's only.
FILE_MODE = 0o600


# The layouts' methods, bound once: CPython 3.11 compiles a method call on an
# imported name as an attribute load, a bound method made on every call.
_pack_header = MESSAGE_HEADER.pack
_unpack_header = MESSAGE_HEADER.unpack_from
_HEADER_SIZE = MESSAGE_HEADER.size
_pack_size = SIZE.pack
_unpack_size = SIZE.unpack
_SIZE_SIZE = SIZE.size


def encode_message(msg: Message) -> bytes:
    """nsqd's backend encoding of a message (``Message.WriteTo``): a message
    frame's data; a disk queue file holds each after its :data:`SIZE`."""
    return _pack_header(msg.timestamp, msg.attempts, msg.id) + msg.body


def decode_message(data: bytes) -> Message:
    """The inverse of :func:`encode_message`."""
    timestamp, attempts, msg_id = _unpack_header(data)
    msg = Message(msg_id, data[_HEADER_SIZE:], timestamp)
    msg.attempts = attempts
    return msg


def write_synced(path: Path, data: bytes) -> None:
    """Write ``path`` whole and durably: a temporary file (mode 0600) beside
    it, written and fsynced, then renamed over it (nsqd's writeSyncFile and
    go-diskqueue's persistMetaData)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


class Order:
    """When the messages of one FIFO were put (increasing counts), kept as
    runs of consecutive counts: a run of puts costs one entry, not one a
    message."""

    __slots__ = ("_runs",)

    def __init__(self) -> None:
        self._runs: deque[list[int]] = deque()  # [first count, how many]

    def add(self, first: int, n: int = 1) -> None:
        runs = self._runs
        if runs and runs[-1][0] + runs[-1][1] == first:
            runs[-1][1] += n
        elif n > 0:
            runs.append([first, n])

    def head(self) -> int:
        """The oldest count (-1 when empty)."""
        return self._runs[0][0] if self._runs else -1

    def pop(self) -> None:
        runs = self._runs
        if not runs:
            return
        run = runs[0]
        run[0] += 1
        run[1] -= 1
        if run[1] == 0:
            runs.popleft()

    def clear(self) -> None:
        self._runs.clear()

    def __bool__(self) -> bool:
        return bool(self._runs)


class DiskBackedQueue:
    """Up to ``mem_size`` messages in memory, the overflow on disk (module doc)."""

    def __init__(
        self,
        directory: str,
        name: str,
        *,
        mem_size: int,
        max_bytes_per_file: int,
        sync_every: int = 2500,
        sync_timeout: float = 2.0,
    ) -> None:
        self.directory = Path(directory)
        self.name = name
        self.mem_size = max(0, mem_size)
        self.max_bytes_per_file = max(1, max_bytes_per_file)
        self.sync_every = max(1, sync_every)
        self.sync_timeout = sync_timeout
        #: When :meth:`tick` syncs next (the node sets it from its clock).
        self.next_sync = math.inf
        #: The clock of the ticks (None: ticks only when :meth:`tick` is called).
        self.clock: Callable[[], float] | None = None
        #: Closed or deleted: no more writes, syncs or ticks.
        self.closed = False
        #: nsqd's read order (module doc): memory or disk at random when both
        #: hold messages; None: oldest first.
        self.select: random.Random | None = None
        self._mem: deque[Message] = deque()
        # When each message was put (a count): memory and disk are read
        # oldest first.  Records of an earlier run are older than any.
        self._put_count = 0
        self._mem_order = Order()
        self._disk_order = Order()
        self._writer: BinaryIO | None = None
        self._reader: BinaryIO | None = None
        self._ops_since_sync = 0  # reads and writes, as go-diskqueue's count
        self.directory.mkdir(parents=True, exist_ok=True)
        meta = self._read_meta_file()  # the last sync (a clean close's, or a kill's)
        #: Messages on disk (nsqd's backend depth), as counted since the last sync.
        self.backend_depth: int = meta.get("depth", 0)
        self.read_file: int = meta.get("read_file", 0)
        self.read_pos: int = meta.get("read_pos", 0)
        self.write_file: int = meta.get("write_file", 0)
        self.write_pos: int = meta.get("write_pos", 0)
        if meta:
            size = self._size(self.write_file)
            if self.write_pos < size:
                # Written after the last sync: go on in a new file, and let the
                # reader salvage this one to its end (go-diskqueue's recovery).
                log.warning(
                    "DISKQUEUE(%s) %s metadata writePos %d < file size of %d, skipping to new file",
                    name,
                    self.segment(self.write_file),
                    self.write_pos,
                    size,
                )
                self.write_file += 1
                self.write_pos = 0
        # Records from here on are this run's (their order is in _disk_order).
        self._fresh_from = (self.write_file, self.write_pos)

    # --- files ---

    def segment(self, n: int) -> Path:
        """The path of segment ``n``."""
        return self.directory / f"{self.name}.diskqueue.{n:06d}.dat"

    @property
    def meta_path(self) -> Path:
        """go-diskqueue's metadata file (positions and depth at the last sync)."""
        return self.directory / f"{self.name}.diskqueue.meta.dat"

    def _size(self, n: int) -> int:
        try:
            return self.segment(n).stat().st_size
        except OSError:
            return 0

    def _read_meta_file(self) -> dict[str, int]:
        try:
            lines = self.meta_path.read_text().split("\n")
            depth = int(lines[0])
            read_file, read_pos = (int(v) for v in lines[1].split(","))
            write_file, write_pos = (int(v) for v in lines[2].split(","))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, IndexError) as exc:
            log.error("DISKQUEUE(%s) failed to retrieveMetaData - %s", self.name, exc)
            return {}
        return {
            "depth": depth,
            "read_file": read_file,
            "read_pos": read_pos,
            "write_file": write_file,
            "write_pos": write_pos,
        }

    def sync(self) -> None:
        """Fsync the data, then record the positions in the meta file (written
        to a temporary file and renamed over it, as go-diskqueue does)."""
        if self.closed:
            return
        if self._writer is not None:
            self._writer.flush()
            os.fsync(self._writer.fileno())
        text = (
            f"{self.backend_depth}\n{self.read_file},{self.read_pos}\n"
            f"{self.write_file},{self.write_pos}\n"
        )
        write_synced(self.meta_path, text.encode())
        self._ops_since_sync = 0

    def tick(self, now: float) -> float:
        """The ``sync_timeout`` ticker: sync if due and anything changed since
        the last sync; returns when it is due next."""
        if self.closed:
            return math.inf
        if now >= self.next_sync:
            if self._ops_since_sync:
                self.sync()
            missed = math.floor((now - self.next_sync) / self.sync_timeout) + 1
            self.next_sync += missed * self.sync_timeout
        return self.next_sync

    def _count_op(self) -> None:
        self._ops_since_sync += 1
        if self._ops_since_sync >= self.sync_every:
            self.sync()

    def _catch_up(self) -> None:
        # The ticks due before this read or write (see the module doc).
        if self.clock is not None:
            self.tick(self.clock())

    def _open_writer(self) -> BinaryIO:
        # As go-diskqueue: opened read-write (created 0600) at the write
        # position, never truncated: after a kill before any sync it writes
        # over what an earlier run left there.
        fd = os.open(self.segment(self.write_file), os.O_RDWR | os.O_CREAT, FILE_MODE)
        writer = os.fdopen(fd, "r+b")
        writer.seek(self.write_pos)
        return writer

    def _write(self, msgs: Iterable[Message]) -> None:
        if self.closed:
            return  # deleted: nsqd's queue refuses it ("exiting")
        self._catch_up()
        for msg in msgs:
            if self._writer is None:
                self._writer = self._open_writer()
            data = encode_message(msg)
            self._writer.write(_pack_size(len(data)) + data)
            self._disk_order.add(self._put_count)
            self._put_count += 1
            self.write_pos += _SIZE_SIZE + len(data)
            self.backend_depth += 1
            if self.write_pos >= self.max_bytes_per_file:
                # Roll, as nsqd does once a file reaches max-bytes-per-file
                # (and sync: go-diskqueue syncs at every new file).
                self.write_file += 1
                self.write_pos = 0
                self.sync()
                self._writer.close()
                self._writer = None
            else:
                self._writer.flush()  # seen by the reader (another handle)
            self._count_op()

    def _has_disk(self) -> bool:
        return self.read_file < self.write_file or self.read_pos < self.write_pos

    def _next_file(self) -> None:
        # A finished file: delete it, read the next (and sync, as go-diskqueue).
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        self.segment(self.read_file).unlink(missing_ok=True)
        self.read_file += 1
        self.read_pos = 0
        self.sync()

    def _disk_head_order(self) -> int:
        """When the next record on disk was put (-1: by an earlier run)."""
        if (self.read_file, self.read_pos) < self._fresh_from:
            return -1
        return self._disk_order.head()

    def _read_one(self) -> Message | None:
        self._catch_up()
        while self._has_disk():
            if self._reader is None:
                try:
                    self._reader = open(self.segment(self.read_file), "rb")
                except FileNotFoundError:
                    if self.read_file < self.write_file:
                        self._next_file()
                        continue
                    self.read_pos = self.write_pos  # nothing there: at the tail
                    break
                self._reader.seek(self.read_pos)
            start = (self.read_file, self.read_pos)
            head = self._reader.read(_SIZE_SIZE)
            size = _unpack_size(head)[0] if len(head) == _SIZE_SIZE else -1
            data = self._reader.read(size) if size >= 0 else b""
            if size < 0 or len(data) < size:
                if self.read_file < self.write_file:
                    self._next_file()  # the end of a finished file
                    continue
                self.read_pos = self.write_pos  # torn record at the tail
                break
            if start >= self._fresh_from:
                self._disk_order.pop()
            self.read_pos += _SIZE_SIZE + size
            self.backend_depth -= 1
            self._count_op()
            if (
                self.read_file < self.write_file
                and self.read_pos >= os.fstat(self._reader.fileno()).st_size
            ):
                # The last record of a finished file: go-diskqueue moves to the
                # next file (and removes this one) as it hands this one out.
                self._next_file()
            self._at_tail()
            return decode_message(data)
        self._at_tail()
        return None

    def _at_tail(self) -> None:
        if self._has_disk():
            return
        self._disk_order.clear()
        if self.backend_depth != 0:
            # A depth recorded before later writes (or reads) of a killed node.
            kind = "negative depth at tail" if self.backend_depth < 0 else "positive depth"
            log.error("DISKQUEUE(%s) %s (%d), resetting 0...", self.name, kind, self.backend_depth)
            self.backend_depth = 0
            self.sync()  # (go-diskqueue's needSync)

    # --- MessageQueue ---

    def put(self, msg: Message) -> None:
        self.put_many((msg,))

    def put_many(self, msgs: Iterable[Message]) -> None:
        batch = msgs if isinstance(msgs, (list, tuple)) else list(msgs)
        # Memory while it has room (nsqd's select on its buffered channel),
        # the rest to disk.
        room = self.mem_size - len(self._mem)
        n = len(batch)
        if room > 0:
            first = self._put_count
            if n <= room:
                self._mem.extend(batch)
                self._mem_order.add(first, n)
                self._put_count += n
                return
            self._mem.extend(batch[:room])
            self._mem_order.add(first, room)
            self._put_count += room
            batch = batch[room:]
        self._write(batch)

    def get(self) -> Message | None:
        mem = self._mem
        if mem and self.select is not None and self._has_disk():
            # nsqd's select on its memory channel and its diskqueue: either.
            older = self.select.random() < 0.5
        else:
            older = not self._has_disk() or self._mem_order.head() < self._disk_head_order()
        if mem and older:
            self._mem_order.pop()
            return mem.popleft()
        msg = self._read_one()
        if msg is None and mem:
            self._mem_order.pop()
            return mem.popleft()
        return msg

    def get_many(self, n: int) -> list[Message]:
        mem = self._mem
        if not self._has_disk() and n >= len(mem):
            out = list(mem)  # all of it, in one go (nothing on disk)
            mem.clear()
            self._mem_order.clear()
            return out
        out = []
        while len(out) < n:
            msg = self.get()
            if msg is None:
                break
            out.append(msg)
        return out

    def clear(self) -> None:
        """Drop everything, memory and disk (``/topic/empty``, ``/channel/empty``):
        go-diskqueue's Empty (module doc)."""
        self._mem.clear()
        self._mem_order.clear()
        self._disk_order.clear()
        self._close_files()
        for n in range(self.read_file, self.write_file + 1):
            self.segment(n).unlink(missing_ok=True)
        self.write_file += 1
        self.write_pos = 0
        self.read_file, self.read_pos = self.write_file, 0
        self.backend_depth = 0
        self.meta_path.unlink(missing_ok=True)
        self._ops_since_sync = 0
        self._fresh_from = (self.write_file, 0)

    def delete(self) -> None:
        """The topic or channel is deleted: its files go (as :meth:`clear`), and
        the queue takes nothing more."""
        self.clear()
        self.closed = True

    def __len__(self) -> int:
        return len(self._mem) + max(0, self.backend_depth)

    def __bool__(self) -> bool:
        return bool(self._mem) or self._has_disk()

    # --- stopping ---

    def memory_messages(self) -> list[Message]:
        """What is queued in memory, oldest first."""
        return list(self._mem)

    def flush(self, extra: Iterable[Message] = ()) -> None:
        """A clean stop: what is in memory, then ``extra`` (a channel's in-flight
        and deferred messages), written after what is on disk, as nsqd's flush."""
        msgs = [*self._mem, *extra]
        self._mem.clear()
        self._mem_order.clear()
        self._write(msgs)

    def close(self) -> None:
        """Sync and close the files (a clean stop, after :meth:`flush`)."""
        self.sync()
        self._close_files()
        self.closed = True

    def abandon(self) -> None:
        """A kill: the files are closed as they are, with no sync (what the meta
        file last recorded is what the next start reads)."""
        self._close_files()
        self.closed = True

    def _close_files(self) -> None:
        for handle in (self._reader, self._writer):
            if handle is not None:
                handle.close()
        self._reader = self._writer = None
