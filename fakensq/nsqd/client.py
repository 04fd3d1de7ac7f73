"""One TCP client connection: nsqd's protocol V2.

The reader task parses commands (with :class:`CommandParser`) and executes them
in order, answering responses and errors at once, like nsqd's IOLoop.  The
writer task is nsqd's messagePump minus the channel reading: it sends
heartbeats and flushes buffered message frames (when the buffer fills, when the
client has no RDY left, or at the output buffer timeout).  Channels hand
messages to :meth:`ClientConnection.send_messages` synchronously.
"""

from __future__ import annotations

import logging
import math
import ssl
import time
from typing import TYPE_CHECKING, Any, Final

import trio

from trionsq.protocol import commands as cmds
from trionsq.protocol import states
from trionsq.protocol.codecs import Decoder, DeflateDecoder, SnappyDecoder
from trionsq.protocol.errors import (
    BadBodyError,
    CompressionError,
    IdentifyFailedError,
    InvalidError,
    LineTooLong,
    NSQErrorResponse,
    SubFailedError,
)
from trionsq.protocol.frames import (
    CLOSE_WAIT,
    OK,
    encode_error,
    encode_response,
)
from trionsq.protocol.identify import decode_identify
from trionsq.protocol.states import ConnState

from ..golang import json as gojson
from ..golang.flate import FlateWriter
from ..golang.snappy import SnappyWriter
from ..golang.tls import cipher_suite_text
from ..golang.tlsconfig import HandshakeError, server_handshake
from ..golang.tlsrecords import RecordSizer
from .auth import ClientAuth
from .negotiation import apply_identify, features, identify_response
from .options import TLS_NOT_REQUIRED
from .output import STREAM_ERRORS, ClientOutput

if TYPE_CHECKING:
    from .channel import Channel
    from .message import Message
    from .owner import ClientOwner
    from .topic import Topic

__all__ = ["ClientConnection", "STATE_NUMBERS"]

log = logging.getLogger(__name__)

# nsqd's client states (their numeric values appear in /stats).
#: nsqd's numbers for a client's state, as ``/stats`` shows them (``state``);
#: which command is valid in which state is :mod:`trionsq.protocol.states`.
STATE_NUMBERS: Final = {ConnState.INIT: 0, ConnState.SUBSCRIBED: 3, ConnState.CLOSING: 4}
#: stateDisconnected: the connection has ended.
STATE_DISCONNECTED: Final = 1

_OK_FRAME: Final = encode_response(OK)

_READ_SIZE = 64 * 1024
_DEFAULT_OUTPUT_BUFFER_SIZE = 16 * 1024


class _Closed(Exception):
    """Internal: stop serving this connection (after an error frame or silently)."""


class ClientConnection:
    """A client connected over TCP (or any stream) speaking protocol V2."""

    def __init__(
        self, nsqd: ClientOwner, stream: trio.abc.Stream, client_id: int, remote: str | None = None
    ) -> None:
        opts = nsqd.options
        self.nsqd = nsqd
        self.id = client_id
        self.stream: trio.abc.Stream = stream
        self.remote_address = remote or _remote_address(stream)
        host = self.remote_address.rpartition(":")[0].strip("[]")
        self.client_id = host
        self.hostname = host
        self.user_agent = ""
        #: Where the connection is in the protocol's state machine.
        self.state = ConnState.INIT
        self._disconnected = False
        self.connect_ts = int(time.time())

        self.heartbeat_interval = opts.client_timeout / 2
        self.msg_timeout = opts.msg_timeout
        self.output_buffer_size = _DEFAULT_OUTPUT_BUFFER_SIZE
        self.output_buffer_timeout = opts.output_buffer_timeout
        self.sample_rate = 0

        self.ready_count = 0
        self.in_flight_count = 0
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.pub_counts: dict[str, int] = {}
        self.channel: Channel | None = None

        self.tls = False
        self.snappy = False
        self.deflate = False
        self._decoder: Decoder | None = None
        self.auth = ClientAuth(nsqd, self._auth_peer, self.remote_address)

        self.parser = cmds.CommandParser(
            max_msg_size=opts.max_msg_size,
            max_body_size=opts.max_body_size,
            max_req_timeout_ms=int(opts.max_req_timeout * 1000),
            precheck=self._precheck,
            mpub_head=True,
            fin_runs=True,
        )
        #: what the client is sent: answers, message frames, heartbeats
        self.output = ClientOutput(self)
        # FINs of one read hand out new messages once, before any later answer.
        self._dispatch_pending = False
        # Messages this read published or requeued (REQ 0): they reach the
        # channels once the read is executed (see _reader_loop).
        self._in_transit: list[tuple[Topic, list[Message]]] = []
        self._requeued: list[Message] = []
        self._read_deadline = math.inf
        self._scope = trio.CancelScope()

    def __repr__(self) -> str:
        return f"ClientConnection({self.id}, {self.remote_address})"

    # --- lifecycle ---

    async def run(self) -> None:
        self.nsqd.clients[self.id] = self
        try:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    if not self.parser.awaiting_magic:
                        self.output.reset_heartbeat()
                    nursery.start_soon(self.output.run)
                    try:
                        await self._reader_loop()
                    except (_Closed, *STREAM_ERRORS, trio.TooSlowError) as exc:
                        log.debug("client %s: closed (%r)", self.remote_address, exc)
                    except CompressionError as exc:
                        log.info("client %s: %s", self.remote_address, exc)
                    except Exception:
                        # A bug here must not take the node (and the other clients) down.
                        log.exception("client %s: internal error", self.remote_address)
                    finally:
                        nursery.cancel_scope.cancel()
        finally:
            self._disconnected = True
            self.nsqd.clients.pop(self.id, None)
            channel, self.channel = self.channel, None
            try:
                if channel is not None:
                    channel.remove_client(self)
            except Exception:
                log.exception("client %s: error while leaving its channel", self.remote_address)
            finally:
                await trio.aclose_forcefully(self.stream)

    def close(self) -> None:
        """Drop the connection (the channel or topic was deleted, or the node stops)."""
        self._scope.cancel()

    # --- reading and executing ---

    async def _reader_loop(self) -> None:
        parser = self.parser
        # nsqd reads the magic with no deadline, and its IOLoop (heartbeats,
        # the read deadline) starts once it has it.
        awaiting_magic = parser.awaiting_magic
        self._read_deadline = math.inf if awaiting_magic else self._next_read_deadline()
        while True:
            try:
                go_on = await self._execute_buffered()
            finally:
                self._release_in_transit()
            if awaiting_magic and not parser.awaiting_magic:
                awaiting_magic = False
                self.output.reset_heartbeat()
                self._read_deadline = self._next_read_deadline()
            if self.output.answered:
                # The answers to every publish of one read, in one write.
                await self.output.send(b"")
            if not go_on:
                return
            decoder = self._decoder
            if isinstance(decoder, DeflateDecoder) and decoder.pending:
                # The rest of what the last read inflates to, a piece at a time.
                parser.feed(decoder.decode_some(b"", _READ_SIZE))
                continue
            data = await self._receive()
            if not data:
                # EOF or the read deadline inside a command's body: nsqd's
                # reader of that part fails, and nsqd says so as it closes.
                error = parser.cut_short()
                if error is not None:
                    await self._send_error(error)
                return
            if isinstance(decoder, DeflateDecoder):
                # (nsqd reads inflated data through its 16 KiB buffer: a line
                # too long ends the connection before the rest is inflated)
                data = decoder.decode_some(data, _READ_SIZE)
            elif decoder is not None:
                data = decoder.decode(data)
            parser.feed(data)

    async def _execute_buffered(self) -> bool:
        """Execute every whole command received; False once the connection must close.

        The order of frames follows nsqd's, where the IOLoop runs every command
        already received while the messagePump (another goroutine) hands out
        messages: a message already queued goes out as soon as a command makes
        room for it (RDY, FIN), before later answers; a message this read
        publishes or requeues (REQ 0) passes through nsqd's topic and channel
        pumps first, so it goes out after the read's answers (a FIN then a PUB,
        RDY 1: the PUB's OK, then its message; REQ then REQ of one message: the
        second fails, the message not being in flight yet).
        """
        parser = self.parser
        progressed = False
        while True:
            try:
                command = parser.next_command()
            except LineTooLong:
                return False  # (answers to what came before still go out)
            except NSQErrorResponse as exc:
                await self._send_error(exc)
                return False
            if command is None:
                self.deliver_pending()
                if progressed:
                    self._read_deadline = self._next_read_deadline()
                return True
            # (an MPUB's line alone does not: its body is read under the
            # deadline set before the line)
            progressed = progressed or type(command) is not cmds.MPubHead
            try:
                if type(command) is cmds.FinRun:
                    # The hot path, kept out of a coroutine call; new messages
                    # are handed out once for a run of FINs.
                    channel = self.channel
                    assert channel is not None  # prechecked: subscribed or closing
                    ids = command.ids
                    start = 0
                    while start < len(ids):
                        failed = channel.finish_many(self, ids, start)
                        if failed != start:
                            self._dispatch_pending = True
                        if failed < 0:
                            break
                        start = failed + 1
                        try:
                            channel.finish(self, ids[failed], dispatch=False)  # raises
                        except NSQErrorResponse as exc:
                            await self._send_error(exc)  # (E_FIN_FAILED: not fatal)
                elif type(command) is cmds.Pub and not self.nsqd.auth_enabled:
                    # The other hot path: a PUB to a topic that exists needs
                    # nothing awaited (no authorization, no topic to set up).
                    topic = self.nsqd.topics.get(command.topic)
                    if topic is None:
                        await self._exec(command)
                    else:
                        self._publish_to(topic, [command.body])
                else:
                    await self._exec(command)
            except NSQErrorResponse as exc:
                await self._send_error(exc)
                if exc.fatal:
                    return False

    def deliver_pending(self) -> None:
        """Hand out once the messages the FINs executed so far made room for."""
        if self._dispatch_pending:
            self._dispatch_pending = False
            if self.channel is not None:
                self.channel.dispatch()

    def _release_in_transit(self) -> None:
        """What this read published or requeued reaches its topics and channels."""
        self.deliver_pending()
        requeued, self._requeued = self._requeued, []
        if requeued and self.channel is not None:
            self.channel.put_back(requeued)
        in_transit, self._in_transit = self._in_transit, []
        i, n = 0, len(in_transit)
        while i < n:
            topic, msgs = in_transit[i]
            i += 1
            if i < n and in_transit[i][0] is topic and topic.takes_batches():
                # Consecutive publishes to one topic in one put: the same
                # outcome (see Topic.takes_batches), at one put's cost.
                msgs = list(msgs)
                while i < n and in_transit[i][0] is topic:
                    msgs += in_transit[i][1]
                    i += 1
            if topic.exiting:  # deleted meanwhile: published to the new one
                topic = self.nsqd.get_topic(topic.name)
            topic.put_many(msgs, admitted=True)

    def _next_read_deadline(self) -> float:
        """nsqd's read deadline, set before it reads each command: two heartbeat
        intervals, for the whole command (its line and its body), so a peer
        that trickles a command in meets it as a silent one does."""
        hb = self.heartbeat_interval
        return trio.current_time() + 2 * hb if hb > 0 else math.inf

    async def _receive(self) -> bytes:
        if self._read_deadline < math.inf:
            with trio.move_on_at(self._read_deadline):
                return bytes(await self.stream.receive_some(_READ_SIZE))
            log.info("client %s: read timeout", self.remote_address)
            return b""
        return bytes(await self.stream.receive_some(_READ_SIZE))

    def _precheck(self, name: bytes) -> None:
        """The checks nsqd makes before it looks at a command's parameters: the
        state machine's table (IDENTIFY first, as nsqd checks nothing before it),
        then TLS, then what SUB needs."""
        if name != b"IDENTIFY" and self.nsqd.options.tls_required != TLS_NOT_REQUIRED:
            if not self.tls:
                text = name.decode("utf-8", "surrogateescape")
                raise InvalidError(f"cannot {text} in current state (TLS required)")
        states.check(self.state, name)
        if name == b"SUB" and self.heartbeat_interval <= 0:
            raise InvalidError("cannot SUB with heartbeats disabled")

    async def _exec(self, command: cmds.Command) -> None:
        if isinstance(command, cmds.Fin):
            self._subscribed_channel().finish(self, command.id)
        elif isinstance(command, cmds.Rdy):
            if states.is_ignored(self.state, b"RDY"):
                return  # nsqd ignores RDY after CLS, before parsing the count
            self._rdy(command.count())
        elif isinstance(command, cmds.Pub):
            await self.auth.check("PUB", command.topic, "")
            await self.nsqd.open_topic(command.topic)
            self._publish(command.topic, [command.body])
        elif isinstance(command, cmds.MPubHead):
            # nsqd authorizes an MPUB and creates its topic before reading the body.
            await self.auth.check("MPUB", command.topic, "")
            await self.nsqd.open_topic(command.topic)
        elif isinstance(command, cmds.MPub):
            self._publish(command.topic, command.bodies)
        elif isinstance(command, cmds.Req):
            delay_ns = min(max(command.delay_ns, 0), int(self.nsqd.options.max_req_timeout * 1e9))
            self._subscribed_channel().requeue(
                self, command.id, delay_ns / 1e9, hold=self._requeued
            )
        elif isinstance(command, cmds.Touch):
            self._subscribed_channel().touch(self, command.id)
        elif isinstance(command, cmds.DPub):
            await self.auth.check("DPUB", command.topic, "")
            await self.nsqd.open_topic(command.topic)
            self._publish(command.topic, [command.body], command.delay_ms / 1000)
        elif isinstance(command, cmds.Nop):
            pass
        elif isinstance(command, cmds.Sub):
            await self._sub(command)
        elif isinstance(command, cmds.Cls):
            self.state = states.state_after(self.state, b"CLS")
            self._set_ready(0)
            await self._send_response(CLOSE_WAIT)
        elif isinstance(command, cmds.Identify):
            await self._identify(command.body)
        elif isinstance(command, cmds.Auth):
            await self._send_response(gojson.dumps(await self.auth.authenticate(command.secret)))

    def _subscribed_channel(self) -> Channel:
        assert self.channel is not None  # the precheck allows only subscribed/closing
        return self.channel

    def _publish(self, name: str, bodies: list[bytes], defer: float = 0.0) -> None:
        """PUB, MPUB, DPUB: answered now, in the topic once the read is executed."""
        self._publish_to(self.nsqd.get_topic(name), bodies, defer)

    def _publish_to(self, topic: Topic, bodies: list[bytes], defer: float = 0.0) -> None:
        topic.admit(len(bodies))  # (a fault may refuse the publish)
        if len(bodies) == 1:
            msgs = [topic.new_message(bodies[0], defer)]
        else:
            msgs = topic.new_messages(bodies)
        name = topic.name
        self.pub_counts[name] = self.pub_counts.get(name, 0) + len(bodies)
        if self._dispatch_pending:
            self.deliver_pending()
        self.output.answer(_OK_FRAME)
        self._in_transit.append((topic, msgs))

    def _rdy(self, count: int) -> None:
        max_rdy = self.nsqd.options.max_rdy_count
        if count < 0 or count > max_rdy:
            raise InvalidError(f"RDY count {count} out of range 0-{max_rdy}")
        self._set_ready(count)

    def _set_ready(self, count: int) -> None:
        self.ready_count = count
        self.ready_state_changed()
        if self.channel is not None:
            self.channel.dispatch()
        self.output.pump_wakes()

    async def _sub(self, command: cmds.Sub) -> None:
        await self.auth.check("SUB", command.topic, command.channel)
        topic = await self.nsqd.open_topic(command.topic)
        channel = topic.get_channel(command.channel)
        limit = self.nsqd.options.max_channel_consumers
        if limit and len(channel.clients) >= limit:
            raise SubFailedError(
                f"SUB failed consumers for {command.topic}:{command.channel} "
                f"exceeds limit of {limit}"
            )
        channel.add_client(self)
        self.state = states.state_after(self.state, b"SUB")
        self.channel = channel
        await self._send_response(OK)
        self.output.pump_wakes()

    # --- IDENTIFY ---

    async def _identify(self, body: bytes) -> None:
        opts = self.nsqd.options
        data = decode_identify(body)
        # (v1.3.0 no longer reads the short_id/long_id of older clients)
        self.client_id = data.get("client_id", "")
        self.hostname = data.get("hostname", "")
        self.user_agent = data.get("user_agent", "")
        try:
            apply_identify(self, opts, data)
        except ValueError as exc:
            raise BadBodyError(f"IDENTIFY {exc}") from None
        self.output.reset_heartbeat()
        if not data.get("feature_negotiation"):
            await self._send_response(OK)
            return
        granted = features(opts, data, tls_available=self.nsqd.tls_context is not None)
        reply = identify_response(opts, self, granted, auth_required=self.nsqd.auth_enabled)
        output = self.output
        async with output.lock:
            # (after the answers to what came before it in the same read)
            await output.send_through(encode_response(gojson.dumps(reply)))
            if granted.upgrades and self.parser.take_buffer():
                # nsqd reads the upgraded stream through a new reader: what the
                # client sent behind IDENTIFY, already in the old one, is lost.
                log.info("client %s: bytes sent before the upgrade are lost", self.remote_address)
            if granted.tls_v1:
                assert self.nsqd.tls_context is not None
                try:
                    tls_stream = await server_handshake(
                        self.stream, self.nsqd.tls_context, where=self._tcp_ends()
                    )
                except HandshakeError as exc:
                    # nsqd answers over the plain connection (then closes).
                    failed = IdentifyFailedError(f"IDENTIFY failed {exc}")
                    log.info("client %s: %s", self.remote_address, failed.wire_text())
                    with trio.move_on_after(1):
                        try:
                            await output.write(encode_error(failed))
                        except (*STREAM_ERRORS, trio.TooSlowError):
                            pass
                    raise _Closed from None
                self.stream = tls_stream
                self.tls = True
                output.upgrade(
                    records=RecordSizer(tls_stream.version() or "", _cipher_name(tls_stream))
                )
                await output.write(encode_response(OK))
            if granted.snappy or granted.deflate:
                codec: SnappyWriter | FlateWriter
                if granted.snappy:
                    codec, self._decoder = SnappyWriter(), SnappyDecoder()
                    self.snappy = True
                else:
                    codec, self._decoder = FlateWriter(granted.deflate_level), DeflateDecoder()
                    self.deflate = True
                output.upgrade(codec)
                await output.write(encode_response(OK))
        self.output.pump_wakes()

    # --- AUTH ---

    def _auth_peer(self) -> dict[str, str]:
        """What the auth server is told of this client besides its secret."""
        return {
            "remote_ip": self.remote_address.rpartition(":")[0].strip("[]"),
            "tls": "true" if self.tls else "false",
            "common_name": self._tls_common_name(),  # "" without a client certificate
        }

    def _tls_common_name(self) -> str:
        if not isinstance(self.stream, trio.SSLStream):
            return ""
        try:
            cert = self.stream.getpeercert()
        except (ssl.SSLError, trio.NeedHandshakeError, ValueError):
            return ""
        for rdn in (cert or {}).get("subject", ()):
            for key, value in rdn:
                if key == "commonName":
                    return str(value)
        return ""

    # --- the channel's side ---

    def is_ready_for_messages(self) -> bool:
        channel = self.channel
        if channel is None or channel.paused:
            return False
        if self.output.writing:
            # nsqd's messagePump takes no message while it writes, so a peer
            # that does not read holds it there: what is handed out is bounded
            # by what its socket took, not by its RDY.  (Asked again once the
            # write is done.)
            self.output.starved = True
            return False
        return self.ready()

    def ready(self) -> bool:
        """nsqd's IsReadyForMessages (whatever is being written)."""
        channel = self.channel
        if channel is None or channel.paused:
            return False
        return 0 < self.ready_count and self.in_flight_count < self.ready_count

    def is_producer(self) -> bool:
        return bool(self.pub_counts)

    def send_messages(self, batch: list[Message]) -> None:
        """Buffer message frames (the channel has put them in flight for us)."""
        n = len(batch)
        if not n:
            return
        self.in_flight_count += n
        self.message_count += n
        self.output.add_messages(batch)

    def ready_state_changed(self) -> None:
        self.output.ready_changed()

    def redispatch(self) -> None:
        """A write ended that turned the channel away: it may hand out again."""
        if self.channel is not None:
            self.channel.dispatch()

    def requeued_message(self) -> None:
        self.requeue_count += 1
        self.in_flight_count -= 1

    def timed_out_message(self) -> None:
        self.in_flight_count -= 1

    # --- writing ---

    def _tcp_ends(self) -> str:
        """Go's "local->remote" of this connection (in its network errors)."""
        sock = getattr(self.stream, "socket", None)
        try:
            return f"{_address_text(sock.getsockname())}->{self.remote_address}"  # type: ignore[union-attr]
        except (AttributeError, OSError):
            return f"->{self.remote_address}"

    async def _send_response(self, data: bytes) -> None:
        await self.output.send(encode_response(data))

    async def _send_error(self, error: NSQErrorResponse) -> None:
        log.info("client %s: %s", self.remote_address, error.wire_text())
        await self.output.send(encode_error(error))

    # --- stats ---

    def stats(self, topic_filter: str = "") -> dict[str, Any]:
        """nsqd's ClientV2Stats (the per-client entry of /stats)."""
        # nsqd's loop breaks after the first topic it keeps: one entry at most.
        pub_counts = [
            {"topic": t, "count": n}
            for t, n in self.pub_counts.items()
            if not topic_filter or t == topic_filter
        ][:1]
        doc: dict[str, Any] = {
            "client_id": self.client_id,
            "hostname": self.hostname,
            "version": "V2",
            "remote_address": self.remote_address,
            "state": STATE_DISCONNECTED if self._disconnected else STATE_NUMBERS[self.state],
            "ready_count": self.ready_count,
            "in_flight_count": self.in_flight_count,
            "message_count": self.message_count,
            "finish_count": self.finish_count,
            "requeue_count": self.requeue_count,
            "connect_ts": self.connect_ts,
            "sample_rate": self.sample_rate,
            "deflate": self.deflate,
            "snappy": self.snappy,
            "user_agent": self.user_agent,
        }
        # Go's omitempty fields.
        auth = self.auth.state
        if auth is not None and auth.authorizations:
            doc["authed"] = True
            if auth.identity:
                doc["auth_identity"] = auth.identity
            if auth.identity_url:
                doc["auth_identity_url"] = auth.identity_url
        if pub_counts:
            doc["pub_counts"] = pub_counts
        doc.update(self._tls_stats())
        return doc

    def _tls_stats(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "tls": self.tls,
            "tls_cipher_suite": "",
            "tls_version": "",
            "tls_negotiated_protocol": "",
            "tls_negotiated_protocol_is_mutual": False,
        }
        if self.tls and isinstance(self.stream, trio.SSLStream):
            try:
                cipher = self.stream.cipher()
                version = self.stream.version()
                alpn = self.stream.selected_alpn_protocol()
            except (ssl.SSLError, trio.NeedHandshakeError, ValueError):
                return info
            if cipher:
                info["tls_cipher_suite"] = cipher_suite_text(cipher[0])
            info["tls_version"] = _TLS_VERSIONS.get(version or "", version or "")
            if alpn:
                info["tls_negotiated_protocol"] = alpn
            # Go: "NegotiatedProtocolIsMutual is always true" (deprecated field).
            info["tls_negotiated_protocol_is_mutual"] = True
        return info


def _address_text(address: Any) -> str:
    host, port = address[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _cipher_name(stream: trio.SSLStream[Any]) -> str:
    cipher = stream.cipher()
    return cipher[0] if cipher else ""


_TLS_VERSIONS = {
    "TLSv1": "TLS1.0",
    "TLSv1.1": "TLS1.1",
    "TLSv1.2": "TLS1.2",
    "TLSv1.3": "TLS1.3",
}


def _remote_address(stream: trio.abc.Stream) -> str:
    sock = getattr(stream, "socket", None)
    if sock is not None:
        try:
            host, port = sock.getpeername()[:2]
        except OSError:
            pass
        else:
            return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return "127.0.0.1:0"
