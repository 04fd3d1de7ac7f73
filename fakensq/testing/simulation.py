"""A whole NSQ cluster without sockets: deterministic simulation in virtual time.

:class:`SimNetwork` maps ``"host:port"`` addresses to in-process handlers and
connects clients to them through Trio memory streams; :class:`SimCluster` is a
:class:`fakensq.Cluster` whose nsqds and lookupds listen only there (nsqd→lookupd
registrations included).  Point trionsq at it and run under
``trio.testing.MockClock(autojump_threshold=0)``: message timeouts, heartbeats,
lookupd polls and backoff take virtual seconds, and milliseconds of wall time::

    async with SimCluster(nsqd=2, lookupd=1, seed=7) as cluster:
        consumer = trionsq.Consumer(
            "topic", "channel",
            lookupd_http_addresses=cluster.lookupd_http_addresses,
            connector=cluster.connector,
            http_transport=cluster.http_transport,
            rng=random.Random(7),
        )

Determinism: with a ``seed``, every nsqd draws its random choices (message ids,
the client a message goes to, sampling) from a generator derived from it, and
Trio's scheduler (which shuffles runnable tasks on purpose) is seeded too
(:func:`seed_scheduler`), so the same seed gives the same run, event for event,
within one Python process.  Give clients their own seeded ``rng``.
"""

from __future__ import annotations

import errno
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import h11
import httpx
import trio
import trio.testing

from ..golang.net import join_host_port
from ..lookupd.daemon import NSQLookupd
from ..nsqd.http_api import NSQDHTTP
from ..nsqd.node import NSQD
from .cluster import Cluster
from .faults import Faults, Tracer

if TYPE_CHECKING:
    from trionsq.transport import Connector

__all__ = ["SimCluster", "SimHTTPTransport", "SimNetwork", "seed_scheduler"]

#: ``handler(stream, remote)`` serves one accepted connection.
StreamHandler = Callable[[trio.abc.Stream, str], Awaitable[None]]


def seed_scheduler(seed: int) -> None:
    """Seed Trio's scheduler, which shuffles each batch of runnable tasks to flush
    out ordering bugs; seeded, a run repeats exactly.

    This reaches into ``trio._core._run._r`` (a private ``random.Random``): there is
    no public way, and without it two runs of the same program interleave tasks
    differently.
    """
    import trio._core._run as trio_run

    generator = getattr(trio_run, "_r", None)
    if isinstance(generator, random.Random):
        generator.seed(seed)


class _Listener:
    __slots__ = ("handler", "node", "nursery")

    def __init__(self, handler: StreamHandler, nursery: trio.Nursery, node: str) -> None:
        self.handler = handler
        self.nursery = nursery
        self.node = node


class SimNetwork:
    """An in-memory network: addresses to handlers, connections as memory streams.

    Connection tasks run in the listening node's nursery, so they end with it (as
    a stopped node's sockets close).  Connecting to an address nobody listens on
    raises ``ConnectionRefusedError``; connecting across a partition (see
    :meth:`fakensq.faults.Faults.partition`) raises ``OSError(ETIMEDOUT)``.
    """

    def __init__(self) -> None:
        self._listeners: dict[str, _Listener] = {}
        self._serial = 0
        #: set by the cluster: consulted for partitions at connect time
        self.faults: Faults | None = None

    def listen(
        self, address: str, handler: StreamHandler, nursery: trio.Nursery, node: str = ""
    ) -> None:
        """Serve connections to ``address`` with ``handler``, in ``nursery``."""
        if address in self._listeners:
            raise OSError(errno.EADDRINUSE, f"listen {address}: address already in use")
        self._listeners[address] = _Listener(handler, nursery, node or address)

    def unlisten(self, address: str) -> None:
        """Stop accepting connections to ``address`` (open ones are the node's)."""
        self._listeners.pop(address, None)

    def serve_node(
        self, name: str, node: NSQD | NSQLookupd, slot: Any, nursery: trio.Nursery
    ) -> None:
        """Listen on ``slot``'s TCP and HTTP addresses for a cluster's node."""
        tcp_handler: Callable[[trio.abc.Stream, str], Awaitable[None]]
        http_handler: Callable[[trio.abc.Stream], Awaitable[None]]
        if isinstance(node, NSQD):
            tcp_handler = node.handle_stream
            http_handler = NSQDHTTP(node, tls=False).server.handle_stream
        else:
            tcp_handler, http_handler = node.handle_tcp, node.handle_http

        async def serve_http(stream: trio.abc.Stream, remote: str) -> None:
            await http_handler(stream)

        self.listen(slot.tcp_address, tcp_handler, nursery, name)
        self.listen(slot.http_address, serve_http, nursery, name)

    def node_at(self, address: str) -> str:
        listener = self._listeners.get(address)
        return listener.node if listener is not None else address

    async def connect(self, host: str, port: int, *, source: str = "client") -> trio.abc.Stream:
        """A stream from ``source`` (a client or node name) to ``host:port``."""
        await trio.lowlevel.checkpoint()
        address = join_host_port(host, port)
        if self.faults is not None:
            target = self.node_at(address)
            if target == address:
                target = host  # a stopped node: its name is the host
            if self.faults.partitioned(source, (target,)):
                raise OSError(errno.ETIMEDOUT, f"dial tcp {address}: i/o timeout (partition)")
        listener = self._listeners.get(address)
        if listener is None:
            raise ConnectionRefusedError(
                errno.ECONNREFUSED, f"dial tcp {address}: connection refused"
            )
        self._serial += 1
        client, server = trio.testing.memory_stream_pair()
        try:
            listener.nursery.start_soon(listener.handler, server, f"{source}:{self._serial}")
        except RuntimeError:
            # The node is stopping (its nursery no longer takes tasks): as a
            # closed listening socket, it refuses.
            raise ConnectionRefusedError(
                errno.ECONNREFUSED, f"dial tcp {address}: connection refused"
            ) from None
        return client

    def connector(self, name: str = "client") -> Connector:
        """A trionsq ``connector`` whose connections come from ``name`` (the name
        faults use for this client)."""

        async def connect(host: str, port: int) -> trio.abc.Stream:
            return await self.connect(host, port, source=name)

        return connect

    def http_transport(self, name: str = "client") -> SimHTTPTransport:
        """An httpx transport reaching the network's HTTP servers (one memory
        stream per request)."""
        return SimHTTPTransport(self, name)


class SimHTTPTransport(httpx.AsyncBaseTransport):
    """httpx over a :class:`SimNetwork`: HTTP/1.1 by h11, a stream per request."""

    def __init__(self, network: SimNetwork, name: str = "client") -> None:
        self.network = network
        self.name = name

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        port = url.port or (443 if url.scheme == "https" else 80)
        timeouts = request.extensions.get("timeout", {})
        limit = timeouts.get("read") or timeouts.get("pool")
        try:
            stream = await self.network.connect(url.host, port, source=self.name)
        except OSError as exc:
            raise httpx.ConnectError(str(exc), request=request) from exc
        body = await request.aread()
        try:
            with trio.fail_after(limit if limit else float("inf")):
                return await self._exchange(stream, request, body)
        except trio.TooSlowError:
            raise httpx.ReadTimeout("timed out (simulated network)", request=request) from None
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError) as exc:
            raise httpx.ReadError(str(exc), request=request) from exc
        finally:
            await trio.aclose_forcefully(stream)

    async def _exchange(
        self, stream: trio.abc.Stream, request: httpx.Request, body: bytes
    ) -> httpx.Response:
        conn = h11.Connection(h11.CLIENT)
        headers = [(k, v) for k, v in request.headers.raw if k.lower() != b"connection"]
        headers.append((b"Connection", b"close"))
        if body and not any(k.lower() == b"content-length" for k, _ in headers):
            headers.append((b"Content-Length", str(len(body)).encode()))
        target = url_target(request.url)
        data = conn.send(h11.Request(method=request.method, target=target, headers=headers))
        if body:
            data += conn.send(h11.Data(data=body))
        data += conn.send(h11.EndOfMessage())
        await stream.send_all(data)
        response: h11.Response | None = None
        content = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(bytes(await stream.receive_some(65536)))
                continue
            if isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                content += event.data
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                break
        if response is None:
            raise h11.RemoteProtocolError("no response", 400)
        return httpx.Response(
            response.status_code,
            headers=[(bytes(k), bytes(v)) for k, v in response.headers],
            content=bytes(content),
            request=request,
        )


def url_target(url: httpx.URL) -> bytes:
    """The request target (path and query) of ``url``."""
    return url.raw_path or b"/"


class SimCluster(Cluster):
    """A :class:`fakensq.Cluster` on a :class:`SimNetwork`: no socket at all.

    Addresses are ``"nsqd-0:4150"`` (TCP) and ``"nsqd-0:4151"`` (HTTP) for nsqds,
    ``"lookupd-0:4160"``/``"lookupd-0:4161"`` for lookupds.  Give clients
    :attr:`connector` and :attr:`http_transport` (or :meth:`connector_for` /
    :meth:`http_transport_for` a named client, the name faults use).  ``seed``
    seeds every nsqd and Trio's scheduler; ``trace`` (a list or a path) records
    every frame and fault with its virtual time.  Other keywords are Cluster's.
    """

    def __init__(
        self,
        nsqd: int = 1,
        lookupd: int = 1,
        *,
        seed: int | None = 0,
        trace: Tracer | list[dict[str, Any]] | str | None = None,
        network: SimNetwork | None = None,
        **options: Any,
    ) -> None:
        nsqd_options = dict(options.pop("nsqd_options", None) or {})
        if seed is not None:
            nsqd_options.setdefault("seed", seed)
        self.seed = seed
        super().__init__(
            nsqd,
            lookupd,
            nsqd_options=nsqd_options,
            network=network if network is not None else SimNetwork(),
            trace=trace,
            **options,
        )

    @property
    def sim_network(self) -> SimNetwork:
        """The network the nodes listen on."""
        assert self.network is not None
        return self.network

    async def __aenter__(self) -> SimCluster:
        if self.seed is not None:
            seed_scheduler(self.seed)
        await super().__aenter__()
        return self

    @property
    def connector(self) -> Connector:
        """A trionsq connector into the cluster (connections named ``"client"``)."""
        return self.sim_network.connector("client")

    @property
    def http_transport(self) -> SimHTTPTransport:
        """An httpx transport for the cluster's HTTP APIs (lookupd and nsqd)."""
        return self.sim_network.http_transport("client")

    def connector_for(self, name: str) -> Connector:
        """A connector whose connections are named ``name`` (for faults)."""
        return self.sim_network.connector(name)

    def http_transport_for(self, name: str) -> SimHTTPTransport:
        """An httpx transport whose requests come from ``name``."""
        return self.sim_network.http_transport(name)
