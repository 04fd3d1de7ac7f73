"""The real NSQ v1.3.0 binaries, for tests and benchmarks that compare against them.

Where the binaries come from, in order:

1. ``NSQ_BIN``: a folder holding ``nsqd``, ``nsqlookupd``, ``nsqadmin`` and the tools;
2. ``shared/reference/nsq-bin`` in the project's parent folder, or in any folder
   above it (CI has ``../shared`` beside the checkout); that script unpacks the
   binaries once and prints their folder.

With neither, :func:`nsq_bin` returns ``None`` and :data:`SKIP_REASON` says why;
tests then skip with that reason (``pytest -rs`` shows it).

:class:`RealDaemon` runs one daemon on free loopback ports and keeps them across
``stop``/``kill``/``start``, so a test can kill nsqd mid-stream and bring it back
where clients will look for it.  It is synchronous (``subprocess``): benchmarks and
threads use it as it is; Trio tests use :func:`open_nsqd` and :func:`open_nsqlookupd`,
which run the blocking parts in a worker thread.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from pathlib import Path

import httpx
import trio

from .support.ports import free_port

ROOT = Path(__file__).resolve().parent.parent

#: Why real-daemon tests skip on this machine (None once the binaries are found).
SKIP_REASON: str | None = None

#: A cold start of a Go daemon takes a few ms; a loaded machine can take far longer.
START_TIMEOUT = 20.0
#: How long a daemon gets to leave after SIGTERM before it is killed.
STOP_TIMEOUT = 10.0

# One TLS context for the readiness checks (httpx builds one per client
# otherwise, loading the CA bundle: 10-150 ms a start on a loaded machine).
_TLS_CONTEXT = ssl.create_default_context()


@functools.cache
def nsq_bin() -> Path | None:
    """The folder with the real NSQ v1.3.0 binaries, or ``None`` (see the module doc)."""
    global SKIP_REASON
    env = os.environ.get("NSQ_BIN")
    if env:
        folder = Path(env)
        if (folder / "nsqd").is_file():
            return folder
        SKIP_REASON = f"NSQ_BIN={env} holds no nsqd"
        return None
    for parent in ROOT.parents:
        script = parent / "shared" / "reference" / "nsq-bin"
        if script.is_file():
            try:
                out = subprocess.run(
                    [os.environ.get("PYTHON", "python3"), str(script)],
                    capture_output=True,
                    text=True,
                    timeout=300,
                    check=True,
                ).stdout.strip()
            except (OSError, subprocess.SubprocessError) as exc:
                SKIP_REASON = f"{script} failed: {exc}"
                return None
            folder = Path(out)
            if (folder / "nsqd").is_file():
                return folder
            SKIP_REASON = f"{script} printed {out!r}, which holds no nsqd"
            return None
    SKIP_REASON = (
        "no real NSQ binaries: set NSQ_BIN, or put shared/reference/nsq-bin beside the checkout"
    )
    return None


def binary(name: str) -> Path | None:
    """One real binary (``"nsqd"``, ``"nsq_tail"``...), or ``None``."""
    folder = nsq_bin()
    if folder is None:
        return None
    path = folder / name
    return path if path.is_file() else None


def skip_reason() -> str:
    """Why there is no real daemon here ('' when there is one)."""
    nsq_bin()
    return SKIP_REASON or ""


def require(name: str = "nsqd") -> Path:
    """The real binary ``name``, or skip the calling test with the reason."""
    import pytest

    path = binary(name)
    if path is None:
        pytest.skip(skip_reason() or f"the reference folder has no {name}")
    return path


class RealDaemon:
    """A real nsqd, nsqlookupd or nsqadmin on fixed loopback ports, restartable.

    ``flags`` are passed as they are (``"--mem-queue-size=0"``); the addresses,
    ``--broadcast-address`` and, for nsqd, ``--data-path`` are added (nsqadmin
    gets only ``--http-address``).  Output goes to ``log_path`` (read it when a
    test fails).
    """

    def __init__(
        self,
        name: str,
        flags: Sequence[str] = (),
        *,
        data_path: Path | None = None,
        tcp_port: int | None = None,
        http_port: int | None = None,
    ) -> None:
        path = binary(name)
        if path is None:
            raise RuntimeError(skip_reason() or f"no real {name}")
        self.name = name
        self.path = path
        self.flags = list(flags)
        self.tcp_address = f"127.0.0.1:{tcp_port or free_port()}"
        self.http_address = f"127.0.0.1:{http_port or free_port()}"
        # Ports chosen here may be taken by another process before the daemon
        # binds them (free_port's race; parallel test workers): the first start
        # then tries fresh ones.
        self._fresh_ports = (tcp_port is None, http_port is None)
        self._started_once = False
        self._own_dir: tempfile.TemporaryDirectory[str] | None = None
        if data_path is None:
            self._own_dir = tempfile.TemporaryDirectory(prefix=f"real-{name}-")
            data_path = Path(self._own_dir.name)
        self.data_path = data_path
        self.log_path = data_path / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def argv(self) -> list[str]:
        if self.name == "nsqadmin":  # HTTP only
            return [str(self.path), f"--http-address={self.http_address}", *self.flags]
        argv = [
            str(self.path),
            f"--tcp-address={self.tcp_address}",
            f"--http-address={self.http_address}",
            "--broadcast-address=127.0.0.1",
        ]
        if self.name == "nsqd":
            argv.append(f"--data-path={self.data_path}")
        return argv + self.flags

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        """Start (again, on the same ports and data) and wait until ``/ping`` answers."""
        for _ in range(3):
            try:
                self._start()
                self._started_once = True
                return
            except RuntimeError as exc:
                taken = "address already in use" in str(exc)
                if self._started_once or not taken or not any(self._fresh_ports):
                    raise
                if self._fresh_ports[0]:
                    self.tcp_address = f"127.0.0.1:{free_port()}"
                if self._fresh_ports[1]:
                    self.http_address = f"127.0.0.1:{free_port()}"
        self._start()
        self._started_once = True

    def _start(self) -> None:
        if self.running:
            raise RuntimeError(f"{self.name} is already running")
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + START_TIMEOUT
        with httpx.Client(timeout=2.0, verify=_TLS_CONTEXT) as client:
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"{self.name} exited with {self.process.returncode}: {self.log()[-2000:]}"
                    )
                try:
                    # Any answer will do: with --tls-required=true nsqd answers
                    # plain HTTP with 403 TLS_REQUIRED.
                    if client.get(f"http://{self.http_address}/ping").status_code < 500:
                        if self._answering_is_ours(client):
                            return
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    self.kill()
                    raise TimeoutError(f"{self.name} did not answer /ping: {self.log()[-2000:]}")
                time.sleep(0.01)  # polling another process's readiness

    def _answering_is_ours(self, client: httpx.Client) -> bool:
        """Whether the daemon answering on our HTTP port is this one.

        Free ports are picked by binding and releasing them, so a daemon that
        another test started meanwhile can hold one of ours: this one then
        dies at once ("address already in use"), but the other answers /ping.
        An nsqd's /info names its TCP port; for the others, this process must
        still be running (checked again by the caller's loop).
        """
        if self.name != "nsqd":
            return self.process is not None and self.process.poll() is None
        response = client.get(f"http://{self.http_address}/info")
        if response.status_code != 200:
            return True  # --tls-required: /info is refused over plain HTTP
        port = response.json().get("tcp_port")
        return port == int(self.tcp_address.rsplit(":", 1)[1])

    def stop(self) -> int | None:
        """SIGTERM, as an operator stops it (nsqd saves its state), then wait."""
        return self._signal(signal.SIGTERM)

    def kill(self) -> int | None:
        """SIGKILL: nothing saved, connections cut."""
        return self._signal(signal.SIGKILL)

    def _signal(self, sig: signal.Signals) -> int | None:
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(sig)
            try:
                process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return process.returncode

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        """Stop it (if running) and remove the data folder it made."""
        try:
            self.stop()
        finally:
            if self._own_dir is not None:
                shutil.rmtree(self._own_dir.name, ignore_errors=True)
                self._own_dir = None

    def __enter__(self) -> RealDaemon:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def running(name: str, flags: Sequence[str] = (), **kwargs: object) -> Iterator[RealDaemon]:
    """A started :class:`RealDaemon` (blocking code and benchmarks)."""
    daemon = RealDaemon(name, flags, **kwargs)  # type: ignore[arg-type]
    with daemon:
        yield daemon


@asynccontextmanager
async def _open(name: str, flags: Sequence[str], **kwargs: object) -> AsyncIterator[RealDaemon]:
    daemon = RealDaemon(name, flags, **kwargs)  # type: ignore[arg-type]
    await trio.to_thread.run_sync(daemon.start)
    try:
        yield daemon
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(daemon.close)


def open_nsqd(*flags: str, **kwargs: object) -> AbstractAsyncContextManager[RealDaemon]:
    """``async with open_nsqd("--mem-queue-size=0") as nsqd:`` a started real nsqd."""
    return _open("nsqd", flags, **kwargs)


def open_nsqlookupd(*flags: str, **kwargs: object) -> AbstractAsyncContextManager[RealDaemon]:
    """``async with open_nsqlookupd() as lookupd:`` a started real nsqlookupd."""
    return _open("nsqlookupd", flags, **kwargs)


def open_nsqadmin(*flags: str, **kwargs: object) -> AbstractAsyncContextManager[RealDaemon]:
    """``async with open_nsqadmin("--lookupd-http-address=...") as admin:`` a started
    real nsqadmin (``admin.http_address``)."""
    return _open("nsqadmin", flags, **kwargs)
