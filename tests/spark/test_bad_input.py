"""Bad input never crashes the source's processes: garbage on the agent's and the
coordinator's sockets is refused, and both go on serving."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fakensq import NSQD
from trionsq.spark import _framing as framing
from trionsq.spark._agent_client import agent_socket_path, connect_agent
from trionsq.spark._executor import ExecutorIdentity
from trionsq.spark._options import parse_source_options
from trionsq.spark.source import NSQStreamReader

from .conftest import publish

garbage = st.one_of(
    st.binary(max_size=200),
    st.builds(
        lambda header, payload: b"".join(framing.encode(header, payload)),
        st.dictionaries(
            st.sampled_from(["op", "token", "set", "batch", "coordinator", "id", "re"]),
            st.one_of(st.integers(), st.text(max_size=10), st.none(), st.lists(st.integers())),
            max_size=5,
        ),
        st.binary(max_size=50),
    ),
)


@pytest.fixture(scope="module")
def agent() -> Iterator[ExecutorIdentity]:
    """A running agent (anchored to a stand-in executor process)."""
    anchor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    identity = ExecutorIdentity("bad-input", "127.0.0.1", 1, anchor.pid)
    connect_agent(identity, 30).close()
    yield identity
    anchor.kill()
    anchor.wait()


def ask(path: str, data: bytes) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(path)
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(65536):
            pass


def still_serves(identity: ExecutorIdentity) -> None:
    with connect_agent(identity, 10) as sock:
        framing.send_sync(sock, {"op": "nonsense"})
        header, _ = framing.receive_sync(sock, framing.Limits(65536))
    assert header == {"error": "unknown operation 'nonsense'"}


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(garbage)
def test_garbage_to_the_agent(agent: ExecutorIdentity, data: bytes) -> None:
    ask(agent_socket_path(agent), data)
    still_serves(agent)


def test_a_read_without_options_is_refused(agent: ExecutorIdentity) -> None:
    with connect_agent(agent, 10) as sock:
        framing.send_sync(sock, {"op": "read", "token": "t"}, b"not a pickle")
        header, _ = framing.receive_sync(sock, framing.Limits(65536))
    assert "error" in header
    still_serves(agent)


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(garbage)
def test_garbage_to_the_coordinator(nsqd_address: str, data: bytes) -> None:
    reader, address = nsqd_address_reader(nsqd_address)
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(20)
        try:
            while sock.recv(65536):
                pass
        except ConnectionResetError:
            pass  # closed with garbage unread: closed all the same
        except TimeoutError:
            pytest.fail("the coordinator kept a garbage connection open")
    # Still planning batches.
    assert reader.latestOffset({"batch": 3}, reader.getDefaultReadLimit()) == {"batch": 4}


_readers: dict[str, tuple[NSQStreamReader, tuple[str, int]]] = {}


def nsqd_address_reader(address: str) -> tuple[NSQStreamReader, tuple[str, int]]:
    if address not in _readers:
        reader = NSQStreamReader(
            parse_source_options({"topic": "t", "channel": "c", "nsqd_tcp_addresses": address})
        )
        _, coordinator = reader._started()
        assert coordinator.address is not None
        _readers[address] = (reader, coordinator.address)
    return _readers[address]


@pytest.fixture(scope="module")
def nsqd_address() -> Iterator[str]:
    from fakensq.threaded import BackgroundNode

    with BackgroundNode(lambda: NSQD(tcp_address="127.0.0.1:0", http_address="")) as node:
        publish(node.tcp_address, "t", [b"x"])
        yield node.tcp_address
        for reader, _ in _readers.values():
            reader.stop()
        _readers.clear()


def test_a_hello_with_the_wrong_token_is_refused(nsqd_address: str) -> None:
    reader, address = nsqd_address_reader(nsqd_address)
    loop, coordinator = reader._started()
    context = coordinator.keys.client_context()  # past TLS: the query's key, not its token
    with context.wrap_socket(socket.create_connection(address, timeout=10)) as sock:
        framing.send_sync(sock, {"op": "hello", "id": 0, "token": "guess", "agent": "x"})
        header, _ = framing.receive_sync(sock, framing.Limits(65536))
    assert header == {"re": 0, "error": "not this query's agent"}
    assert loop.run_sync(lambda: list(coordinator.agents)) == []
