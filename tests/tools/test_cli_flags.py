"""Every tool has --help, rejects bad flags (exit 2) and unreachable nodes (exit 1)."""

from __future__ import annotations

import pytest

from fakensq import NSQD

from .helpers import dead_address, run_tool

TOOLS = {
    "tail": [
        "--topic",
        "--channel",
        "--nsqd-tcp-address",
        "--lookupd-http-address",
        "-n",
        "--print-topic",
        "--tls-root-ca-file",
        "--auth-secret",
    ],
    "to-file": [
        "--filename-format",
        "--datetime-format",
        "--rotate-interval",
        "--rotate-size",
        "--gzip",
        "--gzip-level",
        "--output-dir",
        "--work-dir",
    ],
    "pub": ["--topic", "--nsqd-tcp-address", "--delimiter", "--rate"],
    "stat": [
        "--topic",
        "--channel",
        "--nsqd-http-address",
        "--lookupd-http-address",
        "--status-every",
        "--count",
    ],
    "to-nsq": ["--destination-nsqd-tcp-address", "--destination-topic"],
    "to-http": ["--get", "--post", "--mode", "--content-type", "--http-timeout"],
}


def test_top_level_help_lists_every_tool() -> None:
    result = run_tool("--help")
    assert result.returncode == 0
    for name in TOOLS:
        assert name in result.stdout.decode()


@pytest.mark.parametrize("tool", list(TOOLS))
def test_help(tool: str) -> None:
    result = run_tool(tool, "--help")
    assert result.returncode == 0, result.stderr
    text = result.stdout.decode()
    for flag in TOOLS[tool]:
        assert flag in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["tail", "--bogus"], "unrecognized arguments: --bogus"),
        (["tail", "--nsqd-tcp-address", "127.0.0.1:4150"], "--topic is required"),
        (["tail", "--topic", "t"], "--nsqd-tcp-address or --lookupd-http-address required"),
        (
            ["tail", "--topic", "t", "--nsqd-tcp-address", "a:1", "--lookupd-http-address", "b:2"],
            "not both",
        ),
        (
            ["tail", "--topic", "bad topic!", "--nsqd-tcp-address", "127.0.0.1:4150"],
            "invalid topic name",
        ),
        (["tail", "--topic", "t", "--nsqd-tcp-address", "nonsense"], "invalid address"),
        (["tail", "--topic", "t", "--nsqd-tcp-address", "h:1", "-n", "x"], "invalid integer"),
        (
            ["tail", "--topic", "t", "--nsqd-tcp-address", "h:1", "--consumer-opt", "nope=1"],
            "unknown option 'nope'",
        ),
        (
            ["tail", "--topic", "t", "--nsqd-tcp-address", "h:1", "--tls-cert", "/no/such"],
            "tls_cert",
        ),
        (
            ["to-file", "--topic", "t", "--nsqd-tcp-address", "h:1", "--gzip-level", "12"],
            "--gzip-level",
        ),
        (
            [
                "to-file",
                "--topic",
                "t",
                "--nsqd-tcp-address",
                "h:1",
                "--gzip",
                "--filename-format",
                "<TOPIC>.log",
            ],
            "missing <REV>",
        ),
        (
            ["to-file", "--topic", "t", "--nsqd-tcp-address", "h:1", "--rotate-interval", "soon"],
            "invalid duration",
        ),
        (["pub", "--nsqd-tcp-address", "h:1"], "--topic"),
        (["pub", "--topic", "t"], "--nsqd-tcp-address required"),
        (
            ["pub", "--topic", "t", "--nsqd-tcp-address", "h:1", "--delimiter", "ab"],
            "single character",
        ),
        (["stat", "--topic", "t", "--channel", "c"], "required"),
        (
            ["stat", "--topic", "t", "--channel", "c", "--nsqd-http-address", "http://h:1"],
            "should not contain scheme",
        ),
        (
            ["to-nsq", "--topic", "t", "--nsqd-tcp-address", "h:1"],
            "--destination-nsqd-tcp-address required",
        ),
        (["to-http", "--topic", "t", "--nsqd-tcp-address", "h:1"], "--get or --post required"),
        (
            [
                "to-http",
                "--topic",
                "t",
                "--nsqd-tcp-address",
                "h:1",
                "--get",
                "http://x/%s",
                "--post",
                "http://y/",
            ],
            "not both",
        ),
        (
            ["to-http", "--topic", "t", "--nsqd-tcp-address", "h:1", "--post", "ftp://y/"],
            "http(s) URL",
        ),
        (
            [
                "to-http",
                "--topic",
                "t",
                "--nsqd-tcp-address",
                "h:1",
                "--post",
                "http://y/",
                "--mode",
                "hostpool",
            ],
            "invalid choice",
        ),
    ],
)
def test_bad_flags_exit_2_with_a_clear_message(args: list[str], message: str) -> None:
    result = run_tool(*args)
    assert result.returncode == 2, result
    assert message in result.stderr.decode()


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
            "{nsqd}",
            "--destination-nsqd-tcp-address",
            "{dead}",
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
    dead = dead_address()
    filled = [a.format(dead=dead, nsqd=nsqd.tcp_address, tmp=tmp_path) for a in args]
    result = run_tool(*filled, input=b"x\n")
    assert result.returncode == 1, result
    err = result.stderr.decode()
    assert f"trionsq {args[0]}: error:" in err
    assert "Traceback" not in err
