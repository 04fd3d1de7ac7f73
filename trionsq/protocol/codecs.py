"""Stream compression as NSQ negotiates it: raw deflate and snappy framing.

After IDENTIFY negotiates ``deflate`` or ``snappy``, everything after the server's
response (both directions) goes through a compressed stream.  These codecs are
sans-IO: bytes in, bytes out.  Decoders bound what they produce from one input,
so a small hostile input cannot inflate into unbounded memory: :meth:`decode`
refuses more than a fixed amount at once, and :meth:`decode_some` (what a client
reads with) produces at most what it is asked for, keeping the rest of the input
for the next call, so that a decompression bomb costs no more memory than its
compressed bytes and one read's worth of output.
"""

from __future__ import annotations

import zlib
from typing import Final, Protocol

import cramjam
import snappy

from .errors import CompressionError

__all__ = [
    "Encoder",
    "Decoder",
    "DeflateEncoder",
    "DeflateDecoder",
    "SnappyEncoder",
    "SnappyDecoder",
    "IdentityCodec",
]

# Largest output a decoder returns for one feed before it asks for a pause
# (well above any legal frame: nsqd's max body is 5 MiB).
_MAX_DECODED_PER_FEED: Final = 64 * 1024 * 1024


class Encoder(Protocol):
    def encode(self, data: bytes) -> bytes:
        """Compress ``data``; the result is decodable up to its last byte."""


class Decoder(Protocol):
    def decode(self, data: bytes) -> bytes:
        """Decompress what can be decompressed so far."""

    def decode_some(self, data: bytes, limit: int) -> bytes:
        """Take ``data`` and decompress at most ``limit`` bytes of what was
        taken so far; call again (``data`` empty) while :attr:`pending`."""

    @property
    def pending(self) -> bool:
        """Whether input taken may still give output without more data."""


class IdentityCodec:
    def __init__(self) -> None:
        self._rest = b""

    def encode(self, data: bytes) -> bytes:
        return data

    def decode(self, data: bytes) -> bytes:
        return data

    def decode_some(self, data: bytes, limit: int) -> bytes:
        data = self._rest + data if self._rest else data
        out, self._rest = data[:limit], data[limit:]
        return out

    @property
    def pending(self) -> bool:
        return bool(self._rest)


class DeflateEncoder:
    """Raw deflate (no zlib header), sync-flushed after every write, as Go's
    ``compress/flate`` writer that nsqd uses."""

    def __init__(self, level: int = 6) -> None:
        self._z = zlib.compressobj(level, zlib.DEFLATED, -15)

    def encode(self, data: bytes) -> bytes:
        return self._z.compress(data) + self._z.flush(zlib.Z_SYNC_FLUSH)


class DeflateDecoder:
    def __init__(self) -> None:
        self._z = zlib.decompressobj(-15)
        # Whether the last decode_some stopped at its limit: input (or output
        # zlib holds back, a match cut short) may be left.
        self._full = False

    def decode(self, data: bytes) -> bytes:
        if self._z.unconsumed_tail:
            raise CompressionError("decode() while decode_some() has input pending")
        out = self.decode_some(data, _MAX_DECODED_PER_FEED)
        if self._z.unconsumed_tail:
            raise CompressionError("deflate data expands beyond the allowed size")
        return out

    def decode_some(self, data: bytes, limit: int) -> bytes:
        """At most ``limit`` bytes of output; what ``data`` holds beyond them
        stays :attr:`pending` (``decode_some(b"", limit)`` goes on), so a
        reader takes a small input's large output a piece at a time."""
        tail = self._z.unconsumed_tail
        if tail:
            data = tail + data if data else tail
        try:
            out = self._z.decompress(data, limit)
        except zlib.error as exc:
            raise CompressionError(f"invalid deflate stream: {exc}") from None
        self._full = len(out) >= limit
        return out

    @property
    def pending(self) -> bool:
        """Input fed that :meth:`decode_some` has not decompressed yet, or
        output zlib may hold back (the last call stopped at its limit)."""
        return self._full or bool(self._z.unconsumed_tail)


_STREAM_IDENTIFIER: Final = b"\xff\x06\x00\x00sNaPpY"
_CHUNK_COMPRESSED: Final = 0x00
_CHUNK_UNCOMPRESSED: Final = 0x01
_CHUNK_PADDING: Final = 0xFE
_CHUNK_STREAM_ID: Final = 0xFF
# The framing format's limit on a chunk's uncompressed data.
_MAX_UNCOMPRESSED_CHUNK: Final = 65536
# Worst-case snappy output for 64 KiB of input (32 + n + n/6), with the CRC.
_MAX_COMPRESSED_CHUNK: Final = 4 + 32 + _MAX_UNCOMPRESSED_CHUNK + _MAX_UNCOMPRESSED_CHUNK // 6


class SnappyEncoder:
    """Snappy framing format (stream identifier, then CRC-checked chunks)."""

    def __init__(self) -> None:
        self._c = snappy.StreamCompressor()

    def encode(self, data: bytes) -> bytes:
        out = []
        # python-snappy emits one chunk per call; chunks hold at most 64 KiB.
        for start in range(0, len(data), _MAX_UNCOMPRESSED_CHUNK):
            out.append(self._c.add_chunk(data[start : start + _MAX_UNCOMPRESSED_CHUNK]))
        return b"".join(out)


class SnappyDecoder:
    """Incremental decoder of the snappy framing format.

    Chunks are split here; each whole chunk is decoded (and its CRC checked) by
    the snappy library.  A chunk announcing more than the format allows is
    refused as soon as its header is read, and skippable chunks are read past
    as they come, so the buffer never holds more than one chunk.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._seen_identifier = False
        # Bytes of a skippable chunk (or padding) still to read past.
        self._skip = 0

    def decode(self, data: bytes) -> bytes:
        return self.decode_some(data, -1)

    def decode_some(self, data: bytes, limit: int) -> bytes:
        """As :meth:`Decoder.decode_some`; a ``limit`` below 0: no limit."""
        if self._skip and data:
            skipped = min(self._skip, len(data))
            self._skip -= skipped
            data = data[skipped:]
        buf = self._buffer
        buf += data
        out: list[bytes] = []
        produced = 0
        pos = 0
        while len(buf) - pos >= 4 and (limit < 0 or produced < limit):
            chunk_type = buf[pos]
            length = int.from_bytes(buf[pos + 1 : pos + 4], "little")
            # A header is judged before its body is waited for (as golang/snappy
            # does): garbage ends the stream at once, not after megabytes.
            self._check_header(chunk_type, length)
            if chunk_type >= 0x80 and chunk_type != _CHUNK_STREAM_ID:
                # Skippable (0x80-0xfd) or padding (0xfe): read past, not kept.
                available = len(buf) - pos - 4
                if available < length:
                    self._skip = length - available
                    pos = len(buf)
                    break
                pos += 4 + length
                continue
            if len(buf) - pos - 4 < length:
                break
            chunk = bytes(buf[pos : pos + 4 + length])
            pos += 4 + length
            if chunk_type == _CHUNK_STREAM_ID:
                if chunk != _STREAM_IDENTIFIER:
                    raise CompressionError("invalid snappy stream identifier")
                self._seen_identifier = True
                continue
            decoded = self._decode_chunk(chunk)
            out.append(decoded)
            produced += len(decoded)
        if pos:
            del buf[:pos]
        return b"".join(out)

    def _check_header(self, chunk_type: int, length: int) -> None:
        if chunk_type == _CHUNK_STREAM_ID:
            if length != len(_STREAM_IDENTIFIER) - 4:
                raise CompressionError("invalid snappy stream identifier")
        elif not self._seen_identifier:
            raise CompressionError("snappy stream does not start with its identifier")
        elif chunk_type in (_CHUNK_COMPRESSED, _CHUNK_UNCOMPRESSED):
            if length < 4:
                raise CompressionError("snappy chunk too short for its checksum")
            if length > _MAX_COMPRESSED_CHUNK:
                raise CompressionError("snappy chunk longer than the framing format allows")
        elif 0x02 <= chunk_type <= 0x7F:
            raise CompressionError(f"unskippable snappy chunk type {chunk_type:#x}")

    @property
    def pending(self) -> bool:
        """Whether a whole chunk is buffered, not decoded yet."""
        buf = self._buffer
        if len(buf) < 4:
            return False
        return len(buf) - 4 >= int.from_bytes(buf[1:4], "little")

    @staticmethod
    def _decode_chunk(chunk: bytes) -> bytes:
        if len(chunk) > 4 + _MAX_COMPRESSED_CHUNK:
            raise CompressionError("snappy chunk longer than the framing format allows")
        try:
            if chunk[0] == _CHUNK_COMPRESSED:
                # Refuse before decoding if the chunk claims too much data.
                claimed = cramjam.snappy.decompress_raw_len(chunk[8:])
                if claimed > _MAX_UNCOMPRESSED_CHUNK:
                    raise CompressionError("snappy chunk larger than 65536 bytes uncompressed")
            decoded = bytes(cramjam.snappy.decompress(_STREAM_IDENTIFIER + chunk))
        except CompressionError:
            raise
        except Exception as exc:  # cramjam raises its own DecompressionError
            raise CompressionError(f"invalid snappy chunk: {exc}") from None
        if len(decoded) > _MAX_UNCOMPRESSED_CHUNK:
            raise CompressionError("snappy chunk larger than 65536 bytes uncompressed")
        return decoded
