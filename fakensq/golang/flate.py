"""Go's ``compress/flate`` Writer as nsqd uses it: its writes below.

Go's Huffman bit writer hands its output below in pieces of at most 246
bytes as it encodes (seen from nsqd v1.3.0: full pieces are 246 bytes), and a
``Flush`` ends with the empty stored block's ``00 00 ff ff`` as a write of its
own (the 3-bit header before it ends the previous write); an empty ``Flush``
is two writes, 1 and 4 bytes.  Over TLS each write is a record: a client
reading a record at a time (pynsq's ``DeflateSocket``) gets one that
inflates to nothing.

The bytes are zlib's raw deflate at the same level; Go's encoder chooses
other blocks (its own Huffman codes; stored blocks for tiny writes and for
data that does not compress, whose bytes Go writes in one piece), so the
bytes, and where the pieces are cut, are alike but not the same.
"""

from __future__ import annotations

import zlib
from typing import Final

__all__ = ["FlateWriter"]

#: The largest piece Go's bit writer hands below while it encodes.
PIECE: Final = 246
_SYNC_MARKER: Final = 4  # 00 00 ff ff
_EMPTY_STORED_BLOCK: Final = b"\x00\x00\x00\xff\xff"


class FlateWriter:
    """What Go's flate ``Writer`` writes below for each ``Write`` and ``Flush``."""

    def __init__(self, level: int) -> None:
        self._z = zlib.compressobj(level, zlib.DEFLATED, -15)

    def write(self, data: bytes, below: list[bytes]) -> None:
        _cut(self._z.compress(data), below)

    def flush(self, below: list[bytes]) -> None:
        out = self._z.flush(zlib.Z_SYNC_FLUSH)
        if not out:
            # zlib has nothing to flush; Go still writes an empty stored block
            # (the stream is byte-aligned here, and the block adds no data).
            out = _EMPTY_STORED_BLOCK
        _cut(out[:-_SYNC_MARKER], below)
        below.append(out[-_SYNC_MARKER:])


def _cut(data: bytes, below: list[bytes]) -> None:
    for start in range(0, len(data), PIECE):
        below.append(data[start : start + PIECE])
