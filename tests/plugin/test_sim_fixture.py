"""The plugin's simulated cluster, TLS and auth markers, and its clean teardown."""

from __future__ import annotations

import time
from typing import Any

import pytest
import trio
import trio.testing

import trionsq
from fakensq.testing.simulation import SimCluster


@pytest.mark.sim_cluster(nsqd=2, lookupd=1, seed=11, nsqd_options={"msg_timeout": 30.0})
async def test_sim_cluster_runs_in_virtual_time(
    sim_cluster: SimCluster, autojump_clock: trio.testing.MockClock
) -> None:
    wall = time.perf_counter()
    assert sim_cluster.nsqd_tcp_addresses == ["nsqd-0:4150", "nsqd-1:4150"]
    async with trionsq.Producer(
        nsqd_tcp_addresses=["nsqd-1:4150"], connector=sim_cluster.connector
    ) as producer:
        await producer.publish("t", b"hello")
    async with trionsq.Consumer(
        "t",
        "c",
        lookupd_http_addresses=sim_cluster.lookupd_http_addresses,
        connector=sim_cluster.connector,
        http_transport=sim_cluster.http_transport,
    ) as consumer:
        first = await consumer.__anext__()
        second = await consumer.__anext__()  # the 30 s timeout, in virtual time
        assert second.attempts == 2 and second.id == first.id
        await second.finish()
        await trio.sleep(600)  # ten virtual minutes of heartbeats and polls
    assert trio.current_time() > 600
    assert time.perf_counter() - wall < 5


@pytest.mark.nsqd(tls=True)
async def test_tls_marker_gives_certificates(nsqd: Any) -> None:
    assert nsqd.tls_ca_file.endswith(".pem")
    async with trionsq.Producer(
        nsqd_tcp_addresses=[nsqd.tcp_address], tls=nsqd.client_ssl_context
    ) as producer:
        await producer.publish("secure", b"x")
        clients = nsqd.stats()["producers"]
        assert clients[0]["tls"] is True


def allow_publish(query: dict[str, str]) -> dict[str, Any]:
    if query["secret"] != "open sesame":
        return {"ttl": 60, "authorizations": []}
    rule = {"topic": ".*", "channels": [".*"], "permissions": ["publish"]}
    return {"ttl": 60, "identity": "tester", "authorizations": [rule]}


@pytest.mark.nsqd(auth_handler=allow_publish)
async def test_auth_handler_marker(nsqd: Any) -> None:
    async with trionsq.Producer(
        nsqd_tcp_addresses=[nsqd.tcp_address], auth_secret="open sesame"
    ) as producer:
        await producer.publish("t", b"x")
        # (while connected: a closed connection leaves the stats)
        assert nsqd.stats()["producers"][0]["auth_identity"] == "tester"


def test_fixtures_leave_nothing_behind(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import os, socket, threading
        import pytest
        import trio

        seen = {}

        async def test_sim(sim_cluster, autojump_clock):
            seen["root"] = sim_cluster._own_data_root
            seen["tasks"] = len(trio.lowlevel.current_root_task().child_nurseries)
            assert os.path.isdir(seen["root"])

        @pytest.mark.nsqd(tls=True)
        def test_tcp(nsqd):
            seen["tcp"] = nsqd.tcp_address
            seen["http"] = nsqd.http_address

        def test_nothing_left():
            assert not os.path.exists(seen["root"])
            assert threading.active_count() == 1
            for address in (seen["tcp"], seen["http"]):
                host, port = address.rsplit(":", 1)
                with pytest.raises(OSError):
                    socket.create_connection((host, int(port)), timeout=1).close()
        """
    )
    pytester.makeini("[pytest]\ntrio_mode = true\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
