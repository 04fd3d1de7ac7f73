"""nsqlookupd, in-process: the TCP protocol V1, the registration DB, the HTTP API.

Behaves as nsqlookupd v1.3:

- TCP: a client sends the magic ``"  V1"``, then newline-terminated commands:
  ``IDENTIFY`` (followed by a 4-byte big-endian size and a JSON body),
  ``REGISTER topic [channel]``, ``UNREGISTER topic [channel]`` and ``PING``.
  Every answer, errors included, is ``[4-byte size][data]``; every error
  (``E_INVALID``, ``E_BAD_TOPIC``, ``E_BAD_CHANNEL``, ``E_BAD_BODY``) is fatal:
  nsqlookupd closes the connection after sending it.  When a connection closes,
  its producer is removed from every registration (the registrations stay).
- HTTP: ``/ping``, ``/info``, ``/debug``, ``/lookup``, ``/topics``, ``/channels``,
  ``/nodes`` (GET), ``/topic/create``, ``/topic/delete``, ``/channel/create``,
  ``/channel/delete``, ``/topic/tombstone`` (POST) and Go's ``/debug/pprof``
  (:mod:`fakensq.pprof`), routed as httprouter does (:mod:`fakensq.router`).
  Answers are plain JSON (no ``status_code``/``data`` envelope: v1.3 dropped the
  Accept negotiation); errors are ``{"message": "..."}``.  The aliases older
  versions served (``/create_topic``, ``/delete_topic``, ``/create_channel``,
  ``/delete_channel``, ``/tombstone_topic_producer``) answer 404 as in v1.3.0,
  unless the ``legacy_http_aliases`` option asks for them.
- Producers silent for longer than ``inactive_producer_timeout`` are left out of
  ``/lookup`` and ``/nodes``; a tombstoned producer is left out of ``/lookup`` of
  that topic for ``tombstone_lifetime``.  Times are ``trio.current_time()``, so a
  ``MockClock`` drives them.
"""

from __future__ import annotations

import json
import logging
import math
import socket
import struct
import time
from collections.abc import Callable
from typing import Any, Final

import trio

from trionsq.protocol.names import is_valid_channel_name, is_valid_topic_name

from ..golang.flags import format_go_duration
from ..golang.net import check_listen, join_host_port, split_host_port
from ..http import pprof
from ..http.router import Router
from ..http.server import HTTPServer, Request, Response
from ..serving import ServingNode
from ..version import VERSION
from .options import LookupdOptions
from .protocol import MAGIC_V1, encode_response
from .registry import PeerInfo, Producer, Registration, RegistrationDB, filter_by_active

__all__ = [
    "NSQLookupd",
    "LookupdOptions",
    "RegistrationDB",
    "Registration",
    "PeerInfo",
    "Producer",
    "LEGACY_ALIASES",
]

log = logging.getLogger("fakensq.nsqlookupd")

# nsqlookupd reads commands and IDENTIFY bodies unbounded; bounds keep a
# misbehaving client from growing our memory forever, far above what any nsqd
# sends (a longer line closes the connection; a larger body is read, dropped
# and refused as undecodable).
_MAX_LINE: Final = 8 * 1024 * 1024
_MAX_IDENTIFY_BODY: Final = 16 * 1024 * 1024
_READ_SIZE: Final = 16 * 1024
# time.Time{}.UnixNano() as Go computes it: /debug shows it for never-tombstoned producers.
_GO_ZERO_TIME_UNIX_NANO: Final = -6795364578871345152


#: The endpoints nsqlookupd v1.3.0 removed -> the one each stood for (served
#: only with ``legacy_http_aliases``).
LEGACY_ALIASES: Final = {
    "/create_topic": "/topic/create",
    "/delete_topic": "/topic/delete",
    "/create_channel": "/channel/create",
    "/delete_channel": "/channel/delete",
    "/tombstone_topic_producer": "/topic/tombstone",
}


class _FatalClientError(Exception):
    def __init__(self, code: str, description: str) -> None:
        super().__init__(f"{code} {description}")
        self.code = code
        self.description = description


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


class NSQLookupd(ServingNode):
    """An nsqlookupd serving TCP and HTTP inside the caller's task tree.

    Use ``async with NSQLookupd(tcp_address="127.0.0.1:0") as lookupd:``; the
    listening addresses (real ports) are then ``lookupd.tcp_address`` and
    ``lookupd.http_address``.  Options are :class:`LookupdOptions` fields.
    """

    def __init__(self, options: LookupdOptions | None = None, **overrides: Any) -> None:
        base = options or LookupdOptions()
        for name in overrides:
            if not hasattr(base, name):
                raise TypeError(f"unknown nsqlookupd option {name!r}")
        self.options = LookupdOptions(**{**base.__dict__, **overrides})
        self.db = RegistrationDB()
        self.tcp_address = ""
        self.http_address = ""
        self._tcp_port = 0
        self._http_port = 0
        self._hostname = socket.gethostname()
        # Maps trio time onto the wall clock for /debug's nanosecond timestamps.
        self._wall_offset = 0.0
        self._connections: set[trio.abc.Stream] = set()
        self._http = HTTPServer(self._handle_http)
        #: ``hooks(stream, remote) -> stream``: wraps every TCP connection served
        #: (fault injection, :mod:`fakensq.faults`); None: served as is.
        self.hooks: Callable[[trio.abc.Stream, str | None], trio.abc.Stream] | None = None
        self.router = Router(
            not_found=lambda _request: _v1_error(404, "NOT_FOUND"),
            method_not_allowed=lambda _request: _v1_error(405, "METHOD_NOT_ALLOWED"),
        )
        add = self.router.add
        add("GET", "/ping", self._ping)
        add("GET", "/info", self._info)
        add("GET", "/debug", self._debug)
        add("GET", "/lookup", self._lookup)
        add("GET", "/topics", self._topics)
        add("GET", "/channels", self._channels)
        add("GET", "/nodes", self._nodes)
        add("POST", "/topic/create", self._create_topic)
        add("POST", "/topic/delete", self._delete_topic)
        add("POST", "/channel/create", self._create_channel)
        add("POST", "/channel/delete", self._delete_channel)
        add("POST", "/topic/tombstone", self._tombstone_topic_producer)
        pprof.add_routes(add, index="/debug/pprof")
        if self.options.legacy_http_aliases:
            routes = {route.pattern: route for route in self.router.routes()}
            for alias, path in LEGACY_ALIASES.items():
                route = routes[path]
                add(route.method, alias, route.handler)

    # -- lifecycle ---------------------------------------------------------

    async def serve(
        self, *, task_status: trio.TaskStatus[NSQLookupd] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen on both addresses and serve until cancelled.

        ``task_status.started(self)`` once both listeners are bound.
        """
        self._wall_offset = time.time() - trio.current_time()
        # nsqlookupd.New listens first: an address it cannot have ends the
        # start with nsqlookupd's text (ListenError), not a socket traceback.
        check_listen(self.options.tcp_address, self.options.http_address, unix=False)
        listeners: list[trio.SocketListener] = []
        try:
            # An empty address means no listener: streams are then served through
            # handle_tcp / handle_http (an in-memory network, fakensq.simulation).
            if self.options.tcp_address:
                tcp_host, tcp_port = split_host_port(self.options.tcp_address)
                listeners = await trio.open_tcp_listeners(tcp_port, host=tcp_host or None)
                sockname = listeners[0].socket.getsockname()
                self._tcp_port = sockname[1]
                self.tcp_address = join_host_port(sockname[0], sockname[1])
                self._logf(logging.INFO, f"TCP: listening on {self.tcp_address}")
            async with trio.open_nursery() as nursery:
                if self.options.http_address:
                    http_host, http_port = split_host_port(self.options.http_address)
                    host, port = await nursery.start(self._http.serve, http_host or None, http_port)
                    self._http_port = port
                    self.http_address = join_host_port(host, port)
                    self._logf(logging.INFO, f"HTTP: listening on {self.http_address}")
                for listener in listeners:
                    nursery.start_soon(self._accept_loop, listener, nursery)
                task_status.started(self)
                if not listeners:
                    await trio.sleep_forever()  # stay up for handle_tcp's streams
        finally:
            for listener in listeners:
                await trio.aclose_forcefully(listener)
            for stream in list(self._connections):
                await trio.aclose_forcefully(stream)

    def _stopped(self, *, started: bool) -> None:
        if started:
            self._logf(logging.INFO, "TCP: closing " + self.tcp_address)

    def advertise(self, tcp_address: str, http_address: str) -> None:
        """Without listeners (served through an in-memory network), the addresses
        to report as its own (IDENTIFY's answer, ``/info``)."""
        self.tcp_address, self.http_address = tcp_address, http_address
        self._tcp_port = split_host_port(tcp_address)[1]
        self._http_port = split_host_port(http_address)[1]

    @property
    def tcp_port(self) -> int:
        return self._tcp_port

    @property
    def http_port(self) -> int:
        return self._http_port

    # -- programmatic views (what /lookup, /topics, /channels, /nodes show) --

    def topics(self) -> list[str]:
        return [r.key for r in self.db.find_registrations("topic", "*", "")]

    def channels(self, topic: str) -> list[str]:
        return [r.subkey for r in self.db.find_registrations("channel", topic, "*")]

    def producers(self, topic: str) -> list[PeerInfo]:
        """The producers ``/lookup?topic=`` lists (active, not tombstoned)."""
        producers = filter_by_active(
            self.db.find_producers("topic", topic, ""),
            self.options.inactive_producer_timeout,
            self.options.tombstone_lifetime,
        )
        return [p.peer for p in producers]

    def nodes(self) -> list[dict[str, Any]]:
        """The ``producers`` list of ``/nodes``."""
        producers = filter_by_active(
            self.db.find_producers("client", "", ""), self.options.inactive_producer_timeout, 0
        )
        nodes = []
        topic_producers: dict[str, list[Producer]] = {}
        for p in producers:
            topics = [
                r.key
                for r in self.db.lookup_registrations(p.peer.id)
                if r.category == "topic" and r.subkey == ""
            ]
            tombstones = []
            for t in topics:
                if t not in topic_producers:
                    topic_producers[t] = self.db.find_producers("topic", t, "")
                flag = False
                for tp in topic_producers[t]:
                    if tp.peer is p.peer:
                        flag = tp.is_tombstoned(self.options.tombstone_lifetime)
                        break
                tombstones.append(flag)
            node = p.peer.to_json()
            node["tombstones"] = tombstones
            node["topics"] = topics
            nodes.append(node)
        return nodes

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Return once ``predicate()`` holds, re-checking at every DB change."""
        while not predicate():
            await self.db.wait_changed()

    # -- logging -------------------------------------------------------------

    def _logf(self, level: int, msg: str) -> None:
        log.log(level, msg, extra={"nsq_prefix": self.options.log_prefix})

    # -- TCP ---------------------------------------------------------------

    async def _accept_loop(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:  # EMFILE and friends: back off, keep serving
                self._logf(logging.ERROR, f"accept failed - {exc}")
                await trio.sleep(0.01)
                continue
            nursery.start_soon(self.handle_tcp, stream)

    async def handle_http(self, stream: trio.abc.Stream) -> None:
        """Serve the HTTP API on an already connected stream, until it ends."""
        await self._http.handle_stream(stream)

    async def handle_tcp(self, stream: trio.abc.Stream, remote: str | None = None) -> None:
        """Serve the TCP protocol on an already connected stream, until it ends.

        ``remote`` (``"host:port"``) identifies the peer; by default the socket's.
        """
        if self.hooks is not None:
            stream = self.hooks(stream, remote)
        await self._handle_tcp(stream, remote)

    async def _handle_tcp(self, stream: trio.abc.Stream, remote: str | None = None) -> None:
        self._connections.add(stream)
        if remote is None:
            try:
                host, port = stream.socket.getpeername()[:2]  # type: ignore[attr-defined]
                remote = join_host_port(host, port)
            except (OSError, AttributeError):
                remote = "unknown:0"
        self._logf(logging.INFO, f"TCP: new client({remote})")
        peer: PeerInfo | None = None
        try:
            reader = _LineReader(stream)
            magic = await reader.read_exactly(4)
            if magic is None:
                self._logf(logging.ERROR, "failed to read protocol version - EOF")
                return
            self._logf(
                logging.INFO,
                f"CLIENT({remote}): desired protocol magic '{magic.decode('latin-1')}'",
            )
            if magic != MAGIC_V1:
                await stream.send_all(encode_response(b"E_BAD_PROTOCOL"))
                self._logf(
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
                except _FatalClientError as err:
                    self._logf(logging.ERROR, f"[{remote}] - {err}")
                    await stream.send_all(
                        encode_response(str(err).encode("utf-8", "surrogateescape"))
                    )
                    break
                await stream.send_all(encode_response(response))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except Exception:  # a bug must cost one connection, never the server
            log.exception("nsqlookupd: client(%s) handler failed", remote)
        finally:
            self._connections.discard(stream)
            self._logf(logging.INFO, f"PROTOCOL(V1): [{remote}] exiting ioloop")
            if peer is not None:
                for reg in self.db.lookup_registrations(peer.id):
                    removed, _ = self.db.remove_producer(reg, peer.id)
                    if removed:
                        self._logf(
                            logging.INFO,
                            f"DB: client({remote}) UNREGISTER category:{reg.category} "
                            f"key:{reg.key} subkey:{reg.subkey}",
                        )
            await trio.aclose_forcefully(stream)

    async def _exec(
        self, params: list[str], reader: _LineReader, remote: str, peer: PeerInfo | None
    ) -> tuple[bytes, PeerInfo | None]:
        command = params[0]
        if command == "PING":
            if peer is not None:
                now = trio.current_time()
                self._logf(
                    logging.INFO,
                    f"CLIENT({peer.id}): pinged "
                    f"(last ping {format_go_duration(now - peer.last_update)})",
                )
                peer.last_update = now
            return b"OK", peer
        if command == "IDENTIFY":
            return await self._identify(reader, remote, peer)
        if command == "REGISTER":
            return self._register(params[1:], remote, peer), peer
        if command == "UNREGISTER":
            return self._unregister(params[1:], remote, peer), peer
        raise _FatalClientError("E_INVALID", f"invalid command {command}")

    async def _identify(
        self, reader: _LineReader, remote: str, peer: PeerInfo | None
    ) -> tuple[bytes, PeerInfo]:
        if peer is not None:
            raise _FatalClientError("E_INVALID", "cannot IDENTIFY again")
        size_bytes = await reader.read_exactly(4)
        if size_bytes is None:
            raise _FatalClientError("E_BAD_BODY", "IDENTIFY failed to read body size")
        (size,) = struct.unpack(">l", size_bytes)
        if size < 0:
            # nsqlookupd v1.3.0 panics here (make with a negative length) and
            # its process dies: the connection closes with no answer.
            raise _SilentClose()
        if size > _MAX_IDENTIFY_BODY:
            if not await reader.discard(size):
                raise _FatalClientError("E_BAD_BODY", "IDENTIFY failed to read body")
            raise _FatalClientError("E_BAD_BODY", "IDENTIFY failed to decode JSON body")
        body = await reader.read_exactly(size)
        if body is None:
            raise _FatalClientError("E_BAD_BODY", "IDENTIFY failed to read body")
        new_peer = PeerInfo(id=remote)
        try:
            _decode_peer_json(body, new_peer)
        except (ValueError, RecursionError):
            raise _FatalClientError("E_BAD_BODY", "IDENTIFY failed to decode JSON body") from None
        new_peer.remote_address = remote
        if (
            not new_peer.broadcast_address
            or new_peer.tcp_port == 0
            or new_peer.http_port == 0
            or not new_peer.version
        ):
            raise _FatalClientError("E_BAD_BODY", "IDENTIFY missing fields")
        new_peer.last_update = trio.current_time()
        self._logf(
            logging.INFO,
            f"CLIENT({remote}): IDENTIFY Address:{new_peer.broadcast_address} "
            f"TCP:{new_peer.tcp_port} HTTP:{new_peer.http_port} Version:{new_peer.version}",
        )
        if self.db.add_producer(Registration("client", "", ""), Producer(new_peer)):
            self._logf(logging.INFO, f"DB: client({remote}) REGISTER category:client key: subkey:")
        # Go marshals this map with its keys sorted.
        response = {
            "broadcast_address": self.options.broadcast_address,
            "hostname": self._hostname,
            "http_port": self._http_port,
            "tcp_port": self._tcp_port,
            "version": VERSION,
        }
        return json.dumps(response, separators=(",", ":")).encode(), new_peer

    @staticmethod
    def _topic_channel(command: str, params: list[str]) -> tuple[str, str]:
        if not params:
            raise _FatalClientError("E_INVALID", f"{command} insufficient number of params")
        topic = params[0]
        channel = params[1] if len(params) >= 2 else ""
        if not is_valid_topic_name(topic):
            raise _FatalClientError("E_BAD_TOPIC", f"{command} topic name '{topic}' is not valid")
        if channel and not is_valid_channel_name(channel):
            raise _FatalClientError(
                "E_BAD_CHANNEL", f"{command} channel name '{channel}' is not valid"
            )
        return topic, channel

    def _register(self, params: list[str], remote: str, peer: PeerInfo | None) -> bytes:
        if peer is None:
            raise _FatalClientError("E_INVALID", "client must IDENTIFY")
        topic, channel = self._topic_channel("REGISTER", params)
        if channel:
            key = Registration("channel", topic, channel)
            if self.db.add_producer(key, Producer(peer)):
                self._logf(
                    logging.INFO,
                    f"DB: client({remote}) REGISTER category:channel key:{topic} subkey:{channel}",
                )
        if self.db.add_producer(Registration("topic", topic, ""), Producer(peer)):
            self._logf(
                logging.INFO, f"DB: client({remote}) REGISTER category:topic key:{topic} subkey:"
            )
        return b"OK"

    def _unregister(self, params: list[str], remote: str, peer: PeerInfo | None) -> bytes:
        if peer is None:
            raise _FatalClientError("E_INVALID", "client must IDENTIFY")
        topic, channel = self._topic_channel("UNREGISTER", params)
        if channel:
            key = Registration("channel", topic, channel)
            removed, left = self.db.remove_producer(key, peer.id)
            if removed:
                self._logf(
                    logging.INFO,
                    f"DB: client({remote}) UNREGISTER category:channel "
                    f"key:{topic} subkey:{channel}",
                )
            # An ephemeral channel goes away with its last producer.
            if left == 0 and channel.endswith("#ephemeral"):
                self.db.remove_registration(key)
        else:
            # A topic unregistration drops this producer from the topic's channels
            # too (nsqd unregisters channels first, so normally there are none).
            for reg in self.db.find_registrations("channel", topic, "*"):
                removed, _ = self.db.remove_producer(reg, peer.id)
                if removed:
                    self._logf(
                        logging.WARNING,
                        f"client({remote}) unexpected UNREGISTER category:channel "
                        f"key:{topic} subkey:{reg.subkey}",
                    )
            key = Registration("topic", topic, "")
            removed, left = self.db.remove_producer(key, peer.id)
            if removed:
                self._logf(
                    logging.INFO,
                    f"DB: client({remote}) UNREGISTER category:topic key:{topic} subkey:",
                )
            if left == 0 and topic.endswith("#ephemeral"):
                self.db.remove_registration(key)
        return b"OK"

    # -- HTTP --------------------------------------------------------------

    async def _handle_http(self, request: Request) -> Response:
        response = await self.router.handle(request)
        self._logf(
            logging.DEBUG,
            f"{response.status} {request.method} {request.path} ({request.remote_addr})",
        )
        return response

    async def _ping(self, request: Request) -> Response:
        return Response.text("OK")

    async def _info(self, request: Request) -> Response:
        return _v1({"version": VERSION})

    async def _topics(self, request: Request) -> Response:
        return _v1({"topics": self.topics()})

    async def _channels(self, request: Request) -> Response:
        topic = _topic_arg(request)
        if isinstance(topic, Response):
            return topic
        return _v1({"channels": self.channels(topic)})

    async def _lookup(self, request: Request) -> Response:
        topic = _topic_arg(request)
        if isinstance(topic, Response):
            return topic
        if not self.db.find_registrations("topic", topic, ""):
            return _v1_error(404, "TOPIC_NOT_FOUND")
        return _v1(
            {
                "channels": self.channels(topic),
                "producers": [p.to_json() for p in self.producers(topic)],
            }
        )

    async def _nodes(self, request: Request) -> Response:
        return _v1({"producers": self.nodes()})

    async def _debug(self, request: Request) -> Response:
        data: dict[str, list[dict[str, Any]]] = {}
        for reg, producers in self.db.items():
            key = f"{reg.category}:{reg.key}:{reg.subkey}"
            for p in producers:
                data.setdefault(key, []).append(
                    {  # a Go map: keys sorted
                        "broadcast_address": p.peer.broadcast_address,
                        "hostname": p.peer.hostname,
                        "http_port": p.peer.http_port,
                        "id": p.peer.id,
                        "last_update": self._unix_nano(p.peer.last_update),
                        "tcp_port": p.peer.tcp_port,
                        "tombstoned": p.tombstoned,
                        "tombstoned_at": self._unix_nano(p.tombstoned_at)
                        if p.tombstoned
                        else _GO_ZERO_TIME_UNIX_NANO,
                        "version": p.peer.version,
                    }
                )
        return _v1(dict(sorted(data.items())))

    def _unix_nano(self, trio_time: float) -> int:
        return math.floor((trio_time + self._wall_offset) * 1e9)

    async def _create_topic(self, request: Request) -> Response:
        topic = _topic_arg(request)
        if isinstance(topic, Response):
            return topic
        if not is_valid_topic_name(topic):
            return _v1_error(400, "INVALID_ARG_TOPIC")
        self._logf(logging.INFO, f"DB: adding topic({topic})")
        self.db.add_registration(Registration("topic", topic, ""))
        return _v1(None)

    async def _delete_topic(self, request: Request) -> Response:
        topic = _topic_arg(request)
        if isinstance(topic, Response):
            return topic
        for reg in self.db.find_registrations("channel", topic, "*"):
            self._logf(logging.INFO, f"DB: removing channel({reg.subkey}) from topic({topic})")
            self.db.remove_registration(reg)
        for reg in self.db.find_registrations("topic", topic, ""):
            self._logf(logging.INFO, f"DB: removing topic({topic})")
            self.db.remove_registration(reg)
        return _v1(None)

    async def _tombstone_topic_producer(self, request: Request) -> Response:
        topic = _topic_arg(request)
        if isinstance(topic, Response):
            return topic
        node = request.arg("node")
        if node is None:
            return _v1_error(400, "MISSING_ARG_NODE")
        self._logf(logging.INFO, f"DB: setting tombstone for producer@{node} of topic({topic})")
        for p in self.db.find_producers("topic", topic, ""):
            # nsqlookupd compares with "%s:%d" (no brackets, even for IPv6).
            if f"{p.peer.broadcast_address}:{p.peer.http_port}" == node:
                p.tombstone()
        return _v1(None)

    @staticmethod
    def _topic_channel_args(request: Request) -> tuple[str, str] | Response:
        topic = _topic_arg(request)
        if isinstance(topic, Response):
            return topic
        if not is_valid_topic_name(topic):
            return _v1_error(400, "INVALID_ARG_TOPIC")
        channel = request.arg("channel")
        if channel is None:
            return _v1_error(400, "MISSING_ARG_CHANNEL")
        if not is_valid_channel_name(channel):
            return _v1_error(400, "INVALID_ARG_CHANNEL")
        return topic, channel

    async def _create_channel(self, request: Request) -> Response:
        args = self._topic_channel_args(request)
        if isinstance(args, Response):
            return args
        topic, channel = args
        self._logf(logging.INFO, f"DB: adding channel({channel}) in topic({topic})")
        self.db.add_registration(Registration("channel", topic, channel))
        self._logf(logging.INFO, f"DB: adding topic({topic})")
        self.db.add_registration(Registration("topic", topic, ""))
        return _v1(None)

    async def _delete_channel(self, request: Request) -> Response:
        args = self._topic_channel_args(request)
        if isinstance(args, Response):
            return args
        topic, channel = args
        regs = self.db.find_registrations("channel", topic, channel)
        if not regs:
            return _v1_error(404, "CHANNEL_NOT_FOUND")
        self._logf(logging.INFO, f"DB: removing channel({channel}) from topic({topic})")
        for reg in regs:
            self.db.remove_registration(reg)
        return _v1(None)


_V1_HEADER: Final = ("X-NSQ-Content-Type", "nsq; version=1.0")


def _topic_arg(request: Request) -> str | Response:
    """The ``topic`` argument, or nsqlookupd's error for a query without one."""
    if request.query_error is not None:
        return _v1_error(400, "INVALID_REQUEST")  # http_api.NewReqParams failed
    topic = request.arg("topic")
    if topic is None:
        return _v1_error(400, "MISSING_ARG_TOPIC")
    return topic


def _v1(data: Any) -> Response:
    """A 200 as http_api.RespondV1 writes it: JSON, or an empty body for nil."""
    if data is None:
        return Response(200, b"", [_V1_HEADER])
    response = Response.json(data)
    response.headers.append(_V1_HEADER)
    return response


def _v1_error(status: int, message: str) -> Response:
    response = Response.json({"message": message}, status)
    response.headers.append(_V1_HEADER)
    return response
