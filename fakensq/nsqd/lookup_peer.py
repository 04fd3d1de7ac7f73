"""The nsqd side of nsqlookupd: one connection per ``--lookupd-tcp-address``.

Behaves as nsqd v1.3's ``lookupLoop`` and ``lookupPeer``:

- at start, every peer connects (sending the magic ``"  V1"``), IDENTIFYs with
  the nsqd's broadcast address, ports, hostname and version, then REGISTERs every
  topic (a topic with channels is registered through its channels:
  ``REGISTER topic channel``);
- every 15 s each peer sends ``PING`` and reads the answer; a failed command
  closes the connection, and the next command (the next ping, or the next
  registration change) reconnects and re-registers everything;
- each topic/channel creation or deletion is sent to every peer as
  ``REGISTER``/``UNREGISTER``, in order;
- each command waits at most 1 s for its answer, and answers larger than
  ``max_body_size`` are refused, as nsqd does.

It works with fakensq's nsqlookupd and with a real one.  Start it next to an
NSQD with ``await nursery.start(run_lookup_peers, nsqd)``; ``poke()`` makes it
heartbeat at once (fakensq only: lets a test or a Cluster skip the 15 s wait
after a lookupd restarts).
"""

from __future__ import annotations

import json
import logging
import math
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol

import trio

from trionsq.protocol import commands as cmds
from trionsq.protocol.errors import InvalidError
from trionsq.protocol.frames import SIZE

from ..golang.net import split_host_port
from ..lookupd.protocol import MAGIC_V1
from .options import VERSION, NSQDOptions

__all__ = [
    "HEARTBEAT_INTERVAL",
    "LookupPeer",
    "LookupPeers",
    "LookupPeerError",
    "run_lookup_peers",
    "lookup_peers_of",
    "NSQDHooks",
    "RegistryEvent",
    "set_lookup_connector",
    "lookup_connector_of",
]

log = logging.getLogger("fakensq.nsqd.lookup")

#: nsqd's heartbeat to every lookupd.
HEARTBEAT_INTERVAL: Final = 15.0
# nsqd's lookupPeer dials with a 1 s timeout and sets 1 s read/write deadlines.
_IO_TIMEOUT: Final = 1.0


@dataclass(frozen=True)
class RegistryEvent:
    """A topic or channel appeared or went (what nsqd tells nsqlookupd)."""

    action: Literal["register", "unregister"]
    topic: str
    channel: str | None = None


class NSQDHooks(Protocol):
    """The public parts of :class:`fakensq.NSQD` the lookup peers use."""

    @property
    def options(self) -> NSQDOptions: ...
    @property
    def tcp_address(self) -> str: ...
    @property
    def http_address(self) -> str: ...
    @property
    def hostname(self) -> str: ...

    def add_registry_listener(self, callback: Callable[[Any], None]) -> None: ...
    def remove_registry_listener(self, callback: Callable[[Any], None]) -> None: ...
    def registrations(self) -> list[tuple[str, str | None]]: ...


_running: weakref.WeakKeyDictionary[Any, LookupPeers] = weakref.WeakKeyDictionary()

#: ``connector(host, port) -> stream``: how an nsqd's peers dial its lookupds.
LookupConnector = Callable[[str, int], Awaitable[trio.abc.Stream]]
_connectors: weakref.WeakKeyDictionary[Any, LookupConnector] = weakref.WeakKeyDictionary()


def set_lookup_connector(nsqd: NSQDHooks, connector: LookupConnector | None) -> None:
    """Make ``nsqd``'s lookup peers dial through ``connector`` (an in-memory
    network, a fault-injecting wrapper) instead of TCP; None restores TCP.
    Takes effect at the next connection."""
    if connector is None:
        _connectors.pop(nsqd, None)
    else:
        _connectors[nsqd] = connector


def lookup_connector_of(nsqd: NSQDHooks) -> LookupConnector | None:
    """The connector set by :func:`set_lookup_connector`, if any."""
    return _connectors.get(nsqd)


def lookup_peers_of(nsqd: NSQDHooks) -> LookupPeers | None:
    """The running :class:`LookupPeers` of ``nsqd``, if any."""
    return _running.get(nsqd)


class LookupPeerError(Exception):
    """A lookupd command failed (connection refused, closed, timed out...)."""


def _command(name: bytes, *params: str) -> bytes:
    return b" ".join([name, *(p.encode() for p in params if p)]) + b"\n"


def identify_command(info: dict[str, Any]) -> bytes:
    """IDENTIFY as nsqd sends it to nsqlookupd: nsqd's peer info, in JSON."""
    return cmds.identify(info)


@dataclass
class _OptionsChanged:
    pass


@dataclass
class _Tick:
    retry: bool = False
    done: trio.Event | None = None


class LookupPeer:
    """One lookupd connection, connected lazily by :meth:`command`."""

    def __init__(self, address: str, peers: LookupPeers) -> None:
        self.address = address
        self._peers = peers
        self._stream: trio.abc.Stream | None = None
        self._buf = bytearray()
        #: The lookupd's IDENTIFY answer (tcp_port, http_port, version, ...).
        self.info: dict[str, Any] = {}
        #: How many times this peer has connected (each is followed by IDENTIFY
        #: and the registration of everything).
        self.connections = 0

    def __str__(self) -> str:
        return self.address

    @property
    def connected(self) -> bool:
        return self._stream is not None

    async def close(self) -> None:
        stream, self._stream = self._stream, None
        self._buf.clear()
        if stream is not None:
            await trio.aclose_forcefully(stream)

    async def _connect(self) -> None:
        self._peers.logf(logging.INFO, f"LOOKUP connecting to {self.address}")
        try:
            host, port = split_host_port(self.address)
        except ValueError as exc:  # nsqd logs it at each try and keeps running
            raise LookupPeerError(f"dial tcp: {exc}") from None
        try:
            with trio.fail_after(_IO_TIMEOUT):
                connector = _connectors.get(self._peers.nsqd)
                if connector is None:
                    stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
                else:
                    stream = await connector(host, port)
        except (OSError, trio.TooSlowError) as exc:
            raise LookupPeerError(f"dial tcp {self.address}: {exc}") from None
        self._stream = stream
        try:
            await self._send(MAGIC_V1)
        except LookupPeerError:
            await self.close()
            raise
        self.connections += 1
        if not await self._peers._connect_callback(self):
            await self.close()
            raise LookupPeerError("lookupPeer connectCallback() failed")

    async def command(self, cmd: bytes | None) -> bytes | None:
        """Send ``cmd`` and return the answer, connecting (and re-registering) first
        when disconnected.  ``None`` only connects.  Failures close the connection
        and raise :class:`LookupPeerError`."""
        if self._stream is None:
            await self._connect()
        if cmd is None:
            return None
        try:
            await self._send(cmd)
            return await self._read_response()
        except LookupPeerError:
            await self.close()
            raise

    async def _send(self, data: bytes) -> None:
        assert self._stream is not None
        try:
            with trio.fail_after(_IO_TIMEOUT):
                await self._stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise LookupPeerError(f"write: {exc}") from None
        except trio.TooSlowError:
            raise LookupPeerError("write: i/o timeout") from None

    async def _read_response(self) -> bytes:
        try:
            with trio.fail_after(_IO_TIMEOUT):
                await self._fill(4)
                (size,) = SIZE.unpack_from(self._buf)
                limit = self._peers.max_body_size
                if size > limit:
                    raise LookupPeerError(
                        f"response body size ({size}) is greater than limit ({limit})"
                    )
                if size < 0:
                    raise LookupPeerError(f"invalid response body size ({size})")
                await self._fill(4 + size)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise LookupPeerError(f"read: {exc}") from None
        except trio.TooSlowError:
            raise LookupPeerError("read: i/o timeout") from None
        data = bytes(self._buf[4 : 4 + size])
        del self._buf[: 4 + size]
        return data

    async def _fill(self, n: int) -> None:
        assert self._stream is not None
        while len(self._buf) < n:
            chunk = await self._stream.receive_some(64 * 1024)
            if not chunk:
                raise LookupPeerError("read: EOF")
            self._buf += chunk


class LookupPeers:
    """nsqd's lookup loop: every peer of one NSQDHooks, driven by one task."""

    def __init__(self, nsqd: NSQDHooks, addresses: list[str] | None = None) -> None:
        self.nsqd = nsqd
        opts = nsqd.options
        addresses = list(opts.lookupd_tcp_addresses if addresses is None else addresses)
        # nsqd skips duplicates of an address it already has.
        self.peers = [LookupPeer(a, self) for a in dict.fromkeys(addresses)]
        self.max_body_size = opts.max_body_size
        self._send, self._receive = trio.open_memory_channel[Any](math.inf)
        self._prefix = getattr(opts, "log_prefix", "[nsqd] ")

    def logf(self, level: int, msg: str) -> None:
        log.log(level, msg, extra={"nsq_prefix": self._prefix})

    def _on_registry_event(self, event: RegistryEvent) -> None:
        # Called synchronously by NSQD; the loop task sends it, in order.
        try:
            self._send.send_nowait(event)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass

    def poke(self, retry: bool = True) -> trio.Event:
        """Heartbeat every peer now (reconnecting the disconnected ones).

        With ``retry``, a peer whose PING fails (its lookupd restarted) reconnects
        at once instead of at the next heartbeat.  The returned event is set when
        the round is done.
        """
        done = trio.Event()
        try:
            self._send.send_nowait(_Tick(retry=retry, done=done))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            done.set()
        return done

    def _identify_info(self) -> dict[str, Any]:
        opts = self.nsqd.options
        tcp_port = opts.broadcast_tcp_port or _port_of(self.nsqd.tcp_address)
        http_port = opts.broadcast_http_port or _port_of(self.nsqd.http_address)
        return {
            "broadcast_address": opts.broadcast_address,
            "hostname": self.nsqd.hostname,
            "http_port": http_port,
            "tcp_port": tcp_port,
            "version": VERSION,
        }

    async def _connect_callback(self, peer: LookupPeer) -> bool:
        """IDENTIFY and REGISTER everything; False (connection closed) on failure."""
        cmd = identify_command(self._identify_info())
        try:
            resp = await peer.command(cmd)
        except LookupPeerError as exc:
            self.logf(logging.ERROR, f"LOOKUPD({peer}): IDENTIFY - {exc}")
            return False
        assert resp is not None
        if resp == InvalidError.code.encode():
            self.logf(logging.INFO, f"LOOKUPD({peer}): lookupd returned {resp.decode()}")
            await peer.close()
            return False
        try:
            info = json.loads(resp)
            if not isinstance(info, dict):
                raise ValueError(resp)
        except ValueError:
            self.logf(
                logging.ERROR, f"LOOKUPD({peer}): parsing response - {resp.decode('latin-1')}"
            )
            await peer.close()
            return False
        peer.info = info
        # Go's %+v of nsqd's peerInfo struct.
        described = (
            f"{{TCPPort:{info.get('tcp_port', 0)} HTTPPort:{info.get('http_port', 0)} "
            f"Version:{info.get('version', '')} "
            f"BroadcastAddress:{info.get('broadcast_address', '')}}}"
        )
        self.logf(logging.INFO, f"LOOKUPD({peer}): peer info {described}")
        if not info.get("broadcast_address"):
            self.logf(logging.ERROR, f"LOOKUPD({peer}): no broadcast address")
        # A topic with channels is registered through them (the channel
        # registration adds the topic too), as nsqd does.
        commands: list[bytes] = []
        regs = self.nsqd.registrations()
        with_channels = {topic for topic, channel in regs if channel is not None}
        for topic, channel in regs:
            if channel is None and topic not in with_channels:
                commands.append(_command(b"REGISTER", topic))
            elif channel is not None:
                commands.append(_command(b"REGISTER", topic, channel))
        for cmd in commands:
            if not await self._register(peer, cmd):
                return False
        return True

    async def _register(self, peer: LookupPeer, cmd: bytes, branch: str = "") -> bool:
        """Send a REGISTER or UNREGISTER, logged as nsqd logs it (``branch``:
        topic or channel, where nsqd says which); False if it failed."""
        text = cmd.decode().strip()
        self.logf(logging.INFO, f"LOOKUPD({peer}): {branch}{text}")
        try:
            await peer.command(cmd)
        except LookupPeerError as exc:
            self.logf(logging.ERROR, f"LOOKUPD({peer}): {text} - {exc}")
            return False
        return True

    async def _connect_all(self, peers: list[LookupPeer]) -> None:
        for peer in peers:
            self.logf(logging.INFO, f"LOOKUP({peer}): adding peer")
            try:
                await peer.command(None)
            except LookupPeerError as exc:
                self.logf(logging.ERROR, f"LOOKUPD({peer}): connect - {exc}")

    def _on_options_changed(self, options: Any) -> None:
        try:
            self._send.send_nowait(_OptionsChanged())
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass

    async def _update_peers(self) -> None:
        """Follow a changed ``lookupd_tcp_addresses`` (nsqd's ``PUT /config``)."""
        wanted = list(dict.fromkeys(self.nsqd.options.lookupd_tcp_addresses))
        kept = []
        for peer in self.peers:
            if peer.address in wanted:
                kept.append(peer)
            else:
                self.logf(logging.INFO, f"LOOKUP({peer}): removing peer")
                await peer.close()
        have = {peer.address for peer in kept}
        added = [LookupPeer(a, self) for a in wanted if a not in have]
        self.peers = kept + added
        await self._connect_all(added)

    async def _heartbeat(self, retry: bool) -> None:
        for peer in self.peers:
            self.logf(logging.DEBUG, f"LOOKUPD({peer}): sending heartbeat")
            attempts = 2 if retry else 1
            for _ in range(attempts):
                try:
                    await peer.command(b"PING\n")
                    break
                except LookupPeerError as exc:
                    self.logf(logging.ERROR, f"LOOKUPD({peer}): PING - {exc}")

    async def _announce(self, event: RegistryEvent) -> None:
        name = b"REGISTER" if event.action == "register" else b"UNREGISTER"
        branch = "topic" if event.channel is None else "channel"
        cmd = _command(name, event.topic, event.channel or "")
        for peer in self.peers:
            await self._register(peer, cmd, f"{branch} ")

    async def _ticker(self) -> None:
        deadline = trio.current_time()
        while True:
            deadline += HEARTBEAT_INTERVAL
            await trio.sleep_until(deadline)
            self._send.send_nowait(_Tick())

    async def run(
        self, *, task_status: trio.TaskStatus[LookupPeers] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Connect every peer, then serve heartbeats and registrations until cancelled.

        ``task_status.started(self)`` after the first connection attempt to every
        peer (successful or not), so registrations made after it reach them.
        """
        self.nsqd.add_registry_listener(self._on_registry_event)
        add_options_listener = getattr(self.nsqd, "add_options_listener", None)
        if add_options_listener is not None:
            add_options_listener(self._on_options_changed)
        _running[self.nsqd] = self
        try:
            async with trio.open_nursery() as nursery:
                await self._connect_all(self.peers)
                nursery.start_soon(self._ticker)
                task_status.started(self)
                async for item in self._receive:
                    if isinstance(item, _Tick):
                        await self._heartbeat(item.retry)
                        if item.done is not None:
                            item.done.set()
                    elif isinstance(item, _OptionsChanged):
                        await self._update_peers()
                    else:
                        await self._announce(item)
        finally:
            _running.pop(self.nsqd, None)
            try:
                self.nsqd.remove_registry_listener(self._on_registry_event)
            except ValueError:
                pass
            self._send.close()
            self.logf(logging.INFO, "LOOKUP: closing")
            for peer in self.peers:
                await peer.close()


def _port_of(address: str) -> int:
    # No port for a Unix socket (nsqd then identifies with port 0).
    try:
        return split_host_port(address)[1] if address else 0
    except ValueError:
        return 0


async def run_lookup_peers(
    nsqd: NSQDHooks,
    *,
    task_status: trio.TaskStatus[LookupPeers] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``nsqd``'s lookup loop (its ``lookupd_tcp_addresses``) until cancelled.

    Call it once ``nsqd`` is listening (it announces the bound ports):
    ``await nursery.start(run_lookup_peers, nsqd)``.
    """
    peers = LookupPeers(nsqd)
    await peers.run(task_status=task_status)
