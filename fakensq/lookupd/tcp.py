"""nsqlookupd's TCP protocol V1 (``LookupProtocolV1`` in Go), served for one node.

A client sends the magic ``"  V1"``, then newline-terminated commands:
``IDENTIFY`` (followed by a 4-byte big-endian size and a JSON body),
``REGISTER topic [channel]``, ``UNREGISTER topic [channel]`` and ``PING``.  Every
answer, errors included, is ``[4-byte size][data]``; every error (``E_INVALID``,
``E_BAD_TOPIC``, ``E_BAD_CHANNEL``, ``E_BAD_BODY``) is fatal: nsqlookupd closes the
connection after sending it.  When a connection closes, its producer is removed
from every registration (the registrations stay).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any, Final

import trio

from trionsq.protocol.errors import (
    BadBodyError,
    BadChannelError,
    BadProtocolError,
    BadTopicError,
    InvalidError,
    NSQErrorResponse,
)
from trionsq.protocol.frames import OK, SIZE
from trionsq.protocol.names import is_valid_channel_name, is_valid_topic_name
from trionsq.tools.flags import format_duration

from ..golang.net import join_host_port
from ..version import VERSION
from .protocol import MAGIC_V1, encode_response
from .registry import PeerInfo, Producer, Registration

if TYPE_CHECKING:
    from .daemon import NSQLookupd

__all__ = ["LookupProtocolV1"]

log = logging.getLogger("fakensq.nsqlookupd")

# nsqlookupd reads commands and IDENTIFY bodies unbounded; bounds keep a
# misbehaving client from growing our memory forever, far above what any nsqd
# sends (a longer line closes the connection; a larger body is read, dropped
# and refused as undecodable).
_MAX_LINE: Final = 8 * 1024 * 1024
_MAX_IDENTIFY_BODY: Final = 16 * 1024 * 1024
_READ_SIZE: Final = 16 * 1024


# Go's unicode.IsSpace (strings.TrimSpace): Python's whitespace but \x1c-\x1f.
_GO_SPACE: Final = (
    "\t\n\v\f\r \x85\xa0\u1680"
    + "".join(chr(c) for c in range(0x2000, 0x200B))
    + "\u2028\u2029\u202f\u205f\u3000"
)


class _SilentClose(Exception):
    """Close the connection without an answer."""


class _LineReader:
    """Buffered reads of lines and exact byte counts off a stream."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.buf = bytearray()

    async def _fill(self) -> bool:
        data = await self.stream.receive_some(_READ_SIZE)
        if not data:
            return False
        self.buf += data
        return True

    async def read_line(self) -> bytes | None:
        """The next line with its newline removed, or None at EOF / overlong line."""
        start = 0
        while True:
            idx = self.buf.find(b"\n", start)
            if idx >= 0:
                line = bytes(self.buf[:idx])
                del self.buf[: idx + 1]
                return line
            start = len(self.buf)
            if len(self.buf) > _MAX_LINE or not await self._fill():
                return None

    async def discard(self, n: int) -> bool:
        """Read and drop ``n`` bytes; False at EOF."""
        while n > 0:
            if not self.buf and not await self._fill():
                return False
            taken = min(n, len(self.buf))
            del self.buf[:taken]
            n -= taken
        return True

    async def read_exactly(self, n: int) -> bytes | None:
        while len(self.buf) < n:
            if not await self._fill():
                return None
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data


_PEER_FIELDS: Final = {
    "remote_address": str,
    "hostname": str,
    "broadcast_address": str,
    "tcp_port": int,
    "http_port": int,
    "version": str,
}


def _decode_peer_json(body: bytes, peer: PeerInfo) -> None:
    """Fill ``peer`` from an IDENTIFY body as Go's ``json.Unmarshal`` would.

    Raises ValueError where Go's decoder fails: invalid JSON, a non-object, or a
    value of the wrong type.  Keys match case-insensitively as in Go; unknown
    keys and nulls are ignored.
    """

    def reject_constant(name: str) -> Any:
        raise ValueError(name)  # NaN/Infinity are not JSON to Go

    data = json.loads(body.decode("utf-8", "replace"), parse_constant=reject_constant)
    if data is None:
        return
    if not isinstance(data, dict):
        raise ValueError("IDENTIFY body is not an object")
    for name, kind in _PEER_FIELDS.items():
        value: Any = None
        if name in data:
            value = data[name]
        else:
            for key, candidate in data.items():
                if key.lower() == name:
                    value = candidate
                    break
        if value is None:
            continue
        if kind is int:
            # Go decodes only an integer literal into an int (4150.0 and 1e3 fail).
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(name)
            if not -(1 << 63) <= value < (1 << 63):
                raise ValueError(name)
        elif not isinstance(value, str):
            raise ValueError(name)
        setattr(peer, name, value)


class LookupProtocolV1:
    """The V1 protocol of one nsqlookupd: a connection's commands against its DB."""

    def __init__(self, node: NSQLookupd) -> None:
        self.node = node

    async def serve(self, stream: trio.abc.Stream, remote: str | None = None) -> None:
        """Speak V1 on ``stream`` until it ends; then forget its producer and close it."""
        if remote is None:
            try:
                host, port = stream.socket.getpeername()[:2]  # type: ignore[attr-defined]
                remote = join_host_port(host, port)
            except (OSError, AttributeError):
                remote = "unknown:0"
        self.node.logf(logging.INFO, f"TCP: new client({remote})")
        peer: PeerInfo | None = None
        try:
            reader = _LineReader(stream)
            magic = await reader.read_exactly(4)
            if magic is None:
                self.node.logf(logging.ERROR, "failed to read protocol version - EOF")
                return
            self.node.logf(
                logging.INFO,
                f"CLIENT({remote}): desired protocol magic '{magic.decode('latin-1')}'",
            )
            if magic != MAGIC_V1:
                await stream.send_all(encode_response(BadProtocolError().to_bytes()))
                self.node.logf(
                    logging.ERROR,
                    f"client({remote}) bad protocol magic '{magic.decode('latin-1')}'",
                )
                return
            while True:
                raw = await reader.read_line()
                if raw is None:
                    break
                line = raw.decode("utf-8", "surrogateescape").strip(_GO_SPACE)
                params = line.split(" ")
                try:
                    response, peer = await self._exec(params, reader, remote, peer)
                except _SilentClose:
                    break
                except NSQErrorResponse as err:
                    self.node.logf(logging.ERROR, f"[{remote}] - {err}")
                    await stream.send_all(encode_response(err.to_bytes()))
                    break
                await stream.send_all(encode_response(response))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except Exception:  # a bug must cost one connection, never the server
            log.exception("nsqlookupd: client(%s) handler failed", remote)
        finally:
            self.node.logf(logging.INFO, f"PROTOCOL(V1): [{remote}] exiting ioloop")
            if peer is not None:
                for reg in self.node.db.lookup_registrations(peer.id):
                    self._remove(reg, peer, remote)
            await trio.aclose_forcefully(stream)

    async def _exec(
        self, params: list[str], reader: _LineReader, remote: str, peer: PeerInfo | None
    ) -> tuple[bytes, PeerInfo | None]:
        command = params[0]
        if command == "PING":
            if peer is not None:
                now = trio.current_time()
                self.node.logf(
                    logging.INFO,
                    f"CLIENT({peer.id}): pinged "
                    f"(last ping {format_duration(now - peer.last_update)})",
                )
                peer.last_update = now
            return OK, peer
        if command == "IDENTIFY":
            return await self._identify(reader, remote, peer)
        if command == "REGISTER":
            return self._register(params[1:], remote, peer), peer
        if command == "UNREGISTER":
            return self._unregister(params[1:], remote, peer), peer
        raise InvalidError(f"invalid command {command}")

    async def _identify(
        self, reader: _LineReader, remote: str, peer: PeerInfo | None
    ) -> tuple[bytes, PeerInfo]:
        if peer is not None:
            raise InvalidError("cannot IDENTIFY again")
        size_bytes = await reader.read_exactly(4)
        if size_bytes is None:
            raise BadBodyError("IDENTIFY failed to read body size")
        (size,) = SIZE.unpack(size_bytes)
        if size < 0:
            # nsqlookupd v1.3.0 panics here (make with a negative length) and
            # its process dies: the connection closes with no answer.
            raise _SilentClose()
        if size > _MAX_IDENTIFY_BODY:
            if not await reader.discard(size):
                raise BadBodyError("IDENTIFY failed to read body")
            raise BadBodyError("IDENTIFY failed to decode JSON body")
        body = await reader.read_exactly(size)
        if body is None:
            raise BadBodyError("IDENTIFY failed to read body")
        new_peer = PeerInfo(id=remote)
        try:
            _decode_peer_json(body, new_peer)
        except (ValueError, RecursionError):
            raise BadBodyError("IDENTIFY failed to decode JSON body") from None
        new_peer.remote_address = remote
        if (
            not new_peer.broadcast_address
            or new_peer.tcp_port == 0
            or new_peer.http_port == 0
            or not new_peer.version
        ):
            raise BadBodyError("IDENTIFY missing fields")
        new_peer.last_update = trio.current_time()
        self.node.logf(
            logging.INFO,
            f"CLIENT({remote}): IDENTIFY Address:{new_peer.broadcast_address} "
            f"TCP:{new_peer.tcp_port} HTTP:{new_peer.http_port} Version:{new_peer.version}",
        )
        if self.node.db.add_producer(Registration("client", "", ""), Producer(new_peer)):
            self.node.logf(
                logging.INFO, f"DB: client({remote}) REGISTER category:client key: subkey:"
            )
        # Go marshals this map with its keys sorted.
        response = {
            "broadcast_address": self.node.options.broadcast_address,
            "hostname": self.node.hostname,
            "http_port": self.node.http_port,
            "tcp_port": self.node.tcp_port,
            "version": VERSION,
        }
        return json.dumps(response, separators=(",", ":")).encode(), new_peer

    @staticmethod
    def _topic_channel(command: str, params: list[str]) -> tuple[str, str]:
        if not params:
            raise InvalidError(f"{command} insufficient number of params")
        topic = params[0]
        channel = params[1] if len(params) >= 2 else ""
        if not is_valid_topic_name(topic):
            raise BadTopicError(f"{command} topic name '{topic}' is not valid")
        if channel and not is_valid_channel_name(channel):
            raise BadChannelError(f"{command} channel name '{channel}' is not valid")
        return topic, channel

    def _register(self, params: list[str], remote: str, peer: PeerInfo | None) -> bytes:
        if peer is None:
            raise InvalidError("client must IDENTIFY")
        topic, channel = self._topic_channel("REGISTER", params)
        if channel:
            self._add(Registration("channel", topic, channel), peer, remote)
        self._add(Registration("topic", topic, ""), peer, remote)
        return OK

    def _unregister(self, params: list[str], remote: str, peer: PeerInfo | None) -> bytes:
        if peer is None:
            raise InvalidError("client must IDENTIFY")
        topic, channel = self._topic_channel("UNREGISTER", params)
        if channel:
            key = Registration("channel", topic, channel)
        else:
            # A topic unregistration drops this producer from the topic's channels
            # too (nsqd unregisters channels first, so normally there are none).
            for reg in self.node.db.find_registrations("channel", topic, "*"):
                self._remove(reg, peer, remote, unexpected=True)
            key = Registration("topic", topic, "")
        left = self._remove(key, peer, remote)
        # An ephemeral topic or channel goes away with its last producer.
        if left == 0 and (channel or topic).endswith("#ephemeral"):
            self.node.db.remove_registration(key)
        return OK

    def _add(self, key: Registration, peer: PeerInfo, remote: str) -> None:
        if self.node.db.add_producer(key, Producer(peer)):
            self.node.logf(logging.INFO, f"DB: client({remote}) REGISTER {_described(key)}")

    def _remove(
        self, key: Registration, peer: PeerInfo, remote: str, *, unexpected: bool = False
    ) -> int:
        """Remove ``peer`` from ``key``'s producers (logged as nsqlookupd logs
        it); how many producers ``key`` has left."""
        removed, left = self.node.db.remove_producer(key, peer.id)
        if removed and unexpected:
            self.node.logf(
                logging.WARNING, f"client({remote}) unexpected UNREGISTER {_described(key)}"
            )
        elif removed:
            self.node.logf(logging.INFO, f"DB: client({remote}) UNREGISTER {_described(key)}")
        return left


def _described(key: Registration) -> str:
    return f"category:{key.category} key:{key.key} subkey:{key.subkey}"
