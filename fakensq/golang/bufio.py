"""Go's ``bufio.Writer``: which writes reach the writer below it.

nsqd writes each frame into a ``bufio.Writer`` of the client's output buffer
size as three writes (size, frame type, data: ``SendFramedResponse``) and
flushes it after each response.  A write that does not fit fills the buffer,
which is written out whole; a write larger than an empty buffer goes below as
it is.  Where the writes below can be told apart (TLS records, compressed
chunks), fakensq cuts its output where Go's would be cut.
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["BufferedWriter", "frame_pieces", "whole_frames"]


def whole_frames(data: bytes) -> int:
    """How many bytes of ``data`` make whole frames, from its start."""
    pos, end = 0, len(data)
    while end - pos >= 4:
        stop = pos + 4 + int.from_bytes(data[pos : pos + 4], "big")
        if stop > end:
            break
        pos = stop
    return pos


def frame_pieces(data: bytes) -> Iterator[memoryview]:
    """The writes nsqd makes of ``data``, a run of whole frames: for each frame
    its size, its type and its data (anything left over: one write)."""
    view = memoryview(data)
    pos, end = 0, len(data)
    while end - pos >= 8:
        stop = pos + 4 + int.from_bytes(view[pos : pos + 4], "big")
        if stop > end:
            break
        yield view[pos : pos + 4]
        yield view[pos + 4 : pos + 8]
        if stop > pos + 8:
            yield view[pos + 8 : stop]
        pos = stop
    if pos < end:
        yield view[pos:]


class BufferedWriter:
    """A ``bufio.Writer`` of ``size`` bytes over nothing: it tells the writes
    that would go below, in order, into the list given."""

    def __init__(self, size: int) -> None:
        self.size = max(size, 1)
        self._buffer = bytearray()

    @property
    def buffered(self) -> int:
        """Bytes waiting in the buffer."""
        return len(self._buffer)

    def write(self, piece: bytes | memoryview, below: list[bytes]) -> None:
        """One ``Write``; what it sends below is appended to ``below``."""
        buffer, size = self._buffer, self.size
        while len(piece) > size - len(buffer):
            if not buffer:  # a large write, an empty buffer: written as it is
                below.append(bytes(piece))
                return
            n = size - len(buffer)
            buffer += piece[:n]
            below.append(bytes(buffer))
            buffer.clear()
            piece = piece[n:]
        buffer += piece

    def flush(self, below: list[bytes]) -> None:
        """``Flush``: what is buffered goes below."""
        if self._buffer:
            below.append(bytes(self._buffer))
            self._buffer.clear()
