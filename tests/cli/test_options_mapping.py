"""nsqd/nsqlookupd flags and --config files mapped onto fakensq's options."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from fakensq.cli import (
    ConfigError,
    GoLogFormatter,
    nsqd_flagset,
    nsqd_options_from_flags,
    nsqlookupd_flagset,
    nsqlookupd_options_from_flags,
)
from fakensq.nsqd.options import (
    TLS_NOT_REQUIRED,
    TLS_REQUIRED,
    TLS_REQUIRED_EXCEPT_HTTP,
    NSQDOptions,
)
from trionsq.tools.flags import FlagError


def nsqd(*args: str) -> NSQDOptions:
    return nsqd_options_from_flags(nsqd_flagset().parse(list(args))[0])


def test_defaults_are_nsqdoptions_defaults_but_the_listeners() -> None:
    # The command binds as nsqd v1.3.0 does; NSQD() in a test stays on loopback.
    defaults = NSQDOptions()
    options = nsqd()
    assert (options.tcp_address, options.http_address, options.https_address) == (
        "0.0.0.0:4150",
        "0.0.0.0:4151",
        "0.0.0.0:4152",
    )
    listeners = {"tcp_address": "", "http_address": "", "https_address": ""}
    assert options.replace(**listeners) == defaults.replace(**listeners)


def test_every_flag_maps_onto_a_real_field() -> None:
    fields = set(NSQDOptions.__dataclass_fields__)
    ignored = {"version", "config", "verbose", "worker-id"}
    for flag in nsqd_flagset().flags.values():
        if flag.name in ignored:
            assert flag.dest is None
        else:
            assert flag.dest in fields, flag.name


def test_values_and_units() -> None:
    options = nsqd(
        "--lookupd-tcp-address=a:4160",
        "--lookupd-tcp-address",
        "b:4160",
        "--msg-timeout=1m30s",
        "--max-msg-size",
        "0x100000",
        "--output-buffer-timeout=250ms",
        "--snappy=false",
        "--e2e-processing-latency-percentile=0.99,0.5",
        "--e2e-processing-latency-percentile=1.0",
        "--log-level=WARN",
        "--tls-min-version=TLS1.2",
        "--node-id=7",
        "--auth-http-address=auth:80",
    )
    assert options.lookupd_tcp_addresses == ["a:4160", "b:4160"]
    assert options.msg_timeout == 90.0
    assert options.max_msg_size == 1024 * 1024
    assert options.output_buffer_timeout == 0.25
    assert options.snappy is False
    assert options.e2e_processing_latency_percentiles == [1.0, 0.99, 0.5]  # largest first
    assert options.log_level == "warn"
    assert options.tls_min_version == "tls1.2"
    assert options.node_id == 7
    assert options.auth_http_addresses == ["auth:80"]


@pytest.mark.parametrize(
    ("args", "value"),
    [
        ([], TLS_NOT_REQUIRED),
        (["--tls-required"], TLS_REQUIRED),
        (["--tls-required=tcp-https"], TLS_REQUIRED_EXCEPT_HTTP),
        (["--tls-required=false"], TLS_NOT_REQUIRED),
    ],
)
def test_tls_required(args: list[str], value: int) -> None:
    assert nsqd(*args).tls_required == value


def test_bad_custom_values() -> None:
    with pytest.raises(
        FlagError, match=r"invalid value \"x\" for flag -log-level: invalid log level"
    ):
        nsqd("--log-level=x")
    with pytest.raises(FlagError, match='unknown tlsVersionOption "tls9"'):
        nsqd("--tls-min-version", "tls9")


def test_config_file_and_precedence(tmp_path: Path) -> None:
    config = tmp_path / "nsqd.cfg"
    config.write_text(
        'msg_timeout = "5s"\n'
        "sync_timeout = 1500\n"  # integers are milliseconds
        "max_rdy_count = 100\n"
        "mem_queue_size = 7\n"
        'nsqlookupd_tcp_addresses = ["l1:4160"]\n'
        "tls_required = true\n"
        "id = 12\n"
        'unknown_key = "ignored"\n'
    )
    options = nsqd(f"--config={config}", "--max-rdy-count=200")
    assert options.msg_timeout == 5.0
    assert options.sync_timeout == 1.5
    assert options.max_rdy_count == 200  # the command line wins
    assert options.mem_queue_size == 7
    assert options.lookupd_tcp_addresses == ["l1:4160"]
    assert options.tls_required == TLS_REQUIRED
    assert options.node_id == 12


def test_bad_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="failed to load config file"):
        nsqd(f"--config={tmp_path / 'missing.cfg'}")
    bad = tmp_path / "bad.cfg"
    bad.write_text("msg_timeout = [")
    with pytest.raises(ConfigError):
        nsqd(f"--config={bad}")


def test_nsqlookupd_flags(tmp_path: Path) -> None:
    config = tmp_path / "nsqlookupd.cfg"
    config.write_text('tombstone_lifetime = "10s"\nbroadcast_address = "lk"\n')
    values = nsqlookupd_flagset().parse(
        [f"-config={config}", "-inactive-producer-timeout=1m", "--tcp-address=127.0.0.1:0"]
    )[0]
    options = nsqlookupd_options_from_flags(values)
    assert options.inactive_producer_timeout == 60.0
    assert options.tombstone_lifetime == 10.0
    assert options.broadcast_address == "lk"
    assert options.tcp_address == "127.0.0.1:0"


def test_go_log_format() -> None:
    record = logging.LogRecord("fakensq.nsqd", logging.WARNING, "", 0, "hello %s", ("x",), None)
    record.created = 1700000000.123456
    text = GoLogFormatter("[nsqd] ").format(record)
    assert text.startswith("[nsqd] 2023/11/")
    assert text.endswith(" WARNING: hello x")
    record.nsq_prefix = "[nsqlookupd] "
    assert GoLogFormatter("[nsqd] ").format(record).startswith("[nsqlookupd] ")
