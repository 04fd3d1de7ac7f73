"""The nsqd node: listeners, the topic registry, lifecycle.

Everything runs inside the caller's task tree::

    async with fakensq.NSQD(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0") as nsqd:
        ...  # nsqd.tcp_address, nsqd.http_address are the bound "host:port"

or ``await nursery.start(nsqd.serve)``.  ``await nsqd.handle_stream(stream)`` serves
an already connected stream (memory streams, simulations).
"""

from __future__ import annotations

import functools
import logging
import math
import random
import socket
import ssl
import time
import weakref
from collections.abc import Callable
from typing import Any, Literal

import httpx
import trio

from trionsq.protocol.names import is_ephemeral

from ..golang.net import accept_forever, check_listen, split_address
from ..golang.tlsconfig import server_context
from ..serving import ServingNode
from .auth import AuthHandler
from .channel import Channel
from .client import ClientConnection
from .diskqueue import DiskBackedQueue
from .hooks import NodeHooks
from .http_api import NSQDHTTP
from .listeners import UNIX_REMOTE_ADDRESS, is_unix_stream, open_listeners
from .lookup_peer import RegistryEvent, run_lookup_peers
from .message import GUIDFactory, MemoryQueue, MessageQueue
from .options import TLS_NOT_REQUIRED, TLS_REQUIRED, NSQDOptions
from .persist import load_state, metadata_writer, save_state, write_metadata
from .stats import build_stats
from .statsd import run_statsd
from .topic import Topic

__all__ = ["NSQD", "RegistryEvent"]

log = logging.getLogger(__name__)


RegistryListener = Callable[[RegistryEvent], None]


@functools.cache
def _tls_context() -> ssl.SSLContext:
    # httpx builds a context (loading the CA certificates) for each client it
    # makes: 0.05-0.2 s of the event loop for every new topic, long enough to
    # delay its registration with nsqlookupd past what readers expect.  One
    # for the process (the lookupd queries are plain HTTP anyway).
    return httpx.create_ssl_context()


async def query_lookupd_channels(
    addresses: list[str],
    topic: str,
    *,
    connect_timeout: float,
    request_timeout: float,
    transport: httpx.AsyncBaseTransport | None = None,
) -> list[str]:
    """nsqd's GetLookupdTopicChannels: ``/channels?topic=`` of every nsqlookupd,
    merged and sorted; an error only when none answered."""
    channels: set[str] = set()
    errors: list[str] = []
    timeout = httpx.Timeout(request_timeout, connect=connect_timeout)

    async def ask(client: httpx.AsyncClient, address: str) -> None:
        try:
            resp = await client.get(
                f"http://{address}/channels",
                params={"topic": topic},
                headers={"Accept": "application/vnd.nsq; version=1.0"},
            )
            resp.raise_for_status()
            found = resp.json().get("channels") or []
            channels.update(str(c) for c in found)
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            errors.append(f"{address}: {exc}")

    async with (
        httpx.AsyncClient(timeout=timeout, transport=transport, verify=_tls_context()) as client,
        trio.open_nursery() as nursery,
    ):
        for address in addresses:
            nursery.start_soon(ask, client, address)
    if errors and len(errors) == len(addresses):
        raise OSError("Failed to query any nsqlookupd: " + "; ".join(errors))
    return sorted(channels)


def _only_cancelled(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(trio.Cancelled)[1] is None
    return isinstance(exc, trio.Cancelled)


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class NSQD(ServingNode):
    """An nsqd v1.3, in process.

    Keyword arguments are :class:`NSQDOptions` fields (or pass ``options=``);
    an empty ``tcp_address``/``http_address`` means no such listener (serve
    streams with :meth:`handle_stream`).  fakensq-only settings:

    - ``auth_handler``: a callable standing in for the auth server;
    - ``ssl_context``: the server TLS context (instead of tls_cert/tls_key);
    - ``exact_timers`` (default False, as nsqd v1.3.0): nsqd acts on message
      timeouts and deferred messages in its queue scan, every
      ``queue_scan_interval`` (100 ms), and looks only at the channels that
      existed at its last refresh, every ``queue_scan_refresh_interval`` (5 s):
      in a fresh node a 1 s msg-timeout takes up to 5 s.  True is an opt-in
      kindness: each deadline is acted on when it is due, exactly;
    - ``requeue_on_disconnect`` (default False, as nsqd v1.3.0): when a
      consumer's connection ends, nsqd leaves its in-flight messages in flight
      until their msg-timeout expires (then they count as timed out and go back
      to the queue).  True is an opt-in kindness: they go straight back to the
      queue, so a test need not wait out the timeout;
    - ``select_order`` (default False: oldest first, so tests can rely on
      order): ready messages in memory and on disk (beyond
      ``mem_queue_size``) go out in nsqd's order, memory or disk at random
      (seeded by ``seed``) when both hold some, as nsqd's select picks: a
      message requeued into memory may overtake older ones on disk.  The
      pytest plugin's fault runs turn it on (:mod:`fakensq.testing.pytest_faults`).

    With a ``data_path``, ``run`` restores the topics and channels ``nsqd.dat``
    lists there, each with its disk queue, and, when it ends cleanly
    (cancelled, ``async with`` left), writes every message it holds (queued,
    in flight, deferred) to the disk queues for the next start, as nsqd
    does (:mod:`fakensq.nsqd.persist`); ready messages beyond
    ``mem_queue_size`` go to disk as they come (:mod:`fakensq.nsqd.diskqueue`).
    Set :attr:`persist_on_stop` False to stop as a killed nsqd would: what
    was in memory is lost.
    """

    def __init__(
        self,
        options: NSQDOptions | None = None,
        *,
        auth_handler: AuthHandler | None = None,
        ssl_context: ssl.SSLContext | None = None,
        requeue_on_disconnect: bool = False,
        exact_timers: bool = False,
        select_order: bool = False,
        **fields: Any,
    ) -> None:
        base = options if options is not None else NSQDOptions()
        self.options: NSQDOptions = base.replace(**fields) if fields else base
        if self.options.tls_client_auth_policy and self.options.tls_required == TLS_NOT_REQUIRED:
            # nsqd.New: a client auth policy requires TLS.
            self.options = self.options.replace(tls_required=TLS_REQUIRED)
        self.auth_handler = auth_handler
        self.requeue_on_disconnect = requeue_on_disconnect
        self.exact_timers = exact_timers
        self.select_order = select_order
        # The trio time nsqd's queue scan loop starts (its tickers' origin).
        self._scan_epoch: float | None = None
        self.rng = random.Random(self.options.seed)
        self.guids = GUIDFactory(
            self.options.node_id, self.rng if self.options.seed is not None else None
        )
        self.topics: dict[str, Topic] = {}
        self.clients: dict[int, ClientConnection] = {}
        self._client_ids = 0
        self._listeners: list[RegistryListener] = []
        self._options_listeners: list[Callable[[NSQDOptions], None]] = []
        self.tls_context = ssl_context if ssl_context is not None else self._build_tls_context()
        self.tcp_address = ""
        self.http_address = ""
        self.https_address = ""
        self.start_time = int(time.time())
        self._nursery: trio.Nursery | None = None
        self._healthy: str | None = None
        self.hostname = socket.gethostname()
        #: Fault injection and tracing (:mod:`fakensq.nsqd.hooks`); None: none.
        self.hooks: NodeHooks | None = None
        #: The httpx transport for nsqd's own HTTP requests to nsqlookupd (None:
        #: the network; fakensq.simulation gives an in-memory one).
        self.http_transport: httpx.AsyncBaseTransport | None = None
        #: Save state to data_path when ``run`` ends (False: a kill, nothing saved).
        self.persist_on_stop = True
        self._disk_queues: weakref.WeakSet[DiskBackedQueue] = weakref.WeakSet()

    # --- lifecycle ---

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; ``task_status.started()`` once listening."""
        opts = self.options
        listeners: list[trio.abc.Listener[trio.SocketStream]] = []
        restored = False
        keep_metadata: Callable[[object], None] | None = None
        # nsqd.New listens before anything else: an address it cannot have ends
        # the start with nsqd's text (ListenError), not a socket traceback.
        https = opts.https_address if self.tls_context is not None else ""
        check_listen(opts.tcp_address, opts.http_address, https)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self.start_time = int(time.time())
                self._scan_epoch = None  # channels made during start-up: listed at once
                if opts.data_path:
                    # Before listening, as nsqd's LoadMetadata: no client sees a
                    # half-restored node.
                    load_state(self, opts.data_path)
                    restored = True
                    # Then nsqd.dat follows every topic and channel change (a
                    # killed node comes back with them, as nsqd does).
                    write_metadata(self, opts.data_path)
                    keep_metadata = metadata_writer(self, opts.data_path)
                    self.add_registry_listener(keep_metadata)
                # host:port is TCP, anything else a Unix socket path, as nsqd.
                if opts.tcp_address:
                    tcp, self.tcp_address = await open_listeners(opts.tcp_address)
                    listeners.extend(tcp)
                    for listener in tcp:
                        nursery.start_soon(
                            accept_forever, listener, self._handle_accepted, nursery, _accept_failed
                        )
                if opts.http_address:
                    http, self.http_address = await open_listeners(opts.http_address)
                    server = NSQDHTTP(self, tls=False).server
                    await nursery.start(server.serve_listeners, http)
                # As nsqd: HTTPS only with a TLS configuration (the nsqd command's
                # default https_address is 0.0.0.0:4152, unused without one).
                if opts.https_address and self.tls_context is not None:
                    host, port = split_address(opts.https_address)
                    server = NSQDHTTP(self, tls=True).server
                    bound = await nursery.start(server.serve, host, port)
                    self.https_address = _join(bound[0], bound[1])
                # Idle without lookupd addresses, but it follows later changes of
                # them (PUT /config/nsqlookupd_tcp_addresses), as nsqd does.
                await nursery.start(run_lookup_peers, self)
                if opts.statsd_address:  # as nsqd: the loop only when configured at start
                    nursery.start_soon(run_statsd, self)
                # nsqd's queue scan loop starts now, with the channels there are.
                self._scan_epoch = trio.current_time()
                task_status.started()
                await trio.sleep_forever()
        except BaseException as exc:
            # A crash is no clean stop: nothing saved (a cancellation is one).
            if not _only_cancelled(exc):
                restored = False
            raise
        finally:
            self._nursery = None
            if keep_metadata is not None:
                self.remove_registry_listener(keep_metadata)
            if restored and self.persist_on_stop:
                # Before the channels close (in-flight messages still listed);
                # only when the earlier state was restored, never overwriting it
                # with an empty one after a failed start.
                save_state(self, opts.data_path)
            elif opts.data_path:
                # Killed (or crashed): the ticks up to now, then the files are
                # left as the last sync recorded them.
                self.catch_up_disk_syncs()
                for queue in list(self._disk_queues):
                    queue.abandon()
            for topic in list(self.topics.values()):
                for channel in topic.channels.values():
                    channel.close()
            for listener in listeners:
                await trio.aclose_forcefully(listener)

    #: The name ``serve`` had before the daemons shared :class:`ServingNode`.
    run = serve

    async def _handle_accepted(self, stream: trio.SocketStream) -> None:
        remote = UNIX_REMOTE_ADDRESS if is_unix_stream(stream) else None
        await self.handle_stream(stream, remote)

    async def handle_stream(
        self, stream: trio.abc.Stream, remote_address: str | None = None
    ) -> None:
        """Serve the TCP protocol on an already connected stream, until it ends."""
        if self.hooks is not None:
            stream = self.hooks.wrap_stream(stream, remote_address)
        self._client_ids += 1
        client = ClientConnection(self, stream, self._client_ids, remote_address)
        await client.run()

    def _build_tls_context(self) -> ssl.SSLContext | None:
        opts = self.options
        if not (opts.tls_cert or opts.tls_key):
            return None
        return server_context(
            opts.tls_cert,
            opts.tls_key,
            min_version=opts.tls_min_version,
            client_auth_policy=opts.tls_client_auth_policy,
            root_ca_file=opts.tls_root_ca_file,
        )

    # --- registry ---

    def add_registry_listener(self, callback: RegistryListener) -> None:
        """``callback(RegistryEvent)`` on every topic/channel creation and deletion."""
        self._listeners.append(callback)

    def remove_registry_listener(self, callback: RegistryListener) -> None:
        self._listeners.remove(callback)

    def registrations(self) -> list[tuple[str, str | None]]:
        """Every (topic, None) and (topic, channel) that exists now."""
        out: list[tuple[str, str | None]] = []
        for topic in self.topics.values():
            out.append((topic.name, None))
            out.extend((topic.name, name) for name in topic.channels)
        return out

    def notify_registry(
        self, action: Literal["register", "unregister"], topic: str, channel: str | None
    ) -> None:
        """Tell the registry listeners (nsqlookupd registration) of a change."""
        event = RegistryEvent(action, topic, channel)
        for callback in list(self._listeners):
            try:
                callback(event)
            except Exception:
                log.exception("registry listener failed")

    # --- topics ---

    def get_topic(self, name: str) -> Topic:
        """The topic, created (and registered) if new."""
        topic = self.topics.get(name)
        if topic is None:
            topic = Topic(name, self)
            self.topics[name] = topic
            self.notify_registry("register", name, None)
            # nsqd asks nsqlookupd which channels the topic has elsewhere and
            # creates them first, so that every channel gets what is published.
            addresses = self.lookupd_http_addresses()
            if addresses and self._nursery is not None:
                topic.started = False
                self._nursery.start_soon(self._precreate_channels, topic, addresses)
        return topic

    async def open_topic(self, name: str) -> Topic:
        """:meth:`get_topic` as nsqd's commands call it (PUB, MPUB, DPUB, SUB,
        ``/pub``, ``/mpub``, ``/topic/create``): when the call creates the topic,
        it returns only once the channels nsqlookupd knows of exist (nsqd's
        GetTopic blocks on that query), so the answer comes after them and what
        is published next reaches them.  Other callers of a topic still being
        set up get it at once, as in nsqd (their messages wait in the topic)."""
        created = name not in self.topics
        topic = self.get_topic(name)
        if created and not topic.started:
            # The query runs in the node's nursery: a caller that goes away
            # (a closed connection) does not leave the topic unstarted.
            await topic.wait_started()
        return topic

    def lookupd_http_addresses(self) -> list[str]:
        """The nsqlookupds' HTTP addresses, as their IDENTIFY answers gave them."""
        from .lookup_peer import lookup_peers_of

        peers = lookup_peers_of(self)
        if peers is None:
            return []
        out: list[str] = []
        for peer in peers.peers:
            address = peer.info.get("broadcast_address")
            if address:
                out.append(_join(str(address), int(peer.info.get("http_port", 0))))
        return out

    async def _precreate_channels(self, topic: Topic, addresses: list[str]) -> None:
        try:
            names = await query_lookupd_channels(
                addresses,
                topic.name,
                connect_timeout=self.options.http_client_connect_timeout,
                request_timeout=self.options.http_client_request_timeout,
                transport=self.http_transport,
            )
        except Exception as exc:
            log.warning(
                "failed to query nsqlookupd for channels to pre-create for topic %s - %s",
                topic.name,
                exc,
            )
            names = []
        if topic.exiting or self.topics.get(topic.name) is not topic:
            return
        for name in names:
            if not is_ephemeral(name):  # no ephemeral channel without its consumer
                topic.get_channel(name)
        topic.start()

    def new_queue(self, topic: str, channel: str | None) -> MessageQueue:
        """The queue a new topic (``channel`` None) or channel keeps its messages in.

        With a data_path, up to mem_queue_size in memory and the rest on disk, as
        nsqd; without one (or for an ephemeral topic or channel, which never
        touches disk), memory only.  A channel goes by its own name, as in
        nsqd: a non-ephemeral channel of an ephemeral topic has a disk queue.
        """
        opts = self.options
        if not opts.data_path or is_ephemeral(topic if channel is None else channel):
            return MemoryQueue()
        queue = DiskBackedQueue(
            opts.data_path,
            topic if channel is None else f"{topic}:{channel}",
            mem_size=opts.mem_queue_size,
            max_bytes_per_file=opts.max_bytes_per_file,
            sync_every=opts.sync_every,
            sync_timeout=opts.sync_timeout,
        )
        # Each go-diskqueue has its own sync ticker, from its creation on.
        try:
            now = trio.current_time()
        except RuntimeError:  # made outside a trio run: ticks from the node's start
            now = 0.0
        queue.next_sync = now + opts.sync_timeout if opts.sync_timeout > 0 else math.inf
        queue.clock = _trio_time
        if self.select_order:
            queue.select = self.rng
        self._disk_queues.add(queue)
        return queue

    def catch_up_disk_syncs(self) -> None:
        """Run the disk queues' due ``sync_timeout`` ticks now.

        A queue runs its ticks when it is next read or written, and the node
        when it is killed (no task of its own: a simulation's schedule stays
        as it was): what is on disk is then what nsqd's tickers would have
        left.  Call it to see the meta files as they would be now.
        """
        now = trio.current_time()
        for queue in list(self._disk_queues):
            queue.tick(now)

    def get_existing_topic(self, name: str) -> Topic | None:
        return self.topics.get(name)

    def delete_topic(self, name: str) -> bool:
        topic = self.topics.pop(name, None)
        if topic is None:
            return False
        self.notify_registry("unregister", name, None)
        topic.close()
        return True

    # --- nsqd's queue scan: when timeouts and deferred messages are acted on ---

    def scan_known_from(self) -> float:
        """When the queue scan first sees a channel made now: nsqd's scan loop
        lists the channels at its start and then at each refresh tick
        (``queue_scan_refresh_interval``), so a channel made after the start
        waits for the next one."""
        epoch = self._scan_epoch
        if epoch is None or self.exact_timers:
            return -math.inf  # made before the node runs: listed at the start
        refresh = self.options.queue_scan_refresh_interval
        if refresh <= 0:
            return -math.inf
        now = trio.current_time()
        return epoch + (math.floor((now - epoch) / refresh) + 1) * refresh

    def scan_time(self, deadline: float, known_from: float) -> float:
        """When a deadline (a message timeout, a deferred message's due time) of
        a channel the scan knows from ``known_from`` is acted on: the first
        scan tick (every ``queue_scan_interval`` from the loop's start) at or
        after both; the deadline itself with ``exact_timers``."""
        epoch = self._scan_epoch
        interval = self.options.queue_scan_interval
        if self.exact_timers or epoch is None or interval <= 0 or math.isinf(deadline):
            return deadline
        when = max(deadline, known_from)
        ticks = max(math.ceil((when - epoch) / interval - 1e-9), 0)
        # Never a tick before the deadline (the 1e-9 can round to one just
        # below it: the timer then woke before it, found nothing due and
        # slept until the same instant, for ever).
        while epoch + ticks * interval < deadline:
            ticks += 1
        return epoch + ticks * interval

    def start_channel(self, channel: Channel) -> None:
        """Run a new channel's timers in the node's task tree."""
        if self._nursery is None:
            raise RuntimeError("the NSQD is not running")
        self._nursery.start_soon(channel.run_timers)

    @property
    def running(self) -> bool:
        """Whether the node serves (between its start and its stop)."""
        return self._nursery is not None

    # --- auth, health, stats ---

    @property
    def auth_enabled(self) -> bool:
        return bool(self.options.auth_http_addresses) or self.auth_handler is not None

    def add_options_listener(self, callback: Callable[[NSQDOptions], None]) -> None:
        """``callback(options)`` after ``PUT /config/...`` changed an option."""
        self._options_listeners.append(callback)

    def options_changed(self) -> None:
        """Tell the options listeners that an option changed (``PUT /config``)."""
        for callback in list(self._options_listeners):
            try:
                callback(self.options)
            except Exception:
                log.exception("options listener failed")

    def health(self) -> str:
        return "OK" if self._healthy is None else f"NOK - {self._healthy}"

    def set_health(self, error: str | None) -> None:
        """Make /ping answer 500 with ``error`` (None: healthy again)."""
        self._healthy = error

    def stats(
        self,
        topic: str = "",
        channel: str = "",
        include_clients: bool = True,
        include_mem: bool = True,
    ) -> dict[str, Any]:
        """The same document as ``GET /stats?format=json``."""
        return build_stats(self, topic, channel, include_clients, include_mem)


def _trio_time() -> float:
    return trio.current_time()


def _accept_failed(exc: OSError) -> None:
    log.warning("accept failed: %s", exc)
