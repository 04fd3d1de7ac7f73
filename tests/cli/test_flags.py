"""Go flag-package semantics of the daemons' flags (trionsq.tools.flags, as
fakensq's nsqd declares them)."""

from __future__ import annotations

import pytest

from trionsq.tools.flags import (
    FlagError,
    FlagSet,
    HelpRequested,
    format_duration,
    go_duration,
    go_int,
)


def make() -> FlagSet:
    fs = FlagSet("nsqd")
    fs.string("tcp-address", "0.0.0.0:4150", "<addr>:<port> to listen on for TCP clients")
    fs.bool("snappy", True, "enable snappy feature negotiation (client compression)")
    fs.bool("verbose", False, "[deprecated] has no effect, use --log-level")
    fs.int("max-rdy-count", 2500, "maximum RDY count for a client")
    fs.duration("msg-timeout", 60.0, "default duration to wait before auto-requeing a message")
    fs.strings("lookupd-tcp-address", "lookupd TCP address (may be given multiple times)")
    return fs


@pytest.mark.parametrize(
    "args",
    [
        ["-tcp-address", "h:1"],
        ["-tcp-address=h:1"],
        ["--tcp-address", "h:1"],
        ["--tcp-address=h:1"],
    ],
)
def test_value_spellings(args: list[str]) -> None:
    assert make().parse(args) == ({"tcp-address": "h:1"}, [])


def test_bools_never_consume_the_next_argument() -> None:
    values, rest = make().parse(["--snappy", "false", "--verbose"])
    assert values == {"snappy": True}
    assert rest == ["false", "--verbose"]  # parsing stops at the first non-flag
    assert make().parse(["--snappy=false", "-verbose=T"])[0] == {"snappy": False, "verbose": True}


def test_lists_accumulate_and_double_dash_ends_flags() -> None:
    values, rest = make().parse(
        ["--lookupd-tcp-address", "a:1", "-lookupd-tcp-address=b:2", "--", "-x"]
    )
    assert values == {"lookupd-tcp-address": ["a:1", "b:2"]}
    assert rest == ["-x"]
    assert make().parse(["-", "--snappy"]) == ({}, ["-", "--snappy"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nope"], "flag provided but not defined: -nope"),
        (["-x=1"], "flag provided but not defined: -x"),
        (["--max-rdy-count", "x"], 'invalid value "x" for flag -max-rdy-count: parse error'),
        (
            ["--max-rdy-count=99999999999999999999"],
            'invalid value "99999999999999999999" for flag -max-rdy-count: value out of range',
        ),
        (["--msg-timeout", "60"], 'invalid value "60" for flag -msg-timeout: parse error'),
        (["--snappy=maybe"], 'invalid boolean value "maybe" for -snappy: parse error'),
        (["--tcp-address"], "flag needs an argument: -tcp-address"),
        (["---x"], "bad flag syntax: ---x"),
        (["-=x"], "bad flag syntax: -=x"),
    ],
)
def test_errors(args: list[str], message: str) -> None:
    with pytest.raises(FlagError) as info:
        make().parse(args)
    assert str(info.value) == message


@pytest.mark.parametrize("arg", ["-h", "--h", "-help", "--help"])
def test_help(arg: str) -> None:
    with pytest.raises(HelpRequested):
        make().parse([arg])


def test_usage_is_go_printdefaults() -> None:
    assert make().usage() == (
        "Usage of nsqd:\n"
        "  -lookupd-tcp-address value\n"
        "    \tlookupd TCP address (may be given multiple times)\n"
        "  -max-rdy-count int\n"
        "    \tmaximum RDY count for a client (default 2500)\n"
        "  -msg-timeout duration\n"
        "    \tdefault duration to wait before auto-requeing a message (default 1m0s)\n"
        "  -snappy\n"
        "    \tenable snappy feature negotiation (client compression) (default true)\n"
        "  -tcp-address string\n"
        '    \t<addr>:<port> to listen on for TCP clients (default "0.0.0.0:4150")\n'
        "  -verbose\n"
        "    \t[deprecated] has no effect, use --log-level\n"
    )


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("60s", 60.0),
        ("1m30s", 90.0),
        ("250ms", 0.25),
        ("1h", 3600.0),
        ("1.5h", 5400.0),
        ("0", 0.0),
        ("-2s", -2.0),
        ("100us", 1e-4),
        ("10µs", 1e-5),
        ("1h2m3.5s", 3723.5),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "60", "s", "1x", "1.s.", ".s", "1m-2s"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(Exception, match="parse error"):
        go_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (60.0, "1m0s"),
        (2.0, "2s"),
        (0.25, "250ms"),
        (0.025, "25ms"),
        (900.0, "15m0s"),
        (3600.0, "1h0m0s"),
        (1.5, "1.5s"),
        (0.0, "0s"),
    ],
)
def test_format_durations(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize(
    ("text", "value"),
    [("10", 10), ("0x1f", 31), ("010", 8), ("0b11", 3), ("1_000", 1000), ("-5", -5), ("0", 0)],
)
def test_go_ints(text: str, value: int) -> None:
    assert go_int(text) == value
