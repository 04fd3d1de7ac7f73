"""nsqd's ``/config/:opt``: every option name, its value as nsqd shows it (under
default and given flags), and ``PUT`` of the two options nsqd lets change
(``nsqlookupd_tcp_addresses``, ``log_level``), compared with nsqd v1.3.0."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import Conformance, Target
from .httpcheck import request

#: Every cfg name nsqd v1.3.0 answers, and names it refuses (flag names, Go
#: field names, options without a flag, fakensq-only options).
NAMES = [
    "id",
    "log_level",
    "log_prefix",
    "tcp_address",
    "http_address",
    "https_address",
    "broadcast_address",
    "broadcast_tcp_port",
    "broadcast_http_port",
    "nsqlookupd_tcp_addresses",
    "auth_http_addresses",
    "http_client_connect_timeout",
    "http_client_request_timeout",
    "data_path",
    "mem_queue_size",
    "max_bytes_per_file",
    "sync_every",
    "sync_timeout",
    "queue_scan_selection_count",
    "queue_scan_worker_pool_max",
    "msg_timeout",
    "max_msg_timeout",
    "max_msg_size",
    "max_body_size",
    "max_req_timeout",
    "max_heartbeat_interval",
    "max_rdy_count",
    "max_output_buffer_size",
    "max_output_buffer_timeout",
    "min_output_buffer_timeout",
    "output_buffer_timeout",
    "max_channel_consumers",
    "statsd_address",
    "statsd_prefix",
    "statsd_interval",
    "statsd_mem_stats",
    "statsd_udp_packet_size",
    "statsd_exclude_ephemeral",
    "e2e_processing_latency_window_time",
    "e2e_processing_latency_percentiles",
    "tls_cert",
    "tls_key",
    "tls_client_auth_policy",
    "tls_root_ca_file",
    "tls_required",
    "tls_min_version",
    "deflate",
    "max_deflate_level",
    "snappy",
    # refused
    "node_id",
    "lookupd_tcp_address",
    "auth_http_request_method",
    "queue_scan_interval",
    "queue_scan_refresh_interval",
    "queue_scan_dirty_percent",
    "client_timeout",
    "e2e_processing_latency_percentile",
    "deflate_enabled",
    "snappy_enabled",
    "verbose",
    "config",
    "version",
    "worker_id",
    "logger",
    "seed",
    "legacy_http_aliases",
    "MsgTimeout",
    "MSG_TIMEOUT",
    "msg-timeout",
    "msg_timeout%00",
    "%20msg_timeout",
]


def _masked(t: Target, name: str, answer: tuple[Any, ...]) -> tuple[Any, ...]:
    """The answer with what differs by construction masked: the data folder
    (each daemon has its own), the listen addresses (fakensq is given port 0,
    nsqd the port it will use) and the HTTP port inside the statsd prefix."""
    status, headers, body = answer
    if name in ("data_path", "tcp_address", "http_address") and status == 200 and body:
        body = f"<{name}>".encode()
    port = t.http_address.rpartition(":")[2].encode()
    if isinstance(body, bytes):
        body = body.replace(b"_" + port + b".", b"_<http_port>.")
        headers.pop("content-length", None)
    return status, headers, body


@pytest.mark.parametrize("name", NAMES)
async def test_get(conformance: Conformance, name: str) -> None:
    async def scenario(t: Target) -> Any:
        async with t.http() as http:
            return _masked(t, name, await request(http, "GET", f"/config/{name}"))

    await conformance.nsqd(scenario)


FLAG_SETS = [
    (
        "--msg-timeout=30s",
        "--max-msg-timeout=1h",
        "--max-req-timeout=90m",
        "--mem-queue-size=7",
        "--max-rdy-count=99",
        "--log-level=warn",
    ),
    (
        "--e2e-processing-latency-percentile=0.99,0.5",
        "--e2e-processing-latency-percentile=1.0",
        "--e2e-processing-latency-window-time=30s",
    ),
    (
        "--statsd-prefix=custom.%s.x",
        "--statsd-interval=5s",
        "--statsd-mem-stats=false",
        "--statsd-exclude-ephemeral",
        "--statsd-udp-packet-size=1000",
    ),
    ("--tls-min-version=tls1.2", "--deflate=false", "--snappy=false", "--max-deflate-level=1"),
    (
        "--broadcast-address=example.test",
        "--broadcast-tcp-port=1",
        "--broadcast-http-port=2",
        "--node-id=3",
        "--log-prefix=[x] ",
    ),
    ("--output-buffer-timeout=100ms", "--min-output-buffer-timeout=1ms", "--sync-every=1"),
    ("--statsd-prefix=", "--max-channel-consumers=2", "--queue-scan-worker-pool-max=1"),
]


@pytest.mark.parametrize("flags", FLAG_SETS, ids=lambda f: " ".join(f))
async def test_values_under_flags(conformance: Conformance, flags: tuple[str, ...]) -> None:
    names = NAMES[: NAMES.index("snappy") + 1]

    async def scenario(t: Target) -> Any:
        async with t.http() as http:
            return {
                name: _masked(t, name, await request(http, "GET", f"/config/{name}"))
                for name in names
            }

    await conformance.nsqd(scenario, *flags)


PUTS: list[tuple[str, bytes | None]] = [
    ("log_level", b"debug"),
    ("log_level", b"DEBUG"),
    ("log_level", b"Warn"),
    ("log_level", b"error"),
    ("log_level", b"fatal"),
    ("log_level", b"info\n"),
    ("log_level", b" info"),
    ("log_level", b"2"),
    ("log_level", b"nope"),
    ("log_level", b""),
    ("log_level", None),
    ("nsqlookupd_tcp_addresses", b"[]"),
    ("nsqlookupd_tcp_addresses", b"null"),
    ("nsqlookupd_tcp_addresses", b'["127.0.0.1:1"]'),
    ("nsqlookupd_tcp_addresses", b'["127.0.0.1:1", "127.0.0.1:1"]'),
    ("nsqlookupd_tcp_addresses", b'  ["127.0.0.1:1"]  '),
    ("nsqlookupd_tcp_addresses", b'"127.0.0.1:1"'),
    ("nsqlookupd_tcp_addresses", b"[1]"),
    ("nsqlookupd_tcp_addresses", b'["a", 1]'),
    ("nsqlookupd_tcp_addresses", b"{}"),
    ("nsqlookupd_tcp_addresses", b"nope"),
    ("nsqlookupd_tcp_addresses", b"[] x"),
    ("nsqlookupd_tcp_addresses", b""),
    ("msg_timeout", b"1"),
    ("msg_timeout", b""),
    ("nope", b"x"),
    ("nope", b""),
    ("log_level", b"x" * 11),
]


@pytest.mark.parametrize(("name", "body"), PUTS, ids=[f"{n}={b!r}" for n, b in PUTS])
async def test_put(conformance: Conformance, name: str, body: bytes | None) -> None:
    """A PUT's answer, then what GET shows (the value kept, or not)."""

    async def scenario(t: Target) -> Any:
        async with t.http() as http:
            put = await request(http, "PUT", f"/config/{name}", body)
            got = await request(http, "GET", f"/config/{name}")
            return put, got

    await conformance.nsqd(scenario, "--max-msg-size=10")
