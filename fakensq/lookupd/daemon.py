"""nsqlookupd, in-process: the node that owns the registration DB and serves
its TCP protocol (:mod:`.tcp`) and HTTP API (:mod:`.http_api`).

Behaves as nsqlookupd v1.3.0.  Producers silent for longer than
``inactive_producer_timeout`` are left out of ``/lookup`` and ``/nodes``; a
tombstoned producer is left out of ``/lookup`` of that topic for
``tombstone_lifetime``.  Times are ``trio.current_time()``, so a ``MockClock``
drives them.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from typing import Any

import trio

from ..golang.net import accept_forever, check_listen, join_host_port, split_host_port
from ..serving import ServingNode
from .http_api import LEGACY_ALIASES, LookupdHTTP
from .options import LookupdOptions
from .registry import PeerInfo, Producer, Registration, RegistrationDB, filter_by_active
from .tcp import LookupProtocolV1

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
        #: what IDENTIFY answers as the hostname
        self.hostname = socket.gethostname()
        #: maps trio time onto the wall clock (/debug's nanosecond timestamps)
        self.wall_offset = 0.0
        self._connections: set[trio.abc.Stream] = set()
        #: ``hooks(stream, remote) -> stream``: wraps every TCP connection served
        #: (fault injection, :mod:`fakensq.faults`); None: served as is.
        self.hooks: Callable[[trio.abc.Stream, str | None], trio.abc.Stream] | None = None
        self._tcp = LookupProtocolV1(self)
        self._http = LookupdHTTP(self)
        #: the HTTP API's routes (httprouter's)
        self.router = self._http.router

    # -- lifecycle ---------------------------------------------------------

    async def serve(
        self, *, task_status: trio.TaskStatus[NSQLookupd] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen on both addresses and serve until cancelled.

        ``task_status.started(self)`` once both listeners are bound.
        """
        self.wall_offset = time.time() - trio.current_time()
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
                self.logf(logging.INFO, f"TCP: listening on {self.tcp_address}")
            async with trio.open_nursery() as nursery:
                if self.options.http_address:
                    http_host, http_port = split_host_port(self.options.http_address)
                    host, port = await nursery.start(
                        self._http.server.serve, http_host or None, http_port
                    )
                    self._http_port = port
                    self.http_address = join_host_port(host, port)
                    self.logf(logging.INFO, f"HTTP: listening on {self.http_address}")
                for listener in listeners:
                    nursery.start_soon(
                        accept_forever, listener, self.handle_tcp, nursery, self._accept_failed
                    )
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
            self.logf(logging.INFO, "TCP: closing " + self.tcp_address)

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

    def logf(self, level: int, msg: str) -> None:
        """Log as nsqlookupd does, with its ``log_prefix``."""
        log.log(level, msg, extra={"nsq_prefix": self.options.log_prefix})

    # -- connections (TCP: .tcp, HTTP: .http_api) ----------------------------

    def _accept_failed(self, exc: OSError) -> None:
        self.logf(logging.ERROR, f"accept failed - {exc}")

    async def handle_http(self, stream: trio.abc.Stream) -> None:
        """Serve the HTTP API on an already connected stream, until it ends."""
        await self._http.server.handle_stream(stream)

    async def handle_tcp(self, stream: trio.abc.Stream, remote: str | None = None) -> None:
        """Serve the TCP protocol on an already connected stream, until it ends.

        ``remote`` (``"host:port"``) identifies the peer; by default the socket's.
        """
        if self.hooks is not None:
            stream = self.hooks(stream, remote)
        self._connections.add(stream)
        try:
            await self._tcp.serve(stream, remote)
        finally:
            self._connections.discard(stream)
