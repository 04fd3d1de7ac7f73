"""Conformance fixtures: the same tests against fakensq and, when available, the
real daemons.

``nsqd_under_test`` / ``nsqlookupd_under_test`` give a :class:`Target` (its TCP
and HTTP addresses).  Each is parametrized: ``fakensq`` (always, in process) and
``real`` (a subprocess of the binary named by ``NSQD_BINARY`` /
``NSQLOOKUPD_BINARY``, started on free loopback ports with a temporary data path
and ready once ``/ping`` answers; skipped when the variable is unset)::

    NSQD_BINARY=$(which nsqd) NSQLOOKUPD_BINARY=$(which nsqlookupd) \\
        python -m pytest tests/conformance
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

import fakensq
from fakensq.lookupd import NSQLookupd

#: A cold start of a daemon (a Go binary is fast; a Python stand-in less so).
START_TIMEOUT = 15.0


@dataclass(frozen=True)
class Target:
    """A daemon under test: ``kind`` is ``"fakensq"`` or ``"real"``."""

    kind: str
    tcp_address: str
    http_address: str


def _free_port() -> int:
    # Bound then released: a tiny race with other processes, acceptable in tests.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _wait_for_ping(http_address: str, process: trio.Process) -> None:
    async with httpx.AsyncClient() as client:
        with trio.fail_after(START_TIMEOUT):
            while True:
                if process.returncode is not None:
                    raise RuntimeError(f"daemon exited with {process.returncode}")
                try:
                    r = await client.get(f"http://{http_address}/ping")
                    if r.status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                await trio.sleep(0.02)  # polling another process's readiness


async def _real(binary_var: str, tmp: Path, *extra: str) -> AsyncIterator[Target]:
    binary = os.environ[binary_var]
    tcp = f"127.0.0.1:{_free_port()}"
    http = f"127.0.0.1:{_free_port()}"
    process = await trio.lowlevel.open_process(
        [
            binary,
            f"--tcp-address={tcp}",
            f"--http-address={http}",
            "--broadcast-address=127.0.0.1",
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        await _wait_for_ping(http, process)
        yield Target("real", tcp, http)
    finally:
        if process.returncode is None:
            process.terminate()
        with trio.move_on_after(5) as scope:
            await process.wait()
        if scope.cancelled_caught:
            process.kill()


def _params(binary_var: str) -> list[Any]:
    # Skipped at collection, with the reason shown by ``-rs``.
    missing = not os.environ.get(binary_var)
    reason = f"{binary_var} is not set: no real daemon to compare with"
    return ["fakensq", pytest.param("real", marks=pytest.mark.skipif(missing, reason=reason))]


@pytest.fixture(params=_params("NSQD_BINARY"))
async def nsqd_under_test(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Target]:
    """An nsqd: fakensq's, or the real one from ``NSQD_BINARY``."""
    if request.param == "real":
        async for target in _real("NSQD_BINARY", tmp_path, f"--data-path={tmp_path}"):
            yield target
        return
    async with fakensq.NSQD(
        tcp_address="127.0.0.1:0", http_address="127.0.0.1:0", broadcast_address="127.0.0.1"
    ) as nsqd:
        yield Target("fakensq", nsqd.tcp_address, nsqd.http_address)


@pytest.fixture(params=_params("NSQLOOKUPD_BINARY"))
async def nsqlookupd_under_test(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[Target]:
    """An nsqlookupd: fakensq's, or the real one from ``NSQLOOKUPD_BINARY``."""
    if request.param == "real":
        async for target in _real("NSQLOOKUPD_BINARY", tmp_path):
            yield target
        return
    async with NSQLookupd(
        tcp_address="127.0.0.1:0", http_address="127.0.0.1:0", broadcast_address="127.0.0.1"
    ) as lookupd:
        yield Target("fakensq", lookupd.tcp_address, lookupd.http_address)
