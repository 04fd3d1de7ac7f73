"""Peak memory (VmHWM) of fakensq's and the real nsqd v1.3.0's processes
under hostile peers, case by case.

Each case starts a fresh daemon as a process of its own (``python -m
fakensq.nsqd``, the real ``nsqd`` from tests/reference.py), reads its
``VmHWM`` (the peak resident set) once it serves, runs the hostile peers
against it, checks that it still serves (``/ping``, a PUB), and reports the
growth of the peak, in MiB, for both daemons side by side.  The tests in
``tests/hostile`` measure fakensq in-process (tracemalloc); this is the
resident figure of the whole process, the way an operator sees it.

    python benchmarks/bench_hostile.py [--cases NAME,NAME]

Cases:

- ``line``: 8 connections each sending 1 GiB without a newline;
- ``lengths``: 8 connections each announcing a PUB body of 2^31-1 bytes, then
  sending 64 MiB;
- ``deflate``: 8 connections each sending 64 MiB of one byte, no newline,
  deflated (64 KiB on the wire each);
- ``deaf``: a consumer with RDY 400 that never reads, 400 messages of 64 KiB;
- ``http_body``: 8 requests declaring a 1 GiB body to /pub, 64 MiB sent each;
- ``profiles``: 45 concurrent ``/debug/pprof/profile?seconds=100000``.
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import reference
from tests.support.ports import free_port
from trionsq.protocol import commands as cmds

MiB = 1024 * 1024
GiB = 1024 * MiB


def _vm_hwm(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


class Daemon:
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.tcp = free_port()
        self.http = free_port()
        self.data = tempfile.mkdtemp(prefix="bench-hostile-")
        flags = [
            f"--tcp-address=127.0.0.1:{self.tcp}",
            f"--http-address=127.0.0.1:{self.http}",
            f"--data-path={self.data}",
        ]
        if kind == "real":
            binary = reference.binary("nsqd")
            assert binary is not None
            argv = [str(binary), *flags]
        else:
            argv = [sys.executable, "-m", "fakensq.nsqd", *flags]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not self._ping():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{kind} nsqd did not start")
            time.sleep(0.05)  # a starting process: poll it
        self.base = _vm_hwm(self.proc.pid)

    def _ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.http), timeout=2) as sock:
                sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                return sock.recv(100).startswith(b"HTTP/1.1 200")
        except OSError:
            return False

    def tcp_conn(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.tcp), timeout=30)
        sock.sendall(cmds.MAGIC_V2)
        return sock

    def serves(self) -> bool:
        with self.tcp_conn() as sock:
            sock.sendall(cmds.pub("alive", b"x"))
            return sock.recv(100).endswith(b"OK") and self._ping()

    def growth(self) -> float:
        return (_vm_hwm(self.proc.pid) - self.base) / MiB

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def _flood(sock: socket.socket, total: int, chunk: bytes) -> None:
    sent = 0
    try:
        while sent < total:
            sock.sendall(chunk)
            sent += len(chunk)
    except OSError:
        pass
    finally:
        sock.close()


def _parallel(n: int, work: Callable[[], None]) -> None:
    threads = [threading.Thread(target=work) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)


def case_line(d: Daemon) -> None:
    _parallel(8, lambda: _flood(d.tcp_conn(), GiB, b"A" * (256 * 1024)))


def case_lengths(d: Daemon) -> None:
    def one() -> None:
        sock = d.tcp_conn()
        sock.sendall(b"PUB t\n" + struct.pack(">l", 2**31 - 1))
        _flood(sock, 64 * MiB, b"\0" * (256 * 1024))

    _parallel(8, one)


def case_deflate(d: Daemon) -> None:
    z = zlib.compressobj(6, zlib.DEFLATED, -15)
    blob = b"".join(z.compress(b"A" * MiB) for _ in range(64)) + z.flush(zlib.Z_SYNC_FLUSH)

    def one() -> None:
        sock = d.tcp_conn()
        sock.sendall(cmds.identify({"feature_negotiation": True, "deflate": True}))
        time.sleep(0.2)  # (its answers, then the upgrade: the bytes after are deflated)
        sock.recv(65536)
        _flood(sock, len(blob), blob)

    _parallel(8, one)


def case_deaf(d: Daemon) -> None:
    deaf = d.tcp_conn()
    deaf.sendall(
        cmds.identify({"heartbeat_interval": 1000, "msg_timeout": 1000})
        + cmds.sub("t", "c")
        + cmds.rdy(400)
    )
    with d.tcp_conn() as producer:
        for start in range(0, 400, 20):
            bodies = [b"%04d" % i + b"." * (64 * 1024 - 4) for i in range(start, start + 20)]
            producer.sendall(cmds.mpub("t", bodies))
            producer.recv(100)
    time.sleep(3)  # (nsqd's write deadline, 1 s, ends the deaf connection)
    deaf.close()


def case_http_body(d: Daemon) -> None:
    def one() -> None:
        sock = socket.create_connection(("127.0.0.1", d.http), timeout=30)
        sock.sendall(b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % GiB)
        _flood(sock, 64 * MiB, b"x" * (256 * 1024))

    _parallel(8, one)


def case_profiles(d: Daemon) -> None:
    socks = []
    for _ in range(45):
        sock = socket.create_connection(("127.0.0.1", d.http), timeout=30)
        sock.sendall(b"GET /debug/pprof/profile?seconds=100000 HTTP/1.1\r\nHost: x\r\n\r\n")
        socks.append(sock)
    time.sleep(2)  # (the sampler runs meanwhile)
    for sock in socks:
        sock.close()


CASES: dict[str, Callable[[Daemon], None]] = {
    "line": case_line,
    "lengths": case_lengths,
    "deflate": case_deflate,
    "deaf": case_deaf,
    "http_body": case_http_body,
    "profiles": case_profiles,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    kinds = ["fakensq"] + (["real"] if reference.binary("nsqd") else [])
    if len(kinds) == 1:
        print(f"no real nsqd ({reference.skip_reason()}): fakensq alone")
    print(f"{'case':<10}" + "".join(f"{k + ' MiB':>14}" for k in kinds) + "   serves after")
    for name in args.cases.split(","):
        row, alive = [], []
        for kind in kinds:
            daemon = Daemon(kind)
            try:
                CASES[name](daemon)
                alive.append(daemon.serves())
                row.append(daemon.growth())
            finally:
                daemon.stop()
        print(f"{name:<10}" + "".join(f"{v:>14.1f}" for v in row) + f"   {alive}")
        os.sys.stdout.flush()


if __name__ == "__main__":
    main()
