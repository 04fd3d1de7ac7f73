"""Every tool has --help, rejects bad flags (exit 2) and unreachable nodes (exit 1)."""

from __future__ import annotations

import re

import pytest

from fakensq import NSQD

from ..support.ports import free_address
from .helpers import run_here, run_tool

#: Every flag each NSQ v1.3.0 tool lists in its --help (to_nsq has no -version;
#: ours does).
TOOLS = {
    "tail": "channel consumer-opt lookupd-http-address max-in-flight n nsqd-tcp-address "
    "print-topic topic version",
    "to-file": "channel consumer-opt datetime-format filename-format gzip gzip-level "
    "host-identifier http-client-connect-timeout http-client-request-timeout log-level "
    "log-prefix lookupd-http-address max-in-flight nsqd-tcp-address output-dir rotate-interval "
    "rotate-size skip-empty-files sync-interval topic topic-pattern topic-refresh version work-dir",
    "pub": "delimiter nsqd-tcp-address producer-opt rate topic version",
    "stat": "channel count http-client-connect-timeout http-client-request-timeout interval "
    "lookupd-http-address nsqd-http-address topic version",
    "to-nsq": "channel consumer-opt destination-nsqd-tcp-address destination-topic "
    "lookupd-http-address max-in-flight mode nsqd-tcp-address producer-opt require-json-field "
    "require-json-value status-every topic version whitelist-json-field",
    "to-http": "channel consumer-opt content-type get header http-client-connect-timeout "
    "http-client-request-timeout lookupd-http-address max-in-flight mode n nsqd-tcp-address "
    "post sample status-every topic version",
}


def listed_flags(help_text: str) -> set[str]:
    """The flags of a Go-style usage (lines ``  -name [type]``)."""
    return {
        line.split()[0].lstrip("-")
        for line in help_text.splitlines()
        if line.startswith("  -") and not line.startswith("   ")
    }


def test_top_level_help_lists_every_tool() -> None:
    result = run_here("--help")
    assert result.returncode == 0
    for name in TOOLS:
        assert name in result.stdout.decode()


@pytest.mark.parametrize("tool", list(TOOLS))
@pytest.mark.parametrize("form", ["--help", "-help", "-h"])
def test_help_lists_every_flag_of_the_go_tool(tool: str, form: str) -> None:
    result = run_here(tool, form)
    assert result.returncode == 0, result.stderr
    text = result.stdout.decode()
    assert set(TOOLS[tool].split()) <= listed_flags(text)
    assert f"Usage of trionsq {tool}:" in text
    # The header is the tool's docstring as plain text: no reStructuredText left.
    header = text.split("Usage of")[0]
    assert header.startswith(f"trionsq {tool}")
    assert "``" not in header and "::" not in header
    assert re.search(r":[a-z]+:`", header) is None


@pytest.mark.parametrize("tool", list(TOOLS))
def test_version(tool: str) -> None:
    for form in ("--version", "-version", "--version=true"):
        result = run_here(tool, form)
        assert result.returncode == 0, result.stderr
        assert result.stdout.decode().startswith(f"trionsq {tool} v")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["tail", "--bogus"], "flag provided but not defined: -bogus"),
        (["tail", "-n", "x"], 'invalid value "x" for flag -n: parse error'),
        (["tail", "--print-topic=maybe"], 'invalid boolean value "maybe" for -print-topic'),
        (["tail", "--topic"], "flag needs an argument: -topic"),
        (["tail", "---topic=t"], "bad flag syntax: ---topic=t"),
        (
            ["tail", "--consumer-opt=nope,1"],
            'invalid value "nope,1" for flag -consumer-opt: invalid option nope',
        ),
        (
            ["tail", "--consumer-opt=max_attempts,x"],
            'invalid value "max_attempts,x" for flag -consumer-opt: failed to coerce option',
        ),
        (
            ["to-file", "--rotate-interval", "soon"],
            'invalid value "soon" for flag -rotate-interval',
        ),
        (["to-file", "--rotate-size=1k"], 'invalid value "1k" for flag -rotate-size'),
        (["to-http", "--sample=x"], 'invalid value "x" for flag -sample'),
        (["pub", "--rate=1.5"], 'invalid value "1.5" for flag -rate'),
        (["stat", "--interval=2"], None),  # accepted: plain seconds (an addition)
    ],
)
def test_bad_flags_exit_2_with_go_s_message(args: list[str], message: str | None) -> None:
    result = run_here(*args, "--nsqd-http-address=http://x") if message is None else run_here(*args)
    if message is None:
        assert result.returncode == 1, result  # got past the flags
        return
    assert result.returncode == 2, result
    err = result.stderr.decode()
    assert err.splitlines()[0].startswith(message), err
    assert f"Usage of trionsq {args[0]}:" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["tail", "--nsqd-tcp-address", "127.0.0.1:4150"], "--topic required"),
        (["tail", "--topic", "t"], "--nsqd-tcp-address or --lookupd-http-address required"),
        (
            ["tail", "--topic", "t", "--nsqd-tcp-address", "a:1", "--lookupd-http-address", "b:2"],
            "use --nsqd-tcp-address or --lookupd-http-address not both",
        ),
        (["tail", "--topic", "bad topic!", "--nsqd-tcp-address", "a:1"], "invalid topic name"),
        (["tail", "--topic=t", "--channel=bad!", "--nsqd-tcp-address=a:1"], "invalid channel name"),
        (["tail", "--topic", "t", "--nsqd-tcp-address", "nonsense"], "invalid address"),
        (
            ["tail", "--topic", "t", "--nsqd-tcp-address", "h:1", "--tls-cert", "/no/such"],
            "tls_cert",
        ),
        (
            ["to-file", "--topic", "t", "--nsqd-tcp-address", "h:1", "--gzip-level", "12"],
            "invalid --gzip-level value (12), should be 1-9",
        ),
        (
            [
                "to-file",
                "--topic=t",
                "--nsqd-tcp-address=h:1",
                "--gzip",
                "--filename-format=<TOPIC>.log",
            ],
            "missing <REV> in --filename-format when gzip, rotation, or work dir enabled",
        ),
        (["to-file", "--nsqd-tcp-address=h:1"], "--topic or --topic-pattern required"),
        (
            ["to-file", "--topic-pattern=x", "--nsqd-tcp-address=h:1"],
            "--lookupd-http-address must be specified when no --topic specified",
        ),
        (["to-file", "--topic=t"], "--nsqd-tcp-address or --lookupd-http-address required."),
        (["pub", "--nsqd-tcp-address", "h:1"], "--topic required"),
        (["pub", "--topic", "t"], "--nsqd-tcp-address required"),
        (
            ["pub", "--topic=t", "--nsqd-tcp-address=h:1", "--delimiter=ab"],
            "--delimiter must be a single byte",
        ),
        (["stat", "--topic", "t"], "--topic and --channel are required"),
        (
            ["stat", "--topic", "t", "--channel", "c"],
            "--nsqd-http-address or --lookupd-http-address required",
        ),
        (
            ["stat", "--topic", "t", "--channel", "c", "--nsqd-http-address", "http://h:1"],
            "--nsqd-http-address error - address should not contain scheme",
        ),
        (
            ["stat", "--topic=t", "--channel=c", "--nsqd-http-address=h:1", "--count=0"],
            "--count should be positive",
        ),
        (
            ["to-nsq", "--topic", "t", "--nsqd-tcp-address", "h:1"],
            "--destination-nsqd-tcp-address required",
        ),
        (
            [
                "to-nsq",
                "--topic=t",
                "--nsqd-tcp-address=h:1",
                "--destination-nsqd-tcp-address=h:2",
                "--destination-topic=bad!",
            ],
            "--destination-topic is invalid",
        ),
        (["to-http", "--topic", "t", "--nsqd-tcp-address", "h:1"], "--get or --post required"),
        (
            [
                "to-http",
                "--topic=t",
                "--nsqd-tcp-address=h:1",
                "--get=http://x/%s",
                "--post=http://y/",
            ],
            "use --get or --post not both",
        ),
        (
            ["to-http", "--topic=t", "--nsqd-tcp-address=h:1", "--get=http://x/"],
            "invalid GET address - must be a printf string",
        ),
        (
            ["to-http", "--topic=t", "--nsqd-tcp-address=h:1", "--post=ftp://y/"],
            "invalid endpoint 'ftp://y/': unsupported protocol scheme",
        ),
        (
            ["to-http", "--topic=t", "--nsqd-tcp-address=h:1", "--post=http://y/", "--sample=2"],
            "--sample must be between 0.0 and 1.0",
        ),
        (
            ["to-http", "--topic=t", "--nsqd-tcp-address=h:1", "--post=http://y/", "--header=X"],
            "--header value format",
        ),
        (
            [
                "to-http",
                "--topic=t",
                "--nsqd-tcp-address=h:1",
                "--get=http://y/%s",
                "--content-type=a/b",
            ],
            "--content-type only used with --post",
        ),
    ],
)
def test_bad_values_exit_1_with_go_s_message(args: list[str], message: str) -> None:
    result = run_here(*args)
    assert result.returncode == 1, result
    err = result.stderr.decode()
    assert f"trionsq {args[0]}: error: {message}" in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "args",
    [
        ["tail", "--topic", "t", "--nsqd-tcp-address", "{dead}"],
        ["tail", "--topic", "t", "--lookupd-http-address", "{dead}"],
        ["to-file", "--topic", "t", "--nsqd-tcp-address", "{dead}", "--output-dir", "{tmp}"],
        ["pub", "--topic", "t", "--nsqd-tcp-address", "{dead}"],
        ["stat", "--topic", "t", "--channel", "c", "--nsqd-http-address", "{dead}", "--count", "1"],
        [
            "stat",
            "--topic",
            "t",
            "--channel",
            "c",
            "--lookupd-http-address",
            "{dead}",
            "--count",
            "1",
        ],
        [
            "to-nsq",
            "--topic",
            "t",
            "--nsqd-tcp-address",
            "{dead}",
            "--destination-nsqd-tcp-address",
            "{nsqd}",
        ],
        [
            "to-http",
            "--topic",
            "t",
            "--nsqd-tcp-address",
            "{dead}",
            "--post",
            "http://127.0.0.1:1/",
        ],
    ],
)
def test_unreachable_nodes_exit_1(args: list[str], nsqd: NSQD, tmp_path: object) -> None:
    dead = free_address()
    filled = [a.format(dead=dead, nsqd=nsqd.tcp_address, tmp=tmp_path) for a in args]
    result = run_tool(*filled, input=b"x\n")
    assert result.returncode == 1, result
    err = result.stderr.decode()
    assert f"trionsq {args[0]}: error:" in err
    assert "Traceback" not in err
    (line,) = [line for line in err.splitlines() if line.startswith(f"trionsq {args[0]}: error:")]
    # The address once, and what the operating system said (as Go's tools:
    # "dial tcp 127.0.0.1:4150: connect: connection refused").
    if args[0] != "pub":
        assert line.count(dead) == 1, line
        assert line.endswith(": connection refused") or "connection refused)" in line, line
    else:
        # pub connects through the Producer, whose text is the connection's
        # own (trionsq/connection.py: its messages are being changed apart);
        # the Producer no longer adds the address a second time.
        assert f"{dead}: {dead}" not in line, line
