"""``fakensq admin`` against ``nsqadmin`` v1.3.0's command line.

The flag sets, types and defaults are read from the real ``nsqadmin --help``;
bad command lines are given to both and their exit codes and messages compared;
a ``--config`` file and flags are given to both and every option read back
through ``GET /config/<name>``.  Tests needing the real binary skip with the
reason where it is absent.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio

from fakensq.admin.options import AdminOptions
from fakensq.cli.nsqadmin import admin_flagset, admin_main, admin_options_from_flags
from tests import reference
from tests.gousage import parse_usage
from tests.support.ports import free_port

_STAMP = re.compile(r"\d{4}/\d\d/\d\d \d\d:\d\d:\d\d(\.\d+)? ")


def run_fake(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fakensq", "admin", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def run_real(*args: str) -> subprocess.CompletedProcess[str]:
    binary = reference.require("nsqadmin")
    return subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=60)


def first_line(text: str) -> str:
    """A log line without its timestamp (``[nsqadmin] FATAL: ...``)."""
    lines = [line for line in text.splitlines() if "INFO:" not in line]
    return _STAMP.sub("", lines[0]) if lines else ""


def test_every_flag_of_nsqadmin_with_its_type_and_default() -> None:
    real = parse_usage(run_real("--help").stderr)
    ours = parse_usage(admin_flagset().usage())
    assert len(real) == 26
    # fakensq's own, opt-in: the Faults page's buttons for ``fakensq proxy``.
    assert ours.keys() - real.keys() == {"proxy-http-address"}
    assert ours.keys() >= real.keys()
    for name, (kind, default) in real.items():
        assert ours[name] == (kind, default), name


def test_help_explains_the_flags_that_only_matter_to_nsqadmins_own_pages() -> None:
    usage = admin_flagset().usage()
    for flag in ("statsd-prefix", "statsd-gauge-format", "statsd-counter-format", "graphite-url"):
        block = usage.split(f"  -{flag} ")[1].split("\n  -")[0]
        assert "here:" in block, flag


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--lookupd-http-address=127.0.0.1:1", "--nsqd-http-address=127.0.0.1:2"],
        ["--lookupd-http-address=nohost"],
        ["--lookupd-http-address=127.0.0.1:99999"],
        ["--lookupd-http-address=http://127.0.0.1:4161"],
        ["--nsqd-http-address=[::1:4151"],
        ["--lookupd-http-address=127.0.0.1:1", "--http-client-tls-cert=/x"],
        ["--lookupd-http-address=127.0.0.1:1", "--allow-config-from-cidr=bad"],
        ["--lookupd-http-address=127.0.0.1:1", "--config=/nonexistent/nsqadmin.cfg"],
        ["--lookupd-http-address=127.0.0.1:1", "--http-client-tls-root-ca-file=/nonexistent"],
        ["--lookupd-http-address=127.0.0.1:1", "--http-address=badaddr"],
        ["--no-such-flag"],
        ["--statsd-interval=xx"],
        ["--log-level=bogus"],
        ["--proxy-graphite=maybe"],
        ["--http-address"],
    ],
)
def test_bad_command_lines_fail_as_nsqadmin_fails(args: list[str]) -> None:
    real, fake = run_real(*args), run_fake(*args)
    assert fake.returncode == real.returncode, fake.stderr
    assert first_line(fake.stderr) == first_line(real.stderr)
    if real.returncode == 2:  # the usage follows, as Go's flag package prints it
        ours = parse_usage(fake.stderr)
        # with fakensq's one opt-in flag of its own (the Faults page's proxy buttons)
        assert ours.pop("proxy-http-address") == ("value", "")
        assert ours == parse_usage(real.stderr)


def test_version() -> None:
    real, fake = run_real("--version"), run_fake("-version")
    assert fake.returncode == real.returncode == 0
    assert fake.stdout.split(" (")[0] == real.stdout.split(" (")[0] == "nsqadmin v1.3.0"


def test_help_exits_zero() -> None:
    assert admin_main(["-h"]) == 0
    assert admin_main(["--help"]) == 0


def test_go_flag_forms() -> None:
    fs = admin_flagset()
    values, rest = fs.parse(
        [
            "-lookupd-http-address=127.0.0.1:1",
            "--lookupd-http-address",
            "127.0.0.1:2",
            "--proxy-graphite",
            "-http-client-tls-insecure-skip-verify=false",
            "--statsd-interval=1m30s",
            "-admin-user",
            "alice",
            "--admin-user=bob",
            "rest",
        ]
    )
    options = admin_options_from_flags(values)
    assert options.nsqlookupd_http_addresses == ["127.0.0.1:1", "127.0.0.1:2"]
    assert options.proxy_graphite is True
    assert options.http_client_tls_insecure_skip_verify is False
    assert options.statsd_interval == 90.0
    assert options.admin_users == ["alice", "bob"]
    assert rest == ["rest"]


def test_defaults_are_nsqadmins() -> None:
    options = admin_options_from_flags({})
    assert options == AdminOptions()
    assert options.http_address == "0.0.0.0:4171"
    assert options.log_prefix == "[nsqadmin] "


_OPTIONS = [
    "log_level",
    "log_prefix",
    "http_address",
    "base_path",
    "dev_static_dir",
    "graphite_url",
    "proxy_graphite",
    "statsd_prefix",
    "statsd_counter_format",
    "statsd_gauge_format",
    "statsd_interval",
    "nsqlookupd_http_addresses",
    "nsqd_http_addresses",
    "http_client_connect_timeout",
    "http_client_request_timeout",
    "http_client_tls_insecure_skip_verify",
    "http_client_tls_root_ca_file",
    "http_client_tls_cert",
    "http_client_tls_key",
    "allow_config_from_cidr",
    "notification_http_endpoint",
    "acl_http_header",
    "admin_users",
    "verbose",
    "config",
]


async def _config_answers(address: str, base: str) -> dict[str, tuple[int, str]]:
    answers = {}
    async with httpx.AsyncClient() as http:
        for name in _OPTIONS:
            r = await http.get(f"http://{address}{base}/config/{name}")
            answers[name] = (r.status_code, r.text)
    return answers


async def _serve_and_read(
    argv: list[str], address: str, base: str, real: bool
) -> dict[str, tuple[int, str]]:
    if real:
        binary = reference.require("nsqadmin")
        proc = await trio.lowlevel.open_process(
            [str(binary), *argv], stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL
        )
    else:
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "fakensq", "admin", *argv],
            stderr=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
    try:
        with trio.fail_after(20):
            async with httpx.AsyncClient() as http:
                while True:
                    try:
                        if (await http.get(f"http://{address}{base}/ping")).status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    await trio.sleep(0.02)  # waiting for another process to listen
        return await _config_answers(address, base)
    finally:
        proc.terminate()
        with trio.move_on_after(10):
            await proc.wait()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_config_file_and_flags_resolve_as_in_nsqadmin(tmp_path: Path) -> None:
    """A --config file, overridden by flags, gives the same /config answers."""
    answers = []
    for real in (True, False):
        port = free_port()
        config = tmp_path / f"nsqadmin-{real}.cfg"
        config.write_text(
            f'http_address = "127.0.0.1:{port}"\n'
            'nsqlookupd_http_addresses = ["127.0.0.1:4161", "127.0.0.1:4261"]\n'
            'statsd_interval = "30s"\n'
            "http_client_connect_timeout = 1500\n"
            'admin_users = ["bob"]\n'
            'log_level = "debug"\n'
            'base_path = "/admin/"\n'
            "proxy_graphite = true\n"
            'graphite_url = "http://127.0.0.1:1"\n'
            "unknown_key = 1\n"
        )
        argv = [f"--config={config}", "--statsd-prefix=x.%s", "--log-prefix=[a] "]
        answers.append(await _serve_and_read(argv, f"127.0.0.1:{port}", "/admin", real))
    real_answers, fake_answers = answers
    for name in _OPTIONS:
        if name == "http_address":
            continue  # each had its own port
        assert fake_answers[name] == real_answers[name], name
