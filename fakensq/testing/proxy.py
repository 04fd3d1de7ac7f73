"""``fakensq proxy``: fakensq's connection faults in front of a *real* nsqd.

A :class:`FaultProxy` listens for NSQ TCP clients and relays each connection to
an upstream nsqd, through a :class:`fakensq.faults.FaultyStream`: the same
wrapper fakensq's own nsqds use, so the same connection faults act on the wire
between any client (any language) and the real daemon::

    async with FaultProxy("127.0.0.1:4150") as proxy:
        ...  # clients connect to proxy.tcp_address
        await proxy.faults.drop(role="consumer")
        stall = proxy.faults.stall(direction="out")
        stall.heal()

Its HTTP address (:attr:`FaultProxy.http_address`) takes the same faults from
any language (``POST /faults/drop``, ``DELETE /faults/ID``...: see
:func:`http_router`).  The proxy is node ``"nsqd-0"`` to the faults; clients
are named by their ``"host:port"``, IDENTIFY ``client_id`` or ``hostname``.

What the proxy can do: the faults of the wire (:data:`WIRE_KINDS`): drop,
delay, stall, swallow heartbeats, corrupt or truncate the next frame, partition
a client from nsqd.  What it cannot: anything inside nsqd (time out messages
in flight, requeue storms, restarts, failing publishes): those are refused with
a message saying so.  TLS, snappy and deflate pass through untouched (the
client negotiates them with the real nsqd); once a connection upgrades, the
proxy no longer sees frames in it, so frame faults (swallowed heartbeats,
corrupt and truncated frames) pass over it, while drop, delay, stall and
partition still act on its bytes; and when it upgraded before it subscribed or
published, its role is ``"unknown"`` to the proxy (``role=`` faults pass over
it).  The HTTP API says so when it adds a frame fault while such connections
are open.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any, Final

import trio

from ..faultkinds import KINDS, WIRE_KINDS, Direction, Role, kinds_for
from ..golang.net import join_host_port, split_host_port
from ..http.router import Router
from ..http.server import HTTPServer, Request, Response
from ..serving import ServingNode
from .faultplayer import MetFault
from .faults import Fault, Faults
from .stream import FaultyStream, socket_peer
from .tracer import Tracer

__all__ = [
    "FRAME_KINDS",
    "FaultProxy",
    "ProxyRefusal",
    "SCHEDULE_KINDS",
    "WIRE_KINDS",
    "add_fault",
    "http_router",
]

log = logging.getLogger("fakensq.proxy")

#: The kinds of :mod:`fakensq.testing.schedule` a proxy can play (the safe
#: ones of the wire).
SCHEDULE_KINDS: Final = tuple(k for k in kinds_for("safe") if k in WIRE_KINDS)
#: Those that act on whole frames (not on TLS or compressed connections).
FRAME_KINDS: Final = tuple(k for k in WIRE_KINDS if KINDS[k].frame)
_BUFFER: Final = 64 * 1024


class ProxyRefusal(ValueError):
    """A fault the proxy cannot inject, or malformed parameters (one line)."""


class FaultProxy(ServingNode):
    """Relays NSQ TCP clients to ``upstream`` (``"host:port"`` of a real nsqd)
    through :attr:`faults`; serves the faults' HTTP API on ``http_address``
    (``None``: no HTTP API).  ``tcp_address`` and ``http_address`` take port 0
    for a free port; the bound addresses are set once started.
    ``connect_timeout``: how long a client's connection waits for upstream
    before the proxy closes it.  ``async with proxy:`` serves it (a
    :class:`~fakensq.serving.ServingNode`)."""

    def __init__(
        self,
        upstream: str,
        *,
        tcp_address: str = "127.0.0.1:0",
        http_address: str | None = "127.0.0.1:0",
        name: str = "nsqd-0",
        connect_timeout: float = 5.0,
        tracer: Tracer | None = None,
        faults: Faults | None = None,
    ) -> None:
        self.upstream = upstream
        self._upstream_host, self._upstream_port = split_host_port(upstream)
        self._tcp_host, self._tcp_port = split_host_port(tcp_address)
        self._http = split_host_port(http_address) if http_address is not None else None
        self.tcp_address = tcp_address
        self.http_address = http_address
        #: the proxy's name to its faults (the node its clients connect to)
        self.name = name
        self.connect_timeout = connect_timeout
        #: the faults (the Python API): its own (node faults refused: no
        #: cluster), or ``faults``, shared with other proxies
        self.faults = faults if faults is not None else Faults(None, tracer)
        #: connections relayed so far
        self.relayed = 0

    def retarget(self, upstream: str) -> None:
        """Relay the connections made from now on to ``upstream`` (a daemon
        that moved to another port: a first start that found its port taken)."""
        self._upstream_host, self._upstream_port = split_host_port(upstream)
        self.upstream = upstream

    async def check_upstream(self) -> None:
        """Connect to upstream once (``OSError``, one line, when it cannot)."""
        try:
            with trio.fail_after(self.connect_timeout):
                stream = await trio.open_tcp_stream(self._upstream_host, self._upstream_port)
        except trio.TooSlowError:
            raise OSError(
                f"upstream {self.upstream}: no answer in {self.connect_timeout:g}s"
            ) from None
        except OSError as exc:
            raise OSError(f"upstream {self.upstream}: {exc.strerror or exc}") from None
        await stream.aclose()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen and relay until cancelled; ``started`` once listening."""
        listeners = await trio.open_tcp_listeners(self._tcp_port, host=self._tcp_host)
        self.tcp_address = _bound(listeners[0])
        async with trio.open_nursery() as nursery:
            if self._http is not None:
                # (no handler of its API reads a body: answered once the head is read)
                server = HTTPServer(http_router(self).handle, body_limit=lambda _request: 0)
                host, port = await nursery.start(server.serve, self._http[0], self._http[1])
                self.http_address = join_host_port(host, port)
            for listener in listeners:
                nursery.start_soon(trio.serve_listeners, self._relay, [listener])
            log.info(
                "PROXY: %s -> %s (HTTP %s)", self.tcp_address, self.upstream, self.http_address
            )
            task_status.started()

    def _stopped(self, *, started: bool) -> None:
        self.faults.heal_all()

    async def play_seeded(
        self,
        seed: int,
        *,
        rate: float = 4.0,
        horizon: float = 60.0,
        kinds: tuple[str, ...] = SCHEDULE_KINDS,
        on_met: Callable[[MetFault], None] | None = None,
        rounds: int | None = None,
    ) -> list[MetFault]:
        """Play fault schedules drawn from ``seed``, one per ``horizon`` seconds
        (about ``rate`` faults each, of ``kinds``: a subset of
        :data:`SCHEDULE_KINDS`), until cancelled or ``rounds`` are played; the
        same seed draws the same schedules.  Consumers' connections only, as
        ``pytest --nsq-faults`` does.  Returns (or hands ``on_met``) the faults
        as they happened."""
        import random

        from .faultplayer import FaultPlayer
        from .schedule import draw_schedule, seed_for

        wrong = sorted(set(kinds) - set(SCHEDULE_KINDS))
        if wrong:
            raise ProxyRefusal(
                f"the proxy cannot play {', '.join(wrong)} (it can: {', '.join(SCHEDULE_KINDS)})"
            )
        met: list[MetFault] = []
        played = 0
        while rounds is None or played < rounds:
            rng = random.Random(seed_for(seed, f"proxy-round-{played}"))
            schedule = draw_schedule(
                rng, rate=rate, horizon=horizon, kinds=kinds, nsqd=1, lookupd=0
            )
            start = trio.current_time()
            player = FaultPlayer(
                schedule, self.faults, nsqd_names=[self.name], label=f"round {played}"
            )
            await player.run()
            met += player.met
            if on_met is not None:
                for fault in sorted(player.met, key=lambda m: m.at):
                    on_met(fault)
            await trio.sleep_until(start + horizon)
            played += 1
        return met

    # -- relaying ------------------------------------------------------------

    async def _relay(self, client: trio.SocketStream) -> None:
        faulty = FaultyStream(client, self.faults, self.name, socket_peer(client), parse_nsq=True)
        self.relayed += 1
        try:
            if self.faults.partitioned(self.name, faulty.names()):
                return  # cut off: the client sees its connection closed at once
            try:
                with trio.fail_after(self.connect_timeout):
                    upstream = await trio.open_tcp_stream(self._upstream_host, self._upstream_port)
            except (OSError, trio.TooSlowError) as exc:
                log.warning(
                    "PROXY: upstream %s unreachable for %s - %s", self.upstream, faulty.peer, exc
                )
                return
            try:
                async with trio.open_nursery() as nursery:
                    done = nursery.cancel_scope.cancel
                    nursery.start_soon(_pump, faulty.receive_some, upstream.send_all, done)
                    nursery.start_soon(_pump, upstream.receive_some, faulty.send_all, done)
            finally:
                await trio.aclose_forcefully(upstream)
        finally:
            await trio.aclose_forcefully(faulty)


async def _pump(
    receive: Callable[[int], Awaitable[bytes]],
    send: Callable[[bytes], Awaitable[None]],
    done: Callable[[], None],
) -> None:
    """Copy bytes until either end closes or breaks; then end the relay."""
    try:
        while True:
            data = await receive(_BUFFER)
            if not data:
                break
            await send(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
    finally:
        done()


def _bound(listener: trio.SocketListener) -> str:
    host, port = listener.socket.getsockname()[:2]
    return join_host_port(host, port)


# -- faults by name (the HTTP API's and the CLI's) -----------------------------------


def _role(text: str | None) -> Role | None:
    if text in (None, ""):
        return None
    if text in ("consumer", "producer"):
        return text  # type: ignore[return-value]
    raise ProxyRefusal(f"role must be consumer or producer, not {text!r}")


def _direction(text: str | None) -> Direction:
    if text in (None, ""):
        return "both"
    if text in ("in", "out", "both"):
        return text  # type: ignore[return-value]
    raise ProxyRefusal(f"direction must be in, out or both, not {text!r}")


def _number(name: str, text: str | None, default: float) -> float:
    if text in (None, ""):
        return default
    try:
        value = float(text)
    except ValueError:
        raise ProxyRefusal(f"{name} must be a number, not {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ProxyRefusal(f"{name} must be a number >= 0, not {text!r}")
    return value


async def add_fault(proxy: FaultProxy, kind: str, args: dict[str, str]) -> dict[str, Any]:
    """Inject fault ``kind`` with ``args`` (``client``, ``role``, ``direction``,
    ``seconds``, ``count``) on ``proxy``; the answer as JSON-ready data.
    :class:`ProxyRefusal` for what the proxy cannot do or a bad argument."""
    if kind in KINDS and kind not in WIRE_KINDS:
        raise ProxyRefusal(
            f"{kind} happens inside nsqd: the proxy only sees the wire "
            f"(it can: {', '.join(WIRE_KINDS)}); use fakensq's own nsqd for {kind}"
        )
    if kind not in WIRE_KINDS:
        raise ProxyRefusal(f"unknown fault {kind!r} (the proxy can: {', '.join(WIRE_KINDS)})")
    known = {"client", "role", "direction", "seconds", "count"}
    unknown = sorted(set(args) - known)
    if unknown:
        raise ProxyRefusal(
            f"unknown parameter(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})"
        )
    faults = proxy.faults
    client = args.get("client") or None
    role = _role(args.get("role"))
    if kind == "drop":
        return {"dropped": await faults.drop(client=client, role=role)}
    fault: Fault
    if kind == "delay":
        if not args.get("seconds"):
            raise ProxyRefusal("delay needs seconds (how long each write is held)")
        seconds = _number("seconds", args.get("seconds"), 0.0)
        direction = _direction(args.get("direction"))
        fault = faults.delay(seconds, client=client, direction=direction, role=role)
    elif kind == "stall":
        fault = faults.stall(client=client, direction=_direction(args.get("direction")), role=role)
    elif kind == "swallow_heartbeats":
        fault = faults.swallow_heartbeats(client=client, role=role)
    elif kind == "corrupt":
        count = int(_number("count", args.get("count"), 1))
        fault = faults.corrupt_next_frame(client=client, count=max(count, 1), role=role)
    elif kind == "truncate":
        fault = faults.truncate_next_frame(client=client, role=role)
    else:  # partition
        fault = faults.partition(proxy.name, client or "*")
    answer: dict[str, Any] = {"fault": fault.describe()}
    if kind in FRAME_KINDS:
        hidden = [s for s in faults.connections(client=client) if s.opaque]
        if hidden:
            answer["note"] = (
                f"{len(hidden)} matching connection(s) use TLS, snappy or deflate: "
                f"the proxy cannot see their frames, so {kind} passes over them "
                "(drop, delay, stall and partition still act on them)"
            )
    return answer


def http_router(proxy: FaultProxy) -> Router:
    """The proxy's HTTP API:

    - ``GET /ping``: ``OK``;
    - ``GET /faults``: the faults in force and the connections relayed;
    - ``POST /faults/KIND?client=&role=&direction=&seconds=&count=``: inject
      one of :data:`WIRE_KINDS` (``drop`` answers how many it dropped, the
      others the fault with its ``id``);
    - ``DELETE /faults/ID``: heal one; ``DELETE /faults``: heal all.

    Errors are ``{"message": "..."}`` with status 400 (404 for an unknown id).
    """

    def error(message: str, status: int = 400) -> Response:
        return Response.json({"message": message}, status)

    router = Router(
        not_found=lambda request: error("NOT_FOUND", 404),
        method_not_allowed=lambda request: error("METHOD_NOT_ALLOWED", 405),
    )

    async def ping(request: Request) -> Response:
        return Response.text("OK")

    async def listing(request: Request) -> Response:
        faults = proxy.faults
        return Response.json(
            {
                "upstream": proxy.upstream,
                "tcp_address": proxy.tcp_address,
                "faults": [f.describe() for f in faults.active],
                "connections": [
                    {
                        "peer": s.peer,
                        "client_id": s.client_id,
                        "hostname": s.hostname,
                        "role": s.role,
                        "opaque": s.opaque,
                    }
                    for s in faults.connections()
                ],
            }
        )

    async def inject(request: Request) -> Response:
        if request.query_error is not None:
            return error(f"bad query: {request.query_error}")
        args = {name: values[0] for name, values in request.query.items() if values}
        try:
            return Response.json(await add_fault(proxy, request.params["kind"], args))
        except ProxyRefusal as exc:
            return error(str(exc))

    async def heal(request: Request) -> Response:
        text = request.params["id"]
        for fault in list(proxy.faults.active):
            if str(fault.id) == text:
                fault.heal()
                return Response.json({"healed": fault.describe()})
        return error(f"no fault {text!r} in force", 404)

    async def heal_all(request: Request) -> Response:
        count = len(proxy.faults.active)
        proxy.faults.heal_all()
        return Response.json({"healed": count})

    router.add("GET", "/ping", ping)
    router.add("GET", "/faults", listing)
    router.add("POST", "/faults/:kind", inject)
    router.add("DELETE", "/faults/:id", heal)
    router.add("DELETE", "/faults", heal_all)
    return router
