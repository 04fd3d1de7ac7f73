"""The driver's coordinator against peers that lie.

The coordinator runs in this process (as in Spark's source process, on its Trio
thread) and plans a query whose agent is a real process; peers that are not
that agent send wrong tokens, forged lengths, payloads streamed under a wrong
token, slow and half-open connections, garbage at every byte offset of a hello,
and an agent that knows the token lies after its hello.  The lies come from a
stranger (plain TCP, which meets the TLS handshake) and from an insider holding
the query's TLS key.  Each time the coordinator must keep serving (its nursery
alive), what the attack allocated stay bounded (tracemalloc's peak over the
attack, printed), other peers be served meanwhile, and the query beside the
attack get every message.
"""

from __future__ import annotations

import ssl
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fakensq import NSQD
from fakensq.testing.threaded import BackgroundNode
from trionsq.spark import _framing as framing
from trionsq.spark import coordinator as coordinator_module
from trionsq.spark import source as source_module
from trionsq.spark._executor import ExecutorIdentity
from trionsq.spark._link import Link
from trionsq.spark._options import parse_source_options
from trionsq.spark._secure import QueryKeys
from trionsq.spark.source import NSQStreamReader

from .hostile import (
    HUGE_LENGTHS,
    Beside,
    attack,
    closed_by_peer,
    connect,
    forge,
    refused_at_handshake,
    reply_of,
    send_until_refused,
    start_agent,
)

HELLO_TIMEOUT = 2.0
#: What an attack may allocate in this process (the coordinator's part of it).
MEMORY_BOUND = 8 << 20


class Attacked:
    def __init__(self, beside: Beside) -> None:
        self.beside = beside
        coordinator = beside.coordinator()
        self.address = coordinator.address
        self.token = coordinator.token
        self.context = coordinator.keys.client_context()

    def context_of(self, keyed: bool) -> ssl.SSLContext | None:
        """An insider's TLS context (the query's key), or none: a stranger."""
        return self.context if keyed else None

    def hello(self, token: str | None = None, **extra: Any) -> dict[str, Any]:
        return {
            "op": "hello",
            "id": 0,
            "token": self.token if token is None else token,
            "agent": "intruder#1",
            "peer": ["127.0.0.1", 9],
            **extra,
        }

    def is_served(self) -> None:
        """Another peer is answered (a refusal: it does not know the token)."""
        frame = b"".join(framing.encode(self.hello(token="guess")))
        answer = attack(self.address, frame, self.context)
        assert reply_of(answer) == {"re": 0, "error": "not this query's agent"}

    def check(self, what: str, peak: int) -> None:
        print(f"{what}: tracemalloc peak during the attack {peak / 2**20:.2f} MiB")
        assert peak < MEMORY_BOUND, (what, peak)
        self.is_served()
        self.beside.roundtrip()
        loop, coordinator = self.beside.reader._started()
        names = loop.run_sync(lambda: sorted(coordinator.agents))
        assert len(names) == 1 and "intruder" not in names[0], names


class Measured:
    """tracemalloc's peak over a block (tracing started by the module's fixture)."""

    def __enter__(self) -> Measured:
        tracemalloc.reset_peak()
        self.base = tracemalloc.get_traced_memory()[0]
        return self

    def __exit__(self, *exc: object) -> None:
        self.peak = tracemalloc.get_traced_memory()[1] - self.base


@pytest.fixture(scope="module")
def attacked() -> Iterator[Attacked]:
    anchor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    identity = ExecutorIdentity("hostile-coordinator", "127.0.0.1", 1, anchor.pid)
    process = start_agent(identity, 30)
    with (
        BackgroundNode(lambda: NSQD(tcp_address="127.0.0.1:0", http_address="")) as node,
        pytest.MonkeyPatch.context() as patch,
    ):
        patch.setattr(source_module, "identify", lambda: identity)
        patch.setattr(coordinator_module, "HELLO_TIMEOUT", HELLO_TIMEOUT)
        options = {
            "topic": "beside",
            "channel": "c",
            "nsqd_tcp_addresses": node.tcp_address,
            "max_batch_wait": "0.2",
            "num_partitions": "1",
        }
        reader = NSQStreamReader(parse_source_options(options))
        tracemalloc.start()
        try:
            beside = Beside(reader, node.tcp_address, "beside")
            beside.roundtrip()
            yield Attacked(beside)
        finally:
            tracemalloc.stop()
            reader.stop()
            anchor.kill()
            anchor.wait()
            process.wait(30)


KEYED = pytest.mark.parametrize("keyed", [False, True], ids=["stranger", "insider"])


@KEYED
@pytest.mark.parametrize("length", HUGE_LENGTHS)
def test_a_huge_length_under_a_wrong_token_costs_nothing(
    attacked: Attacked, length: int, keyed: bool
) -> None:
    frame = forge(attacked.hello(token="wrong"), length)
    with Measured() as measured:
        assert attack(attacked.address, frame, attacked.context_of(keyed)) == b""
    who = "insider" if keyed else "stranger"
    attacked.check(f"coordinator, {who}, wrong token, payload length {length}", measured.peak)


@pytest.mark.parametrize("length", [4097, 2**31, 2**32 - 1])
def test_a_header_beyond_the_cap_is_refused_unread(attacked: Attacked, length: int) -> None:
    frame = forge(attacked.hello(), header_length=length)
    with Measured() as measured:
        assert attack(attacked.address, frame, attacked.context) == b""
    attacked.check(f"coordinator, header length {length}", measured.peak)


def test_a_peer_without_the_querys_key_is_refused_at_the_handshake(attacked: Attacked) -> None:
    with Measured() as measured:
        assert refused_at_handshake(attacked.address, QueryKeys.new().client_context())
    attacked.check("coordinator, another query's key", measured.peak)


@KEYED
def test_a_payload_streamed_under_a_wrong_token_is_cut_off(attacked: Attacked, keyed: bool) -> None:
    declared = 3 << 29  # 1.5 GiB
    who = "insider" if keyed else "stranger"
    with Measured() as measured, connect(attacked.address, attacked.context_of(keyed)) as sock:
        sock.sendall(forge(attacked.hello(token="wrong"), declared))
        sent = send_until_refused(sock, declared)
    print(f"coordinator, {who}: {sent / 2**20:.1f} MiB of a 1.5 GiB payload went out")
    assert sent < declared
    attacked.check(f"coordinator, {who}, 1.5 GiB streamed under a wrong token", measured.peak)


def test_slow_and_half_open_peers_time_out_while_others_are_served(attacked: Attacked) -> None:
    frame = b"".join(framing.encode(attacked.hello(token="wrong")))
    with Measured() as measured:
        idle = [connect(attacked.address) for _ in range(70)]
        idle += [connect(attacked.address, attacked.context) for _ in range(10)]
        for sock in idle[-5:]:
            sock.sendall(frame[:10])
        with connect(attacked.address, attacked.context) as slow:
            began = time.monotonic()
            for byte in frame[:-1]:
                try:
                    slow.sendall(bytes([byte]))
                except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
                    break
                attacked.is_served()
                if time.monotonic() - began > 2 * HELLO_TIMEOUT:
                    break
            assert closed_by_peer(slow, 3 * HELLO_TIMEOUT) == b""
        for sock in idle:
            with sock:
                assert closed_by_peer(sock, 3 * HELLO_TIMEOUT) == b""
    attacked.check("coordinator, 81 slow and half-open connections", measured.peak)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(offset=st.integers(min_value=0, max_value=300), garbage=st.binary(min_size=1, max_size=40))
def test_garbage_at_every_offset_of_a_hello(
    attacked: Attacked, offset: int, garbage: bytes
) -> None:
    # The right token: a hello that survives the garbage links, and is unlinked
    # when the connection ends.
    frame = b"".join(framing.encode(attacked.hello()))
    attack(attacked.address, frame[: offset % (len(frame) + 1)] + garbage, attacked.context)
    attacked.is_served()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(offset=st.integers(min_value=0, max_value=600), garbage=st.binary(min_size=1, max_size=40))
def test_garbage_at_every_offset_of_a_client_hello(
    attacked: Attacked, offset: int, garbage: bytes
) -> None:
    outgoing = ssl.MemoryBIO()
    tls = QueryKeys.new().client_context().wrap_bio(ssl.MemoryBIO(), outgoing)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    hello = outgoing.read()
    attack(attacked.address, hello[: offset % (len(hello) + 1)] + garbage)  # closed in time
    attacked.is_served()


@pytest.mark.parametrize(
    "lie",
    [
        forge({"op": "status"}, 2**40),
        b"".join(framing.encode({"op": "ready", "set": "not a number"})),
        b"".join(framing.encode({"op": "read", "batch": [], "partition": {}})),
        b"".join(framing.encode({"op": "status", "buffered": "many"})),
        b"".join(framing.encode({"op": "x" * 70_000})),
        b"garbage" * 10,
    ],
    ids=["payload", "bad-set", "bad-read", "bad-status", "big-header", "garbage"],
)
def test_an_agent_that_lies_after_its_hello_ends_its_own_link(
    attacked: Attacked, lie: bytes
) -> None:
    hello = attacked.hello(agent="intruder#2", cores=1)
    with Measured() as measured, connect(attacked.address, attacked.context) as sock:
        sock.sendall(b"".join(framing.encode(hello)))
        reply, _ = framing.receive_sync(sock, framing.Limits(4096))
        assert reply == {"re": 0, "ok": True}  # linked
        try:
            sock.sendall(lie)  # a big lie may be cut off as the coordinator hangs up
        except (ssl.SSLError, BrokenPipeError, ConnectionResetError):
            pass
        else:
            closed_by_peer(sock, 20)
    attacked.check("coordinator, a linked agent's lie", measured.peak)  # and unlinked


async def test_a_peer_that_stops_reading_breaks_its_link(autojump_clock: Any) -> None:
    ours, _theirs = trio.testing.lockstep_stream_pair()  # nothing moves unless read
    link = Link(ours, framing.Limits(4096), send_timeout=5.0)
    began = trio.current_time()
    with pytest.raises(trio.BrokenResourceError, match="stopped reading"):
        await link.send({"op": "tick"})
    assert trio.current_time() - began == 5.0
    assert link.closed
    with pytest.raises(trio.ClosedResourceError):
        await link.send({"op": "tick"})
