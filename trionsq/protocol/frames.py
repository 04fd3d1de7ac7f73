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
raises :class:`~trionsq.protocol.errors.FrameTooLarge` before anything is buffered.
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
    "SIZE",
    "FRAME_HEADER",
    "MESSAGE_HEADER",
    "MESSAGE_FRAME_HEADER",
    "sized",
    "Response",
    "Error",
    "MessageFrame",
    "Frame",
    "encode_frame",
    "encode_response",
    "encode_error",
    "encode_message",
    "message_frame_header",
    "decode_message",
    "FrameParser",
    "MessageFactory",
]

FRAME_TYPE_RESPONSE: Final = 0
FRAME_TYPE_ERROR: Final = 1
FRAME_TYPE_MESSAGE: Final = 2

MSG_ID_LENGTH: Final = 16
MESSAGE_HEADER_SIZE: Final = 8 + 2 + MSG_ID_LENGTH

HEARTBEAT: Final = b"_heartbeat_"
OK: Final = b"OK"
CLOSE_WAIT: Final = b"CLOSE_WAIT"

#: nsqd's default max-msg-size (1 MiB) plus the message header and frame type;
#: clients talking to nsqds with a larger max-msg-size raise it.
DEFAULT_MAX_FRAME_SIZE: Final = 1024 * 1024 + MESSAGE_HEADER_SIZE + 4

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


Frame = Response | Error | MessageFrame


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
        self: FrameParser[MessageFrame], max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    ) -> None: ...

    @overload
    def __init__(
        self,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        *,
        message_factory: MessageFactory[M],
    ) -> None: ...

    def __init__(
        self,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        *,
        message_factory: MessageFactory[Any] | None = None,
    ) -> None:
        if max_frame_size < 4:
            raise ValueError("max_frame_size must be at least 4")
        self.max_frame_size = max_frame_size
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
        """Bytes held that do not make a whole frame yet."""
        return len(self._rest)

    def take_buffer(self) -> bytes:
        """Remove and return the bytes not parsed yet (for a switch to
        compression: they belong to the compressed stream)."""
        data = bytes(self._rest)
        self._rest = bytearray()
        self._need = 4
        return data

    def feed(self, data: bytes | bytearray | memoryview) -> list[Response | Error | M]:
        """Add ``data`` and return every frame it completes, in order.

        Raises :class:`InvalidFrame` or :class:`FrameTooLarge` on bytes that break
        the framing; the parser is unusable afterwards (the stream is lost).
        """
        rest = self._rest
        if rest:
            if len(rest) + len(data) < self._need:
                rest += data
                self.others = 0
                return []
            buf = b"".join((rest, data))
        else:
            buf = data if type(data) is bytes else bytes(data)
        frames: list[Response | Error | M] = []
        append = frames.append
        make = self._make
        unpack_message = MESSAGE_FRAME_HEADER.unpack_from
        limit = self.max_frame_size
        others = 0
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
                raise FrameTooLarge(f"frame size {size} exceeds the limit of {limit}")
            if left - 4 < size:
                break
            frame_type = FRAME_HEADER.unpack_from(buf, pos)[1]
            end_of_frame = pos + 4 + size
            if frame_type == FRAME_TYPE_MESSAGE:
                if size - 4 < MESSAGE_HEADER_SIZE:
                    raise InvalidFrame(
                        f"message frame too short ({size - 4} < {MESSAGE_HEADER_SIZE} bytes)"
                    )
                timestamp, attempts, msg_id = MESSAGE_HEADER.unpack_from(buf, pos + 8)
                append(make(timestamp, attempts, msg_id, buf[pos + 34 : end_of_frame]))
            elif frame_type == FRAME_TYPE_RESPONSE:
                append(Response(bytes(buf[pos + 8 : end_of_frame])))
                others += 1
            elif frame_type == FRAME_TYPE_ERROR:
                append(Error(bytes(buf[pos + 8 : end_of_frame])))
                others += 1
            else:
                raise InvalidFrame(f"unknown frame type {frame_type}")
            pos = end_of_frame
        self.others = others
        if pos < end:
            self._rest = bytearray(memoryview(buf)[pos:])
            left = end - pos
            self._need = 4 + SIZE.unpack_from(buf, pos)[0] if left >= 4 else 4
        elif rest:
            self._rest = bytearray()
            self._need = 4
        return frames
