"""The task side: find (or start) this executor's agent and ask it for rows.

Runs in PySpark's Python worker, with blocking sockets.  The agent's Unix socket
lives in a private folder (``$TMPDIR/trionsq-spark-<uid>``, mode 0700), named
after the process that bounds the executor's life (the PySpark daemon), so every
Python worker of an executor finds the same agent and a new executor starts its
own.  Starting one is serialized with a lock file, so concurrent tasks start it
once.
"""

from __future__ import annotations

import fcntl
import json
import os
import pickle
import select
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ._executor import ExecutorIdentity, process_start_time
from ._framing import Limits, receive_sync, send_sync
from ._held import ipc_limit
from ._options import SourceOptions
from ._phases import mark

__all__ = ["AgentUnavailableError", "agent_socket_path", "read_from_agent"]

#: How long a new agent may take to answer (Python, Trio and trionsq imports).
START_TIMEOUT = 60.0

_spawned: list[subprocess.Popen[bytes]] = []


class AgentUnavailableError(RuntimeError):
    """The executor's agent could not be started or reached."""


def _private_dir() -> Path:
    folder = Path(tempfile.gettempdir()) / f"trionsq-spark-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    if folder.stat().st_uid != os.getuid():
        raise AgentUnavailableError(f"{folder} belongs to another user")
    return folder


def agent_socket_path(identity: ExecutorIdentity) -> str:
    return str(_private_dir() / f"agent-{identity.anchor_pid}.sock")


def _connect(path: str, timeout: float) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        raise
    return sock


def _reap() -> None:
    for process in list(_spawned):
        if process.poll() is not None:
            _spawned.remove(process)


def _start(identity: ExecutorIdentity, path: str, ready: int) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable,
        "-m",
        "trionsq.spark.agent",
        "--socket",
        path,
        "--identity",
        json.dumps(asdict(identity)),
    ]
    start = process_start_time(identity.anchor_pid)
    if start is not None:
        argv += ["--anchor-start", str(start)]
    argv += ["--ready-fd", str(ready)]
    # Same process group as this worker: the PySpark daemon's SIGHUP on executor
    # shutdown reaches the agent too.  stderr goes where the worker's goes (the
    # executor's log).
    process = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, close_fds=True, pass_fds=(ready,)
    )
    _spawned.append(process)
    return process


def connect_agent(identity: ExecutorIdentity, timeout: float) -> socket.socket:
    """A connection to this executor's agent, started first if need be."""
    _reap()
    path = agent_socket_path(identity)
    try:
        return _connect(path, timeout)
    except OSError:
        pass
    with open(path + ".lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return _connect(path, timeout)
        except OSError:
            pass
        mark("task.agent_spawn")
        # The agent closes its end of this pipe once it listens (or if it dies): the
        # task waits for that, not for the next turn of a polling loop.
        deadline = time.monotonic() + START_TIMEOUT
        ready, ready_w = os.pipe()
        try:
            process = _start(identity, path, ready_w)
        except BaseException:
            os.close(ready)
            raise
        finally:
            os.close(ready_w)
        with open(ready, "rb", buffering=0) as pipe:
            _wait_closed(pipe, deadline - time.monotonic())
        while True:
            try:
                sock = _connect(path, timeout)
            except OSError:
                pass
            else:
                mark("task.agent_answered")
                return sock
            code = process.poll()
            if code is not None:
                raise AgentUnavailableError(
                    f"the nsq source's agent exited with {code} at start (see the executor's log)"
                )
            if time.monotonic() > deadline:
                raise AgentUnavailableError(
                    f"the nsq source's agent did not answer within {START_TIMEOUT:g}s"
                )
            # It closed the pipe but does not answer (yet): another agent won the
            # socket and this one left, say.  Seldom; polled.
            time.sleep(0.02)


def _wait_closed(pipe: Any, seconds: float) -> None:
    """Until the other end of ``pipe`` is closed (EOF), or ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select([pipe], [], [], left)
        if readable and not pipe.read(64):
            return


def read_from_agent(
    identity: ExecutorIdentity, request: dict[str, Any], options: SourceOptions, timeout: float
) -> tuple[dict[str, Any], bytes | memoryview]:
    """Send one read request; the agent's answer (header, Arrow IPC bytes: big ones
    mapped from the memory file the agent passed, see :func:`._framing.send_file`)."""
    sock = connect_agent(identity, timeout)
    with sock:
        send_sync(sock, request, pickle.dumps(options))
        return receive_sync(sock, Limits(64 << 10, ipc_limit(options)), files=True)
