"""The nsqd side: lookup peers registering with nsqlookupds (a stand-in nsqd)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio
import trio.testing

from fakensq.lookupd.daemon import NSQLookupd
from fakensq.nsqd.lookup_peer import (
    HEARTBEAT_INTERVAL,
    LookupPeers,
    lookup_peers_of,
    run_lookup_peers,
)
from fakensq.nsqd.options import NSQDOptions

from .conftest import V1Client


@dataclass(frozen=True)
class RegistryEvent:
    action: str
    topic: str
    channel: str | None = None


@dataclass
class StubNSQD:
    """Just the public hooks of fakensq.NSQD that the lookup peers use."""

    options: NSQDOptions
    tcp_address: str = "127.0.0.1:14150"
    http_address: str = "127.0.0.1:14151"
    hostname: str = "stubhost"
    regs: list[tuple[str, str | None]] = field(default_factory=list)
    listeners: list[Callable[[RegistryEvent], None]] = field(default_factory=list)

    def add_registry_listener(self, cb: Callable[[RegistryEvent], None]) -> None:
        self.listeners.append(cb)

    def remove_registry_listener(self, cb: Callable[[RegistryEvent], None]) -> None:
        self.listeners.remove(cb)

    def registrations(self) -> list[tuple[str, str | None]]:
        return list(self.regs)

    def emit(self, action: Any, topic: str, channel: str | None = None) -> None:
        if action == "register":
            self.regs.append((topic, channel))
        else:
            self.regs.remove((topic, channel))
        for cb in list(self.listeners):
            cb(RegistryEvent(action, topic, channel))

    def __hash__(self) -> int:
        return id(self)


def stub(*lookupds: NSQLookupd, **options: Any) -> StubNSQD:
    addresses = [lookupd.tcp_address for lookupd in lookupds]
    return StubNSQD(
        NSQDOptions(lookupd_tcp_addresses=addresses, broadcast_address="127.0.0.1", **options)
    )


def ports(lookupd: NSQLookupd, topic: str) -> list[int]:
    return [p.tcp_port for p in lookupd.producers(topic)]


async def test_identify_and_register_existing_topics(nursery: trio.Nursery) -> None:
    async with NSQLookupd() as lookupd:
        nsqd = stub(lookupd)
        nsqd.regs = [("a", None), ("b", None), ("b", "c1"), ("b", "c2")]
        peers: LookupPeers = await nursery.start(run_lookup_peers, nsqd)
        assert lookup_peers_of(nsqd) is peers
        (peer,) = peers.peers
        assert peer.connected
        assert peer.info["tcp_port"] == lookupd.tcp_port
        (node,) = lookupd.nodes()
        assert node["tcp_port"] == 14150
        assert node["http_port"] == 14151
        assert node["hostname"] == "stubhost"
        assert node["broadcast_address"] == "127.0.0.1"
        assert node["version"] == "1.3.0"
        assert lookupd.topics() == ["a", "b"]
        assert lookupd.channels("b") == ["c1", "c2"]
        with trio.fail_after(5):
            # Events go to the lookupd in order.
            nsqd.emit("register", "d")
            nsqd.emit("register", "d", "x")
            await lookupd.wait_until(lambda: lookupd.channels("d") == ["x"])
            nsqd.emit("unregister", "d", "x")
            nsqd.emit("unregister", "d")
            await lookupd.wait_until(lambda: ports(lookupd, "d") == [])
        assert lookupd.db.find_producers("channel", "d", "x") == []
        nursery.cancel_scope.cancel()


async def test_broadcast_ports_override(nursery: trio.Nursery) -> None:
    async with NSQLookupd() as lookupd:
        nsqd = stub(lookupd, broadcast_tcp_port=24150, broadcast_http_port=24151)
        await nursery.start(run_lookup_peers, nsqd)
        (node,) = lookupd.nodes()
        assert (node["tcp_port"], node["http_port"]) == (24150, 24151)
        nursery.cancel_scope.cancel()


async def test_registers_with_every_lookupd(nursery: trio.Nursery) -> None:
    async with NSQLookupd() as one, NSQLookupd() as two:
        nsqd = stub(one, two)
        await nursery.start(run_lookup_peers, nsqd)
        nsqd.emit("register", "t", "c")
        with trio.fail_after(5):
            for lookupd in (one, two):
                await lookupd.wait_until(lambda lk=lookupd: ports(lk, "t") == [14150])  # type: ignore[misc]
                assert lookupd.channels("t") == ["c"]
        nursery.cancel_scope.cancel()


async def test_pings_keep_the_producer_active(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    async with NSQLookupd(inactive_producer_timeout=20) as lookupd:
        nsqd = stub(lookupd)
        nsqd.regs = [("t", None)]
        await nursery.start(run_lookup_peers, nsqd)
        await trio.sleep(1000)  # 66 heartbeats of virtual time
        assert ports(lookupd, "t") == [14150]
        # A producer that stops pinging goes inactive.
        silent = await V1Client.connect(lookupd.tcp_address)
        await silent.identify(tcp_port=1)
        assert await silent.command("REGISTER t") == b"OK"
        assert ports(lookupd, "t") == [14150, 1]
        await trio.sleep(21)
        assert ports(lookupd, "t") == [14150]
        nursery.cancel_scope.cancel()


async def test_reconnects_and_reregisters_after_lookupd_restart(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    async with NSQLookupd() as first:
        address = first.tcp_address
        nsqd = stub(first)
        nsqd.regs = [("t", "c")]
        peers: LookupPeers = await nursery.start(run_lookup_peers, nsqd)
        assert ports(first, "t") == [14150]
    # Registrations made while the lookupd is down are not lost.
    nsqd.emit("register", "u")
    async with NSQLookupd(tcp_address=address) as second:
        # nsqd notices at a heartbeat (the PING fails) and reconnects at the next.
        start = trio.current_time()
        with trio.fail_after(2 * HEARTBEAT_INTERVAL + 1):
            await second.wait_until(lambda: ports(second, "t") == [14150])
            await second.wait_until(lambda: ports(second, "u") == [14150])
        assert trio.current_time() - start <= 2 * HEARTBEAT_INTERVAL
        assert second.channels("t") == ["c"]
        assert peers.peers[0].connections == 2
    nursery.cancel_scope.cancel()


async def test_poke_reconnects_at_once(nursery: trio.Nursery) -> None:
    async with NSQLookupd() as first:
        address = first.tcp_address
        nsqd = stub(first)
        nsqd.regs = [("t", None)]
        peers: LookupPeers = await nursery.start(run_lookup_peers, nsqd)
    async with NSQLookupd(tcp_address=address) as second:
        with trio.fail_after(5):
            await peers.poke().wait()
        assert ports(second, "t") == [14150]
    nursery.cancel_scope.cancel()


async def test_lookupd_down_at_start(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    async with NSQLookupd() as probe:
        address = probe.tcp_address
    nsqd = StubNSQD(NSQDOptions(lookupd_tcp_addresses=[address, address]))
    nsqd.regs = [("t", None)]
    peers: LookupPeers = await nursery.start(run_lookup_peers, nsqd)
    assert len(peers.peers) == 1  # duplicates are skipped, as nsqd does
    assert not peers.peers[0].connected
    async with NSQLookupd(tcp_address=address) as lookupd:
        with trio.fail_after(HEARTBEAT_INTERVAL + 1):
            await lookupd.wait_until(lambda: ports(lookupd, "t") == [14150])
    nursery.cancel_scope.cancel()


async def test_rejected_identify_closes(nursery: trio.Nursery) -> None:
    # No http_port (an nsqd without HTTP): nsqlookupd refuses the IDENTIFY.
    async with NSQLookupd() as lookupd:
        nsqd = stub(lookupd)
        nsqd.http_address = ""
        peers: LookupPeers = await nursery.start(run_lookup_peers, nsqd)
        assert not peers.peers[0].connected
        assert lookupd.nodes() == []
        nursery.cancel_scope.cancel()


async def test_follows_changed_lookupd_addresses(nursery: trio.Nursery) -> None:
    async with NSQLookupd() as one, NSQLookupd() as two:
        nsqd = stub(one)
        nsqd.regs = [("t", None)]
        options_listeners: list[Callable[[Any], None]] = []
        nsqd.add_options_listener = options_listeners.append  # type: ignore[attr-defined]
        peers: LookupPeers = await nursery.start(run_lookup_peers, nsqd)
        nsqd.options.lookupd_tcp_addresses = [two.tcp_address]
        for cb in options_listeners:
            cb(nsqd.options)
        with trio.fail_after(5):
            await two.wait_until(lambda: ports(two, "t") == [14150])
            await one.wait_until(lambda: one.nodes() == [])
        assert [p.address for p in peers.peers] == [two.tcp_address]
        nursery.cancel_scope.cancel()
