"""A connection as the faults see it: :class:`FaultyStream` wraps a stream
between a node and its peer, follows NSQ's framing through it, and applies the
faults of a :class:`fakensq.testing.faults.Faults` to its bytes and frames.

It asks the faults what applies to it through their small stream-facing API
(:meth:`~fakensq.testing.faults.Faults.matching`,
:meth:`~fakensq.testing.faults.Faults.spend`, ...), and keeps its own parsing
state to itself.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, Literal

import trio

from trionsq.protocol.commands import BODY_COMMANDS
from trionsq.protocol.frames import (
    FRAME_HEADER,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    HEARTBEAT,
    MESSAGE_HEADER_SIZE,
    SIZE,
    decode_message,
)
from trionsq.protocol.identify import UPGRADES

from ..faultkinds import Role

if TYPE_CHECKING:
    from .faults import Faults

__all__ = ["FaultyStream", "socket_peer"]

_MAX_SCAN = 64 * 1024 * 1024
#: The longest command line followed (nsqd's own limit is 16 KiB), and the
#: largest IDENTIFY body read for the client's names (nsqd's default
#: --max-body-size); bodies of other commands are never held.
_MAX_LINE_SCAN = 64 * 1024
_MAX_IDENTIFY_SCAN = 5 * 1024 * 1024
#: The largest frame of the node's held whole before it goes on; a larger one
#: (a message of a large body) is passed on as it comes.
_MAX_FRAME_HOLD = 64 * 1024
#: How much of a message's body the trace keeps.
_TRACED_BODY = 200
# What a stall that holds the node's writes (Fault.buffered) takes before
# the node's writes block: about a loopback socket's send buffer.
_HOLD_LIMIT = 256 * 1024
#: The client's commands the faults' flow counts (:mod:`fakensq.testing.flow`).
_FLOW_EVENTS: Final[dict[bytes, Literal["fin", "published"]]] = {
    b"FIN": "fin",
    b"PUB": "published",
    b"MPUB": "published",
    b"DPUB": "published",
}
#: The frame type a ``corrupt`` fault writes (no such type in NSQ).
_BAD_FRAME_TYPE = FRAME_HEADER.pack(0, 0x7F)[SIZE.size :]


def socket_peer(stream: trio.abc.Stream) -> str:
    """The peer's ``"host:port"`` of a socket stream (``"unknown:0"`` without one)."""
    sock = getattr(stream, "socket", None)
    if sock is not None:
        try:
            host, port = sock.getpeername()[:2]
            return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        except OSError:
            pass
    return "unknown:0"


class FaultyStream(trio.abc.Stream):
    """A stream that applies a :class:`Faults`'s faults to the bytes it carries.

    ``node`` is the node's name, ``peer`` the other end (a client's name or
    ``"host:port"``, or for a ``dialer`` stream, the node dialled).  With
    ``parse_nsq`` (an nsqd's side of a client connection) it follows NSQ's framing
    both ways: it learns the client's IDENTIFY ``client_id``/``hostname``, traces
    each command and frame, and applies frame faults.  Once a connection upgrades
    to TLS or compression the bytes are opaque and only byte-level faults apply.
    """

    _serials = itertools.count(1)

    def __init__(
        self,
        inner: trio.abc.Stream,
        faults: Faults,
        node: str,
        peer: str,
        *,
        parse_nsq: bool,
        dialer: bool = False,
    ) -> None:
        self.inner = inner
        self.faults = faults
        self.node = node
        self.peer = peer
        self.serial = next(FaultyStream._serials)
        self.dialer = dialer
        self.client_id = ""
        self.hostname = ""
        #: the role seen in the commands (before any TLS or compression)
        self.parsed_role: Role = "unknown"
        #: asks the node for the role (set by the node's hooks)
        self.role_of: Callable[[], Role] | None = None
        self._parse = parse_nsq
        self._opaque = not parse_nsq
        self._in_buf = bytearray()
        self._in_magic = False
        # A body being stepped over: bytes left, and its command (traced once
        # the body has passed).
        self._in_skip = 0
        self._in_pending: tuple[bytes, bytes, int, int] | None = None
        # A fault placed at the command just read drops the connection: the
        # bytes read with it never reach the node.
        self._drop_in = False
        self._out_buf = bytearray()
        # A large frame being passed on: bytes left, and whether the connection
        # ends after them (a truncate fault).
        self._out_passing = 0
        self._out_cut = False
        self._aborted = False
        self._scopes: set[trio.CancelScope] = set()
        # The node's writes a buffered stall holds (see _holding), and the
        # lock that keeps them before what the node writes after them.
        self._held = bytearray()
        self._send_lock = trio.Lock()
        faults.opened(self)

    @property
    def socket(self) -> Any:
        """The inner stream's socket (so the node still sees the peer address)."""
        sock = getattr(self.inner, "socket", None)
        if sock is None:
            raise AttributeError("socket")
        return sock

    @property
    def role(self) -> Role:
        """``"consumer"``, ``"producer"`` or ``"unknown"`` (not subscribed, no
        publish yet)."""
        return self.role_of() if self.role_of is not None else self.parsed_role

    @property
    def opaque(self) -> bool:
        """Whether its frames are hidden (TLS or compression): only byte-level
        faults act on it."""
        return self._opaque

    def names(self) -> tuple[str, ...]:
        """The names faults know the client by: its address, host, IDENTIFY
        ``client_id`` and ``hostname``."""
        return self._names()

    def _names(self) -> tuple[str, ...]:
        host = self.peer.rpartition(":")[0].strip("[]")
        names = [self.peer, host]
        if self.client_id:
            names.append(self.client_id)
        if self.hostname:
            names.append(self.hostname)
        return tuple(names)

    def matches(self, node: str | None, client: str | None) -> bool:
        if node is not None and node not in (self.node, self.peer):
            return False
        return client is None or client in self._names()

    # -- gating ----------------------------------------------------------------

    def _blocked(self, direction: Literal["in", "out"]) -> bool:
        names = self._names()
        if self.faults.partitioned(self.node, names):
            return True
        for fault in self.faults.matching("stall", self.node, names, self.role):
            if fault.direction in ("both", direction):
                return True
        return False

    def _delay(self, direction: Literal["in", "out"]) -> float:
        seconds = 0.0
        for fault in self.faults.matching("delay", self.node, self._names(), self.role):
            if fault.direction in ("both", direction):
                seconds = max(seconds, fault.seconds)
        return seconds

    def _holding(self) -> bool:
        """Whether the node's writes are held, not blocked: every stall of
        them is a buffered one (a network that stopped carrying them takes
        the node's writes into the socket's buffer: the node goes on reading)."""
        names = self._names()
        if self.faults.partitioned(self.node, names):
            return False
        stalls = [
            f
            for f in self.faults.matching("stall", self.node, names, self.role)
            if f.direction in ("both", "out")
        ]
        return bool(stalls) and all(f.buffered for f in stalls)

    async def release_held(self) -> None:
        """Send what a buffered stall held, once nothing stops it (the stall
        healed); a no-op when nothing is held or the connection ended."""
        if not self._held or self._aborted:
            return

        async def op() -> None:
            async with self._send_lock:
                await self._gate("out")
                if self._held:
                    held = bytes(self._held)
                    self._held.clear()
                    await self.inner.send_all(held)

        await self._guarded(op)

    async def _gate(self, direction: Literal["in", "out"]) -> None:
        while self._blocked(direction):
            await self.faults.wait_changed()
        delay = self._delay(direction)
        if delay > 0:
            await trio.sleep(delay)

    def _direction_of(self, sending: bool) -> Literal["in", "out"]:
        # For the node's own side, sending is "out"; a dialer stream is the node
        # dialling a lookupd, where sending is also "out" of the node.
        return "out" if sending else "in"

    async def _guarded(self, op: Callable[[], Awaitable[Any]]) -> Any:
        if self._aborted:
            raise trio.BrokenResourceError("connection dropped (fakensq fault)")
        with trio.CancelScope() as scope:
            self._scopes.add(scope)
            try:
                return await op()
            finally:
                self._scopes.discard(scope)
        raise trio.BrokenResourceError("connection dropped (fakensq fault)")

    async def abort(self) -> None:
        """Drop the connection: pending and later operations fail, the peer sees EOF."""
        if self._aborted:
            return
        self._aborted = True
        self.faults.trace("dropped", node=self.node, peer=self.peer)
        for scope in list(self._scopes):
            scope.cancel()
        await trio.aclose_forcefully(self.inner)

    # -- trio.abc.Stream -----------------------------------------------------

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        async def op() -> None:
            payload = bytes(data)
            if not self._opaque:
                # Frames are traced as the node writes them, before a stall or a
                # delay holds them: the trace keeps the node's view of time.
                payload, cut = self._scan_out(payload)
                async with self._send_lock:
                    if (
                        not cut
                        and self._holding()
                        and len(self._held) + len(payload) <= _HOLD_LIMIT
                    ):
                        self._held += payload
                        await trio.lowlevel.checkpoint()
                        return
                    await self._gate(self._direction_of(True))
                    if self._held:
                        payload = bytes(self._held) + payload
                        self._held.clear()
                    await self.inner.send_all(payload)
                if cut:
                    await self.abort()
                    raise trio.BrokenResourceError("connection cut (fakensq fault)")
                return
            await self._gate(self._direction_of(True))
            self.faults.trace("bytes", node=self.node, peer=self.peer, dir="out", n=len(payload))
            await self.inner.send_all(payload)

        await self._guarded(op)

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        async def op() -> bytes:
            data = bytes(await self.inner.receive_some(max_bytes))
            if not data:
                # Traced when the peer closed, even if a stall hides it from the node.
                self.faults.trace("eof", node=self.node, peer=self.peer)
            await self._gate(self._direction_of(False))
            if data and self._opaque:
                self.faults.trace("bytes", node=self.node, peer=self.peer, dir="in", n=len(data))
            elif data:
                self._scan_in(data)
            return data

        result: bytes = await self._guarded(op)
        if self._drop_in:
            await self.abort()
            raise trio.BrokenResourceError("connection dropped (fakensq fault)")
        return result

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        self.faults.closed(self)
        await self.inner.aclose()

    # -- NSQ framing -----------------------------------------------------------

    def _scan_in(self, data: bytes) -> None:
        """Trace the client's commands; learn its IDENTIFY names.

        What is held is bounded: a line (nsqd's are 16 KiB at most) and an
        IDENTIFY body; the other bodies are stepped over as they pass, never
        held, however long (:meth:`_skip_in`)."""
        if self._in_skip:
            data = self._skip_in(data)
        buf = self._in_buf
        buf += data
        if not self._in_magic:
            if len(buf) < 4:
                return
            self.faults.trace(
                "magic", node=self.node, peer=self.peer, data=buf[:4].decode("latin-1")
            )
            del buf[:4]
            self._in_magic = True
        while buf:
            end = buf.find(b"\n", 0, _MAX_LINE_SCAN)
            if end < 0:
                if len(buf) >= _MAX_LINE_SCAN:
                    self._go_opaque()  # (nsqd closes such a connection)
                return
            line = bytes(buf[:end]).rstrip(b"\r")
            name = line.split(b" ", 1)[0]
            body: bytes | None = None
            size = -1
            messages = 1
            if name in BODY_COMMANDS:
                if len(buf) < end + 5:
                    return
                (size,) = SIZE.unpack_from(buf, end + 1)
                if size < 0 or size > _MAX_SCAN:
                    self._go_opaque()
                    return
                if name == b"MPUB" and size >= 4 and len(buf) >= end + 9:
                    # How many messages it carries: its body's first word.
                    (messages,) = SIZE.unpack_from(buf, end + 5)
                if name != b"IDENTIFY" or size > _MAX_IDENTIFY_SCAN:
                    have = len(buf) - (end + 5)
                    if have < size:
                        # Step over the rest of the body as it comes.
                        buf.clear()
                        self._in_skip = size - have
                        self._in_pending = (line, name, size, messages)
                        return
                    del buf[: end + 5 + size]
                else:
                    if len(buf) < end + 5 + size:
                        return
                    body = bytes(buf[end + 5 : end + 5 + size])
                    del buf[: end + 5 + size]
            else:
                del buf[: end + 1]
            if not self._command_in(line, name, size, body, messages):
                return

    def _skip_in(self, data: bytes) -> bytes:
        """Step over the body being skipped; what follows it in ``data``."""
        taken = min(self._in_skip, len(data))
        self._in_skip -= taken
        if not self._in_skip and self._in_pending is not None:
            line, name, size, messages = self._in_pending
            self._in_pending = None
            if not self._command_in(line, name, size, None, messages):
                return b""
        return data[taken:]

    def _command_in(
        self, line: bytes, name: bytes, size: int, body: bytes | None, messages: int = 1
    ) -> bool:
        """Trace one whole command, learn from it and tell the faults' flow
        (:meth:`Faults.observe`) of a FIN or a publish (of ``messages``);
        False once the scan stops: the bytes are not NSQ commands any more,
        or a fault drops the connection here."""
        fields: dict[str, Any] = {"dir": "in", "cmd": line[:120].decode("latin-1")}
        if size >= 0:
            fields["size"] = size
        if name == b"IDENTIFY" and body is not None:
            fields.update(self._learn_identify(body))
        elif name == b"SUB":
            self.parsed_role = "consumer"
        elif name in (b"PUB", b"MPUB", b"DPUB") and self.parsed_role == "unknown":
            self.parsed_role = "producer"
        self.faults.trace("frame", node=self.node, peer=self.peer, **fields)
        if not name.isalpha() or not name.isupper():
            self._go_opaque()  # not NSQ commands (TLS, compression): stop parsing
            return False
        event = _FLOW_EVENTS.get(name)
        if event is not None and self.faults.observing:
            count = max(messages, 1) if event == "published" else 1
            verdict = self.faults.observe(self, event, count)
            if event == "published" and verdict != "drop":
                # The command itself, after its messages.
                verdict = self.faults.observe(self, "publish", 1)
            if verdict == "drop":
                self._drop_in = True
                return False
        return True

    def _learn_identify(self, body: bytes) -> dict[str, Any]:
        """Learn the client's names; what the trace keeps of its IDENTIFY."""
        try:
            doc = json.loads(body)
        except ValueError:
            return {}
        if not isinstance(doc, dict):
            return {}
        self.client_id = str(doc.get("client_id") or "")
        self.hostname = str(doc.get("hostname") or "")
        timeout = doc.get("msg_timeout")
        # Its own message timeout (ms), which nsqd applies to its messages.
        return {"msg_timeout": timeout} if isinstance(timeout, int) and timeout > 0 else {}

    def _go_opaque(self) -> None:
        self._opaque = True
        self._in_buf.clear()
        self._out_buf.clear()

    def _scan_out(self, data: bytes) -> tuple[bytes, bool]:
        """Apply frame faults to the node's frames; (bytes to send, whether the
        connection is cut after them: a truncated frame, a drop after a message)."""
        buf = self._out_buf
        buf += data
        out = bytearray()
        names = self._names()
        role = self.role
        while buf:
            if self._out_passing:
                # A large frame's rest, passed on as it comes.
                taken = min(self._out_passing, len(buf))
                out += buf[:taken]
                del buf[:taken]
                self._out_passing -= taken
                if self._out_passing:
                    break
                if self._out_cut:
                    self._out_cut = False
                    return bytes(out), True
                continue
            if len(buf) < 8:
                break
            (size,) = SIZE.unpack_from(buf)
            if size < 4 or size > _MAX_SCAN:
                out += buf
                buf.clear()
                self._go_opaque()
                break
            if len(buf) < 4 + size:
                if size > _MAX_FRAME_HOLD and len(buf) >= 8 + MESSAGE_HEADER_SIZE + _TRACED_BODY:
                    self._pass_large_frame(size, names, role)
                    continue
                break
            frame = bytes(buf[: 4 + size])
            del buf[: 4 + size]
            ftype = FRAME_HEADER.unpack_from(frame)[1]
            payload = frame[8:]
            self._trace_out(ftype, payload)
            if ftype == FRAME_TYPE_RESPONSE and payload == HEARTBEAT:
                swallow = self.faults.matching("swallow_heartbeats", self.node, names, role)
                if swallow:
                    self.faults.hit(swallow[0], frame="heartbeat")
                    continue
            spoiled = self._spoil(names, role)
            if "corrupt" in spoiled:
                frame = frame[:4] + _BAD_FRAME_TYPE + frame[8:]
            if "truncate" in spoiled:
                out += frame[: max(1, len(frame) // 2)]
                return bytes(out), True
            if ftype == FRAME_TYPE_MESSAGE and self.faults.observing:
                verdict = self.faults.observe(self, "sent", 1)
                if verdict == "withhold":
                    return bytes(out), True  # dropped as it goes: the client never gets it
                out += frame
                if verdict == "drop":
                    return bytes(out), True  # dropped after it
                continue
            out += frame
            if ftype == FRAME_TYPE_RESPONSE and payload[:1] == b"{" and self._upgrades(payload):
                # IDENTIFY's answer turned on TLS or compression: the rest is opaque.
                out += buf
                self._go_opaque()
                break
        return bytes(out), False

    def _pass_large_frame(self, size: int, names: tuple[str, ...], role: Role) -> None:
        """Start passing a frame too large to hold on as it comes (a message
        of a large body): traced, and spoiled by a frame fault, by its head
        (corrupt: its type; truncate: half of it goes, then the connection)."""
        buf = self._out_buf
        ftype = FRAME_HEADER.unpack_from(buf)[1]
        self._trace_out(ftype, bytes(buf[8 : 8 + MESSAGE_HEADER_SIZE + _TRACED_BODY]), size - 4)
        self._out_passing = 4 + size
        spoiled = self._spoil(names, role)
        if "corrupt" in spoiled:
            buf[4:8] = _BAD_FRAME_TYPE
        if "truncate" in spoiled:
            self._out_passing = max(1, (4 + size) // 2)
            self._out_cut = True
        elif ftype == FRAME_TYPE_MESSAGE and self.faults.observing:
            if self.faults.observe(self, "sent", 1) != "pass":
                # Dropped once the whole message has gone (one too large to
                # hold is on its way already).
                self._out_cut = True

    def _spoil(self, names: tuple[str, ...], role: Role) -> tuple[str, ...]:
        """The frame faults that spend themselves on the frame going out now
        (a corrupt one, a truncating one, or both)."""
        kinds = ("corrupt", "truncate")
        return tuple(k for k in kinds if self.faults.spend(k, self.node, names, role) is not None)

    @staticmethod
    def _upgrades(payload: bytes) -> bool:
        try:
            doc = json.loads(payload)
        except ValueError:
            return False
        return isinstance(doc, dict) and any(doc.get(k) for k in UPGRADES)

    def _trace_out(self, ftype: int, payload: bytes, length: int | None = None) -> None:
        """Trace one frame of the node's (``length``: the payload's, when
        ``payload`` is only its start)."""
        if not self.faults.tracing:
            return
        fields: dict[str, Any] = {"dir": "out"}
        if length is None:
            length = len(payload)
        if ftype == FRAME_TYPE_MESSAGE and len(payload) >= MESSAGE_HEADER_SIZE:
            message = decode_message(payload)
            # The timestamp is wall-clock time: left out so runs compare.
            fields.update(
                frame="message",
                id=message.id.decode("latin-1"),
                attempts=message.attempts,
                size=length - MESSAGE_HEADER_SIZE,
                # The body's start, to tell messages apart in a trace.
                body=message.body[:_TRACED_BODY].decode("latin-1"),
            )
        else:
            kind = {0: "response", 1: "error"}.get(ftype, str(ftype))
            fields.update(frame=kind, data=payload[:120].decode("latin-1"))
        self.faults.trace("frame", node=self.node, peer=self.peer, **fields)
