"""An executor's agent against peers that lie, on both its listening sockets.

Its query's peer port (other agents fetch replays there, under TLS with the
query's key) and its task socket (the executor's tasks ask for rows there) get
wrong tokens, forged lengths, payloads streamed under a wrong token, slow and
half-open connections, and garbage at every byte offset of a real TLS
ClientHello and of a real frame.  On the peer port each lie comes both from a
stranger (plain TCP: it meets the TLS handshake) and from an insider that holds
the query's key.  Each time the agent process must live, its resident memory
stay bounded (``/proc``'s VmHWM, its peak, is printed), other peers be served
meanwhile, and a query running beside the attack get every one of its messages.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fakensq import NSQD
from fakensq.testing.threaded import BackgroundNode
from trionsq.spark import _framing as framing
from trionsq.spark import source as source_module
from trionsq.spark._agent_client import agent_socket_path
from trionsq.spark._executor import ExecutorIdentity
from trionsq.spark._options import parse_source_options
from trionsq.spark._secure import QueryKeys
from trionsq.spark.source import NSQStreamReader

from .hostile import (
    HUGE_LENGTHS,
    Beside,
    alive,
    attack,
    closed_by_peer,
    connect,
    forge,
    memory,
    refused_at_handshake,
    reply_of,
    send_until_refused,
    start_agent,
)

#: How long the agent under test gives an unproven peer (30 s in production).
REQUEST_TIMEOUT = 2.0
#: What an attack may add to the agent's peak resident memory.
MEMORY_BOUND = 32 << 20


class Attacked:
    """The agent under attack, and the query running beside the attack."""

    def __init__(self, process: subprocess.Popen[bytes], beside: Beside, path: str) -> None:
        self.process = process
        self.beside = beside
        self.task_socket = path
        agent = beside.agent()
        self.peer = agent.peer
        self.keys: QueryKeys = beside.coordinator().keys
        self.token = self.keys.token
        self.context = self.keys.client_context()
        assert agent.pid == process.pid
        self.peak_before = memory(process.pid)[1]

    def check(self, what: str) -> None:
        """The agent lives, kept its memory, serves peers and tasks, and the query
        beside the attack still gets every message."""
        assert alive(self.process.pid), f"the agent died of {what}"
        rss, peak = memory(self.process.pid)  # before the query beside adds its own
        self.fetch_is_served()
        self.task_is_served()
        self.beside.roundtrip()
        print(
            f"{what}: agent VmRSS {rss / 2**20:.1f} MiB, VmHWM {peak / 2**20:.1f} MiB "
            f"(before: {self.peak_before / 2**20:.1f} MiB)"
        )
        assert peak - self.peak_before < MEMORY_BOUND, (what, peak, self.peak_before)

    def before_attack(self) -> None:
        self.peak_before = memory(self.process.pid)[1]

    def fetch_is_served(self) -> None:
        frame = b"".join(framing.encode(self.fetch(2**61)))
        reply = reply_of(attack(self.peer, frame, self.context))
        assert reply is not None and "is not held by" in reply["error"], reply

    def context_of(self, keyed: bool) -> ssl.SSLContext | None:
        """An insider's TLS context (the query's key), or none: a stranger."""
        return self.context if keyed else None

    def task_is_served(self) -> None:
        reply = reply_of(task_attack(self.task_socket, b"".join(framing.encode({"op": "x"}))))
        assert reply == {"error": "unknown operation 'x'"}

    def fetch(self, set_id: int, token: str | None = None) -> dict[str, Any]:
        return {"op": "fetch", "token": self.token if token is None else token, "set": set_id}


def task_attack(path: str, data: bytes) -> bytes:
    return attack(path, data, family=socket.AF_UNIX)


@pytest.fixture(scope="module")
def attacked() -> Iterator[Attacked]:
    anchor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    identity = ExecutorIdentity("hostile-agent", "127.0.0.1", 1, anchor.pid)
    process = start_agent(identity, REQUEST_TIMEOUT)
    with (
        BackgroundNode(lambda: NSQD(tcp_address="127.0.0.1:0", http_address="")) as node,
        pytest.MonkeyPatch.context() as patch,
    ):
        patch.setattr(source_module, "identify", lambda: identity)
        options = {
            "topic": "beside",
            "channel": "c",
            "nsqd_tcp_addresses": node.tcp_address,
            "max_batch_wait": "0.2",
            "num_partitions": "1",
        }
        reader = NSQStreamReader(parse_source_options(options))
        try:
            beside = Beside(reader, node.tcp_address, "beside")
            beside.roundtrip()
            yield Attacked(process, beside, agent_socket_path(identity))
        finally:
            reader.stop()
            anchor.kill()
            anchor.wait()
            process.wait(30)


@pytest.fixture(autouse=True)
def _peak_before(request: pytest.FixtureRequest) -> None:
    if "attacked" in request.fixturenames:
        request.getfixturevalue("attacked").before_attack()


# --- the peer port -------------------------------------------------------------------

KEYED = pytest.mark.parametrize("keyed", [False, True], ids=["stranger", "insider"])


@KEYED
@pytest.mark.parametrize("length", HUGE_LENGTHS)
def test_a_huge_length_under_a_wrong_token_costs_the_peer_port_nothing(
    attacked: Attacked, length: int, keyed: bool
) -> None:
    frame = forge(attacked.fetch(1, token="wrong"), length)
    assert attack(attacked.peer, frame, attacked.context_of(keyed)) == b""  # no answer
    attacked.check(f"peer port, {'insider' if keyed else 'stranger'}, payload length {length}")


def test_a_huge_length_under_the_right_token_is_refused_too(attacked: Attacked) -> None:
    assert attack(attacked.peer, forge(attacked.fetch(1), 2**40), attacked.context) == b""
    attacked.check("peer port, right token, payload length 2^40")


@pytest.mark.parametrize("length", [4097, 2**31, 2**32 - 1])
def test_a_header_beyond_the_cap_is_refused_unread(attacked: Attacked, length: int) -> None:
    frame = forge(attacked.fetch(1), header_length=length)
    assert attack(attacked.peer, frame, attacked.context) == b""
    attacked.check(f"peer port, header length {length}")


def test_a_peer_without_the_querys_key_is_refused_at_the_handshake(attacked: Attacked) -> None:
    assert refused_at_handshake(attacked.peer, QueryKeys.new().client_context())
    attacked.check("peer port, another query's key")


@KEYED
def test_a_payload_streamed_under_a_wrong_token_is_cut_off(attacked: Attacked, keyed: bool) -> None:
    declared = 3 << 29  # 1.5 GiB
    with connect(attacked.peer, attacked.context_of(keyed)) as sock:
        sock.sendall(forge(attacked.fetch(1, token="wrong"), declared))
        sent = send_until_refused(sock, declared)
    who = "insider" if keyed else "stranger"
    print(f"peer port, {who}: {sent / 2**20:.1f} MiB of a 1.5 GiB payload went out")
    assert sent < declared
    attacked.check(f"peer port, {who}, 1.5 GiB streamed under a wrong token")


def test_slow_and_half_open_peers_time_out_while_others_are_served(attacked: Attacked) -> None:
    frame = b"".join(framing.encode(attacked.fetch(2**61, token="wrong")))
    idle = [connect(attacked.peer) for _ in range(70)]  # with the rest, above the gate
    silent = [connect(attacked.peer, attacked.context) for _ in range(5)]  # TLS, then nothing
    halves = [connect(attacked.peer, attacked.context) for _ in range(5)]
    for sock in halves:
        sock.sendall(frame[:10])  # a prefix, then nothing
    with connect(attacked.peer, attacked.context) as slow:
        began = time.monotonic()
        for byte in frame[:-1]:  # a frame dripped byte by byte, never finished
            try:
                slow.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
                break
            attacked.fetch_is_served()  # others are served meanwhile
            if time.monotonic() - began > 2 * REQUEST_TIMEOUT:
                break
        assert closed_by_peer(slow, 3 * REQUEST_TIMEOUT) == b""
    for sock in idle + silent + halves:
        with sock:
            assert closed_by_peer(sock, 3 * REQUEST_TIMEOUT) == b""
    attacked.check("peer port, 81 slow and half-open connections")


def _client_hello() -> bytes:
    """The first bytes a real agent sends a peer port: its TLS ClientHello."""
    outgoing = ssl.MemoryBIO()
    tls = QueryKeys.new().client_context().wrap_bio(ssl.MemoryBIO(), outgoing)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(offset=st.integers(min_value=0, max_value=600), garbage=st.binary(min_size=1, max_size=40))
def test_garbage_at_every_offset_of_a_client_hello(
    attacked: Attacked, offset: int, garbage: bytes
) -> None:
    hello = _client_hello()
    attack(attacked.peer, hello[: offset % (len(hello) + 1)] + garbage)  # closed in time
    assert alive(attacked.process.pid)
    attacked.fetch_is_served()


def _valid_fetch(attacked: Attacked) -> bytes:
    return b"".join(framing.encode(attacked.fetch(2**61)))


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(offset=st.integers(min_value=0, max_value=200), garbage=st.binary(min_size=1, max_size=40))
def test_garbage_at_every_offset_of_a_fetch(
    attacked: Attacked, offset: int, garbage: bytes
) -> None:
    frame = _valid_fetch(attacked)
    answer = attack(attacked.peer, frame[: offset % (len(frame) + 1)] + garbage, attacked.context)
    if answer:  # a frame still: answered as one, with an error
        reply = reply_of(answer)
        assert reply is not None and "error" in reply
    assert alive(attacked.process.pid)
    attacked.fetch_is_served()


def test_after_the_peer_port_garbage_the_query_beside_lost_nothing(attacked: Attacked) -> None:
    attacked.check("peer port, garbage at every offset")


# --- the task socket (Unix) -------------------------------------------------------------


@pytest.mark.parametrize("length", [*HUGE_LENGTHS, (1 << 20) + 1])
def test_a_huge_length_costs_the_task_socket_nothing(attacked: Attacked, length: int) -> None:
    assert task_attack(attacked.task_socket, forge({"op": "read"}, length)) == b""
    attacked.check(f"task socket, read request of {length} payload bytes")


def test_a_payload_on_a_request_that_takes_none_is_refused(attacked: Attacked) -> None:
    assert task_attack(attacked.task_socket, forge({"op": "nonsense"}, 1)) == b""
    attacked.check("task socket, payload on an unknown operation")


def test_half_open_tasks_time_out_while_others_are_served(attacked: Attacked) -> None:
    idle = []
    for _ in range(80):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(attacked.task_socket)
        idle.append(sock)
    idle[0].sendall(forge({"op": "read"}, 100))  # a payload promised, never sent
    attacked.task_is_served()
    for sock in idle:
        with sock:
            assert closed_by_peer(sock, 3 * REQUEST_TIMEOUT) == b""
    attacked.check("task socket, 80 half-open connections")


def _valid_read() -> bytes:
    header = {"op": "read", "token": "t", "coordinator": ["127.0.0.1", 1], "batch": 1}
    return b"".join(framing.encode(header, b"not a pickle"))


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(offset=st.integers(min_value=0, max_value=200), garbage=st.binary(min_size=1, max_size=40))
def test_garbage_at_every_offset_of_a_read(attacked: Attacked, offset: int, garbage: bytes) -> None:
    frame = _valid_read()
    task_attack(attacked.task_socket, frame[: offset % (len(frame) + 1)] + garbage)
    assert alive(attacked.process.pid)
    attacked.task_is_served()


def test_after_the_task_socket_garbage_the_query_beside_lost_nothing(attacked: Attacked) -> None:
    attacked.check("task socket, garbage at every offset")
