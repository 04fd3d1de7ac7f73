"""``fakensq proxy``: fakensq's connection faults in front of the REAL nsqd.

trionsq and pynsq publish and consume exact sets through the proxy; a drop
fault cuts their connections, they reconnect and still get every message.  The
real nsqd runs with a short ``--msg-timeout`` (2 s): nsqd v1.3.0 hands a gone
consumer's in-flight messages out again only at their timeout.
"""

from __future__ import annotations

import asyncio
import functools
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

import trionsq
from fakensq.testing.proxy import FaultProxy
from tests import reference

from ..support.ports import free_port
from ..support.tls import Pki
from ..support.waiting import poll_until, wait_until, wait_until_asyncio

pytestmark = pytest.mark.skipif(reference.binary("nsqd") is None, reason=reference.skip_reason())

MSG_TIMEOUT = "--msg-timeout=2s"


async def _publish(address: str, topic: str, bodies: list[bytes], **options: Any) -> None:
    """Publish as a correct producer does: retry what nsqd did not acknowledge."""
    with trio.fail_after(30):
        while True:
            try:
                async with trionsq.Producer(nsqd_tcp_addresses=[address], **options) as producer:
                    await producer.multi_publish(topic, bodies)
                return
            except trionsq.NSQError:
                await trio.sleep(0.1)


async def _settled(http_address: str, topic: str) -> bool:
    """Whether the real nsqd's channel holds nothing, queued or in flight."""
    async with httpx.AsyncClient() as http:
        answer = await http.get(f"http://{http_address}/stats?format=json&topic={topic}")
    channels = answer.json()["topics"][0]["channels"]
    return all(c["depth"] == 0 and c["in_flight_count"] == 0 for c in channels)


async def _consume_with_a_drop(
    proxy: FaultProxy, http_address: str, topic: str, **options: Any
) -> list[bytes]:
    """Publish 40 bodies through the proxy, consume them through it, drop every
    connection once 10 are handled, publish 40 more; all 80 must arrive, and
    the real nsqd must end with nothing queued or in flight (what the dropped
    connection held comes back at its msg-timeout, and is handled again)."""
    first = [b"a%02d" % i for i in range(40)]
    second = [b"b%02d" % i for i in range(40)]
    await _publish(proxy.tcp_address, topic, first, **options)
    handled: list[bytes] = []

    async def handle(message: trionsq.Message) -> None:
        await trio.sleep(0.01)
        handled.append(message.body)

    async with trionsq.Consumer(
        topic,
        "c",
        nsqd_tcp_addresses=[proxy.tcp_address],
        handler=handle,
        max_in_flight=5,
        **options,
    ):
        await wait_until(lambda: len(handled) >= 10)
        dropped = await proxy.faults.drop()
        assert dropped >= 1
        await _publish(proxy.tcp_address, topic, second, **options)
        await wait_until(lambda: set(handled) >= set(first + second))
        await poll_until(lambda: _settled(http_address, topic), step=0.1)
    return handled


async def test_trionsq_through_the_proxy_survives_a_drop() -> None:
    async with (
        reference.open_nsqd(MSG_TIMEOUT) as nsqd,
        FaultProxy(nsqd.tcp_address) as proxy,
    ):
        handled = await _consume_with_a_drop(proxy, nsqd.http_address, "proxied")
        assert proxy.relayed >= 4  # producer, consumer, the consumer again, a producer
        expected = {b"a%02d" % i for i in range(40)} | {b"b%02d" % i for i in range(40)}
        assert set(handled) == expected


@pytest.mark.parametrize("feature", ["tls", "snappy", "deflate"])
async def test_upgraded_connections_pass_through_and_still_drop(
    feature: str, pki: Pki
) -> None:
    flags = [MSG_TIMEOUT]
    options: dict[str, Any] = {}
    if feature == "tls":
        flags += [
            *pki.nsqd_flags(),
            # (with a certificate nsqd serves HTTPS too: 0.0.0.0:4152 unless told)
            f"--https-address=127.0.0.1:{free_port()}",
        ]
        options["tls"] = pki.client_context()
    else:
        options[feature] = True
    async with (
        reference.open_nsqd(*flags) as nsqd,
        FaultProxy(nsqd.tcp_address) as proxy,
        httpx.AsyncClient() as http,
    ):
        # The frame fault's answer says it cannot see inside such connections.
        base = f"http://{proxy.http_address}/faults"
        seen: list[dict[str, Any]] = []

        async def look() -> None:
            seen.append((await http.get(base)).json())

        first = [b"x%d" % i for i in range(20)]
        await _publish(proxy.tcp_address, "up", first, **options)
        got: list[bytes] = []
        async with trionsq.Consumer(
            "up", "c", nsqd_tcp_addresses=[proxy.tcp_address], max_in_flight=4, **options
        ) as consumer:
            async for message in consumer:
                got.append(message.body)
                await message.finish()
                if len(got) == 5:
                    await look()
                    answer = (await http.post(base + "/swallow_heartbeats")).json()
                    assert "cannot see their frames" in answer["note"], answer
                    assert (await http.delete(base)).json() == {"healed": 1}
                    assert (await http.post(base + "/drop")).json() == {"dropped": 1}
                if set(got) >= set(first):
                    break
        assert [c["opaque"] for c in seen[0]["connections"]] == [True]
        # Its SUB went inside TLS or compression: the proxy cannot tell its role.
        assert seen[0]["connections"][0]["role"] == "unknown"


def _pynsq_with_a_drop(proxy_address: str, http_address: str) -> list[bytes]:
    """pynsq's Reader and Writer through the proxy; the Reader's connection is
    dropped (over the proxy's HTTP API) midway; pynsq reconnects (after its
    fixed 15 s) and gets the rest."""
    import nsq
    from tornado.ioloop import IOLoop

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    ioloop = IOLoop.current()
    received: list[bytes] = []
    done = asyncio.Event()
    count = 40

    def handler(message: Any) -> bool:
        received.append(bytes(message.body))
        if {int(b) for b in received} >= set(range(count)):
            done.set()
        return True

    reader = nsq.Reader(
        topic="py",
        channel="c",
        message_handler=handler,
        nsqd_tcp_addresses=[proxy_address],
        max_in_flight=5,
    )
    writer = nsq.Writer([proxy_address], reconnect_interval=0.2)

    async def mpub(batch: list[bytes]) -> None:
        while True:
            while not writer.conns:  # noqa: ASYNC110 - pynsq offers no event for it
                await asyncio.sleep(0.01)
            fut: asyncio.Future[Any] = loop.create_future()
            writer.mpub("py", batch, callback=lambda conn, data, fut=fut: fut.set_result(data))
            if not isinstance(await fut, Exception):
                return
            await asyncio.sleep(0.1)

    async def run() -> None:
        await mpub([b"%d" % i for i in range(20)])
        await wait_until_asyncio(lambda: len(received) >= 5, step=0.01)
        # (the tornado loop waits for the answer: nothing else runs on it meanwhile)
        with httpx.Client() as http:
            answer = http.post(f"http://{http_address}/faults/drop").json()  # noqa: ASYNC212
        assert answer["dropped"] >= 1, answer
        await mpub([b"%d" % i for i in range(20, count)])
        await asyncio.wait_for(done.wait(), 40)

    try:
        loop.run_until_complete(run())
    finally:
        reader.close()
        writer.close() if hasattr(writer, "close") else None
        ioloop.close(all_fds=False)
        loop.close()
    return received


async def test_pynsq_through_the_proxy_survives_a_drop() -> None:
    async with (
        reference.open_nsqd(MSG_TIMEOUT) as nsqd,
        FaultProxy(nsqd.tcp_address) as proxy,
    ):
        received = await trio.to_thread.run_sync(
            functools.partial(_pynsq_with_a_drop, proxy.tcp_address, str(proxy.http_address))
        )
        assert {int(b) for b in received} == set(range(40))


async def test_http_api_adds_lists_heals_and_refuses() -> None:
    async with (
        reference.open_nsqd() as nsqd,
        FaultProxy(nsqd.tcp_address) as proxy,
        httpx.AsyncClient() as http,
    ):
        base = f"http://{proxy.http_address}"
        assert (await http.get(base + "/ping")).text == "OK"
        stall = await http.post(base + "/faults/stall?role=consumer&direction=out")
        fault = stall.json()["fault"]
        assert fault["kind"] == "stall" and fault["direction"] == "out"
        assert fault["role"] == "consumer"
        delay = (await http.post(base + "/faults/delay?seconds=0.2")).json()["fault"]
        listed = (await http.get(base + "/faults")).json()
        assert [f["id"] for f in listed["faults"]] == [fault["id"], delay["id"]]
        assert listed["upstream"] == nsqd.tcp_address
        # A delay holds each write: a publish still gets through, later.
        start = trio.current_time()
        await _publish(proxy.tcp_address, "slow", [b"1"])
        assert trio.current_time() - start >= 0.2
        assert (await http.delete(f"{base}/faults/{fault['id']}")).status_code == 200
        assert (await http.delete(f"{base}/faults/{fault['id']}")).status_code == 404
        assert [f.kind for f in proxy.faults.active] == ["delay"]
        for path, message in [
            ("/faults/time_out", "time_out happens inside nsqd: the proxy only sees the wire"),
            ("/faults/meteor", "unknown fault 'meteor' (the proxy can: drop, delay"),
            ("/faults/delay", "delay needs seconds"),
            ("/faults/delay?seconds=soon", "seconds must be a number, not 'soon'"),
            ("/faults/stall?direction=sideways", "direction must be in, out or both"),
            ("/faults/drop?role=admin", "role must be consumer or producer"),
            ("/faults/drop?colour=red", "unknown parameter(s) colour"),
        ]:
            answer = await http.post(base + path)
            assert answer.status_code == 400, path
            assert message in answer.json()["message"], (path, answer.json())
        # A partition: new connections are closed at once, until healed.
        part = (await http.post(base + "/faults/partition")).json()["fault"]
        with pytest.raises(trionsq.NSQError):
            async with trionsq.Producer(
                nsqd_tcp_addresses=[proxy.tcp_address], connect_timeout=1
            ) as producer:
                await producer.publish("t", b"x")
        await http.delete(f"{base}/faults/{part['id']}")
        assert (await http.delete(base + "/faults")).json() == {"healed": 1}


async def test_seeded_schedules_on_the_proxy_lose_nothing() -> None:
    """``play_seeded``: the schedules ``fakensq proxy --faults-seed`` plays; the
    same seed draws the same faults, and a consumer still gets every message."""
    async with (
        reference.open_nsqd(MSG_TIMEOUT) as nsqd,
        FaultProxy(nsqd.tcp_address) as proxy,
    ):
        bodies = [b"s%02d" % i for i in range(30)]
        await _publish(nsqd.tcp_address, "seeded", bodies)  # straight to nsqd
        got: set[bytes] = set()
        met: list[Any] = []

        async def handle(message: trionsq.Message) -> None:
            await trio.sleep(0.1)
            got.add(message.body)

        async with (
            trionsq.Consumer(
                "seeded",
                "c",
                nsqd_tcp_addresses=[proxy.tcp_address],
                handler=handle,
                max_in_flight=2,
            ),
            trio.open_nursery() as nursery,
        ):

            async def play() -> None:
                met.extend(await proxy.play_seeded(7, rate=6, horizon=1.5, rounds=2))

            nursery.start_soon(play)
            await wait_until(lambda: got >= set(bodies) and len(met) > 0)
            await poll_until(lambda: _settled(nsqd.http_address, "seeded"), step=0.1)
        assert {m.event.kind for m in met} <= {"drop", "delay", "stall", "swallow_heartbeats"}
        # The same seed draws the same schedules (what happened may differ: real time).
        async with FaultProxy(nsqd.tcp_address) as other:
            again = await other.play_seeded(7, rate=6, horizon=1.5, rounds=2)

        def events(found: list[Any]) -> list[Any]:
            return sorted(((m.source, m.event.at), m.event.describe()) for m in found)

        assert events(again) == events(met)
        with pytest.raises(ValueError, match="the proxy cannot play time_out"):
            await proxy.play_seeded(7, kinds=("time_out",))


def _fakensq(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fakensq", "proxy", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    ("args", "code", "error"),
    [
        ([], 2, "fakensq proxy: --upstream HOST:PORT is required"),
        (["--upstream=nowhere"], 2, "--upstream: address nowhere: missing port in address"),
        (["--upstream=127.0.0.1:1", "--http-address=x"], 2, "--http-address: address x"),
        (["--bogus"], 2, "flag provided but not defined: -bogus"),
        (["--upstream=127.0.0.1:1", "--faults-seed=x"], 2, "--faults-seed wants an integer"),
        (["--upstream=127.0.0.1:1", "--faults-kinds=drop,kill"], 2, "unknown ['kill']"),
    ],
)
def test_cli_bad_flags_exit_2_with_one_line(args: list[str], code: int, error: str) -> None:
    result = _fakensq(*args)
    assert result.returncode == code
    assert error in result.stderr.splitlines()[0], result.stderr


def test_cli_unreachable_upstream_is_one_line_and_quick() -> None:
    port = free_port()  # nothing listens there
    result = _fakensq(f"--upstream=127.0.0.1:{port}", "--connect-timeout=2s")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"upstream 127.0.0.1:{port}" in lines[0], result.stderr


async def test_cli_serves_until_stopped(tmp_path: Path) -> None:
    async with reference.open_nsqd() as nsqd:
        process = await trio.lowlevel.open_process(
            [
                sys.executable,
                "-m",
                "fakensq",
                "proxy",
                f"--upstream={nsqd.tcp_address}",
                "--faults-seed=3",
                "--faults-every=1s",
                "--faults-rate=5",
                "--faults-kinds=delay,stall",  # (nobody consumes: nothing to drop)
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            assert process.stdout is not None
            text = b""
            with trio.fail_after(30):
                while b"ready" not in text:
                    chunk = await process.stdout.receive_some()
                    assert chunk, text
                    text += chunk
            lines = dict(line.split("=", 1) for line in text.decode().splitlines() if "=" in line)
            address = lines["NSQD_TCP_ADDRESSES"]
            await _publish(address, "cli", [b"through the proxy"])
            async with httpx.AsyncClient() as http:
                listed = (await http.get(lines["FAULTS_URL"])).json()
                stats = (await http.get(f"http://{nsqd.http_address}/stats?format=json")).json()
            assert {f["kind"] for f in listed["faults"]} <= {"delay", "stall"}
            assert listed["upstream"] == nsqd.tcp_address
            assert stats["topics"][0]["message_count"] == 1
            # The seeded schedules play, each fault printed as it is over.
            with trio.fail_after(30):
                while b"fault: " not in text:
                    chunk = await process.stdout.receive_some()
                    assert chunk, text
                    text += chunk
            assert re.search(rb"fault: +\d+\.\d{3}s  \[round \d+\] (delay|stall) nsqd-0", text)
        finally:
            process.terminate()
            with trio.fail_after(10):
                assert await process.wait() == 0
