"""Helpers to run fakensq's commands as real subprocesses."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence

import trio
import trio.lowlevel

#: Generous: a cold Python start with trio and httpx imports.
START_TIMEOUT = 10.0

LISTENING = re.compile(r"(TCP|HTTP|HTTPS): listening on (\S+)")


class Daemon:
    """A running subprocess whose stderr (and stdout) lines are read as they come."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.stderr_lines: list[str] = []
        self.stdout_lines: list[str] = []
        self._err = bytearray()
        self._out = bytearray()

    @classmethod
    async def start(cls, args: Sequence[str]) -> Daemon:
        process = await trio.lowlevel.open_process(
            list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        return cls(process)

    @classmethod
    async def fakensq(cls, *args: str) -> Daemon:
        return await cls.start([sys.executable, "-m", "fakensq", *args])

    async def _read(
        self, stream: trio.abc.ReceiveStream | None, buf: bytearray, lines: list[str]
    ) -> bool:
        assert stream is not None
        chunk = await stream.receive_some(65536)
        if not chunk:
            return False
        buf += chunk
        while b"\n" in buf:
            line, _, rest = bytes(buf).partition(b"\n")
            buf[:] = rest
            lines.append(line.decode())
        return True

    async def wait_stderr(self, pattern: str | re.Pattern[str]) -> re.Match[str]:
        """The first stderr line matching ``pattern`` (reading more as needed)."""
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        checked = 0
        with trio.fail_after(START_TIMEOUT):
            while True:
                for line in self.stderr_lines[checked:]:
                    m = regex.search(line)
                    if m:
                        return m
                checked = len(self.stderr_lines)
                if not await self._read(self.process.stderr, self._err, self.stderr_lines):
                    raise AssertionError(f"no {regex.pattern!r} in {self.stderr_lines}")

    async def wait_stdout(self, pattern: str) -> re.Match[str]:
        regex = re.compile(pattern)
        checked = 0
        with trio.fail_after(START_TIMEOUT):
            while True:
                for line in self.stdout_lines[checked:]:
                    m = regex.search(line)
                    if m:
                        return m
                checked = len(self.stdout_lines)
                if not await self._read(self.process.stdout, self._out, self.stdout_lines):
                    raise AssertionError(f"no {pattern!r} in {self.stdout_lines}")

    async def listening(self, *kinds: str) -> dict[str, str]:
        """Wait for the ``KIND: listening on ADDR`` lines; returns kind → address."""
        found: dict[str, str] = {}
        for kind in kinds:
            m = await self.wait_stderr(rf"{kind}: listening on (\S+)")
            found[kind] = m.group(1)
        return found

    async def stop(self, sig: int) -> int:
        """Send ``sig`` and wait for the exit code; the rest of stderr is read."""
        self.process.send_signal(sig)
        with trio.fail_after(START_TIMEOUT):
            while await self._read(self.process.stderr, self._err, self.stderr_lines):
                pass
            return await self.process.wait()

    def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()


async def run(*args: str) -> subprocess.CompletedProcess[bytes]:
    """Run ``python -m fakensq ARGS`` to completion."""
    # Its own working directory: nsqd's default data path, which it locks.
    with tempfile.TemporaryDirectory() as cwd, trio.fail_after(START_TIMEOUT):
        return await trio.run_process(
            [sys.executable, "-m", "fakensq", *args],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            cwd=cwd,
        )
