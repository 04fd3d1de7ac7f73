"""fakensq.Cluster: nsqds wired to nsqlookupds, discovered through HTTP /lookup."""

from __future__ import annotations

import httpx
import trio
import trio.testing

from fakensq.golang.net import split_host_port
from fakensq.testing.cluster import Cluster


async def lookup(client: httpx.AsyncClient, lookupd_http: str, topic: str) -> httpx.Response:
    return await client.get(f"http://{lookupd_http}/lookup", params={"topic": topic})


async def test_cluster_starts_registered() -> None:
    async with Cluster(nsqd=3, lookupd=2) as cluster:
        assert len(cluster.nsqds) == 3
        assert len(cluster.lookupds) == 2
        tcp_ports = {split_host_port(a)[1] for a in cluster.nsqd_tcp_addresses}
        assert len(tcp_ports) == 3
        for lookupd in cluster.lookupds:
            assert {n["tcp_port"] for n in lookupd.nodes()} == tcp_ports
            assert {n["broadcast_address"] for n in lookupd.nodes()} == {"127.0.0.1"}


async def test_topic_published_on_one_nsqd_found_through_both_lookupds() -> None:
    async with Cluster(nsqd=3, lookupd=2) as cluster, httpx.AsyncClient() as client:
        r = await client.post(
            f"http://{cluster.nsqd_http_addresses[1]}/pub", params={"topic": "clicks"}, content=b"x"
        )
        assert r.status_code == 200
        with trio.fail_after(5):
            for lookupd in cluster.lookupds:
                await lookupd.wait_until(lambda lk=lookupd: bool(lk.producers("clicks")))  # type: ignore[misc]
        expected = split_host_port(cluster.nsqd_tcp_addresses[1])[1]
        for http_address in cluster.lookupd_http_addresses:
            body = (await lookup(client, http_address, "clicks")).json()
            assert [(p["broadcast_address"], p["tcp_port"]) for p in body["producers"]] == [
                ("127.0.0.1", expected)
            ]
        # A consumer merging both lookupds finds exactly one producer.
        merged = set()
        for http_address in cluster.lookupd_http_addresses:
            for p in (await lookup(client, http_address, "clicks")).json()["producers"]:
                merged.add(f"{p['broadcast_address']}:{p['tcp_port']}")
        assert merged == {cluster.nsqd_tcp_addresses[1]}


async def test_lookup_merges_producers_of_several_nsqds() -> None:
    async with Cluster(nsqd=3, lookupd=2) as cluster:
        for nsqd in cluster.nsqds[:2]:
            nsqd.get_topic("t")
        cluster.nsqds[2].get_topic("other")
        with trio.fail_after(5):
            for lookupd in cluster.lookupds:
                await lookupd.wait_until(lambda lk=lookupd: len(lk.producers("t")) == 2)  # type: ignore[misc]
        for lookupd in cluster.lookupds:
            assert sorted(lookupd.topics()) == ["other", "t"]


async def test_stop_and_restart_nsqd_keeps_its_ports() -> None:
    async with Cluster(nsqd=2, lookupd=1) as cluster:
        addresses = cluster.nsqd_tcp_addresses, cluster.nsqd_http_addresses
        cluster.nsqd(0).get_topic("t")
        lookupd = cluster.lookupd(0)
        with trio.fail_after(5):
            await lookupd.wait_until(lambda: len(lookupd.producers("t")) == 1)
            await cluster.stop_nsqd(0)
            assert len(cluster.nsqds) == 1
            # Its connection closed: nsqlookupd dropped it everywhere.
            await lookupd.wait_until(lambda: len(lookupd.nodes()) == 1)
        assert lookupd.producers("t") == []
        nsqd = await cluster.start_nsqd(0)
        assert (cluster.nsqd_tcp_addresses, cluster.nsqd_http_addresses) == addresses
        assert nsqd.tcp_address == addresses[0][0]
        assert len(lookupd.nodes()) == 2


async def test_restarted_lookupd_relearns_everything() -> None:
    async with Cluster(nsqd=2, lookupd=2) as cluster:
        cluster.nsqd(0).get_topic("t")
        with trio.fail_after(5):
            await cluster.lookupd(1).wait_until(lambda: bool(cluster.lookupd(1).producers("t")))
        address = cluster.lookupd_tcp_addresses[1]
        await cluster.stop_lookupd(1)
        assert len(cluster.lookupds) == 1
        lookupd = await cluster.start_lookupd(1)
        assert lookupd.tcp_address == address
        assert len(lookupd.nodes()) == 2
        assert [p.tcp_port for p in lookupd.producers("t")] == [
            split_host_port(cluster.nsqd_tcp_addresses[0])[1]
        ]


async def test_restarted_lookupd_is_found_at_the_heartbeat(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Without a poke, the nsqds come back as a real nsqd would: within two heartbeats.
    async with Cluster(nsqd=1, lookupd=1) as cluster:
        cluster.nsqd(0).get_topic("t")
        await cluster.stop_lookupd(0)
        lookupd = await cluster.start_lookupd(0, wait=False)
        assert lookupd.nodes() == []
        with trio.fail_after(31):
            await lookupd.wait_until(lambda: bool(lookupd.producers("t")))


async def test_body_errors_propagate_unwrapped() -> None:
    try:
        async with Cluster(nsqd=1, lookupd=1):
            raise KeyError("boom")
    except KeyError:
        pass
    else:
        raise AssertionError("KeyError swallowed")
