"""What nsqd's writer stack puts on the wire once IDENTIFY upgraded it.

nsqd writes frames into a ``bufio.Writer`` (the client's output buffer size)
over, as negotiated, golang/snappy's or compress/flate's writer, over the TLS
connection or the socket; each response flushes it.  The bytes a client gets
are the same whatever the cuts, but where Go's writes are cut shows: over TLS
each write below is a record of its own (a client reads a record at a time),
over TCP a segment of its own (Go's sockets send at once: no Nagle), which a
client reading as they come may get alone, and a compressed stream's chunks
are cut where bufio's writes were.  :class:`ClientWire` gives, for what
fakensq sends, the writes nsqd would make (records, over TLS), each sent by
itself.  A plain, uncompressed connection does not need it.
"""

from __future__ import annotations

from ..golang.bufio import BufferedWriter, frame_pieces, whole_frames
from ..golang.flate import FlateWriter
from ..golang.snappy import SnappyWriter
from ..golang.tlsrecords import RecordSizer

__all__ = ["ClientWire"]


class ClientWire:
    """nsqd's writer stack for one connection, after an upgrade.

    ``codec``: a :class:`SnappyWriter`, a :class:`FlateWriter` or None;
    ``records``: the connection's :class:`RecordSizer` over TLS, else None.
    """

    def __init__(
        self,
        buffer_size: int,
        codec: SnappyWriter | FlateWriter | None = None,
        records: RecordSizer | None = None,
    ) -> None:
        self._bufio = BufferedWriter(buffer_size)
        self._codec = codec
        self.records = records
        # The start of a frame whose rest comes with the next call (fakensq
        # sends a long output in pieces, which may end inside a frame).
        self._torn = b""
        self._unflushed = False

    @property
    def buffered(self) -> int:
        """Bytes nsqd's buffer holds (written, not yet flushed)."""
        return self._bufio.buffered + len(self._torn)

    @property
    def flushes_empty(self) -> bool:
        """Whether a flush with nothing buffered still writes (deflate)."""
        return isinstance(self._codec, FlateWriter)

    @property
    def unflushed(self) -> bool:
        """Whether something written waits for a flush (in the buffer, or
        in the flate writer, which keeps what it was given until flushed)."""
        return self._unflushed

    def write(self, frames: bytes, *, flush: bool) -> list[bytes]:
        """The writes on the connection (records, over TLS) for ``frames``
        written into nsqd's buffer, then flushed if ``flush``."""
        self._unflushed = not flush and bool(frames or self._unflushed)
        if self._torn:
            frames, self._torn = self._torn + frames, b""
        if not flush:
            whole = whole_frames(frames)
            if whole < len(frames):
                frames, self._torn = frames[:whole], frames[whole:]
        pieces: list[bytes] = []
        bufio = self._bufio
        for frame_piece in frame_pieces(frames):
            bufio.write(frame_piece, pieces)
        if flush:
            bufio.flush(pieces)
        codec = self._codec
        if codec is not None:
            coded: list[bytes] = []
            for piece in pieces:
                codec.write(piece, coded)
            if flush and isinstance(codec, FlateWriter):
                codec.flush(coded)  # (nsqd's Flush flushes the flate writer too)
            pieces = coded
        if self.records is None:
            return pieces
        records: list[bytes] = []
        for piece in pieces:
            self.records.records(piece, records)
        return records
