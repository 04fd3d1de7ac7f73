"""golang/snappy's ``Writer`` (unbuffered, as nsqd makes it): its writes below.

Each ``Write`` is cut into chunks of at most 64 KiB; a chunk is sent
compressed when that saves at least an eighth, else as it is.  A compressed
chunk is one write below (header and data); an uncompressed one is two
writes, its 8-byte header, then its data; the stream identifier goes with the
first header.  Over TLS each write is a record of its own, so a client reads
the header of an uncompressed chunk (the ``OK`` of every answer) without its
data first: pynsq's ``SnappySocket`` closes the connection there.

The compressed bytes are cramjam's (Rust's ``snap``, same framing and the
same one-eighth rule); Go's encoder may compress a chunk to other bytes.
"""

from __future__ import annotations

from typing import Final

import cramjam

__all__ = ["SnappyWriter"]

_STREAM_IDENTIFIER: Final = b"\xff\x06\x00\x00sNaPpY"
_CHUNK_UNCOMPRESSED: Final = 0x01
_HEADER: Final = 8  # type, 3-byte length, 4-byte checksum


class SnappyWriter:
    """What golang/snappy's ``Writer`` writes below for each ``Write``."""

    def __init__(self) -> None:
        self._wrote_identifier = False

    def write(self, data: bytes, below: list[bytes]) -> None:
        if not data:
            return
        framed = bytes(cramjam.snappy.compress(data))
        prefix = b"" if self._wrote_identifier else _STREAM_IDENTIFIER
        self._wrote_identifier = True
        pos = len(_STREAM_IDENTIFIER)
        while pos < len(framed):
            end = pos + 4 + int.from_bytes(framed[pos + 1 : pos + 4], "little")
            if framed[pos] == _CHUNK_UNCOMPRESSED:
                below.append(prefix + framed[pos : pos + _HEADER])
                below.append(framed[pos + _HEADER : end])
            else:
                below.append(prefix + framed[pos:end])
            prefix = b""
            pos = end
