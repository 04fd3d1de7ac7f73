"""A hostile peer's tools, for the tests of the source's listening sockets.

Raw sockets that lie: frames with forged lengths, garbage, payloads streamed
slowly, connections that never finish; and how to measure what they cost (a
process's resident memory from ``/proc``).
"""

from __future__ import annotations

import json
import socket
import ssl
import struct
import time
from pathlib import Path
from typing import Any

from trionsq.spark import _framing as framing

#: Declared payload lengths a liar sends: 1 TiB, 2^63 (negative, read as signed)
#: and the largest an unsigned 8-byte length can say.
HUGE_LENGTHS = [2**40, 2**63, 2**64 - 1]


def forge(
    header: dict[str, Any], payload_length: int = 0, header_length: int | None = None
) -> bytes:
    """A frame's prefix and header saying what the caller wants (no payload)."""
    data = json.dumps(header).encode()
    size = len(data) if header_length is None else header_length
    return framing.MAGIC + struct.pack(">IQ", size, payload_length) + data


def memory(pid: int) -> tuple[int, int]:
    """A process's resident memory now and at its peak (VmRSS, VmHWM), in bytes."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def closed_by_peer(sock: socket.socket, timeout: float) -> bytes:
    """Read until the peer closes (what it said meanwhile); fails after ``timeout``."""
    sock.settimeout(timeout)
    got = bytearray()
    deadline = time.monotonic() + timeout
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError, ssl.SSLError):
            return bytes(got)
        except TimeoutError:
            raise AssertionError(f"the server kept the connection open for {timeout}s") from None
        if not chunk:
            return bytes(got)
        got += chunk
        if time.monotonic() > deadline:
            raise AssertionError(f"the server kept talking for {timeout}s")


def send_until_refused(sock: socket.socket, total: int, chunk: int = 1 << 20) -> int:
    """Stream ``total`` bytes of junk; how many went out before the peer refused more."""
    block = b"\0" * chunk
    sent = 0
    sock.settimeout(30)
    try:
        while sent < total:
            sent += sock.send(block[: min(chunk, total - sent)])
    except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
        pass
    return sent


def connect(
    address: Any,
    context: ssl.SSLContext | None = None,
    family: int = socket.AF_INET,
    timeout: float = 20,
) -> socket.socket:
    """A connection; through TLS (handshake done) with ``context``."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(address)
        if context is not None:
            sock = context.wrap_socket(sock)
    except BaseException:
        sock.close()
        raise
    return sock


def half_close(sock: socket.socket) -> None:
    """No more from us: TCP's FIN (under TLS too, without its close_notify)."""
    socket.socket.shutdown(sock, socket.SHUT_WR)


def attack(
    address: Any,
    data: bytes,
    context: ssl.SSLContext | None = None,
    family: int = socket.AF_INET,
    timeout: float = 20,
) -> bytes:
    """Connect (through TLS with ``context``), send ``data``, say no more
    (half-close), and read until the server closes; what it answered."""
    with connect(address, context, family, timeout) as sock:
        try:
            sock.sendall(data)
            half_close(sock)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            return b""
        return closed_by_peer(sock, timeout)


def refused_at_handshake(address: Any, context: ssl.SSLContext) -> bool:
    """Whether a TLS client with ``context`` (another query's key, say) fails the
    handshake, or gets nothing through it."""
    try:
        with connect(address, context) as sock:
            sock.sendall(b"".join(framing.encode({"op": "hello", "id": 0})))
            return closed_by_peer(sock, 20) == b""
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
        return True


def reply_of(data: bytes) -> dict[str, Any] | None:
    """The header of the first frame in ``data`` (None if there is none)."""
    if len(data) < 16:
        return None
    size = struct.unpack(">I", data[4:8])[0]
    header: dict[str, Any] = json.loads(data[16 : 16 + size])
    return header


# --- a query that runs beside the attack ------------------------------------------


def start_agent(identity: Any, request_timeout: float) -> Any:
    """An executor's agent, started as a task would start it, with a short
    ``--request-timeout`` (how long an unproven peer may take)."""
    import subprocess
    import sys
    from dataclasses import asdict

    from trionsq.spark._agent_client import agent_socket_path

    path = agent_socket_path(identity)
    argv = [
        sys.executable,
        "-m",
        "trionsq.spark.agent",
        "--socket",
        path,
        "--identity",
        json.dumps(asdict(identity)),
        "--request-timeout",
        str(request_timeout),
    ]
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(path)
                return process
            except OSError:
                pass
        assert process.poll() is None, "the agent exited at start"
        assert time.monotonic() < deadline, "the agent did not start"
        time.sleep(0.05)  # polling another process's start-up


class Beside:
    """A query on ``topic`` run by hand (the test plays Spark's driver and tasks,
    the agent is a real process): every message published must come back."""

    def __init__(self, reader: Any, address: str, topic: str) -> None:
        self.reader = reader
        self.address = address
        self.topic = topic
        self.end = 0
        self.rounds = 0

    def publish(self, bodies: list[bytes]) -> None:
        import trio

        import trionsq

        async def main() -> None:
            async with trionsq.Producer(nsqd_tcp_addresses=[self.address]) as producer:
                await producer.multi_publish(self.topic, bodies)

        trio.run(main)

    def roundtrip(self, count: int = 20) -> None:
        self.rounds += 1
        bodies = [b"beside-%d-%d" % (self.rounds, i) for i in range(count)]
        self.publish(bodies)
        seen: list[bytes] = []
        deadline = time.monotonic() + 60
        while not set(bodies) <= set(seen):
            assert time.monotonic() < deadline, f"read {len(seen)} of {count} messages"
            start = self.end
            self.end = self.reader.latestOffset(
                {"batch": start}, self.reader.getDefaultReadLimit()
            )["batch"]
            if self.end == start:
                continue
            for partition in self.reader.partitions({"batch": start}, {"batch": self.end}):
                for batch in self.reader.read(partition):
                    seen.extend(batch.column(0).to_pylist())
        self.reader.commit({"batch": self.end})
        assert sorted(set(seen)) == sorted(bodies)

    def coordinator(self) -> Any:
        _, coordinator = self.reader._started()
        return coordinator

    def agent(self) -> Any:
        """The one linked agent's record at the coordinator (its peer address, pid)."""
        loop, coordinator = self.reader._started()
        agents = loop.run_sync(lambda: list(coordinator.agents.values()))
        assert len(agents) == 1, agents
        return agents[0]
