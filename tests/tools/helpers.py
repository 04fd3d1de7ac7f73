"""Running the ``trionsq`` command in a subprocess against fakensq nodes."""

from __future__ import annotations

import contextlib
import io
import signal
import subprocess
import sys

import httpx

from ..support.stats import channel_stats
from ..support.waiting import wait_until_blocking

TIMEOUT = 30.0


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "trionsq.cli", *args]


def run_tool(
    *args: str, input: bytes | None = None, timeout: float = TIMEOUT
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(command(*args), input=input, capture_output=True, timeout=timeout)


def run_here(*args: str) -> subprocess.CompletedProcess[bytes]:
    """``trionsq ARGS`` run in this process, as a CompletedProcess: for command
    lines refused (or answered, like --help) before any I/O, where starting an
    interpreter would be most of the cost."""
    from trionsq import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = cli.main(list(args))
        except SystemExit as exc:
            status = int(exc.code or 0)
    return subprocess.CompletedProcess(
        list(args), status, out.getvalue().encode(), err.getvalue().encode()
    )


#: Processes the running test started (killed at its end if still running,
#: so that a failing test leaves nothing behind).
STARTED: list[subprocess.Popen[bytes]] = []


def track(process: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
    STARTED.append(process)
    return process


def start_tool(*args: str) -> subprocess.Popen[bytes]:
    return track(subprocess.Popen(command(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE))


def stop_tool(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> tuple[int, str, str]:
    """Signal the tool, wait for it to exit, return (status, stdout, stderr)."""
    process.send_signal(sig)
    out, err = process.communicate(timeout=TIMEOUT)
    return process.returncode, out.decode(), err.decode()


def publish(http_address: str, topic: str, bodies: list[bytes]) -> None:
    data = len(bodies).to_bytes(4, "big") + b"".join(len(b).to_bytes(4, "big") + b for b in bodies)
    response = httpx.post(
        f"http://{http_address}/mpub", params={"topic": topic, "binary": "true"}, content=data
    )
    response.raise_for_status()


def create_channel(http_address: str, topic: str, channel: str) -> None:
    # nsqd answers 404 TOPIC_NOT_FOUND to a channel of a topic it does not have.
    httpx.post(f"http://{http_address}/topic/create", params={"topic": topic}).raise_for_status()
    httpx.post(
        f"http://{http_address}/channel/create", params={"topic": topic, "channel": channel}
    ).raise_for_status()


def drained(http_address: str, topic: str, channel: str, total: int) -> bool:
    """Every one of ``total`` messages went through the channel and was finished."""
    stats = channel_stats(http_address, topic, channel)
    return (
        stats is not None
        and stats["message_count"] >= total
        and stats["depth"] == 0
        and stats["in_flight_count"] == 0
        and stats["deferred_count"] == 0
    )


def stop_when_drained(
    process: subprocess.Popen[bytes], http_address: str, topic: str, channel: str, total: int
) -> str:
    """Wait until the tool's channel is :func:`drained`, stop the tool (SIGTERM),
    check that it exited with status 0; its stderr."""
    wait_until_blocking(
        lambda: drained(http_address, topic, channel, total), what=f"{topic}/{channel} drained"
    )
    status, _, err = stop_tool(process)
    assert status == 0, err
    return err
