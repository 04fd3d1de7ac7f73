"""A TCP session that records what nsqd answers, deterministically.

A :class:`Session` is one connection to the nsqd under test.  Everything it reads
is appended to the target's shared :class:`Transcript`, one entry a frame, so a
scenario's outcome is the transcript of all its connections, in the order the
scenario read them.  Entries are plain tuples, easy to compare and to read in a
diff::

    ("c", "OK")                         # a response
    ("c", "E_INVALID invalid command X")  # an error frame
    ("c", "json", {...}, '{...}')       # a JSON response (IDENTIFY, AUTH), parsed and raw
    ("c", "msg", "<ID1>", 1, b"body")   # a message: alias of its id, attempts, body
    ("c", "heartbeat")
    ("c", "closed")                     # the server closed the connection

Reading never relies on time passing: every read waits for a known number of
frames, or for the connection to close, or for the answer to a command with a
known answer (:meth:`Session.sync`), always under ``trio.fail_after``.  So a
transcript does not depend on how loaded the machine is.

Message ids are recorded through the target's normalizer, which aliases each new
id to ``<ID1>``, ``<ID2>``... in the order first seen (ids are random-ish and
differ between fakensq and nsqd; their order of appearance does not).
"""

from __future__ import annotations

import json
import ssl
import struct
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import trio

from trionsq.protocol import commands as cmds
from trionsq.protocol.codecs import (
    Decoder,
    DeflateDecoder,
    DeflateEncoder,
    Encoder,
    SnappyDecoder,
    SnappyEncoder,
)
from trionsq.protocol.frames import Error, Frame, FrameParser, MessageFrame, Response
from trionsq.transport import parse_address

if TYPE_CHECKING:
    from .normalize import Normalizer

__all__ = ["Entry", "Session", "Transcript", "READ_TIMEOUT", "SYNC_TOPIC"]

#: How long one read may wait for its frames (a loaded machine is slow; nsqd is not).
READ_TIMEOUT = 15.0

#: The topic :meth:`Session.sync` publishes to (its ``OK`` is the sync point).
SYNC_TOPIC = "sync"

Entry = tuple[Any, ...]


class Transcript(list[Entry]):
    """Everything read on a target's connections, in the order it was read."""

    def of(self, session: str) -> list[Entry]:
        """The entries of one session, without the session name."""
        return [e[1:] for e in self if e[0] == session]


class Session:
    """One V2 connection, recording every frame it reads into ``transcript``."""

    def __init__(
        self,
        name: str,
        stream: trio.abc.Stream,
        transcript: Transcript,
        normalizer: Normalizer,
    ) -> None:
        self.name = name
        self.stream: trio.abc.Stream = stream
        self.transcript = transcript
        self.normalizer = normalizer
        # Decoded bytes not yet split into frames: frames are taken one at a
        # time, so that when IDENTIFY switches on compression, the bytes after
        # its answer are still here to be decoded by the new codec.
        self._buffer = bytearray()
        self._encoder: Encoder | None = None
        self._decoder: Decoder | None = None
        self.closed = False
        #: This end's "host:port" (nsqd's remote_address for the client).
        self.local_address = ""
        #: Message frames read, raw (their real ids: for FIN, REQ, TOUCH).
        self.messages: list[MessageFrame] = []

    @classmethod
    async def connect(
        cls,
        address: str,
        name: str,
        transcript: Transcript,
        normalizer: Normalizer,
        *,
        magic: bool = True,
    ) -> Session:
        host, port = parse_address(address)
        stream = await trio.open_tcp_stream(host, port)
        session = cls(name, stream, transcript, normalizer)
        sock = stream.socket
        local = sock.getsockname()
        # The client's own address shows in /stats (remote_address, client_id).
        session.local_address = f"{local[0]}:{local[1]}"
        normalizer.alias(session.local_address, f"<{name}:addr>")
        if magic:
            await session.send(cmds.MAGIC_V2)
        return session

    # --- sending ---

    async def send(self, *parts: bytes) -> None:
        """Send bytes as they are (compressed once compression is negotiated).

        A send to a connection the server has already closed is not an error:
        nsqd may close at any point after an error frame, and the scenario
        then reads the ``closed`` entry.
        """
        data = b"".join(parts)
        if self._encoder is not None:
            data = self._encoder.encode(data)
        try:
            await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError):
            pass

    # --- reading ---

    async def _fill(self) -> bool:
        """Read more bytes; False at EOF (or a reset, which is the same to a client)."""
        try:
            data = await self.stream.receive_some(256 * 1024)
        except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError):
            data = b""
        if not data:
            return False
        raw = bytes(data)
        if self._decoder is not None:
            raw = self._decoder.decode(raw)
        self._buffer += raw
        return True

    def _take_frame(self) -> Frame | None:
        if len(self._buffer) < 4:
            return None
        (size,) = struct.unpack_from(">l", self._buffer)
        if len(self._buffer) < 4 + size:
            return None
        data = bytes(self._buffer[: 4 + size])
        del self._buffer[: 4 + size]
        (frame,) = FrameParser(max_frame_size=max(size, 4)).feed(data)
        return frame

    async def _next_frame(self) -> Frame | None:
        while True:
            frame = self._take_frame()
            if frame is not None:
                return frame
            if self.closed or not await self._fill():
                return None

    def _switch_codec(self, encoder: Encoder, decoder: Decoder) -> None:
        # What arrived after the answer to IDENTIFY is already compressed.
        pending = bytes(self._buffer)
        self._buffer.clear()
        self._encoder, self._decoder = encoder, decoder
        if pending:
            self._buffer += decoder.decode(pending)

    def _record(self, frame: Frame | None) -> Entry:
        entry: Entry
        if frame is None:
            entry = (self.name, "closed")
            self.closed = True
        elif isinstance(frame, MessageFrame):
            self.messages.append(frame)
            alias = self.normalizer.message_id(frame.id)
            entry = (self.name, "msg", alias, frame.attempts, frame.body)
        elif isinstance(frame, Error):
            entry = (self.name, _text(frame.data))
        elif frame.is_heartbeat:
            entry = (self.name, "heartbeat")
        elif frame.data[:1] == b"{":
            # Parsed (readable diffs, normalizable keys) and as sent (Go's
            # encoding: key order, escapes such as \u0026).
            entry = (self.name, "json", json.loads(frame.data), _text(frame.data))
        else:
            entry = (self.name, _text(frame.data))
        self.transcript.append(entry)
        return entry

    async def read(self, n: int = 1, *, heartbeats: bool = True) -> list[Entry]:
        """Read ``n`` frames (fewer if the connection closes: then ``closed``).

        With ``heartbeats=False`` heartbeats are skipped: not counted, not recorded
        (for scenarios that run long enough to see some at varying points).
        """
        entries: list[Entry] = []
        if self.closed:
            return entries
        with trio.fail_after(READ_TIMEOUT):
            while len(entries) < n:
                frame = await self._next_frame()
                if not heartbeats and isinstance(frame, Response) and frame.is_heartbeat:
                    continue
                entries.append(self._record(frame))
                if frame is None:
                    break
        return entries

    async def read_until_closed(self, *, heartbeats: bool = True) -> list[Entry]:
        """Every frame until the server closes the connection, then ``closed``."""
        entries: list[Entry] = []
        with trio.fail_after(READ_TIMEOUT):
            while not self.closed:
                frame = await self._next_frame()
                if not heartbeats and isinstance(frame, Response) and frame.is_heartbeat:
                    continue
                entries.append(self._record(frame))
        return entries

    async def read_messages(self, n: int, *, heartbeats: bool = False) -> list[MessageFrame]:
        """Read until ``n`` message frames arrived (recording everything read)."""
        start = len(self.messages)
        with trio.fail_after(READ_TIMEOUT):
            while len(self.messages) - start < n and not self.closed:
                await self.read(1, heartbeats=heartbeats)
        return self.messages[start:]

    async def read_answer(self) -> tuple[Entry, int]:
        """Read up to the answer to the command just sent (the next frame that
        is not a message), and record it before the messages read on the way.

        nsqd's IOLoop answers while its messagePump (another goroutine) hands
        out messages, so a message can overtake the answer that made it
        available, or that merely came later; the transcript keeps the two
        apart in one order.  Returns the answer and how many messages came
        before it (0 where the answer won: fakensq's order is always one of
        nsqd's, checked by the scenarios that care).
        """
        start = len(self.transcript)
        with trio.fail_after(READ_TIMEOUT):
            while True:
                (entry,) = await self.read(1)
                if entry[1] != "msg":
                    break
        overtaken = len(self.transcript) - start - 1
        if overtaken:
            del self.transcript[-1]
            self.transcript.insert(start, entry)
        return entry, overtaken

    async def sync(self, topic: str = SYNC_TOPIC) -> list[Entry]:
        """A known answer as a sync point: ``PUB sync`` and read until its ``OK``.

        nsqd answers commands in order, so every answer to what was sent before
        is read (and recorded) by then.  The ``OK`` itself is recorded as
        ``("sync",)``.  Messages nsqd delivers on its own (not answers) may
        still arrive after it: read those by count.
        """
        await self.send_sync(topic)
        return await self.read_sync()

    async def send_sync(self, topic: str = SYNC_TOPIC) -> None:
        """The first half of :meth:`sync` (to sync several sessions at once)."""
        await self.send(cmds.pub(topic, b"sync"))

    async def read_sync(self) -> list[Entry]:
        """The second half of :meth:`sync`: read until the sync point."""
        entries: list[Entry] = []
        with trio.fail_after(READ_TIMEOUT):
            while True:
                frame = await self._next_frame()
                if isinstance(frame, Response) and frame.data == b"OK":
                    entry = (self.name, "sync")
                    self.transcript.append(entry)
                    entries.append(entry)
                    return entries
                entries.append(self._record(frame))
                if frame is None:
                    return entries

    async def call(self, *parts: bytes, n: int = 1) -> list[Entry]:
        """Send, then read ``n`` frames."""
        await self.send(*parts)
        return await self.read(n)

    # --- the handshake ---

    async def identify(self, *, ssl_context: ssl.SSLContext | None = None, **fields: Any) -> Entry:
        """IDENTIFY with ``fields``; follows the negotiated upgrades (TLS, snappy,
        deflate) as a client must, recording the JSON answer and each ``OK``.

        ``ssl_context`` is the client's TLS context, used when the answer says
        ``tls_v1``.
        """
        await self.send(cmds.identify(fields))
        (entry,) = await self.read(1)
        if len(entry) < 3 or entry[1] != "json":
            return entry
        doc = entry[2]
        if doc.get("tls_v1"):
            assert ssl_context is not None, "the server offers TLS: give ssl_context"
            assert not self._buffer, "nsqd sends nothing before the TLS handshake"
            tls = trio.SSLStream(self.stream, ssl_context, server_hostname="127.0.0.1")
            with trio.fail_after(READ_TIMEOUT):
                await tls.do_handshake()
            self.stream = tls
            await self.read(1)
        if doc.get("snappy"):
            self._switch_codec(SnappyEncoder(), SnappyDecoder())
            await self.read(1)
        elif doc.get("deflate"):
            self._switch_codec(DeflateEncoder(doc["deflate_level"]), DeflateDecoder())
            await self.read(1)
        return entry

    async def sub(self, topic: str, channel: str, rdy: int | None = None) -> list[Entry]:
        """SUB (reading its answer), then RDY if given (RDY has no answer)."""
        entries = await self.call(cmds.sub(topic, channel))
        if rdy is not None:
            await self.send(cmds.rdy(rdy))
        return entries

    async def close(self) -> None:
        """Close from the client side (nothing recorded)."""
        self.closed = True
        await trio.aclose_forcefully(self.stream)


def _text(data: bytes) -> str:
    return data.decode("utf-8", "backslashreplace")


def bodies(entries: Iterable[Entry]) -> list[bytes]:
    """The bodies of the message entries among ``entries``."""
    return [e[4] for e in entries if len(e) > 1 and e[1] == "msg"]
