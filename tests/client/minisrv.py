"""A tiny scripted nsqd for the client's unit tests, over in-memory streams.

It speaks the server side of the protocol with the sans-IO CommandParser and the
frame encoders, records everything the client sends, and delivers queued
messages within each connection's RDY (nsqd's semantics: RDY caps the messages
in flight).  Tests script it: put messages, inject errors, heartbeats, garbage,
or refuse connections.
"""

from __future__ import annotations

import json
import socket
import ssl
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import trio
import trio.testing

import trionsq
from trionsq.connection import CodecStream
from trionsq.protocol import codecs, commands
from trionsq.protocol.commands import CommandParser
from trionsq.protocol.errors import AuthFailedError, NSQErrorResponse
from trionsq.protocol.frames import encode_error, encode_message, encode_response


@dataclass
class Queued:
    id: bytes
    body: bytes
    attempts: int = 1
    timestamp: int = 1_700_000_000_000_000_000


@dataclass
class Record:
    """Everything one client connection sent, in order."""

    identify: dict[str, Any] = field(default_factory=dict)
    commands: list[commands.Command] = field(default_factory=list)
    rdys: list[int] = field(default_factory=list)
    fins: list[bytes] = field(default_factory=list)
    reqs: list[tuple[bytes, int]] = field(default_factory=list)
    touches: list[bytes] = field(default_factory=list)
    nops: int = 0
    auth: bytes | None = None


class ServerConn:
    def __init__(self, server: MiniNSQD, stream: trio.abc.Stream) -> None:
        self.server = server
        self.stream = stream
        self.record = Record()
        self.parser = CommandParser()
        self.lock = trio.Lock()
        self.rdy = 0
        self.last_rdy = 0  # the last RDY above 0
        self.in_flight: dict[bytes, Queued] = {}
        self.subscribed = False
        self.closing = False
        self.closed = False
        self.wakeup = trio.Event()

    async def send(self, data: bytes) -> None:
        async with self.lock:
            await self.stream.send_all(data)

    async def close(self) -> None:
        self.closed = True
        self.wakeup.set()
        await trio.aclose_forcefully(self.stream)
        # What was in flight goes back to the queue, as in nsqd.
        for item in self.in_flight.values():
            item.attempts += 1
            self.server.queue.appendleft(item)
        self.in_flight.clear()
        self.server.poke()

    async def error(self, error: NSQErrorResponse) -> None:
        await self.send(encode_error(error))
        if error.fatal:
            await self.close()

    async def serve(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._pump)
                await self._read_loop()
                nursery.cancel_scope.cancel()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            if not self.closed:
                with trio.CancelScope(shield=True):
                    await self.close()

    async def _read_loop(self) -> None:
        try:
            await self._read_commands()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def _read_commands(self) -> None:
        while not self.closed:
            data = await self.stream.receive_some(65536)
            if not data:
                return
            self.parser.feed(data)
            while not self.closed:
                try:
                    command = self.parser.next_command()
                except NSQErrorResponse as exc:
                    await self.error(exc)
                    return
                if command is None:
                    break
                self.record.commands.append(command)
                await self._handle(command)

    async def _upgrade(self, request: dict[str, Any]) -> dict[str, Any]:
        server = self.server
        response: dict[str, Any] = {
            "max_rdy_count": server.max_rdy_count,
            "version": "1.3.0",
            "max_msg_timeout": 900000,
            "msg_timeout": 60000,
            "tls_v1": bool(request.get("tls_v1")) and server.tls_context is not None,
            "deflate": bool(request.get("deflate")) and server.compression,
            "deflate_level": request.get("deflate_level", 6),
            "max_deflate_level": 6,
            "snappy": bool(request.get("snappy")) and server.compression,
            "sample_rate": 0,
            "auth_required": server.auth_secret is not None,
            "output_buffer_size": 16384,
            "output_buffer_timeout": 250,
        }
        response.update(server.identify_overrides)
        return response

    async def _handle(self, command: commands.Command) -> None:
        server = self.server
        record = self.record
        if isinstance(command, commands.Identify):
            request = json.loads(command.body)
            record.identify = request
            if server.identify_delay:
                await trio.sleep(server.identify_delay)
            if not server.feature_negotiation:
                await self.send(encode_response(b"OK"))
                return
            response = await self._upgrade(request)
            await self.send(encode_response(json.dumps(response).encode()))
            if response["tls_v1"]:
                assert server.tls_context is not None
                leftover = self.parser.take_buffer()
                assert not leftover
                self.stream = trio.SSLStream(self.stream, server.tls_context, server_side=True)
                await self.stream.do_handshake()
                await self.send(encode_response(b"OK"))
            codec: tuple[codecs.Encoder, codecs.Decoder] | None = None
            if response["snappy"]:
                codec = (codecs.SnappyEncoder(), codecs.SnappyDecoder())
            elif response["deflate"]:
                codec = (codecs.DeflateEncoder(6), codecs.DeflateDecoder())
            if codec is not None:
                leftover = self.parser.take_buffer()
                self.stream = CodecStream(self.stream, *codec, initial=leftover)
                await self.send(encode_response(b"OK"))
        elif isinstance(command, commands.Auth):
            record.auth = command.secret
            if server.auth_secret is not None and command.secret == server.auth_secret:
                reply = {"identity": "tester", "identity_url": "", "permission_count": 1}
                await self.send(encode_response(json.dumps(reply).encode()))
            else:
                await self.error(AuthFailedError("AUTH failed"))
        elif isinstance(command, commands.Sub):
            if server.sub_error is not None:
                await self.error(server.sub_error)
                return
            if server.sub_delay:
                # Answered late, but what follows is still read and recorded.
                server.nursery.start_soon(self._answer_sub_late, server.sub_delay)
                return
            self.subscribed = True
            await self.send(encode_response(b"OK"))
        elif isinstance(command, commands.Pub | commands.MPub | commands.DPub):
            error = server.pub_errors.get(command.topic)
            if error is not None:
                await self.error(error)
                return
            if server.pub_delay:
                await trio.sleep(server.pub_delay)
            if isinstance(command, commands.MPub):
                server.published.extend((command.topic, b) for b in command.bodies)
            else:
                server.published.append((command.topic, command.body))
            if isinstance(command, commands.DPub):
                server.deferred.append((command.topic, command.delay_ms, command.body))
            await self.send(encode_response(b"OK"))
        elif isinstance(command, commands.Rdy):
            self.rdy = command.count()
            if self.rdy:
                self.last_rdy = self.rdy
            record.rdys.append(self.rdy)
            server.rdy_history.append((trio.current_time(), self, self.rdy))
            if server.rdy_log is not None:
                server.rdy_log.append((server.name, self.rdy))
            self.wakeup.set()
        elif isinstance(command, commands.Fin):
            record.fins.append(command.id)
            server.fins.append(command.id)
            if self.in_flight.pop(command.id, None) is None:
                await self.send(encode_error(b"E_FIN_FAILED FIN " + command.id + b" failed"))
            self.wakeup.set()
        elif isinstance(command, commands.Req):
            delay_ms = command.delay_ns // 1_000_000
            record.reqs.append((command.id, delay_ms))
            server.reqs.append((command.id, delay_ms))
            item = self.in_flight.pop(command.id, None)
            if item is not None and server.redeliver_requeued:
                item.attempts += 1
                server.queue.append(item)
                server.poke()
            self.wakeup.set()
        elif isinstance(command, commands.Touch):
            record.touches.append(command.id)
        elif isinstance(command, commands.Cls):
            self.closing = True
            if not server.ignore_cls:
                if server.cls_delay:
                    await trio.sleep(server.cls_delay)
                await self.send(encode_response(b"CLOSE_WAIT"))
                if server.straggler_after is not None:
                    server.nursery.start_soon(self._straggle, server.straggler_after)
        elif isinstance(command, commands.Nop):
            record.nops += 1

    async def _answer_sub_late(self, delay: float) -> None:
        await trio.sleep(delay)
        if not self.closed:
            self.subscribed = True
            self.wakeup.set()
            try:
                await self.send(encode_response(b"OK"))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    async def _straggle(self, delay: float) -> None:
        """What nsqd's sender does when it took a message just before reading
        CLS: the message goes out after CLOSE_WAIT, as late as it gets to run."""
        await trio.sleep(delay)
        # Taken before CLS (or a RDY 0 just before it) was read: under the
        # last RDY above 0.
        if self.server.queue and len(self.in_flight) < self.last_rdy and not self.closed:
            item = self.server.queue.popleft()
            self.in_flight[item.id] = item
            self.server.deliveries.append((self, item.id))
            try:
                await self.send(encode_message(item.timestamp, item.attempts, item.id, item.body))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    async def _pump(self) -> None:
        try:
            await self._deliver()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def _deliver(self) -> None:
        server = self.server
        while not self.closed:
            while (
                self.subscribed
                and not self.closing
                and server.queue
                and len(self.in_flight) < self.rdy
            ):
                item = server.queue.popleft()
                self.in_flight[item.id] = item
                server.deliveries.append((self, item.id))
                await self.send(encode_message(item.timestamp, item.attempts, item.id, item.body))
            self.wakeup = trio.Event()
            server.waiters[self] = None
            await self.wakeup.wait()


class MiniNSQD:
    """One scripted nsqd; ``connector`` hands out in-memory connections to it."""

    def __init__(
        self,
        nursery: trio.Nursery,
        *,
        max_rdy_count: int = 2500,
        feature_negotiation: bool = True,
        tls_context: ssl.SSLContext | None = None,
        compression: bool = True,
        auth_secret: bytes | None = None,
        tcp: bool = False,
    ) -> None:
        self.nursery = nursery
        #: connections over real TCP sockets on 127.0.0.1 (a consumer's
        #: shared I/O serves those), not in-memory streams
        self.tcp = tcp
        self.max_rdy_count = max_rdy_count
        self.feature_negotiation = feature_negotiation
        self.tls_context = tls_context
        self.compression = compression
        self.auth_secret = auth_secret
        self.identify_overrides: dict[str, Any] = {}
        self.conns: list[ServerConn] = []
        self.queue: deque[Queued] = deque()
        self.published: list[tuple[str, bytes]] = []
        self.deferred: list[tuple[str, int, bytes]] = []
        self.fins: list[bytes] = []
        self.reqs: list[tuple[bytes, int]] = []
        self.deliveries: list[tuple[ServerConn, bytes]] = []
        self.rdy_history: list[tuple[float, ServerConn, int]] = []
        self.pub_errors: dict[str, NSQErrorResponse] = {}
        self.sub_error: NSQErrorResponse | None = None
        self.pub_delay = 0.0
        self.redeliver_requeued = False
        self.refuse = False
        #: a slow nsqd: its answer to IDENTIFY, or to SUB, this late (inf:
        #: never; real nsqd's SUB can wait for its metadata lock while it
        #: fsyncs); after IDENTIFY it reads nothing meanwhile, after SUB it
        #: still reads and records what the client sends
        self.identify_delay = 0.0
        self.sub_delay = 0.0
        #: a hung nsqd: CLS is read but never answered
        self.ignore_cls = False
        #: a busy nsqd: CLOSE_WAIT this late, and (if set) one more message
        #: this long after it (its sender had taken one before reading CLS)
        self.cls_delay = 0.0
        self.straggler_after: float | None = None
        # a dict, not a set: wake-ups in a deterministic order
        self.waiters: dict[ServerConn, None] = {}
        self._next_id = 0
        self.name = ""
        #: shared by a Cluster: every RDY any node received, in arrival order
        self.rdy_log: list[tuple[str, int]] | None = None

    @property
    def live(self) -> list[ServerConn]:
        return [c for c in self.conns if not c.closed]

    def poke(self) -> None:
        for conn in self.waiters:
            conn.wakeup.set()
        self.waiters.clear()

    def put(self, *bodies: bytes, attempts: int = 1) -> list[bytes]:
        ids = []
        for body in bodies:
            msg_id = f"{self._next_id:016x}".encode()
            self._next_id += 1
            self.queue.append(Queued(msg_id, body, attempts))
            ids.append(msg_id)
        self.poke()
        return ids

    async def connector(self, host: str, port: int) -> trio.abc.Stream:
        if self.refuse:
            raise OSError(f"connection refused: {host}:{port}")
        client: trio.abc.Stream
        server: trio.abc.Stream
        if self.tcp:
            client, server = await tcp_stream_pair()
        else:
            client, server = trio.testing.memory_stream_pair()
        conn = ServerConn(self, server)
        self.conns.append(conn)
        self.nursery.start_soon(conn.serve)
        return client


class Cluster:
    """Several MiniNSQDs behind one connector, by ``host:port``."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.nodes: dict[str, MiniNSQD] = {}
        self.rdy_log: list[tuple[str, int]] = []

    def add(self, address: str, **options: Any) -> MiniNSQD:
        node = MiniNSQD(self.nursery, **options)
        node.name = address
        node.rdy_log = self.rdy_log
        self.nodes[address] = node
        return node

    async def connector(self, host: str, port: int) -> trio.abc.Stream:
        node = self.nodes.get(f"{host}:{port}")
        if node is None:
            raise OSError(f"connection refused: {host}:{port}")
        return await node.connector(host, port)


async def tcp_stream_pair(
    *, small_buffers: bool = False
) -> tuple[trio.SocketStream, trio.SocketStream]:
    """A connected (client, server) pair of real TCP streams on 127.0.0.1;
    ``small_buffers``: a few KB of socket buffer each way, so that a write of
    more soon fills them while the server does not read."""
    listener = trio.socket.socket()
    with listener:
        if small_buffers:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        await listener.bind(("127.0.0.1", 0))
        listener.listen()
        client = trio.socket.socket()
        if small_buffers:
            client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        await client.connect(listener.getsockname())
        server, _ = await listener.accept()
    return trio.SocketStream(client), trio.SocketStream(server)


def consumer(node: MiniNSQD | Cluster, **options: Any) -> trionsq.Consumer:
    """A Consumer of ``topic``/``chan`` connecting through ``node`` (by default
    to one nsqd, ``nsqd:4150``)."""
    options.setdefault("nsqd_tcp_addresses", ["nsqd:4150"])
    return trionsq.Consumer("topic", "chan", connector=node.connector, **options)
