"""The daemons' command lines: fakensq's ``nsqd``/``nsqlookupd`` stand-ins next to
the real v1.3.0 binaries, run as processes with the same arguments.

- ``--help``: the whole usage text, and flag by flag (name, value type, default);
- what a command line does before the daemon starts: ``--version``, ``-h``,
  Go's flag syntax and value forms, flag errors (exit status 2 and Go's text),
  nsqd's start-up checks (exit status 1 and ``FATAL`` text);
- what a flag's value becomes (``/config/<name>`` of the running node).
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import trio

import fakensq
from fakensq.cli import nsqd_main, nsqlookupd_main

from .. import reference
from .conftest import Conformance, Target
from .httpcheck import request

ROOT = Path(__file__).resolve().parents[2]
DAEMONS = ("nsqd", "nsqlookupd")


def _command(kind: str, daemon: str) -> list[str]:
    if kind == "real":
        path = reference.require(daemon)
        return [str(path)]
    return [sys.executable, "-m", "fakensq", daemon]


@functools.cache
def run(kind: str, daemon: str, *args: str) -> tuple[int, str, str]:
    """Run the command to its end (only for arguments that end it before it
    serves): exit status, stdout, stderr.  fakensq's runs in this process,
    through the console script's own function (a Python start-up per case
    would cost a second each; ``test_the_console_scripts`` runs them whole)."""
    if kind == "fakensq":
        main = nsqd_main if daemon == "nsqd" else nsqlookupd_main
        out, err = io.StringIO(), io.StringIO()
        # The command sets up fakensq's logging as a process would: put it back.
        logger = logging.getLogger("fakensq")
        saved = (list(logger.handlers), logger.level, logger.propagate)
        try:
            # Its own working directory: nsqd's default data path, which it
            # locks (another test's nsqd may be starting in the checkout now).
            with tempfile.TemporaryDirectory() as cwd, contextlib.chdir(cwd):
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    status = main(list(args))
        finally:
            logger.handlers[:], logger.level, logger.propagate = saved
        return status, out.getvalue(), err.getvalue()
    return run_process(_command(kind, daemon), *args)


def run_process(command: list[str], *args: str) -> tuple[int, str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # Its own working directory: nsqd's default data path, which it locks.
    with tempfile.TemporaryDirectory() as cwd:
        done = subprocess.run(
            [*command, *args],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            cwd=cwd,
            check=False,
        )
    return done.returncode, done.stdout, done.stderr


def _strip_log(text: str) -> str:
    # "[nsqd] 2026/11/24 09:30:06.798758 FATAL: ..." -> "[nsqd] FATAL: ..."; Go's
    # plain log's "2026/11/24 09:30:06 " likewise.
    text = re.sub(r"(\[\w+\] )\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d{6} ", r"\1", text)
    text = re.sub(r"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d ", "", text, flags=re.M)
    return _unbuilt(text)


def _unbuilt(text: str) -> str:
    # The version line's build note: "(built w/go1.27.3)" for the real daemon,
    # fakensq's release for the fake (a fake never claims a Go build).
    return re.sub(
        r"^(.*\bv\d+\.\d+\.\d+) \((?:built w/go|fakensq )[^)]*\)$",
        r"\1 (<build>)",
        text,
        flags=re.M,
    )


def compare(daemon: str, *args: str) -> tuple[int, str, str]:
    """The outcome of ``args`` on fakensq's command, checked equal to the real
    one's (skipped when there is no real binary)."""
    fake = run("fakensq", daemon, *args)
    fake = (fake[0], _unbuilt(fake[1]), _strip_log(fake[2]))
    if reference.binary(daemon) is None:
        pytest.skip(f"fakensq ran it; no real {daemon}: {reference.skip_reason()}")
    real = run("real", daemon, *args)
    real = (real[0], _unbuilt(real[1]), _strip_log(real[2]))
    assert fake == real
    return fake


@pytest.mark.parametrize("daemon", DAEMONS)
@pytest.mark.parametrize("flag", ["-h", "--help", "-help"])
def test_usage_text(daemon: str, flag: str) -> None:
    status, _out, err = compare(daemon, flag)
    assert status == 0 and err.startswith(f"Usage of {daemon}:")


@functools.cache
def flags_in_usage(kind: str, daemon: str) -> dict[str, tuple[str, str]]:
    """Each flag of the usage text: (its value type, its usage and default)."""
    _, _, err = run(kind, daemon, "-h")
    flags: dict[str, tuple[str, str]] = {}
    for match in re.finditer(r"^  -(\S+)(?: (\S+))?\n((?:    \t.*\n)+)", err, re.M):
        name, type_name, usage = match.group(1), match.group(2) or "", match.group(3)
        flags[name] = (type_name, " ".join(line.strip() for line in usage.splitlines()))
    return flags


def _real_flags(daemon: str) -> list[str]:
    if reference.binary(daemon) is None:
        return []
    return sorted(flags_in_usage("real", daemon))


@pytest.mark.parametrize(
    ("daemon", "flag"),
    [(d, f) for d in DAEMONS for f in _real_flags(d)] or [("nsqd", "(no real binary)")],
)
def test_each_flag_same_type_and_default(daemon: str, flag: str) -> None:
    reference.require(daemon)
    real = flags_in_usage("real", daemon)
    fake = flags_in_usage("fakensq", daemon)
    assert fake.get(flag) == real[flag]


@pytest.mark.parametrize("daemon", DAEMONS)
def test_no_flag_the_real_daemon_lacks(daemon: str) -> None:
    reference.require(daemon)
    assert sorted(flags_in_usage("fakensq", daemon)) == sorted(flags_in_usage("real", daemon))


# Command lines that end before the daemon serves: --version after the flags
# makes a valid line exit 0 with the version, an invalid one exit 2.  (Never a
# line whose flags stop early, "-" or "--" or a bare word: the daemon would
# start, on nsqd's default ports.)
LINES = [
    ("--version",),
    ("-version",),
    ("--version=true",),
    ("--version=1",),
    ("--version=false", "-h"),
    ("--version=maybe",),
    ("--nope",),
    ("---version",),
    ("--msg-timeout",),
    ("--msg-timeout=x", "--version"),
    ("--msg-timeout=90", "--version"),
    ("--msg-timeout=1h30m", "--version"),
    ("--msg-timeout=1.5h", "--version"),
    ("--msg-timeout=-1s", "--version"),
    ("--msg-timeout=1µs", "--version"),
    ("--msg-timeout=1us", "--version"),
    ("--msg-timeout", "30s", "--version"),
    ("-msg-timeout=30s", "--version"),
    ("--mem-queue-size=0x10", "--version"),
    ("--mem-queue-size=0o17", "--version"),
    ("--mem-queue-size=017", "--version"),
    ("--mem-queue-size=1_000", "--version"),
    ("--mem-queue-size=1e3", "--version"),
    ("--mem-queue-size=9223372036854775808", "--version"),
    ("--mem-queue-size=", "--version"),
    ("--snappy=false", "--version"),
    ("--snappy=FALSE", "--version"),
    ("--snappy=f", "--version"),
    ("--snappy=no", "--version"),
    ("--tls-required", "--version"),
    ("--tls-required=tcp-https", "--version"),
    ("--tls-required=TCP-HTTPS", "--version"),
    ("--tls-required=maybe", "--version"),
    ("--tls-min-version=tls1.2", "--version"),
    ("--tls-min-version=TLS1.3", "--version"),
    ("--tls-min-version=tls9", "--version"),
    ("--tls-min-version=", "--version"),
    ("--log-level=debug", "--version"),
    ("--log-level=WARN", "--version"),
    ("--log-level=loud", "--version"),
    ("--e2e-processing-latency-percentile=0.5,0.99", "--version"),
    ("--e2e-processing-latency-percentile=x", "--version"),
    ("--e2e-processing-latency-percentile=", "--version"),
    ("--e2e-processing-latency-percentile=0.5,x", "--version"),
    ("--lookupd-tcp-address", "a:1", "--lookupd-tcp-address=b:2", "--version"),
    ("--worker-id", "--version"),
    ("--verbose", "--version"),
    ("--node-id=1024", "--version"),
    ("--config=/nonexistent/file.toml", "--version"),
]


@pytest.mark.parametrize("args", LINES, ids=lambda a: " ".join(a) or "none")
def test_nsqd_command_line(args: tuple[str, ...]) -> None:
    compare("nsqd", *args)


LOOKUPD_LINES = [
    ("--version",),
    ("--nope",),
    ("--inactive-producer-timeout=1m", "--version"),
    ("--inactive-producer-timeout=x", "--version"),
    ("--tombstone-lifetime", "--version"),
    ("--tcp-address=:4160", "--version"),
    ("--log-level=fatal", "--version"),
    ("--log-prefix=", "--version"),
    ("--msg-timeout=1s", "--version"),
]


@pytest.mark.parametrize("args", LOOKUPD_LINES, ids=lambda a: " ".join(a))
def test_nsqlookupd_command_line(args: tuple[str, ...]) -> None:
    compare("nsqlookupd", *args)


# nsqd's own start-up checks (after the flags parsed): exit 1 and a FATAL line.
STARTUP = [
    ("--max-deflate-level=0",),
    ("--max-deflate-level=10",),
    ("--node-id=-1",),
    ("--node-id=1024",),
    ("--tls-required=true",),
    ("--tls-required=tcp-https",),
    ("--tls-client-auth-policy=require",),
    ("--tls-cert=/nonexistent/cert.pem", "--tls-key=/nonexistent/key.pem"),
    ("--e2e-processing-latency-percentile=0",),
    ("--e2e-processing-latency-percentile=1.5",),
    ("--e2e-processing-latency-percentile=-0.5",),
    ("--data-path=/nonexistent/folder",),
    ("--config=/nonexistent/file.toml",),
]


@pytest.mark.parametrize("args", STARTUP, ids=lambda a: " ".join(a))
def test_nsqd_startup_checks(args: tuple[str, ...]) -> None:
    status, _, err = compare(
        "nsqd", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", *args
    )
    assert status == 1 and "FATAL: " in err


# What values become: /config/<name> of a node started with the flag.
VALUES = [
    ("--max-rdy-count=0x10", "max_rdy_count"),
    ("--mem-queue-size=1_000", "mem_queue_size"),
    ("--msg-timeout=1m30s", "msg_timeout"),
    ("--msg-timeout=1.5m", "msg_timeout"),
    ("--msg-timeout=1500ms", "msg_timeout"),
    ("--max-req-timeout=2h", "max_req_timeout"),
    ("--deflate=f", "deflate"),
    ("--snappy=0", "snappy"),
    ("--statsd-mem-stats=False", "statsd_mem_stats"),
    ("--tls-min-version=TLS1.2", "tls_min_version"),
    ("--log-level=WARN", "log_level"),
    ("--log-level=error", "log_level"),
    ("--log-prefix=", "log_prefix"),
    ("--node-id=0", "id"),
    ("--e2e-processing-latency-percentile=0.5,0.99", "e2e_processing_latency_percentiles"),
    ("--e2e-processing-latency-percentile=1", "e2e_processing_latency_percentiles"),
    ("--auth-http-address=127.0.0.1:1", "auth_http_addresses"),
    ("--statsd-prefix=%s.%s", "statsd_prefix"),
    ("--statsd-prefix=plain.", "statsd_prefix"),
    ("--max-channel-consumers=3", "max_channel_consumers"),
    ("--http-client-connect-timeout=250ms", "http_client_connect_timeout"),
]


@pytest.mark.parametrize(("flag", "name"), VALUES, ids=[v[0] for v in VALUES])
async def test_flag_value(conformance: Conformance, flag: str, name: str) -> None:
    async def scenario(t: Target) -> Any:
        port = t.http_address.rpartition(":")[2].encode()
        async with t.http() as http:
            status, headers, body = await request(http, "GET", f"/config/{name}")
        if isinstance(body, bytes):
            body = body.replace(b"_" + port + b".", b"_<http_port>.")
            headers.pop("content-length", None)
        return status, headers, body

    await conformance.nsqd(scenario, flag)


async def test_config_keys_of_options_without_a_flag(
    conformance: Conformance, tmp_path: Path
) -> None:
    """nsqd's go-options resolves only options that have a flag: a config file's
    ``client_timeout`` (whose half is the heartbeat interval and whose whole the
    read deadline of a client that does not ask for one) and ``queue_scan_*``
    change nothing, so a quiet client gets no heartbeat for 30 s.  (fakensq
    before: it applied them, heartbeats every 0.25 s and the client closed at
    its 0.5 s deadline.)"""
    config = tmp_path / "nsqd.cfg"
    config.write_text(
        'client_timeout = "500ms"\nqueue_scan_interval = "1ms"\nqueue_scan_refresh_interval = 1\n'
    )

    async def scenario(t: Target) -> Any:
        c = await t.connect()
        await c.identify()
        with trio.move_on_after(1.5):
            await c.read(1)
        async with t.http() as http:
            refused = await request(http, "GET", "/config/client_timeout")
        return c.transcript, c.closed, refused

    await conformance.nsqd(scenario, f"--config={config}")


@pytest.mark.parametrize("daemon", DAEMONS)
@pytest.mark.parametrize("how", ["python -m fakensq", "shim"])
def test_the_console_scripts(daemon: str, how: str, tmp_path: Path) -> None:
    """The executables themselves (``fakensq DAEMON`` and the ``fakensq shims``
    stand-ins a foreign test suite finds on PATH) answer as the real binary."""
    if how == "shim":
        from fakensq.cli.shims import write_shims

        write_shims(tmp_path)
        command = [str(tmp_path / daemon)]
    else:
        command = _command("fakensq", daemon)
    args = ("--version",)
    fake = run_process(command, *args)
    real = run("real", daemon, *args) if reference.binary(daemon) else None
    if real is None:
        pytest.skip(f"fakensq ran it; no real {daemon}: {reference.skip_reason()}")
    assert (fake[0], _unbuilt(fake[1]), fake[2]) == (real[0], _unbuilt(real[1]), real[2])
    assert fake[1].startswith(f"{daemon} v1.3.0 (fakensq ")
    assert run_process(command, "--nope")[:2] == run("real", daemon, "--nope")[:2]


@pytest.mark.parametrize(
    "args",
    [
        ("--tcp-address=127.0.0.1:99999",),
        ("--http-address=127.0.0.1:0", "--tcp-address=127.0.0.1:65536"),
        ("--tcp-address=nohost.invalid:1",),
        ("--tcp-address=/nonexistent/dir/nsqlookupd.sock",),
        ("--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:x"),
    ],
    ids=lambda a: " ".join(a),
)
def test_nsqlookupd_listen_errors(args: tuple[str, ...]) -> None:
    # The host lookup's error names the resolver on nsqlookupd: compared to it.
    status, _, _err = compare_lines("nsqlookupd", *args)
    assert status == 1


@pytest.mark.parametrize("daemon", DAEMONS)
@pytest.mark.parametrize("which", ["tcp", "http"])
def test_address_in_use(daemon: str, which: str, tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = f"127.0.0.1:{busy.getsockname()[1]}"
        other = "tcp" if which == "http" else "http"
        args = [f"--{which}-address={taken}", f"--{other}-address=127.0.0.1:0"]
        if daemon == "nsqd":
            args.append(f"--data-path={tmp_path}")
        status, _, err = compare_lines(daemon, *args)
    assert status == 1 and "address already in use" in err


def compare_lines(daemon: str, *args: str) -> tuple[int, str, str]:
    """:func:`compare` up to a host lookup's resolver address (Go names the DNS
    server it asked)."""
    fake = run("fakensq", daemon, *args)
    if reference.binary(daemon) is None:
        pytest.skip(f"fakensq ran it; no real {daemon}: {reference.skip_reason()}")
    real = run("real", daemon, *args)
    out = []
    for status, stdout, stderr in (fake, real):
        text = re.sub(r"(lookup \S+) on \S+: ", r"\1: ", _strip_log(stderr))
        out.append((status, stdout, text))
    assert out[0] == out[1]
    return out[0]


def test_data_path_in_use(tmp_path: Path) -> None:
    """nsqd locks its data folder: a second nsqd on it is refused."""
    import fcntl

    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another "instance"
        args = (
            "--tcp-address=127.0.0.1:0",
            "--http-address=127.0.0.1:0",
            f"--data-path={tmp_path}",
        )
        fake = run_process(_command("fakensq", "nsqd"), *args)
        real = run_process(_command("real", "nsqd"), *args)
    finally:
        os.close(fd)
    assert (fake[0], _strip_log(fake[2])) == (real[0], _strip_log(real[2]))
    assert fake[0] == 1 and "possibly in use by another instance of nsqd" in fake[2]


@pytest.mark.parametrize("daemon", DAEMONS)
@pytest.mark.parametrize(
    "which, address",
    [
        ("tcp", "<busy>"),
        ("http", "<busy>"),
        ("tcp", "127.0.0.1:99999"),
        ("http", "127.0.0.1:x"),
        ("tcp", "nohost.invalid:1"),
    ],
)
async def test_in_process_listen_errors(daemon: str, which: str, address: str) -> None:
    """``async with fakensq.NSQD(...)``/``NSQLookupd(...)`` on an address the
    daemon cannot have raises :class:`fakensq.ListenError` (no exception group,
    no socket traceback) whose text is the real daemon's FATAL line's own, the
    line the real daemon exits 1 with."""
    import socket

    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        if address == "<busy>":
            address = f"127.0.0.1:{busy.getsockname()[1]}"
        other = "tcp" if which == "http" else "http"
        fields = {f"{which}_address": address, f"{other}_address": "127.0.0.1:0"}
        node = fakensq.NSQD(**fields) if daemon == "nsqd" else fakensq.NSQLookupd(**fields)
        with pytest.raises(fakensq.ListenError) as raised:
            async with node:
                pytest.fail("the node started")
        assert type(raised.value) is fakensq.ListenError
        assert raised.value.address == address
        if reference.binary(daemon) is None:
            pytest.skip(f"fakensq ran it; no real {daemon}: {reference.skip_reason()}")
        args = [f"--{which}-address={address}", f"--{other}-address=127.0.0.1:0"]
        status, _, err = run_process([str(reference.require(daemon))], *args)

    # Go names the DNS server it asked in a host lookup's error (the machine's).
    def dns(text: str) -> str:
        return re.sub(r"(lookup \S+) on \S+: ", r"\1: ", text)

    fatal = dns(_strip_log(err)).strip().splitlines()[-1]
    prefix = (
        "failed to instantiate nsqd - "
        if daemon == "nsqd"
        else "failed to instantiate nsqlookupd%!(EXTRA *errors.errorString="
    )
    suffix = "" if daemon == "nsqd" else ")"
    assert status == 1
    assert fatal == dns(f"[{daemon}] FATAL: {prefix}{raised.value}{suffix}")
