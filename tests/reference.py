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
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from pathlib import Path

import trio

from fakensq.testing.real import RealProcess

ROOT = Path(__file__).resolve().parent.parent

#: Why real-daemon tests skip on this machine (None once the binaries are found).
SKIP_REASON: str | None = None


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


class RealDaemon(RealProcess):
    """A real nsqd, nsqlookupd or nsqadmin on fixed loopback ports, restartable:
    the pytest plugin's :class:`fakensq.testing.real.RealProcess` (its start,
    its flags, its retry on a port taken meanwhile), found here by name.

    ``flags`` are passed as they are (``"--mem-queue-size=0"``); the addresses,
    ``--broadcast-address`` and, for nsqd, ``--data-path`` are added (nsqadmin
    gets only ``--http-address``).  Without ``data_path`` it makes a folder of
    its own, removed by :meth:`close`.  Output goes to ``log_path`` (read it
    when a test fails).
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
        self._own_dir: tempfile.TemporaryDirectory[str] | None = None
        if data_path is None:
            self._own_dir = tempfile.TemporaryDirectory(prefix=f"real-{name}-")
            data_path = Path(self._own_dir.name)
        super().__init__(path, flags, data_path, name, tcp_port=tcp_port, http_port=http_port)

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
