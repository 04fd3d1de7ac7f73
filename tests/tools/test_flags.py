"""Go's flag syntax (trionsq.tools.flags): every form Go accepts, Go's errors,
and no command line, however odd, ends in anything but a parse or a FlagError."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trionsq.tools.flags import (
    FlagError,
    FlagSet,
    HelpRequested,
    format_duration,
    go_int,
    seconds_or_duration,
)


def flag_set() -> FlagSet:
    flags = FlagSet("t")
    flags.string("topic", "", "a topic")
    flags.strings("address", "repeatable")
    flags.int("n", 0, "a count")
    flags.float("sample", 1.0, "a fraction")
    flags.duration("interval", 2.0, "a duration", plain_seconds=True)
    flags.bool("gzip", False, "a switch")
    return flags


@pytest.mark.parametrize(
    "argv",
    [
        ["-topic=a", "-n=3", "-gzip", "-interval=1m30s", "-sample=0.5"],
        ["-topic", "a", "-n", "3", "-gzip", "-interval", "90s", "-sample", "0.5"],
        ["--topic=a", "--n=3", "--gzip=true", "--interval=1.5m", "--sample=.5"],
        ["--topic", "a", "--n", "0x3", "--gzip=1", "--interval", "90", "--sample", "5e-1"],
    ],
)
def test_every_form_go_accepts(argv: list[str]) -> None:
    args = flag_set().parse_args(argv)
    assert (args.topic, args.n, args.gzip, args.interval, args.sample) == ("a", 3, True, 90.0, 0.5)


def test_defaults_repetition_last_wins_and_stopping() -> None:
    flags = flag_set()
    values, ignored = flags.parse(
        ["--address=a", "-address", "b", "-topic=x", "-topic=y", "--gzip=false", "rest", "-n=9"]
    )
    args = flags.namespace(values)
    assert args.address == ["a", "b"] and args.topic == "y" and args.gzip is False
    assert args.n == 0 and ignored == ["rest", "-n=9"]  # stopped at the first non-flag
    assert flag_set().parse(["--", "-n=1"])[1] == ["-n=1"]
    assert flag_set().parse_args(["-topic", "-n"]).topic == "-n"  # a value may start with -
    assert flag_set().parse_args(["-topic="]).topic == ""


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-bogus"], "flag provided but not defined: -bogus"),
        (["--n"], "flag needs an argument: -n"),
        (["-n=x"], 'invalid value "x" for flag -n: parse error'),
        (["-n=1.5"], 'invalid value "1.5" for flag -n: parse error'),
        (["-interval=5x"], 'invalid value "5x" for flag -interval: parse error'),
        (["-gzip=yes"], 'invalid boolean value "yes" for -gzip: parse error'),
        (["---n=1"], "bad flag syntax: ---n=1"),
        (["-=1"], "bad flag syntax: -=1"),
        (["-sample=1__0"], 'invalid value "1__0" for flag -sample: parse error'),
        (["-sample=1e400"], 'invalid value "1e400" for flag -sample: value out of range'),
        (["-n=1e3"], 'invalid value "1e3" for flag -n: parse error'),
        (
            ["-n=0x8000000000000000"],
            'invalid value "0x8000000000000000" for flag -n: value out of range',
        ),
    ],
)
def test_go_s_errors(argv: list[str], message: str) -> None:
    with pytest.raises(FlagError, match="^" + message.replace(".", r"\.") + "$"):
        flag_set().parse_args(argv)


def test_go_s_float_forms() -> None:
    """strconv.ParseFloat's forms, as nsq_to_http's --sample takes them."""
    for text, value in [("1_0", 10.0), ("0x1p-2", 0.25), ("inf", float("inf")), ("5e-1", 0.5)]:
        assert flag_set().parse_args([f"-sample={text}"]).sample == value


def test_usage_as_go_prints_it() -> None:
    assert flag_set().usage().splitlines() == [
        "Usage of t:",
        "  -address value",
        "    \trepeatable",
        "  -gzip",
        "    \ta switch",
        "  -interval duration",
        "    \ta duration (default 2s)",
        "  -n int",
        "    \ta count",
        "  -sample float",
        "    \ta fraction (default 1)",
        "  -topic string",
        "    \ta topic",
    ]


@pytest.mark.parametrize(
    ("text", "value"),
    [("010", 8), ("0x1F", 31), ("0o17", 15), ("0b101", 5), ("1_000", 1000), ("-12", -12)],
)
def test_go_integers(text: str, value: int) -> None:
    assert go_int(text) == value


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("300ms", 0.3), ("1h30m", 5400.0), ("-1.5s", -1.5), ("0", 0.0), ("2.5", 2.5), ("1µs", 1e-6)],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert seconds_or_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(30, "30s"), (60, "1m0s"), (3600, "1h0m0s"), (0.25, "250ms"), (90, "1m30s")],
)
def test_durations_shown_as_go_shows_them(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@given(st.lists(st.text(max_size=12), max_size=8))
def test_any_command_line_parses_or_is_refused(argv: list[str]) -> None:
    flags = flag_set()
    try:
        flags.parse_args(argv)
    except FlagError as exc:
        assert str(exc)
    except HelpRequested:  # -h/-help
        assert {"-h", "--h", "-help", "--help"} & {a.partition("=")[0] for a in argv}
