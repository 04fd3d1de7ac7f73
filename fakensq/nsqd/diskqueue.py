"""A topic's or channel's queue with nsqd's mem-queue-size overflow to disk.

nsqd keeps up to ``--mem-queue-size`` ready messages of a topic or channel in
memory; the rest go to its *diskqueue* (go-diskqueue: append-only segment
files under ``--data-path``, rolled at ``--max-bytes-per-file``).
:class:`DiskBackedQueue` does the same, with one difference on purpose: once
anything is on disk, new messages go to disk too until it drains, so that the
queue stays strictly FIFO (nsqd reads memory and disk in no fixed order) and
tests can rely on order.

Files, as nsqd names them: ``<name>.diskqueue.000000.dat`` and following, where
``<name>`` is the topic name, or ``<topic>:<channel>`` for a channel.  Each
record is a 4-byte big-endian length and the message in nsqd's backend encoding
(8-byte timestamp, 2-byte attempts, 16-byte id, body).  The read and write
positions and the depth are in ``<name>.diskqueue.meta.dat``, in
go-diskqueue's text format, rewritten at each *sync*.

What survives a kill is what go-diskqueue's last sync recorded (measured on
nsqd v1.3.0, SIGKILL):

- a sync comes every ``sync_every`` reads and writes (``--sync-every``), when
  the reader or writer moves to another file, at a clean close, and on the
  queue's own ``sync_timeout`` ticker (``--sync-timeout``, 2 s) when anything
  was read or written since the last one (:meth:`tick`: the ticks due run
  at the next read or write, and when the node is killed);
- killed before its first sync, a queue comes back empty (no meta file: the
  segments are dropped);
- killed after it, the queue comes back at the recorded positions: messages
  read since are read again, and when the data file is longer than the
  recorded write position, writes go on in a new file while the reader
  salvages the old one to its end (the depth, as recorded, may then be short:
  it is reset to 0 when the reader reaches the end, as go-diskqueue does);
- what was in memory (up to mem-queue-size, in flight, deferred) is lost.

File I/O is synchronous: records are small and written in batches, and the
whole point is determinism in tests, not throughput.
"""

from __future__ import annotations

import logging
import math
import os
import struct
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO

from .message import Message

__all__ = ["DiskBackedQueue", "encode_message", "decode_message"]

log = logging.getLogger("fakensq.nsqd")

_LEN = struct.Struct(">i")
_HEAD = struct.Struct(">qH16s")


def encode_message(msg: Message) -> bytes:
    """nsqd's backend encoding of a message (``Message.WriteTo``)."""
    return _HEAD.pack(msg.timestamp, msg.attempts, msg.id) + msg.body


def decode_message(data: bytes) -> Message:
    """The inverse of :func:`encode_message`."""
    timestamp, attempts, msg_id = _HEAD.unpack_from(data)
    msg = Message(msg_id, data[_HEAD.size :], timestamp)
    msg.attempts = attempts
    return msg


class DiskBackedQueue:
    """FIFO: up to ``mem_size`` messages in memory, the overflow on disk."""

    def __init__(
        self,
        directory: str,
        name: str,
        *,
        mem_size: int,
        max_bytes_per_file: int,
        sync_every: int = 2500,
        sync_timeout: float = 2.0,
        meta: dict[str, Any] | None = None,
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
        self._mem: deque[Message] = deque()
        self._writer: BinaryIO | None = None
        self._reader: BinaryIO | None = None
        self._ops_since_sync = 0  # reads and writes, as go-diskqueue's count
        self.directory.mkdir(parents=True, exist_ok=True)
        recovered = False
        if meta is None:
            meta = self._read_meta_file()  # a killed node's last sync
            if meta is None:
                self._remove_segments()  # never synced: what is there is lost
                meta = {}
            else:
                recovered = True
        #: Messages on disk (nsqd's backend depth), as counted since the last sync.
        self.backend_depth: int = int(meta.get("depth", 0))
        self.read_file: int = int(meta.get("read_file", 0))
        self.read_pos: int = int(meta.get("read_pos", 0))
        self.write_file: int = int(meta.get("write_file", 0))
        self.write_pos: int = int(meta.get("write_pos", 0))
        if recovered:
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

    def _remove_segments(self) -> None:
        for path in self.directory.glob(f"{self.name}.diskqueue.*.dat"):
            path.unlink(missing_ok=True)

    def _read_meta_file(self) -> dict[str, Any] | None:
        try:
            lines = self.meta_path.read_text().split("\n")
            depth = int(lines[0])
            read_file, read_pos = (int(v) for v in lines[1].split(","))
            write_file, write_pos = (int(v) for v in lines[2].split(","))
        except (OSError, ValueError, IndexError):
            return None
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
        if self._writer is not None:
            self._writer.flush()
            os.fsync(self._writer.fileno())
        text = (
            f"{self.backend_depth}\n{self.read_file},{self.read_pos}\n"
            f"{self.write_file},{self.write_pos}\n"
        )
        tmp = self.meta_path.with_name(f"{self.meta_path.name}.{os.getpid()}.tmp")
        with open(tmp, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.meta_path)
        self._ops_since_sync = 0

    def tick(self, now: float) -> float:
        """The ``sync_timeout`` ticker: sync if due and anything changed since
        the last sync; returns when it is due next."""
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

    def _write(self, msgs: Iterable[Message]) -> None:
        self._catch_up()
        for msg in msgs:
            if self._writer is None:
                self._writer = open(self.segment(self.write_file), "ab")
            data = encode_message(msg)
            self._writer.write(_LEN.pack(len(data)) + data)
            self.write_pos += _LEN.size + len(data)
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
            head = self._reader.read(_LEN.size)
            size = _LEN.unpack(head)[0] if len(head) == _LEN.size else -1
            data = self._reader.read(size) if size >= 0 else b""
            if size < 0 or len(data) < size:
                if self.read_file < self.write_file:
                    self._next_file()  # the end of a finished file
                    continue
                self.read_pos = self.write_pos  # torn record at the tail
                break
            self.read_pos += _LEN.size + size
            self.backend_depth -= 1
            self._at_tail()
            self._count_op()
            return decode_message(data)
        self._at_tail()
        return None

    def _at_tail(self) -> None:
        if not self._has_disk() and self.backend_depth != 0:
            # A depth recorded before later writes (or reads) of a killed node.
            kind = "negative depth at tail" if self.backend_depth < 0 else "positive depth"
            log.error("DISKQUEUE(%s) %s (%d), resetting 0...", self.name, kind, self.backend_depth)
            self.backend_depth = 0

    # --- MessageQueue ---

    def put(self, msg: Message) -> None:
        self.put_many((msg,))

    def put_many(self, msgs: Iterable[Message]) -> None:
        batch = msgs if isinstance(msgs, (list, tuple)) else list(msgs)
        if not self._has_disk():
            # Memory first while it has room (the common case: one extend).
            room = max(0, self.mem_size - len(self._mem))
            if len(batch) <= room:
                self._mem.extend(batch)
                return
            self._mem.extend(batch[:room])
            batch = batch[room:]
        self._write(batch)

    def put_front(self, msgs: list[Message]) -> None:
        """Messages older than everything queued (a restart's saved memory part)."""
        self._mem.extendleft(reversed(msgs))

    def get(self) -> Message | None:
        if self._mem:
            return self._mem.popleft()
        return self._read_one()

    def get_many(self, n: int) -> list[Message]:
        mem = self._mem
        if not self._has_disk() and n >= len(mem):
            out = list(mem)  # all of it, in one go (nothing on disk)
            mem.clear()
            return out
        out = []
        while len(out) < n:
            if mem:
                out.append(mem.popleft())
                continue
            msg = self._read_one()
            if msg is None:
                break
            out.append(msg)
        return out

    def clear(self) -> None:
        """Drop everything, memory and disk (``/channel/empty``, deletion)."""
        self._mem.clear()
        for handle in (self._reader, self._writer):
            if handle is not None:
                handle.close()
        self._reader = self._writer = None
        self._remove_segments()
        self.meta_path.unlink(missing_ok=True)
        self.backend_depth = 0
        self.read_file = self.read_pos = self.write_file = self.write_pos = 0
        self._ops_since_sync = 0

    def __len__(self) -> int:
        return len(self._mem) + max(0, self.backend_depth)

    def __bool__(self) -> bool:
        return bool(self._mem) or self._has_disk()

    # --- persistence ---

    def memory_messages(self) -> list[Message]:
        """What is queued in memory (saved with the node's state at shutdown)."""
        return list(self._mem)

    def close(self) -> dict[str, Any]:
        """Sync, close the files and return the positions to restore them."""
        self.sync()
        for handle in (self._reader, self._writer):
            if handle is not None:
                handle.close()
        self._reader = self._writer = None
        return {
            "depth": self.backend_depth,
            "read_file": self.read_file,
            "read_pos": self.read_pos,
            "write_file": self.write_file,
            "write_pos": self.write_pos,
        }
