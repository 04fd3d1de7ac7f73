"""Frames (server to client) and the message layout, encoded and parsed.

Every frame nsqd sends is ``[4-byte size][4-byte type][data]`` (big-endian), the
size covering the type and the data.  A message frame's data is
``[8-byte timestamp ns][2-byte attempts][16-byte id][body]``.

The layouts are declared here once (:data:`SIZE`, :data:`FRAME_HEADER`,
:data:`MESSAGE_HEADER`, :data:`MESSAGE_FRAME_HEADER`) for every side that
reads or writes them: the client, fakensq's nsqd (its frames and its disk
queues, which keep a message as its frame's data), nsqlookupd's answers and
the fault proxy.

:class:`FrameParser` is incremental and sans-IO: feed it bytes as they arrive, in
any chunking, and it returns the whole frames they complete.  It never holds more
than one frame's worth of bytes: a frame announcing more than ``max_frame_size``
raises :class:`~trionsq.protocol.errors.FrameTooLarge` before anything is buffered,
or, for a message frame and a parser made with ``skip_oversized``, comes out as an
:class:`OversizedMessage` (its id and size, so that the client can answer it)
while its body is read past without being kept.
It is on every message's path, so it is written for speed: one ``unpack`` for a
message frame's size, type and header, one copy (its body), no object but the
message itself, which the caller may make (``message_factory``).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeAlias, TypeVar, overload

from .errors import FrameTooLarge, InvalidFrame, NSQErrorResponse, parse_error_frame

__all__ = [
    "FRAME_TYPE_RESPONSE",
    "FRAME_TYPE_ERROR",
    "FRAME_TYPE_MESSAGE",
    "MSG_ID_LENGTH",
    "MESSAGE_HEADER_SIZE",
    "HEARTBEAT",
    "OK",
    "CLOSE_WAIT",
    "DEFAULT_MAX_FRAME_SIZE",
    "Response",
    "Error",
    "MessageFrame",
    "OversizedMessage",
    "Frame",
    "encode_frame",
    "encode_response",
    "encode_error",
    "encode_message",
    "message_frame_header",
    "decode_message",
    "FrameParser",
    "MessageFactory",
    "SIZE",
    "FRAME_HEADER",
    "MESSAGE_HEADER",
    "MESSAGE_FRAME_HEADER",
    "sized",
]

FRAME_TYPE_RESPONSE: Final = 0
FRAME_TYPE_ERROR: Final = 1
FRAME_TYPE_MESSAGE: Final = 2

MSG_ID_LENGTH: Final = 16
MESSAGE_HEADER_SIZE: Final = 8 + 2 + MSG_ID_LENGTH

HEARTBEAT: Final = b"_heartbeat_"
OK: Final = b"OK"
CLOSE_WAIT: Final = b"CLOSE_WAIT"

#: The largest frame a client takes whole: a memory bound (a connection holds at
#: most one frame being read, twice that while it completes), far above what
#: nsqds are usually run with (--max-msg-size defaults to 1 MiB; nsqd v1.3.0 does
#: not say its own in IDENTIFY's answer), so that whatever message nsqd accepted
#: is received, as go-nsq (which has no limit) receives it.
DEFAULT_MAX_FRAME_SIZE: Final = 64 * 1024 * 1024 + MESSAGE_HEADER_SIZE + 4

#: The 4-byte size before what it measures, big-endian, signed (nsqd and
#: nsqlookupd read it as an int32): of a frame (its type and data), of a
#: command's body, of an nsqlookupd answer.
SIZE: Final = struct.Struct(">l")
#: A frame's head: its size, then its type.
FRAME_HEADER: Final = struct.Struct(">lL")
#: A message's head, before its body: nanosecond timestamp, attempts, id (as a
#: message frame's data holds it, and as nsqd's Message.WriteTo writes it to a
#: disk queue).
MESSAGE_HEADER: Final = struct.Struct(">qH16s")
#: A message frame's head: FRAME_HEADER then MESSAGE_HEADER (34 bytes).
MESSAGE_FRAME_HEADER: Final = struct.Struct(">lLqH16s")

_MESSAGE_FRAME_HEADER_SIZE: Final = MESSAGE_FRAME_HEADER.size  # 34
#: the smallest size field of a message frame: type, header, empty body
_MIN_MESSAGE_SIZE: Final = 4 + MESSAGE_HEADER_SIZE

M = TypeVar("M")


@dataclass(frozen=True, slots=True)
class Response:
    """A response frame: ``OK``, ``_heartbeat_``, ``CLOSE_WAIT`` or JSON."""

    data: bytes

    @property
    def is_heartbeat(self) -> bool:
        return self.data == HEARTBEAT


@dataclass(frozen=True, slots=True)
class Error:
    """An error frame; ``error`` is the typed exception it stands for."""

    data: bytes

    @property
    def error(self) -> NSQErrorResponse:
        return parse_error_frame(self.data)


@dataclass(frozen=True, slots=True)
class MessageFrame:
    """A message as it travels: nanosecond timestamp, attempts, hex id, body."""

    timestamp: int
    attempts: int
    id: bytes
    body: bytes


@dataclass(frozen=True, slots=True)
class OversizedMessage:
    """A message frame larger than the parser's ``max_frame_size``: its header,
    and ``size``, its body's length; the body itself is read past, never kept
    (see :class:`FrameParser`'s ``skip_oversized``)."""

    timestamp: int
    attempts: int
    id: bytes
    size: int


Frame = Response | Error | MessageFrame

#: A frame whose first part completes a buffered frame at least this large is
#: taken out of the buffer in place, not joined with the read (a copy of it).
_LARGE_FRAME: Final = 256 * 1024


def sized(data: bytes) -> bytes:
    """``data`` after its :data:`SIZE` (a command's body, an nsqlookupd answer)."""
    return SIZE.pack(len(data)) + data


def encode_frame(frame_type: int, data: bytes) -> bytes:
    return FRAME_HEADER.pack(len(data) + 4, frame_type) + data


def encode_response(data: bytes) -> bytes:
    return encode_frame(FRAME_TYPE_RESPONSE, data)


def encode_error(error: NSQErrorResponse | bytes) -> bytes:
    data = error if isinstance(error, bytes) else error.to_bytes()
    return encode_frame(FRAME_TYPE_ERROR, data)


def message_frame_header(timestamp: int, attempts: int, msg_id: bytes, body_len: int) -> bytes:
    """The 30 bytes before a message body in its frame (lets callers avoid copying)."""
    if len(msg_id) != MSG_ID_LENGTH:
        raise ValueError(f"message id must be {MSG_ID_LENGTH} bytes, got {len(msg_id)}")
    return MESSAGE_FRAME_HEADER.pack(
        body_len + MESSAGE_HEADER_SIZE + 4, FRAME_TYPE_MESSAGE, timestamp, attempts, msg_id
    )


def encode_message(timestamp: int, attempts: int, msg_id: bytes, body: bytes) -> bytes:
    """A whole message frame."""
    return message_frame_header(timestamp, attempts, msg_id, len(body)) + body


def decode_message(data: bytes) -> MessageFrame:
    """Decode a message frame's data (everything after the frame type)."""
    if len(data) < MESSAGE_HEADER_SIZE:
        raise InvalidFrame(f"message frame too short ({len(data)} < {MESSAGE_HEADER_SIZE} bytes)")
    timestamp, attempts, msg_id = MESSAGE_HEADER.unpack_from(data)
    return MessageFrame(timestamp, attempts, msg_id, data[MESSAGE_HEADER_SIZE:])


#: Makes a message object from a message frame's fields: ``(timestamp,
#: attempts, id, body)``, as :class:`MessageFrame` takes them.
MessageFactory: TypeAlias = Callable[[int, int, bytes, bytes], M]


class FrameParser(Generic[M]):
    """Incremental frame parser for the client side of a connection.

    Message frames come out as :class:`MessageFrame`, or as whatever
    ``message_factory(timestamp, attempts, id, body)`` makes: a client can build
    its own message objects directly, without an intermediate one per message.
    """

    @overload
    def __init__(
        self: FrameParser[MessageFrame],
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        *,
        skip_oversized: bool = False,
    ) -> None: ...

    @overload
    def __init__(
        self,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        *,
        message_factory: MessageFactory[M],
        skip_oversized: bool = False,
    ) -> None: ...

    def __init__(
        self,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        *,
        message_factory: MessageFactory[Any] | None = None,
        skip_oversized: bool = False,
    ) -> None:
        if max_frame_size < 4:
            raise ValueError("max_frame_size must be at least 4")
        self.max_frame_size = max_frame_size
        #: a message frame above ``max_frame_size`` comes out as an
        #: :class:`OversizedMessage` (its body read past, not kept) rather
        #: than raising :class:`FrameTooLarge`: a consumer can then answer it
        #: and its connection goes on
        self.skip_oversized = skip_oversized
        # Bytes of an oversized message's body still to read past.
        self._skip = 0
        self._make: MessageFactory[Any] = (
            MessageFrame if message_factory is None else message_factory
        )
        # Bytes of a frame not complete yet, and how many the first frame in
        # them needs (its size once its header is there): until that many are
        # there, a feed only appends (large frames arrive in many reads).
        self._rest = bytearray()
        self._need = 4
        #: how many of the frames the last :meth:`feed` returned are not
        #: messages (0: the whole list is messages, in order)
        self.others = 0

    @property
    def buffered(self) -> int:
        """Bytes of a frame not complete yet: held, or (an oversized
        message's) still to read past."""
        return len(self._rest) + self._skip

    def take_buffer(self) -> bytes:
        """Remove and return the bytes not parsed yet (for a switch to
        compression: they belong to the compressed stream)."""
        data = bytes(self._rest)
        self._rest = bytearray()
        self._need = 4
        return data

    def feed(
        self, data: bytes | bytearray | memoryview
    ) -> list[Response | Error | OversizedMessage | M]:
        """Add ``data`` and return every frame it completes, in order.

        Raises :class:`InvalidFrame` or :class:`FrameTooLarge` on bytes that break
        the framing; the parser is unusable afterwards (the stream is lost).
        """
        if self._skip:
            # Within an oversized message's body: read past it.
            if len(data) <= self._skip:
                self._skip -= len(data)
                self.others = 0
                return []
            data = bytes(memoryview(data)[self._skip :])
            self._skip = 0
        frames: list[Response | Error | OversizedMessage | M] = []
        others = 0
        rest = self._rest
        if rest:
            if len(rest) + len(data) < self._need:
                rest += data
                self.others = 0
                return []
            if self._need >= _LARGE_FRAME:
                # A large frame completes: taken out of the buffer as it is
                # (joining the buffer with the read would copy all of it).
                rest += data
                view = memoryview(rest)
                try:
                    frame = self._frame_at(view, 0, self._need - 4)
                    buf: bytes = bytes(view[self._need :])
                finally:
                    view.release()
                frames.append(frame)
                others = 1 if type(frame) is Response or type(frame) is Error else 0
                self._rest = rest = bytearray()
                self._need = 4
            else:
                buf = b"".join((rest, data))
        else:
            buf = data if isinstance(data, bytes) else bytes(data)
        append = frames.append
        make = self._make
        unpack_message = MESSAGE_FRAME_HEADER.unpack_from
        limit = self.max_frame_size
        pos = 0
        end = len(buf)
        while True:
            left = end - pos
            if left >= _MESSAGE_FRAME_HEADER_SIZE:
                # The common case first: a whole message frame, one unpack for
                # its size, type and header, one copy (the body).
                size, frame_type, timestamp, attempts, msg_id = unpack_message(buf, pos)
                if (
                    frame_type == FRAME_TYPE_MESSAGE
                    and _MIN_MESSAGE_SIZE <= size <= limit
                    and size <= left - 4
                ):
                    append(make(timestamp, attempts, msg_id, buf[pos + 34 : pos + 4 + size]))
                    pos += 4 + size
                    continue
            elif left < 4:
                break
            (size,) = SIZE.unpack_from(buf, pos)
            if size < 4:
                raise InvalidFrame(f"frame size {size} is below the minimum of 4")
            if size > limit:
                skipped = self._oversized(buf, pos, size)
                if skipped is None:
                    break  # its header is not all here yet
                append(skipped)
                others += 1
                body_end = pos + 4 + size
                if body_end <= end:
                    pos = body_end
                    continue
                self._skip = body_end - end
                pos = end
                break
            if left - 4 < size:
                break
            # Responses and errors inline (a call each cost 15% more a frame);
            # the rest (a message too short, an unknown type) raises there.
            frame_type = FRAME_HEADER.unpack_from(buf, pos)[1]
            end_of_frame = pos + 4 + size
            if frame_type == FRAME_TYPE_RESPONSE:
                append(Response(bytes(buf[pos + 8 : end_of_frame])))
                others += 1
            elif frame_type == FRAME_TYPE_ERROR:
                append(Error(bytes(buf[pos + 8 : end_of_frame])))
                others += 1
            else:
                append(self._frame_at(buf, pos, size))
            pos = end_of_frame
        self.others = others
        if pos < end:
            self._rest = bytearray(memoryview(buf)[pos:])
            self._need = self._need_for(buf, pos, end - pos)
        elif rest:
            self._rest = bytearray()
            self._need = 4
        return frames

    def _frame_at(
        self, buf: bytes | bytearray | memoryview, pos: int, size: int
    ) -> Response | Error | M:
        """The whole frame of ``size`` (its size field's value) at ``pos``."""
        frame_type = FRAME_HEADER.unpack_from(buf, pos)[1]
        end_of_frame = pos + 4 + size
        if frame_type == FRAME_TYPE_MESSAGE:
            if size - 4 < MESSAGE_HEADER_SIZE:
                raise InvalidFrame(
                    f"message frame too short ({size - 4} < {MESSAGE_HEADER_SIZE} bytes)"
                )
            timestamp, attempts, msg_id = MESSAGE_HEADER.unpack_from(buf, pos + 8)
            body = buf[pos + 34 : end_of_frame]
            message: M = self._make(
                timestamp, attempts, msg_id, body if type(body) is bytes else bytes(body)
            )
            return message
        if frame_type == FRAME_TYPE_RESPONSE:
            return Response(bytes(buf[pos + 8 : end_of_frame]))
        if frame_type == FRAME_TYPE_ERROR:
            return Error(bytes(buf[pos + 8 : end_of_frame]))
        raise InvalidFrame(f"unknown frame type {frame_type}")

    def _oversized(
        self, buf: bytes | bytearray | memoryview, pos: int, size: int
    ) -> OversizedMessage | None:
        """A frame announcing ``size`` above the limit, at ``pos``: raises
        :class:`FrameTooLarge`, unless it is a message frame and oversized
        messages are skipped (None until its header is all there)."""
        left = len(buf) - pos
        too_large = FrameTooLarge(
            f"frame size {size} exceeds the limit of {self.max_frame_size} (max_frame_size)"
        )
        if not self.skip_oversized:
            raise too_large
        if left >= 8 and FRAME_HEADER.unpack_from(buf, pos)[1] != FRAME_TYPE_MESSAGE:
            raise too_large
        if left < _MESSAGE_FRAME_HEADER_SIZE:
            return None
        if size - 4 < MESSAGE_HEADER_SIZE:
            raise InvalidFrame(
                f"message frame too short ({size - 4} < {MESSAGE_HEADER_SIZE} bytes)"
            )
        timestamp, attempts, msg_id = MESSAGE_HEADER.unpack_from(buf, pos + 8)
        return OversizedMessage(timestamp, attempts, msg_id, size - 4 - MESSAGE_HEADER_SIZE)

    def _need_for(self, buf: bytes | bytearray | memoryview, pos: int, left: int) -> int:
        """How many bytes the frame starting at ``pos`` needs before it can be
        parsed: all of it, or (above the limit) its size, type and header."""
        if left < 4:
            return 4
        size: int = SIZE.unpack_from(buf, pos)[0]
        if size <= self.max_frame_size:
            return 4 + size
        return 8 if left < 8 else _MESSAGE_FRAME_HEADER_SIZE
