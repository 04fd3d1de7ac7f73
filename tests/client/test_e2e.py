"""The client end to end over loopback TCP, on fakensq and on the real nsqd v1.3.0.

Each test runs once per kind of daemon (the ``daemons`` fixture); outcomes are
checked on the client's side and through nsqd's ``/stats``.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

import fakensq
import trionsq

from ..support.authserver import running_auth_server
from ..support.ports import free_port
from ..support.tls import Pki
from ..support.waiting import wait_until
from .daemons import Daemons, Nsqd, consumer, nothing_in_flight, publish, wait_channel


async def collect(nsqds: list[Nsqd], count: int, **options: Any) -> list[trionsq.Message]:
    """Handle (finish) messages until ``count`` arrived; returns them."""
    got: list[trionsq.Message] = []
    async with consumer(nsqds, handler=got.append, **options):
        await wait_until(lambda: len(got) >= count)
    return got


# --- publishing and consuming ---


@pytest.mark.parametrize("mode", ["handler", "iterate"])
async def test_publish_and_consume_an_exact_set(daemons: Daemons, mode: str) -> None:
    nsqd = await daemons.nsqd()
    expected = {
        b"one",
        b"later",
        *(b"m%d" % i for i in range(300)),
        *(b"p%d" % i for i in range(50)),
    }
    async with trionsq.Producer([nsqd.tcp_address]) as producer:
        await producer.publish("topic", b"one")
        await producer.deferred_publish("topic", b"later", 0.2)
        await producer.multi_publish("topic", [b"m%d" % i for i in range(300)])
        async with trio.open_nursery() as publishers:
            for i in range(50):
                publishers.start_soon(producer.publish, "topic", b"p%d" % i)
    got: list[trionsq.Message] = []
    if mode == "handler":
        got = await collect([nsqd], len(expected), max_in_flight=32)
    else:
        async with consumer([nsqd], max_in_flight=32) as c:
            async for message in c:
                got.append(message)
                await message.finish()
                if len(got) == len(expected):
                    break
    assert sorted(m.body for m in got) == sorted(expected)  # each exactly once
    assert all(m.attempts == 1 and len(m.id) == 16 and m.timestamp > 0 for m in got)
    assert {m.address for m in got} == {nsqd.tcp_address}
    channel = await nothing_in_flight(nsqd, "topic", "chan")
    assert channel["depth"] == 0 and channel["deferred_count"] == 0
    assert channel["message_count"] == len(expected)
    assert channel["requeue_count"] == 0 and channel["timeout_count"] == 0


async def test_requeue_redelivers_with_more_attempts(daemons: Daemons) -> None:
    nsqd = await daemons.nsqd()
    await publish(nsqd, "topic", [b"again"])
    async with consumer([nsqd], backoff=False) as c:
        with trio.fail_after(20):
            first = await c.__anext__()
            await first.requeue(0)
            second = await c.__anext__()
            await second.requeue(0.3)  # deferred: comes back after 0.3 s
            third = await c.__anext__()
            await third.finish()
    assert first.id == second.id == third.id
    assert [first.attempts, second.attempts, third.attempts] == [1, 2, 3]
    channel = await nothing_in_flight(nsqd, "topic", "chan")
    assert channel["requeue_count"] == 2 and channel["depth"] == 0


async def test_max_attempts_then_give_up(daemons: Daemons) -> None:
    nsqd = await daemons.nsqd()
    await publish(nsqd, "topic", [b"poison", b"fine"])
    handled: list[tuple[bytes, int]] = []
    given_up: list[trionsq.Message] = []

    def handler(message: trionsq.Message) -> None:
        handled.append((message.body, message.attempts))
        if message.body == b"poison":
            raise ValueError("cannot handle this one")

    async with consumer(
        [nsqd],
        handler=handler,
        give_up=given_up.append,
        max_attempts=3,
        default_requeue_delay=0.05,
        backoff=False,
        max_in_flight=2,
    ) as c:
        await wait_until(lambda: given_up)
    assert sorted(handled) == [(b"fine", 1), (b"poison", 1), (b"poison", 2), (b"poison", 3)]
    assert [(m.body, m.attempts) for m in given_up] == [(b"poison", 4)]
    assert c.stats.given_up == 1 and c.stats.requeued == 3 and c.stats.finished == 1
    channel = await nothing_in_flight(nsqd, "topic", "chan")
    # Given up means finished: nsqd forgets it.
    assert channel["depth"] == 0 and channel["deferred_count"] == 0
    assert channel["requeue_count"] == 3


async def test_touch_keeps_a_slow_message_alive(daemons: Daemons) -> None:
    # msg_timeout 1 s; both messages take 2.5 s: the touched one stays ours,
    # the other times out and comes back.
    nsqd = await daemons.nsqd("--msg-timeout=1s")
    await nsqd.scanned_channel("topic", "chan")
    await publish(nsqd, "topic", [b"touched", b"untouched"])
    seen: list[tuple[bytes, int]] = []

    async def handler(message: trionsq.Message) -> None:
        seen.append((message.body, message.attempts))
        if message.attempts > 1:
            return
        deadline = trio.current_time() + 2.5
        while trio.current_time() < deadline:
            if message.body == b"touched":
                await message.touch()
            await trio.sleep(0.2)

    # A third handler takes the redelivery while the first two still run.
    async with consumer([nsqd], handler=handler, max_in_flight=3, backoff=False):
        await wait_until(lambda: (b"untouched", 2) in seen and len(seen) == 3)
        await wait_channel(nsqd, "topic", "chan", lambda c: c["in_flight_count"] == 0)
    assert sorted(seen) == [(b"touched", 1), (b"untouched", 1), (b"untouched", 2)]
    channel = await nothing_in_flight(nsqd, "topic", "chan")
    assert channel["timeout_count"] == 1 and channel["depth"] == 0


# --- features negotiated with nsqd ---


@pytest.mark.parametrize("compression", ["snappy", "deflate"])
async def test_compression(daemons: Daemons, compression: str) -> None:
    nsqd = await daemons.nsqd()
    bodies = [b"z" * 50_000, b"y" * 10, bytes(range(256)) * 40]
    options: dict[str, Any] = {compression: True}
    async with trionsq.Producer([nsqd.tcp_address], **options) as producer:
        await producer.multi_publish("topic", bodies)
    got: list[bytes] = []
    async with consumer([nsqd], handler=lambda m: got.append(m.body), max_in_flight=3, **options):
        await wait_until(lambda: len(got) == 3)
        channel = await nsqd.channel("topic", "chan")
        assert channel is not None
        (client,) = channel["clients"]
        assert client[compression] is True
    assert sorted(got) == sorted(bodies)


@pytest.mark.parametrize(
    "variant", ["tls", "tls+snappy", "client-certificate", "client-certificate-tls-true"]
)
async def test_tls(
    daemons: Daemons,
    pki: Pki,
    variant: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    flags = pki.nsqd_flags(
        "--tls-required=tcp-https",  # TCP needs TLS, plain HTTP (/stats) stays open
        f"--https-address=127.0.0.1:{free_port()}",
    )
    client_cert, client_key = pki.client_files("consumer.example")
    options: dict[str, Any] = {"tls": pki.client_context()}
    if variant == "tls+snappy":
        options["snappy"] = True
    if variant.startswith("client-certificate"):
        flags += [
            "--tls-client-auth-policy=require-verify",
            f"--tls-root-ca-file={pki.ca_file}",
        ]
    if variant == "client-certificate-tls-true":
        # trionsq's own context (the system's trust store, here made to
        # trust the test CA), with the certificate loaded into it.
        monkeypatch.setenv("SSL_CERT_FILE", pki.ca_file)
        options = {"tls": True, "tls_cert": client_cert, "tls_key": client_key}
    elif variant == "client-certificate":
        # The caller's own context carries its certificate (trionsq never
        # loads one into a context it is given).
        options["tls"].load_cert_chain(client_cert, client_key)
    nsqd = await daemons.nsqd(*flags)
    async with trionsq.Producer([nsqd.tcp_address], **options) as producer:
        await producer.multi_publish("topic", [b"secret-1", b"secret-2"])
    with pytest.raises(trionsq.NSQError):
        # TLS is required: a plain client is refused.
        async with trionsq.Producer([nsqd.tcp_address]) as plain:
            await plain.publish("topic", b"in clear")
    got: list[bytes] = []
    async with consumer([nsqd], handler=lambda m: got.append(m.body), max_in_flight=2, **options):
        await wait_until(lambda: len(got) == 2)
        channel = await nsqd.channel("topic", "chan")
        assert channel is not None
        (client,) = channel["clients"]
        assert client["tls"] is True
        assert client["snappy"] is (variant == "tls+snappy")
    assert sorted(got) == [b"secret-1", b"secret-2"]


async def test_auth(daemons: Daemons) -> None:
    grants = {"open-sesame": ["subscribe", "publish"], "read-only": ["subscribe"]}
    with running_auth_server(grants) as auth:
        nsqd = await daemons.nsqd(f"--auth-http-address={auth.address}")
        async with trionsq.Producer([nsqd.tcp_address], auth_secret="open-sesame") as producer:
            await producer.publish("topic", b"for authorized eyes")
            conn = await producer._connection()
            assert conn.auth_response is not None
            assert conn.auth_response["identity"] == "tester"
        with pytest.raises(trionsq.AuthFailedError):
            async with trionsq.Producer([nsqd.tcp_address], auth_secret="wrong") as producer:
                await producer.publish("topic", b"refused")
        with pytest.raises(trionsq.UnauthorizedError):
            async with trionsq.Producer([nsqd.tcp_address], auth_secret="read-only") as producer:
                await producer.publish("topic", b"refused")
        got = await collect([nsqd], 1, auth_secret="read-only")
    assert [m.body for m in got] == [b"for authorized eyes"]
    assert set(auth.seen) == {"open-sesame", "wrong", "read-only"}


# --- the producer ---


@pytest.mark.parametrize("how", ["kill", "stop"])
async def test_producer_fails_over_when_an_nsqd_dies(daemons: Daemons, how: str) -> None:
    first = await daemons.nsqd()
    second = await daemons.nsqd()
    async with trionsq.Producer(
        [first.tcp_address, second.tcp_address], connect_timeout=2.0
    ) as producer:
        await producer.publish("topic", b"to-first")
        assert producer.address == first.tcp_address
        await (first.kill() if how == "kill" else first.stop())
        await wait_until(lambda: producer.address is None)
        for i in range(10):
            await producer.publish("topic", b"to-second-%d" % i)
        assert producer.address == second.tcp_address
    assert await second.topic_depth("topic") == 10
    got = await collect([second], 10, max_in_flight=10)
    assert sorted(m.body for m in got) == sorted(b"to-second-%d" % i for i in range(10))


async def test_server_side_errors_are_typed(daemons: Daemons) -> None:
    nsqd = await daemons.nsqd("--max-msg-size=10")
    async with trionsq.Producer([nsqd.tcp_address]) as producer:
        with pytest.raises(trionsq.BadMessageError):
            await producer.publish("topic", b"x" * 100)
        await producer.publish("topic", b"fits")  # reconnected after the fatal error
    assert await nsqd.topic_depth("topic") == 1


# --- fakensq's own test seams (no real daemon has them) ---


async def test_fakensq_ssl_context_and_auth_handler(pki: Pki) -> None:
    server, client = pki.server_context(), pki.client_context()
    secrets: list[str] = []

    def auth(query: dict[str, str]) -> dict[str, Any]:
        secrets.append(query["secret"])
        return {
            "ttl": 3600,
            "identity": "tester",
            "authorizations": [
                {"topic": ".*", "channels": [".*"], "permissions": ["subscribe", "publish"]}
            ],
        }

    async with fakensq.NSQD(
        tcp_address="127.0.0.1:0", http_address="127.0.0.1:0", ssl_context=server, auth_handler=auth
    ) as node:
        options: dict[str, Any] = {"tls": client, "auth_secret": "open-sesame", "snappy": True}
        async with trionsq.Producer([node.tcp_address], **options) as producer:
            await producer.publish("topic", b"secret message")
        got: list[bytes] = []
        async with trionsq.Consumer(
            "topic",
            "chan",
            nsqd_tcp_addresses=[node.tcp_address],
            handler=lambda m: got.append(m.body),
            **options,
        ):
            await wait_until(lambda: got)
    assert got == [b"secret message"]
    assert secrets and set(secrets) == {"open-sesame"}


async def test_discovery_through_a_fakensq_cluster() -> None:
    async with fakensq.Cluster(nsqd=2, lookupd=2) as cluster:
        for index, address in enumerate(cluster.nsqd_tcp_addresses):
            async with trionsq.Producer([address]) as producer:
                await producer.publish("topic", b"from-%d" % index)
        got: list[bytes] = []
        async with trionsq.Consumer(
            "topic",
            "chan",
            lookupd_http_addresses=cluster.lookupd_http_addresses,
            lookupd_poll_interval=0.1,
            handler=lambda m: got.append(m.body),
            max_in_flight=4,
        ) as c:
            await wait_until(lambda: len(got) == 2)
            assert c.connections == sorted(cluster.nsqd_tcp_addresses)
    assert sorted(got) == [b"from-0", b"from-1"]
