"""V2 commands (client to server): encoders, and the incremental server-side parser.

A command is a line ``NAME param param\\n``, for some commands followed by a body
``[4-byte size][data]``.  The encoders below build the exact bytes a client sends.

:class:`CommandParser` is what a server needs: it turns a byte stream into
:class:`Command` objects and raises the typed error nsqd would send, with nsqd's
texts, for anything malformed.  It checks what needs no server state (parameter
counts, names, numbers, body sizes); a ``precheck`` callback, run as soon as a
command's line is complete and before its parameters or body are looked at,
lets the server apply its state checks first, in the order nsqd applies them.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from .errors import (
    BadBodyError,
    BadChannelError,
    BadMessageError,
    BadProtocolError,
    BadTopicError,
    InvalidError,
    LineTooLong,
    NSQErrorResponse,
)
from .frames import MSG_ID_LENGTH, SIZE, sized
from .names import go_quote, is_valid_channel_name, is_valid_topic_name

__all__ = [
    "MAGIC_V2",
    "identify",
    "auth",
    "sub",
    "pub",
    "mpub",
    "dpub",
    "rdy",
    "fin",
    "req",
    "touch",
    "cls",
    "nop",
    "Identify",
    "Auth",
    "Sub",
    "Pub",
    "MPub",
    "MPubHead",
    "DPub",
    "Rdy",
    "Fin",
    "FinRun",
    "Req",
    "Touch",
    "Cls",
    "Nop",
    "Command",
    "CommandParser",
    "parse_base10",
    "DEFAULT_MAX_LINE_LENGTH",
    "BODY_COMMANDS",
]

MAGIC_V2: Final = b"  V2"

#: nsqd reads command lines through a 16 KiB buffered reader; a longer line
#: (newline included) makes it drop the connection without an error frame.
DEFAULT_MAX_LINE_LENGTH: Final = 16 * 1024

#: The commands whose line is followed by a body (``[4-byte size][data]``).
BODY_COMMANDS: Final = frozenset({b"IDENTIFY", b"AUTH", b"PUB", b"MPUB", b"DPUB"})

# SIZE's methods, bound once: CPython 3.11 compiles ``SIZE.pack(...)`` on an
# imported name as an attribute load, a bound method made on every call (30 ns
# a PUB).
_pack_size = SIZE.pack
_unpack_size = SIZE.unpack_from

# --- encoders (client side) -------------------------------------------------


def _as_bytes(name: str | bytes) -> bytes:
    return name.encode() if isinstance(name, str) else name


def identify(data: Mapping[str, Any]) -> bytes:
    """``IDENTIFY`` with a JSON body of client metadata and negotiated features."""
    return b"IDENTIFY\n" + sized(json.dumps(dict(data), separators=(",", ":")).encode())


def auth(secret: str | bytes) -> bytes:
    return b"AUTH\n" + sized(_as_bytes(secret))


def sub(topic: str, channel: str) -> bytes:
    return b"SUB " + topic.encode() + b" " + channel.encode() + b"\n"


@functools.lru_cache(maxsize=1024)
def _pub_head(topic: str) -> bytes:
    # A publisher uses a few topics, many times each: their command lines once.
    return b"PUB " + topic.encode() + b"\n"


def pub(topic: str, body: bytes) -> bytes:
    return _pub_head(topic) + _pack_size(len(body)) + body


def mpub(topic: str, bodies: Iterable[bytes]) -> bytes:
    items = bodies if type(bodies) is list or type(bodies) is tuple else list(bodies)
    count = len(items)
    sizes = list(map(len, items))
    # [head, size, body, size, body...] filled by slices: no Python loop a body.
    parts = [b""] * (2 * count + 1)
    parts[1::2] = map(_pack_size, sizes)
    parts[2::2] = items
    payload = 4 + 4 * count + sum(sizes)
    parts[0] = b"MPUB " + topic.encode() + b"\n" + _pack_size(payload) + _pack_size(count)
    return b"".join(parts)


def dpub(topic: str, delay_ms: int, body: bytes) -> bytes:
    return b"DPUB " + topic.encode() + b" " + str(int(delay_ms)).encode() + b"\n" + sized(body)


def rdy(count: int) -> bytes:
    return b"RDY " + str(int(count)).encode() + b"\n"


def fin(msg_id: bytes) -> bytes:
    return b"FIN " + msg_id + b"\n"


def req(msg_id: bytes, delay_ms: int) -> bytes:
    return b"REQ " + msg_id + b" " + str(int(delay_ms)).encode() + b"\n"


def touch(msg_id: bytes) -> bytes:
    return b"TOUCH " + msg_id + b"\n"


def cls() -> bytes:
    return b"CLS\n"


def nop() -> bytes:
    return b"NOP\n"


# --- parsed commands (server side) ------------------------------------------


@dataclass(frozen=True, slots=True)
class Identify:
    body: bytes


@dataclass(frozen=True, slots=True)
class Auth:
    secret: bytes


@dataclass(frozen=True, slots=True)
class Sub:
    topic: str
    channel: str


@dataclass(frozen=True, slots=True)
class Pub:
    topic: str
    body: bytes


@dataclass(frozen=True, slots=True)
class MPub:
    topic: str
    bodies: list[bytes]


@dataclass(frozen=True, slots=True)
class MPubHead:
    """An MPUB's valid line, before its body (only with ``mpub_head=True``):
    nsqd authorizes the publish and creates the topic before it reads the body,
    so an MPUB with a bad body still creates its topic."""

    topic: str


@dataclass(frozen=True, slots=True)
class DPub:
    topic: str
    delay_ms: int
    body: bytes


@dataclass(frozen=True, slots=True)
class Rdy:
    """``RDY``; the count is parsed by :meth:`count`, since nsqd ignores a RDY
    sent after CLS before it even looks at the count."""

    raw_count: bytes | None

    def count(self) -> int:
        if self.raw_count is None:
            return 1
        value = parse_base10(self.raw_count)
        if value is None:
            raise InvalidError(f"RDY could not parse count {_text(self.raw_count)}")
        return _to_int64(value)


@dataclass(frozen=True, slots=True)
class Fin:
    id: bytes


@dataclass(frozen=True, slots=True)
class Req:
    id: bytes
    #: the requeue delay in nanoseconds as nsqd computes it (may be negative on
    #: overflow, which nsqd clamps to zero)
    delay_ns: int


@dataclass(frozen=True, slots=True)
class Touch:
    id: bytes


@dataclass(frozen=True, slots=True)
class Cls:
    pass


@dataclass(frozen=True, slots=True)
class Nop:
    pass


@dataclass(frozen=True, slots=True)
class FinRun:
    """Consecutive ``FIN`` commands, in order (only with ``fin_runs=True``):
    what a busy consumer's read mostly holds, parsed in one pass.  Each FIN is
    exactly what :class:`Fin` would have been; the precheck ran once for the
    run (a FIN never changes the connection's state)."""

    ids: list[bytes]


Command = (
    Identify
    | Auth
    | Sub
    | Pub
    | MPubHead
    | MPub
    | DPub
    | Rdy
    | Fin
    | FinRun
    | Req
    | Touch
    | Cls
    | Nop
)

# A run of well-formed FINs ("FIN <16-byte id>\n", the id without a space or
# newline and not ending in "\r", which the line parser would strip), and one
# FIN's id inside such a run.
_FIN_RUN = re.compile(rb"(?:FIN [^ \n]{15}[^ \n\r]\n)+")
_FIN_ID = re.compile(rb"FIN (.{16})\n", re.DOTALL)


def parse_base10(raw: bytes) -> int | None:
    """nsqd's ``ByteToBase10``: digits only (empty is 0), wrapping at 2**64."""
    if raw and not raw.isdigit():  # bytes.isdigit() is ASCII-only
        return None
    return int(raw or b"0") % (1 << 64)


def _to_int64(value: int) -> int:
    return value - (1 << 64) if value >= (1 << 63) else value


def _text(raw: bytes) -> str:
    """Bytes as they appear in an error text (kept byte for byte on the wire)."""
    return raw.decode("utf-8", "surrogateescape")


def _message_id(raw: bytes) -> bytes:
    if len(raw) != MSG_ID_LENGTH:
        raise InvalidError("invalid message ID")
    return raw


Precheck = Callable[[bytes], None]


class _NeedMore(Exception):
    """Internal: the buffer does not hold the whole command yet.

    Its args, when given, are the error class and text nsqd sends if the
    stream ends there (what its reader of that part says it failed to read).
    """


class CommandParser:
    """Incremental parser of the client-to-server byte stream.

    Usage, in the manner of h11: :meth:`feed` received bytes, then call
    :meth:`next_command` until it returns ``None`` (needs more bytes), handling
    each command before asking for the next.  Errors are raised as the typed
    :class:`~trionsq.protocol.errors.NSQErrorResponse` nsqd would send (all of
    them fatal: the server sends the frame and closes), or
    :class:`~trionsq.protocol.errors.LineTooLong` where nsqd closes silently.

    Memory is bounded: a line by ``max_line_length``, a body by
    ``max_body_size`` / ``max_msg_size`` (checked before the body is awaited).
    """

    def __init__(
        self,
        *,
        expect_magic: bool = True,
        max_line_length: int = DEFAULT_MAX_LINE_LENGTH,
        max_msg_size: int = 1024 * 1024,
        max_body_size: int = 5 * 1024 * 1024,
        max_req_timeout_ms: int = 60 * 60 * 1000,
        precheck: Precheck | None = None,
        mpub_head: bool = False,
        fin_runs: bool = False,
    ) -> None:
        self._buffer = bytearray()
        # Parsed bytes are skipped by position and dropped in bulk on the next feed,
        # rather than deleted command by command.
        self._pos = 0
        self._need_magic = expect_magic
        self.max_line_length = max_line_length
        self.max_msg_size = max_msg_size
        self.max_body_size = max_body_size
        self.max_req_timeout_ms = max_req_timeout_ms
        self.precheck = precheck
        #: Return :class:`MPubHead` once an MPUB's line is valid, before its body
        #: (nsqd checks the client's authorization and creates the topic then).
        self.mpub_head = mpub_head
        #: Return consecutive FINs as one :class:`FinRun` (the precheck runs
        #: once for the run), rather than one :class:`Fin` each.
        self.fin_runs = fin_runs
        # A command whose line is parsed and prechecked, waiting for its body.
        self._pending: Callable[[], Command] | None = None
        # What nsqd says if the stream ends inside that body (see cut_short).
        self._cut: tuple[Any, ...] = ()
        # PUB's fast path: topic names seen valid, as on the wire (bounded).
        self._pub_topics: dict[bytes, str] = {}

    def feed(self, data: bytes) -> None:
        if self._pos:
            del self._buffer[: self._pos]
            self._pos = 0
        self._buffer += data

    @property
    def awaiting_magic(self) -> bool:
        """Whether the protocol's magic has yet to come."""
        return self._need_magic

    @property
    def buffered(self) -> int:
        return len(self._buffer) - self._pos

    def take_buffer(self) -> bytes:
        """Remove and return the unparsed bytes (for a switch to compression)."""
        data = bytes(self._buffer[self._pos :])
        self._buffer.clear()
        self._pos = 0
        return data

    def next_command(self) -> Command | None:
        """The next whole command, or ``None`` if more bytes are needed."""
        if self._need_magic:
            if self.buffered < 4:
                return None
            if self._consume(4) != MAGIC_V2:
                raise BadProtocolError()
            self._need_magic = False
        if self._pending is None:
            # Fast paths for the commonest commands, a busy consumer's exactly
            # "FIN <16-byte id>\n" (a run of them with fin_runs) and a busy
            # producer's PUB; the same checks as the general path below.
            buf, pos = self._buffer, self._pos
            if buf.startswith(b"FIN ", pos):
                if self.fin_runs:
                    run = _FIN_RUN.match(buf, pos)
                    if run is not None:
                        end = run.end()
                        self._pos = end
                        if self.precheck is not None:
                            self.precheck(b"FIN")
                        return FinRun(_FIN_ID.findall(buf, pos, end))
                elif len(buf) - pos >= 21 and buf[pos + 20] == 10:
                    msg_id = bytes(buf[pos + 4 : pos + 20])
                    if b" " not in msg_id and b"\n" not in msg_id and msg_id[-1] != 13:
                        self._pos = pos + 21
                        if self.precheck is not None:
                            self.precheck(b"FIN")
                        return Fin(msg_id)
            elif buf.startswith(b"PUB ", pos):
                pub = self._fast_pub(buf, pos)
                if pub is not None:
                    return pub if type(pub) is Pub else None
            params = self._read_line()
            if params is None:
                return None
            name = params[0]
            if self.precheck is not None:
                self.precheck(name)
            result = self._dispatch(name, params)
            if not callable(result):  # a command without a body is whole already
                return result
            self._pending = result
            if self.mpub_head and name == b"MPUB":
                # The server acts on MPUB's line before it reads the body.
                return MPubHead(_text(params[1]))
        try:
            command = self._pending()
        except _NeedMore as exc:
            self._cut = exc.args
            return None
        self._pending = None
        return command

    def cut_short(self) -> NSQErrorResponse | None:
        """The error nsqd sends when the stream ends (EOF, or its read
        deadline passes) inside a command's body: "PUB failed to read message
        body", "MPUB failed to read message count"...; None between commands
        or inside a line, where nsqd closes without a word."""
        if self._pending is None or not self._cut:
            return None
        kind, text = self._cut
        error: NSQErrorResponse = kind(text)
        return error

    def _fast_pub(self, buf: bytearray, pos: int) -> Pub | bool | None:
        """PUB, exactly ``PUB <valid topic>\n``: the same checks and errors as
        the general path in fewer steps (the commonest command of a busy
        producer).  The command, False (its body is not all here yet: it is
        pending), or None (not this simple form: the general path's turn)."""
        end = buf.find(b"\n", pos + 4, pos + self.max_line_length)
        if end < 0:
            return None
        raw = bytes(buf[pos + 4 : end])
        topic = self._pub_topics.get(raw)
        if topic is None:
            if b" " in raw or raw.endswith(b"\r"):
                return None
            topic = _text(raw)
            if not is_valid_topic_name(topic):
                return None
            if len(self._pub_topics) >= 1024:
                self._pub_topics.clear()
            self._pub_topics[raw] = topic
        self._pos = end + 1
        if self.precheck is not None:
            self.precheck(b"PUB")
        try:
            return Pub(topic, self._message_body("PUB"))
        except _NeedMore as exc:
            self._pending = lambda: Pub(topic, self._message_body("PUB"))
            self._cut = exc.args
            return False

    # --- lines and bodies ---

    def _read_line(self) -> list[bytes] | None:
        buf, pos = self._buffer, self._pos
        index = buf.find(b"\n", pos, pos + self.max_line_length)
        if index < 0:
            if len(buf) - pos >= self.max_line_length:
                raise LineTooLong(f"command line longer than {self.max_line_length} bytes")
            return None
        line = bytes(buf[pos:index])
        self._pos = index + 1
        if line.endswith(b"\r"):
            line = line[:-1]
        return line.split(b" ")

    def _need(self, offset: int, size: int, kind: type[NSQErrorResponse], text: str) -> None:
        if len(self._buffer) - self._pos < offset + size:
            raise _NeedMore(kind, text)

    def _int32_at(self, offset: int, kind: type[NSQErrorResponse], text: str) -> int:
        self._need(offset, 4, kind, text)
        value: int = _unpack_size(self._buffer, self._pos + offset)[0]
        return value

    def _consume(self, size: int) -> bytes:
        pos = self._pos
        self._pos = pos + size
        return bytes(self._buffer[pos : pos + size])

    def _dispatch(self, name: bytes, params: list[bytes]) -> Command | Callable[[], Command]:
        handler = _HANDLERS.get(name)
        if handler is None:
            raise InvalidError(f"invalid command {_text(name)}")
        return handler(self, params)

    # --- per command: validate the line now; a reader for the body, if any ---

    def _identify(self, params: list[bytes]) -> Callable[[], Command]:
        def read() -> Command:
            size = self._int32_at(0, BadBodyError, "IDENTIFY failed to read body size")
            if size > self.max_body_size:
                raise BadBodyError(f"IDENTIFY body too big {size} > {self.max_body_size}")
            if size <= 0:
                raise BadBodyError(f"IDENTIFY invalid body size {size}")
            self._need(4, size, BadBodyError, "IDENTIFY failed to read body")
            return Identify(self._consume(4 + size)[4:])

        return read

    def _auth(self, params: list[bytes]) -> Callable[[], Command]:
        if len(params) != 1:
            raise InvalidError("AUTH invalid number of parameters")

        def read() -> Command:
            size = self._int32_at(0, BadBodyError, "AUTH failed to read body size")
            if size > self.max_body_size:
                raise BadBodyError(f"AUTH body too big {size} > {self.max_body_size}")
            if size <= 0:
                raise BadBodyError(f"AUTH invalid body size {size}")
            self._need(4, size, BadBodyError, "AUTH failed to read body")
            return Auth(self._consume(4 + size)[4:])

        return read

    def _sub(self, params: list[bytes]) -> Command:
        if len(params) < 3:
            raise InvalidError("SUB insufficient number of parameters")
        topic, channel = _text(params[1]), _text(params[2])
        if not is_valid_topic_name(topic):
            raise BadTopicError(f"SUB topic name {go_quote(params[1])} is not valid")
        if not is_valid_channel_name(channel):
            raise BadChannelError(f"SUB channel name {go_quote(params[2])} is not valid")
        return Sub(topic, channel)

    def _topic(self, verb: str, params: list[bytes], minimum: int, prefix: str = "") -> str:
        if len(params) < minimum:
            raise InvalidError(f"{verb} insufficient number of parameters")
        topic = _text(params[1])
        if not is_valid_topic_name(topic):
            raise BadTopicError(f"{prefix}{verb} topic name {go_quote(params[1])} is not valid")
        return topic

    def _message_body(self, verb: str) -> bytes:
        buf, pos = self._buffer, self._pos
        if len(buf) - pos < 4:
            raise _NeedMore(BadMessageError, f"{verb} failed to read message body size")
        size: int = _unpack_size(buf, pos)[0]
        if size <= 0:
            raise BadMessageError(f"{verb} invalid message body size {size}")
        if size > self.max_msg_size:
            raise BadMessageError(f"{verb} message too big {size} > {self.max_msg_size}")
        end = pos + 4 + size
        if len(buf) < end:
            raise _NeedMore(BadMessageError, f"{verb} failed to read message body")
        self._pos = end
        return bytes(buf[pos + 4 : end])

    def _pub(self, params: list[bytes]) -> Callable[[], Command]:
        topic = self._topic("PUB", params, 2)
        return lambda: Pub(topic, self._message_body("PUB"))

    def _dpub(self, params: list[bytes]) -> Callable[[], Command]:
        topic = self._topic("DPUB", params, 3)
        raw = params[2]
        value = parse_base10(raw)
        if value is None:
            raise InvalidError(f"DPUB could not parse timeout {_text(raw)}")
        delay_ns = _to_int64((value * 1_000_000) % (1 << 64))
        if delay_ns < 0 or delay_ns > self.max_req_timeout_ms * 1_000_000:
            raise InvalidError(f"DPUB timeout {value} out of range 0-{self.max_req_timeout_ms}")
        delay_ms = delay_ns // 1_000_000
        return lambda: DPub(topic, delay_ms, self._message_body("DPUB"))

    def _mpub(self, params: list[bytes]) -> Callable[[], Command]:
        # nsqd's text really does repeat the code here.
        topic = self._topic("MPUB", params, 2, prefix="E_BAD_TOPIC ")

        # Progress is kept between calls so that a large MPUB arriving in many
        # chunks is scanned once, not once a chunk.
        count = 0
        offset = 8
        spans: list[tuple[int, int]] = []

        def read() -> Command:
            nonlocal count, offset
            if not count:
                size = self._int32_at(0, BadBodyError, "MPUB failed to read body size")
                if size <= 0:
                    raise BadBodyError(f"MPUB invalid body size {size}")
                if size > self.max_body_size:
                    raise BadBodyError(f"MPUB body too big {size} > {self.max_body_size}")
                announced = self._int32_at(4, BadBodyError, "MPUB failed to read message count")
                # 4 bytes of count, and at least 5 bytes (size + 1) a message
                max_messages = (self.max_body_size - 4) // 5
                if announced <= 0 or announced > max_messages:
                    raise BadBodyError(f"MPUB invalid message count {announced}")
                count = announced
            # nsqd reads the messages one by one from the stream, checking each
            # size as it comes; the announced body size is not cross-checked.
            buf, pos = self._buffer, self._pos
            have = len(buf) - pos  # (offsets are from pos)
            unpack = _unpack_size
            max_msg_size = self.max_msg_size
            body_limit = self.max_body_size + 4
            while len(spans) < count:
                if have < offset + 4:
                    raise _NeedMore(
                        BadMessageError, f"MPUB failed to read message({len(spans)}) body size"
                    )
                msg_size: int = unpack(buf, pos + offset)[0]
                if msg_size <= 0:
                    i = len(spans)
                    raise BadMessageError(f"MPUB invalid message({i}) body size {msg_size}")
                if msg_size > max_msg_size:
                    raise BadMessageError(f"MPUB message too big {msg_size} > {max_msg_size}")
                if offset + msg_size > body_limit:
                    # nsqd itself would keep reading; a bound keeps memory finite.
                    raise BadBodyError(
                        f"MPUB body too big {offset + msg_size - 4} > {self.max_body_size}"
                    )
                if have < offset + 4 + msg_size:
                    raise _NeedMore(BadMessageError, "MPUB failed to read message body")
                spans.append((offset + 4, msg_size))
                offset += 4 + msg_size
            data = self._consume(offset)
            return MPub(topic, [data[start : start + n] for start, n in spans])

        return read

    def _rdy(self, params: list[bytes]) -> Command:
        return Rdy(params[1] if len(params) > 1 else None)

    def _id_command(self, verb: str, params: list[bytes], minimum: int) -> bytes:
        if len(params) < minimum:
            raise InvalidError(f"{verb} insufficient number of params")
        return _message_id(params[1])

    def _fin(self, params: list[bytes]) -> Command:
        return Fin(self._id_command("FIN", params, 2))

    def _touch(self, params: list[bytes]) -> Command:
        return Touch(self._id_command("TOUCH", params, 2))

    def _req(self, params: list[bytes]) -> Command:
        msg_id = self._id_command("REQ", params, 3)
        value = parse_base10(params[2])
        if value is None:
            raise InvalidError(f"REQ could not parse timeout {_text(params[2])}")
        return Req(msg_id, _to_int64((value * 1_000_000) % (1 << 64)))

    def _cls(self, params: list[bytes]) -> Command:
        return Cls()

    def _nop(self, params: list[bytes]) -> Command:
        return Nop()


# A handler validates a command's line; it returns the command, or for commands
# with a body a reader that returns it once the body has arrived.
_Handler = Callable[[CommandParser, list[bytes]], Command | Callable[[], Command]]

_HANDLERS: dict[bytes, _Handler] = {
    b"IDENTIFY": CommandParser._identify,
    b"AUTH": CommandParser._auth,
    b"SUB": CommandParser._sub,
    b"PUB": CommandParser._pub,
    b"MPUB": CommandParser._mpub,
    b"DPUB": CommandParser._dpub,
    b"RDY": CommandParser._rdy,
    b"FIN": CommandParser._fin,
    b"REQ": CommandParser._req,
    b"TOUCH": CommandParser._touch,
    b"CLS": CommandParser._cls,
    b"NOP": CommandParser._nop,
}
