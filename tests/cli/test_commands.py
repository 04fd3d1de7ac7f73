"""fakensq's commands, run as subprocesses: flags, logs, signals, exit codes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import trio

from fakensq.lookupd.daemon import NSQLookupd

from .conftest import Daemon, run

LOG_LINE = re.compile(
    r"^\[nsqd\] \d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d{6} (INFO|DEBUG|WARNING|ERROR): "
)


@pytest.fixture
async def daemons() -> AsyncIterator[list[Daemon]]:
    started: list[Daemon] = []
    try:
        yield started
    finally:
        for daemon in started:
            daemon.kill()
            with trio.move_on_after(5):
                await daemon.process.wait()


async def test_nsqlookupd_serves_and_stops_on_sigterm(daemons: list[Daemon]) -> None:
    d = await Daemon.fakensq(
        "nsqlookupd", "--tcp-address=127.0.0.1:0", "-http-address", "127.0.0.1:0"
    )
    daemons.append(d)
    addresses = await d.listening("TCP", "HTTP")
    assert not addresses["TCP"].endswith(":0")
    assert re.match(
        r"^\[nsqlookupd\] \d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d{6} INFO: nsqlookupd v1\.3\.0 \(fakensq \d+\.\d+\.\d+, Python 3\.",
        d.stderr_lines[0],
    )
    async with httpx.AsyncClient() as client:
        r = await client.get(f"http://{addresses['HTTP']}/ping")
        assert (r.status_code, r.text) == (200, "OK")
    assert await d.stop(signal.SIGTERM) == 0


async def test_nsqd_registers_with_lookupd_and_stops_on_sigint(
    daemons: list[Daemon], tmp_path: Path
) -> None:
    async with NSQLookupd() as lookupd:
        d = await Daemon.fakensq(
            "nsqd",
            # its own folder (not the working directory, which a parallel run shares)
            f"--data-path={tmp_path}",
            "--tcp-address",
            "127.0.0.1:0",
            "--http-address=127.0.0.1:0",
            "--lookupd-tcp-address",
            lookupd.tcp_address,
            "--lookupd-tcp-address",
            lookupd.tcp_address,
            "--broadcast-address=127.0.0.1",
            "--snappy",
            "--deflate=false",
            "--verbose",
            "--msg-timeout=1m30s",
        )
        daemons.append(d)
        addresses = await d.listening("TCP", "HTTP")
        tcp_port = int(addresses["TCP"].rsplit(":", 1)[1])
        with trio.fail_after(10):
            await lookupd.wait_until(lambda: [n["tcp_port"] for n in lookupd.nodes()] == [tcp_port])
        async with httpx.AsyncClient() as client:
            r = await client.get(f"http://{addresses['HTTP']}/ping")
            assert (r.status_code, r.text) == (200, "OK")
            r = await client.post(f"http://{addresses['HTTP']}/topic/create?topic=cli")
            assert r.status_code == 200
        with trio.fail_after(10):
            await lookupd.wait_until(lambda: bool(lookupd.producers("cli")))
        assert await d.stop(signal.SIGINT) == 0
        with trio.fail_after(10):
            await lookupd.wait_until(lambda: lookupd.nodes() == [])
    assert all(LOG_LINE.match(line) for line in d.stderr_lines), d.stderr_lines


async def test_version() -> None:
    for app in ("nsqd", "nsqlookupd"):
        result = await run(app, "--version")
        assert result.returncode == 0
        # What scripts look for (the name and the NSQ release) first; then a
        # fake's build note, never a Go build's.
        assert re.fullmatch(
            rf"{app} v1\.3\.0 \(fakensq \d+\.\d+\.\d+, Python \d+\.\d+\.\d+\)\n",
            result.stdout.decode(),
        )


async def test_help_exits_0_with_usage_on_stderr() -> None:
    result = await run("nsqd", "-h")
    assert result.returncode == 0
    assert result.stdout == b""
    err = result.stderr.decode()
    assert err.startswith("Usage of nsqd:\n")
    assert "  -lookupd-tcp-address value\n" in err
    assert "  -msg-timeout duration\n" in err
    result = await run("nsqlookupd", "--help")
    assert result.returncode == 0
    assert "  -tombstone-lifetime duration\n" in result.stderr.decode()
    assert "(default 45s)" in result.stderr.decode()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nsqd", "--bogus"], "flag provided but not defined: -bogus"),
        (
            ["nsqd", "--max-rdy-count", "lots"],
            'invalid value "lots" for flag -max-rdy-count: parse error',
        ),
        (["nsqd", "--tls-required=maybe"], 'invalid boolean value "maybe" for -tls-required: '),
        (
            ["nsqlookupd", "-tombstone-lifetime", "45"],
            'invalid value "45" for flag -tombstone-lifetime',
        ),
        (["nsqd", "--tcp-address"], "flag needs an argument: -tcp-address"),
    ],
)
async def test_bad_flags_exit_2(args: list[str], message: str) -> None:
    result = await run(*args)
    assert result.returncode == 2
    err = result.stderr.decode()
    assert err.startswith(message)
    assert f"\nUsage of {args[0]}:\n" in err


async def test_bad_node_id_is_fatal() -> None:
    result = await run("nsqd", "--node-id=5000")
    assert result.returncode == 1
    assert re.match(
        r"^\[nsqd\] \S+ \S+ FATAL: failed to instantiate nsqd - --node-id must be \[0,1024\)\n$",
        result.stderr.decode(),
    )


async def test_port_in_use_is_fatal(daemons: list[Daemon]) -> None:
    async with NSQLookupd() as lookupd:
        result = await run("nsqlookupd", f"--tcp-address={lookupd.tcp_address}")
    assert result.returncode == 1
    # nsqlookupd's own text, its Go format slip (%!(EXTRA ...)) included
    assert "FATAL: failed to instantiate nsqlookupd%!(EXTRA" in result.stderr.decode()


async def test_shims(tmp_path: Path, daemons: list[Daemon]) -> None:
    result = await run("shims", str(tmp_path / "bin"))
    assert result.returncode == 0
    nsqd, nsqlookupd = tmp_path / "bin" / "nsqd", tmp_path / "bin" / "nsqlookupd"
    assert result.stdout.decode().split() == [str(nsqd), str(nsqlookupd)]
    assert os.access(nsqd, os.X_OK) and os.access(nsqlookupd, os.X_OK)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    with trio.fail_after(10):
        out = await trio.run_process(["nsqd", "--version"], env=env, capture_stdout=True)
    assert out.stdout.startswith(b"nsqd v1.3.0")
    # Started by name, the shim is the daemon itself: SIGTERM reaches it.
    process = await trio.lowlevel.open_process(
        ["nsqlookupd", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"],
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
    )
    d = Daemon(process)
    daemons.append(d)
    await d.listening("TCP", "HTTP")
    assert await d.stop(signal.SIGTERM) == 0


@pytest.mark.parametrize(
    ("args", "status"),
    [(["--help"], 0), (["-h"], 0), (["-help"], 0), (["--bogus"], 2), ([], 2), (["a", "b"], 2)],
)
def test_shims_help_writes_nothing(
    args: list[str],
    status: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from fakensq.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["shims", *args]) == status
    assert "usage: fakensq shims DIR" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # no folder named after the flag


async def test_cluster_command(daemons: list[Daemon]) -> None:
    d = await Daemon.fakensq("cluster", "--nsqd=2", "-lookupd", "2")
    daemons.append(d)
    await d.wait_stdout(r"^ready")
    env = dict(line.split("=", 1) for line in d.stdout_lines if "=" in line)
    nsqd_http = env["NSQD_HTTP_ADDRESSES"].split(",")
    lookupd_http = env["NSQLOOKUPD_HTTP_ADDRESSES"].split(",")
    assert len(nsqd_http) == 2 and len(lookupd_http) == 2
    assert "nsqd 0: tcp " in d.stdout_lines[0]
    async with httpx.AsyncClient() as client:
        for address in nsqd_http + lookupd_http:
            assert (await client.get(f"http://{address}/ping")).text == "OK"
        nodes = (await client.get(f"http://{lookupd_http[1]}/nodes")).json()["producers"]
        assert len(nodes) == 2
    assert await d.stop(signal.SIGINT) == 0


async def test_unknown_command() -> None:
    result = await run("frobnicate")
    assert result.returncode == 2
    assert "unknown command" in result.stderr.decode()


def test_the_package_puts_two_commands_on_path() -> None:
    # pyproject.toml, not the installed metadata: an older install of this
    # checkout may still have more.  Never the real binaries' names.
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert project["project"]["scripts"] == {
        "trionsq": "trionsq.cli:main",
        "fakensq": "fakensq.cli:main",
    }


@pytest.mark.parametrize("module", ["fakensq.nsqd", "fakensq.lookupd"])
def test_python_dash_m_runs_the_daemon_modules(module: str) -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-m", module, "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(("nsqd v1.3.0", "nsqlookupd v1.3.0"))
    assert "RuntimeWarning" not in result.stderr
