"""A topic's or channel's queue with nsqd's mem-queue-size overflow to disk.

nsqd keeps up to ``--mem-queue-size`` ready messages of a topic or channel in
memory; the rest go to its *diskqueue* (append-only segment files under
``--data-path``, rolled at ``--max-bytes-per-file``).  :class:`DiskBackedQueue`
does the same, with one difference on purpose: once anything is on disk, new
messages go to disk too until it drains, so that the queue stays strictly FIFO
(nsqd reads memory and disk in no fixed order) and tests can rely on order.

Files, as nsqd names them: ``<name>.diskqueue.000000.dat`` and following, where
``<name>`` is the topic name, or ``<topic>:<channel>`` for a channel.  Each
record is a 4-byte big-endian length and the message in nsqd's backend encoding
(8-byte timestamp, 2-byte attempts, 16-byte id, body).  The read and write
positions live in memory; a clean shutdown saves them with the node's state
(:mod:`fakensq.persist`), and a queue created without them starts empty and
removes leftover segments (what a killed node left behind is lost).

Records are fsynced every ``sync_every`` of them and when the queue is closed
(``sync_timeout`` is not used: nothing here runs on a timer).  File I/O is
synchronous: records are small and written in batches, and the
whole point is determinism in tests, not throughput.
"""

from __future__ import annotations

import os
import struct
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

from .message import Message

__all__ = ["DiskBackedQueue", "encode_message", "decode_message"]

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
        meta: dict[str, Any] | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.name = name
        self.mem_size = max(0, mem_size)
        self.max_bytes_per_file = max(1, max_bytes_per_file)
        self.sync_every = max(1, sync_every)
        self._mem: deque[Message] = deque()
        self._writer: BinaryIO | None = None
        self._reader: BinaryIO | None = None
        self._writes_since_sync = 0
        self.directory.mkdir(parents=True, exist_ok=True)
        if meta is None:
            self._remove_segments()  # leftovers of a killed node: lost
            meta = {}
        #: Messages on disk (nsqd's backend depth).
        self.backend_depth: int = int(meta.get("depth", 0))
        self.read_file: int = int(meta.get("read_file", 0))
        self.read_pos: int = int(meta.get("read_pos", 0))
        self.write_file: int = int(meta.get("write_file", 0))
        self.write_pos: int = int(meta.get("write_pos", 0))

    # --- files ---

    def segment(self, n: int) -> Path:
        """The path of segment ``n``."""
        return self.directory / f"{self.name}.diskqueue.{n:06d}.dat"

    def _remove_segments(self) -> None:
        for path in self.directory.glob(f"{self.name}.diskqueue.*.dat"):
            path.unlink(missing_ok=True)

    def _write(self, msgs: Iterable[Message]) -> None:
        for msg in msgs:
            if self._writer is None:
                self._writer = open(self.segment(self.write_file), "ab")
            data = encode_message(msg)
            self._writer.write(_LEN.pack(len(data)) + data)
            self.write_pos += _LEN.size + len(data)
            self.backend_depth += 1
            self._writes_since_sync += 1
            if self.write_pos >= self.max_bytes_per_file:
                # Roll, as nsqd does once a file reaches max-bytes-per-file.
                self._writer.close()
                self._writer = None
                self.write_file += 1
                self.write_pos = 0
        if self._writer is not None:
            # Flushed so the reader (another handle) sees it; fsync only every
            # sync_every records, as nsqd's --sync-every.
            self._writer.flush()
            if self._writes_since_sync >= self.sync_every:
                os.fsync(self._writer.fileno())
                self._writes_since_sync = 0

    def _read_one(self) -> Message | None:
        while self.backend_depth > 0:
            if self._reader is None:
                self._reader = open(self.segment(self.read_file), "rb")
                self._reader.seek(self.read_pos)
            head = self._reader.read(_LEN.size)
            if len(head) < _LEN.size:
                # End of a finished segment: delete it and go on with the next.
                self._reader.close()
                self._reader = None
                if self.read_file >= self.write_file:
                    raise RuntimeError(f"diskqueue {self.name}: depth but no data")
                self.segment(self.read_file).unlink(missing_ok=True)
                self.read_file += 1
                self.read_pos = 0
                continue
            (size,) = _LEN.unpack(head)
            data = self._reader.read(size)
            self.read_pos += _LEN.size + size
            self.backend_depth -= 1
            if self.backend_depth == 0:
                self._reset_files()
            return decode_message(data)
        return None

    def _reset_files(self) -> None:
        # Drained: start again from segment 0 (nsqd moves on; either is fine).
        for handle in (self._reader, self._writer):
            if handle is not None:
                handle.close()
        self._reader = self._writer = None
        self._remove_segments()
        self.read_file = self.read_pos = self.write_file = self.write_pos = 0

    def _refill(self) -> None:
        # Memory drained: bring the oldest of the disk back (at least one, so a
        # mem_size of 0 still delivers).
        want = max(1, self.mem_size)
        while self.backend_depth and len(self._mem) < want:
            msg = self._read_one()
            if msg is None:
                break
            self._mem.append(msg)

    # --- MessageQueue ---

    def put(self, msg: Message) -> None:
        self.put_many((msg,))

    def put_many(self, msgs: Iterable[Message]) -> None:
        batch = msgs if isinstance(msgs, (list, tuple)) else list(msgs)
        if not self.backend_depth:
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
        if not self._mem:
            self._refill()
        return self._mem.popleft() if self._mem else None

    def get_many(self, n: int) -> list[Message]:
        mem = self._mem
        if not self.backend_depth and n >= len(mem):
            out = list(mem)  # all of it, in one go (nothing on disk)
            mem.clear()
            return out
        out = []
        while len(out) < n:
            if not self._mem:
                self._refill()
                if not self._mem:
                    break
            out.append(self._mem.popleft())
        return out

    def clear(self) -> None:
        """Drop everything, memory and disk (``/channel/empty``, deletion)."""
        self._mem.clear()
        self.backend_depth = 0
        self._reset_files()

    def __len__(self) -> int:
        return len(self._mem) + self.backend_depth

    def __bool__(self) -> bool:
        return bool(self._mem) or self.backend_depth > 0

    # --- persistence ---

    def memory_messages(self) -> list[Message]:
        """What is queued in memory (saved with the node's state at shutdown)."""
        return list(self._mem)

    def close(self) -> dict[str, Any]:
        """Close the files (fsynced) and return the positions to restore them."""
        if self._writer is not None:
            self._writer.flush()
            os.fsync(self._writer.fileno())
            self._writer.close()
            self._writer = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        return {
            "depth": self.backend_depth,
            "read_file": self.read_file,
            "read_pos": self.read_pos,
            "write_file": self.write_file,
            "write_pos": self.write_pos,
        }
