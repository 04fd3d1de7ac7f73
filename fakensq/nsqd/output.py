"""One client's output: nsqd's buffered writer and its messagePump's flushes
and heartbeats.

Answers and message frames join one buffer, in the order they are made (nsqd's
one ``bufio.Writer``): an answer goes out at once, with whatever is buffered
before it; message frames wait for a flush, which comes when the buffer fills,
when the client cannot take more messages, or at the output buffer timeout.
Heartbeats are sent every heartbeat interval.  Every write has nsqd's write
deadline (the heartbeat interval).  After IDENTIFY upgraded the connection,
what is written goes through nsqd's writer stack (:class:`~.wire.ClientWire`:
TLS records, compressed chunks).

The connection (:mod:`fakensq.nsqd.client`) owns one and reads and executes
commands; the :class:`OutputOwner` protocol is what the output asks of it.
"""

from __future__ import annotations

import logging
import math
import os
import ssl
from typing import TYPE_CHECKING, Final, Protocol

import trio

from trionsq.protocol.errors import CompressionError
from trionsq.protocol.frames import (
    FRAME_TYPE_MESSAGE,
    HEARTBEAT,
    MESSAGE_FRAME_HEADER,
    SIZE,
    encode_response,
)

from ..golang.flate import FlateWriter
from ..golang.snappy import SnappyWriter
from ..golang.tlsrecords import RecordSizer
from .wire import ClientWire

if TYPE_CHECKING:
    from .message import Message

__all__ = ["ClientOutput", "OutputOwner", "STREAM_ERRORS"]

log = logging.getLogger("fakensq.nsqd.client")

#: What a write (or a read) on a client's stream raises when the stream ends.
STREAM_ERRORS: Final = (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError)

# A message frame's head (fakensq's ids are always 16 bytes), and what its
# size field counts beyond the body (the frame type and the message header).
_HEAD_SIZE: Final = MESSAGE_FRAME_HEADER.size
_SIZE_BEYOND_BODY: Final = MESSAGE_FRAME_HEADER.size - SIZE.size

# The most one write joins of the output (beyond one frame): what is buffered
# for a client that does not read is referenced, not copied, past that.
_WRITE_CHUNK: Final = 256 * 1024


class OutputOwner(Protocol):
    """What a client's output asks of its connection."""

    #: the stream written to (TLS after an upgrade)
    stream: trio.abc.Stream
    #: also the write deadline; 0: none
    heartbeat_interval: float
    output_buffer_size: int
    output_buffer_timeout: float
    remote_address: str

    def ready(self) -> bool:
        """nsqd's IsReadyForMessages, whatever is being written."""
        ...

    def is_ready_for_messages(self) -> bool:
        """Whether a channel may hand the client a message now."""
        ...

    def deliver_pending(self) -> None:
        """Hand out the messages the commands executed so far made room for
        (their frames go before whatever is sent next)."""
        ...

    def redispatch(self) -> None:
        """A write ended that turned a channel away: let it hand out again."""
        ...

    def close(self) -> None: ...


class ClientOutput:
    """nsqd's writer to one client (see the module's docstring)."""

    def __init__(self, owner: OutputOwner) -> None:
        self.owner = owner
        #: held for a write and whatever must follow it at once (IDENTIFY's upgrade)
        self.lock = trio.Lock()
        # The output, in the order frames were made.
        self._frames: list[bytes] = []
        self._size = 0
        #: answers buffered that wait for the end of the read
        self.answered = False
        #: after an upgrade: nsqd's writer stack; over TLS, its record sizes
        self.wire: ClientWire | None = None
        self.records: RecordSizer | None = None
        self._flush_now = False
        self._flush_deadline = math.inf
        self._pump_flush = False
        self._next_heartbeat = math.inf
        #: a write in progress, and a channel turned away meanwhile
        self.writing = False
        self.starved = False
        self._wake = trio.Event()

    # --- what the connection buffers ---

    def answer(self, frame: bytes) -> None:
        """Buffer an answer; it goes out at the end of the read, or sooner with
        any other frame (pipelined publishes get one write, not one each).
        (The owner delivers what is pending first: this is a PUB's hot path.)"""
        self._frames.append(frame)
        self.answered = True

    def add_messages(self, batch: list[Message]) -> None:
        """Buffer message frames; flush as nsqd's messagePump would."""
        # Each frame as its head and the body itself: no copy of a body until
        # the writer joins a piece of the output (at most _WRITE_CHUNK bytes
        # beyond one frame), however many messages RDY lets through.
        pack = MESSAGE_FRAME_HEADER.pack
        add = self._frames.append
        size = 0
        for m in batch:
            body = m.body
            add(
                pack(
                    len(body) + _SIZE_BEYOND_BODY, FRAME_TYPE_MESSAGE, m.timestamp, m.attempts, m.id
                )
            )
            add(body)
            size += len(body)
        self._size += size + _HEAD_SIZE * len(batch)
        owner = self.owner
        if self._size + self._wire_buffered() >= owner.output_buffer_size or (
            not owner.is_ready_for_messages()
        ):
            if not self._flush_now:
                self._flush_now = True
                self._wake.set()
        elif self._flush_deadline == math.inf and owner.output_buffer_timeout > 0:
            self._flush_deadline = trio.current_time() + owner.output_buffer_timeout
            self._wake.set()

    def ready_changed(self) -> None:
        """nsqd's messagePump flushes as soon as the client cannot take more."""
        if (self._frames or self._wire_unflushed()) and not self.owner.is_ready_for_messages():
            self._flush_now = True
            self._wake.set()

    def pump_wakes(self) -> None:
        """nsqd's messagePump woke (IDENTIFY, SUB, RDY, a heartbeat sent): it
        flushes whenever the client cannot take messages, and with deflate
        even an empty flush writes (an empty stored block, 5 bytes)."""
        wire = self.wire
        if wire is not None and wire.flushes_empty and not self.owner.ready():
            self._pump_flush = True
            self._wake.set()

    def reset_heartbeat(self) -> None:
        """The next heartbeat a heartbeat interval from now (none if 0)."""
        hb = self.owner.heartbeat_interval
        self._next_heartbeat = trio.current_time() + hb if hb > 0 else math.inf
        self._wake.set()

    def upgrade(
        self, codec: SnappyWriter | FlateWriter | None = None, records: RecordSizer | None = None
    ) -> None:
        """Write through nsqd's writer stack from now on: TLS (``records``),
        then a compression ``codec`` over it."""
        if records is not None:
            self.records = records
        self.wire = ClientWire(self.owner.output_buffer_size, codec, self.records)

    # --- writing ---

    async def send(self, frame: bytes) -> None:
        """Send ``frame`` now, after everything before it (one stream, in order)."""
        self.owner.deliver_pending()
        async with self.lock:
            while (chunk := self._take_chunk()) is not None:
                await self.write(chunk, flush=False)
            await self.write(self.take_buffered() + frame if self._frames else frame)

    async def send_through(self, frame: bytes) -> None:
        """Send ``frame`` after what is buffered (the caller holds the lock)."""
        await self.write(self.take_buffered() + frame)

    async def write(self, data: bytes, *, flush: bool = True) -> None:
        """Send frames (the caller holds the lock), with nsqd's write deadline.

        ``flush=False``: as nsqd's buffer, full, writes itself out: what does
        not fill it stays there (upgraded connections only)."""
        owner = self.owner
        wire = self.wire
        self.writing = True
        try:
            if owner.heartbeat_interval > 0:
                with trio.fail_after(owner.heartbeat_interval):
                    if wire is None:
                        await owner.stream.send_all(data)
                    else:
                        await self._send_writes(wire, wire.write(data, flush=flush))
            elif wire is None:
                await owner.stream.send_all(data)
            else:
                await self._send_writes(wire, wire.write(data, flush=flush))
        finally:
            self.writing = False
        if self.starved:
            self.starved = False
            owner.redispatch()

    async def _send_writes(self, wire: ClientWire, writes: list[bytes]) -> None:
        # Each of nsqd's writes is a send of its own: over TLS one record, over
        # TCP (no Nagle, as Go's sockets) one segment, so a client reading as
        # they come meets the same boundaries as on nsqd (compress/flate's
        # sync marker alone, golang/snappy's chunk header before its data).
        stream = self.owner.stream
        if not isinstance(stream, trio.SocketStream):  # (TLS; a test's wrapper)
            for write in writes:
                await stream.send_all(write)
            return
        # A write() a piece, as Go's: send_all's scheduling once, not per piece
        # (compress/flate's pieces are small and many).  What the socket does
        # not take at once, or refuses, goes through send_all (its waiting,
        # its errors).
        fd = stream.socket.fileno()
        waited = False
        for write in writes:
            try:
                sent = os.write(fd, write)
            except OSError:
                sent = 0
            if sent < len(write):
                await stream.send_all(write[sent:])
                waited = True
        if not waited:
            await trio.lowlevel.checkpoint()

    def _wire_buffered(self) -> int:
        return 0 if self.wire is None else self.wire.buffered

    def _wire_unflushed(self) -> bool:
        return self.wire is not None and self.wire.unflushed

    def _take_chunk(self) -> bytes | None:
        """The output's first _WRITE_CHUNK bytes (or a little more: whole
        items), when more than that is buffered; else None (the rest goes in
        one piece, with what follows it)."""
        out = self._frames
        total = 0
        for n, part in enumerate(out, 1):
            total += len(part)
            if total >= _WRITE_CHUNK:
                if n == len(out):
                    return None
                data = b"".join(out[:n])
                del out[:n]
                self._size = max(0, self._size - total)
                return data
        return None

    def take_buffered(self) -> bytes:
        """Everything buffered, taken out (the flush requests with it)."""
        data = b"".join(self._frames)
        self._frames.clear()
        self._size = 0
        self.answered = False
        self._flush_now = False
        self._flush_deadline = math.inf
        return data

    async def _flush(self, *, empty: bool = False) -> None:
        """Send what is buffered: all of it, or, when only the buffer's size
        called for it (an upgraded connection, its client still ready, before
        the output buffer timeout), what nsqd's full buffer writes out.
        ``empty``: flush even if nothing is buffered (the pump's flush)."""
        self._pump_flush = False
        while (chunk := self._take_chunk()) is not None:
            await self.write(chunk, flush=False)
        now = trio.current_time()
        deadline = self._flush_deadline
        full_only = not empty and self.wire is not None and now < deadline and self.owner.ready()
        if self._frames or (not full_only and (empty or self._wire_unflushed())):
            # (take_buffered clears the flush requests before the write: one
            # made while it writes stays)
            await self.write(self.take_buffered(), flush=not full_only)
        else:
            self._flush_now = False
        if full_only and self._wire_unflushed() and self._flush_deadline == math.inf:
            # The rest goes at the output buffer timeout.
            timeout = self.owner.output_buffer_timeout
            if deadline == math.inf and timeout > 0:
                deadline = now + timeout
            self._flush_deadline = deadline

    async def run(self) -> None:
        """The writer task: flushes and heartbeats until the connection ends
        (a write that fails closes it)."""
        owner = self.owner
        try:
            while True:
                deadline = min(self._next_heartbeat, self._flush_deadline)
                if self._flush_now:
                    deadline = -math.inf
                with trio.move_on_at(deadline):
                    await self._wake.wait()
                self._wake = trio.Event()
                now = trio.current_time()
                pending = self._frames or self._wire_unflushed()
                if self._pump_flush or (
                    pending and (self._flush_now or now >= self._flush_deadline)
                ):
                    async with self.lock:
                        await self._flush(empty=self._pump_flush)
                elif not pending:
                    self._flush_now = False
                    self._flush_deadline = math.inf
                if now >= self._next_heartbeat:
                    self._next_heartbeat = now + owner.heartbeat_interval
                    await self.send(encode_response(HEARTBEAT))
                    self.pump_wakes()
        except (*STREAM_ERRORS, trio.TooSlowError, CompressionError) as exc:
            log.debug("client %s: write failed (%r)", owner.remote_address, exc)
            owner.close()
        except Exception:
            log.exception("client %s: internal error in the writer", owner.remote_address)
            owner.close()
