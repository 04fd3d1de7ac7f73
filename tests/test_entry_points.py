"""Every entry point ends one way on Ctrl-C and SIGTERM (trionsq.stopping):
quietly, with its summary where it has one, and the documented exit status.

Each runs as a user runs it (a subprocess, its own process group's signals),
is waited for until its output says it is ready (under a deadline, never a
sleep), then gets SIGINT, as a terminal's Ctrl-C sends it, or SIGTERM, as a
supervisor does: the two end it alike.  (What a second signal does, and what
is requeued, is tested where each is: tests/tools/test_stopping.py,
tests/cli, tests/frontends/test_examples.)
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

ROOT = Path(__file__).resolve().parent.parent
#: a cold start of an interpreter with trio, httpx and rich on a loaded machine
READY_TIMEOUT = 60.0
#: a clean stop: consumers leave, files are synced, nodes close
EXIT_TIMEOUT = 60.0


@dataclass
class Running:
    """A subprocess whose stdout and stderr are read as they come."""

    process: trio.Process
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)
    changed: trio.Event = field(default_factory=trio.Event)

    async def _pump(self, stream: trio.abc.ReceiveStream | None, buf: bytearray) -> None:
        assert stream is not None
        while chunk := await stream.receive_some(65536):
            buf += chunk
            self.changed.set()
        self.changed.set()

    def text(self) -> str:
        return self.out.decode(errors="replace") + self.err.decode(errors="replace")

    async def ready(self, pattern: str, within: float) -> None:
        with trio.fail_after(within):
            while re.search(pattern, self.text(), re.MULTILINE) is None:
                if self.process.poll() is not None and not self.changed.is_set():
                    raise AssertionError(f"ended before {pattern!r}:\n{self.text()}")
                self.changed = trio.Event()
                await self.changed.wait()


@dataclass(frozen=True)
class EntryPoint:
    """How to start one, when it is ready, and how it must end on SIGINT."""

    argv: Callable[[Any], list[str]]
    ready: str
    status: int
    #: what its last words must say (its summary, where it has one)
    says: str = ""
    #: lines written to its stdin once started (kept open: stdin is its input)
    stdin: bytes | None = None
    #: seconds it may take to be ready (a JVM's start on a loaded machine)
    ready_within: float = READY_TIMEOUT


PY = sys.executable
EXAMPLES = ROOT / "examples"


def tool(*args: str) -> Callable[[Any], list[str]]:
    return lambda n: [PY, "-m", "trionsq.cli", "--log-level=info", *(a.format(n=n) for a in args)]


def fakensq(*args: str) -> Callable[[Any], list[str]]:
    return lambda n: [PY, "-m", "fakensq", *(a.format(n=n) for a in args)]


SUBSCRIBED = r"subscribed to "
ENTRY_POINTS = {
    # The README's first command; slowed so that the signal comes mid-run.
    "python -m fakensq.demo": EntryPoint(
        lambda n: [PY, "-m", "fakensq.demo", "--publish-rate", "100"],
        r"^demo: published=",
        130,
        r"(?s)outcome.*missing.*stopped cleanly on {sig} before the end",
    ),
    "examples/blocking_worker.py": EntryPoint(
        lambda n: [PY, str(EXAMPLES / "blocking_worker.py"), "--nsqd", n.tcp],
        r"^ready$",
        0,
        r"stopped after 0 job\(s\), on {sig}",
    ),
    "asyncio front end in main": EntryPoint(
        lambda n: [PY, str(ROOT / "tests" / "frontends" / "aio_service.py"), n.tcp],
        r"^ready$",
        0,
        r"stopped cleanly on {sig} after 0 message\(s\)",
    ),
    # Streaming queries, run until stopped (Spark's JVM starts first).
    "examples/spark_archive.py": EntryPoint(
        lambda n: [
            PY,
            str(EXAMPLES / "spark_archive.py"),
            "--topic=t",
            "--channel=c",
            f"--nsqd={n.tcp}",
            f"--output={n.folder / 'out'}",
            f"--checkpoint={n.folder / 'checkpoint'}",
            "--master=local[1]",
        ],
        r"^running \(Ctrl-C to stop\)",
        0,
        r"stopped on {sig} after \d+ batch\(es\)",
        ready_within=300,
    ),
    "examples/spark_aggregate.py": EntryPoint(
        lambda n: [
            PY,
            str(EXAMPLES / "spark_aggregate.py"),
            f"--nsqd={n.tcp}",
            f"--checkpoint={n.folder / 'checkpoint'}",
        ],
        r"^running \(Ctrl-C to stop\)",
        0,
        r"stopped on {sig} after \d+ batch\(es\)",
        ready_within=300,
    ),
    "trionsq tail": EntryPoint(
        tool("tail", "--topic=t", "--nsqd-tcp-address={n.tcp}"), SUBSCRIBED, 0
    ),
    "trionsq to-file": EntryPoint(
        tool("to-file", "--topic=t", "--nsqd-tcp-address={n.tcp}", "--output-dir={n.folder}"),
        SUBSCRIBED,
        0,
        r"to-file t done: ",
    ),
    "trionsq pub": EntryPoint(
        tool("pub", "--topic=t", "--nsqd-tcp-address={n.tcp}", "--status-every=1"),
        r"pub t: read=1 published=1",
        0,
        r"pub t done: read=1 published=1",
        stdin=b"one\n",
    ),
    "trionsq stat": EntryPoint(
        tool("stat", "--topic=t", "--channel=c", "--nsqd-http-address={n.http}"),
        r"HTTP Request: GET \S+/stats",
        0,
    ),
    "trionsq to-nsq": EntryPoint(
        tool(
            "to-nsq",
            "--topic=t",
            "--nsqd-tcp-address={n.tcp}",
            "--destination-nsqd-tcp-address={n.tcp}",
            "--destination-topic=u",
        ),
        SUBSCRIBED,
        0,
        r"to-nsq t -> u done: ",
    ),
    "trionsq to-http": EntryPoint(
        tool("to-http", "--topic=t", "--nsqd-tcp-address={n.tcp}", "--get=http://127.0.0.1:9/?%s"),
        SUBSCRIBED,
        0,
        r"to-http t done: ",
    ),
    "fakensq nsqd": EntryPoint(
        fakensq(
            "nsqd",
            "--tcp-address=127.0.0.1:0",
            "--http-address=127.0.0.1:0",
            "--data-path={n.folder}",
        ),
        r"HTTP: listening on",
        0,
    ),
    "fakensq nsqlookupd": EntryPoint(
        fakensq("nsqlookupd", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"),
        r"HTTP: listening on",
        0,
    ),
    "fakensq cluster": EntryPoint(fakensq("cluster", "--nsqd=1"), r"^ready", 0),
    "fakensq admin": EntryPoint(
        fakensq("admin", "--nsqd-http-address={n.http}", "--http-address=127.0.0.1:0"),
        r"HTTP: listening on",
        0,
    ),
    "fakensq proxy": EntryPoint(fakensq("proxy", "--upstream={n.tcp}"), r"^ready", 0),
}


@dataclass(frozen=True)
class Node:
    tcp: str
    http: str
    folder: Path


def _spark_skip() -> str:
    if importlib.util.find_spec("pyspark") is None:
        return "pyspark is not installed (pip install 'trionsq[spark]')"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "Spark needs Java (no java on PATH, no JAVA_HOME)"
    return ""


def _cases() -> list[Any]:
    cases = []
    for name in ENTRY_POINTS:
        marks: list[Any] = []
        signals = [signal.SIGINT, signal.SIGTERM]
        if "spark" in name:
            # One JVM at a time, on the Spark tests' worker; SIGINT only (a
            # JVM's start is most of a minute on a busy machine, and both
            # signals go through the one StopOnSignals).
            marks.append(pytest.mark.xdist_group("spark"))
            signals = [signal.SIGINT]
            if reason := _spark_skip():
                marks.append(pytest.mark.skip(reason=reason))
        for sig in signals:
            cases.append(pytest.param(name, sig, marks=marks, id=f"{name}-{sig.name}"))
    return cases


@pytest.mark.parametrize(("name", "sig"), _cases())
async def test_a_signal_ends_it_quietly(
    name: str, sig: signal.Signals, nsqd: Any, tmp_path: Path
) -> None:
    entry = ENTRY_POINTS[name]
    node = Node(nsqd.tcp_address, nsqd.http_address, tmp_path)
    # The channel the tools read and stat reports (it fails on one that is not there).
    async with httpx.AsyncClient() as http:
        for made in ("topic/create?topic=t", "channel/create?topic=t&channel=c"):
            (await http.post(f"http://{node.http}/{made}")).raise_for_status()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    process = await trio.lowlevel.open_process(
        entry.argv(node),
        stdin=subprocess.PIPE if entry.stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env=env,
        # Ctrl-C's disposition as a shell gives it (the suite's may differ).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    running = Running(process)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(running._pump, process.stdout, running.out)
            nursery.start_soon(running._pump, process.stderr, running.err)
            if entry.stdin is not None:
                assert process.stdin is not None
                await process.stdin.send_all(entry.stdin)
            await running.ready(entry.ready, entry.ready_within)
            process.send_signal(sig)
            with trio.fail_after(EXIT_TIMEOUT):
                status = await process.wait()
    finally:
        if process.poll() is None:
            process.kill()
        if process.stdin is not None:
            await process.stdin.aclose()
    text = running.text()
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    assert status == entry.status, text
    if entry.says:
        assert re.search(entry.says.replace("{sig}", sig.name), text), text
