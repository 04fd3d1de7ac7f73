"""nsqd's options, with real nsqd v1.3's defaults.

Field names are nsqd's flag names with ``-`` turned into ``_``; durations are in
seconds (floats), sizes in bytes.  The command line (``fakensq nsqd``) maps Go-style
flags onto these fields.
"""

from __future__ import annotations

import dataclasses
import hashlib
import socket
import zlib
from dataclasses import dataclass, field
from typing import Any

from ..version import BUILD, VERSION

__all__ = [
    "NSQDOptions",
    "VERSION",
    "default_node_id",
    "BUILD",
    "TLS_NOT_REQUIRED",
    "TLS_REQUIRED_EXCEPT_HTTP",
    "TLS_REQUIRED",
]


# --tls-required values, as nsqd keeps them.
TLS_NOT_REQUIRED = 0
TLS_REQUIRED_EXCEPT_HTTP = 1
TLS_REQUIRED = 2


def default_node_id(hostname: str | None = None) -> int:
    """nsqd's default ``--node-id``: crc32 of the md5 of the hostname, mod 1024."""
    name = socket.gethostname() if hostname is None else hostname
    return zlib.crc32(hashlib.md5(name.encode()).digest()) % 1024


@dataclass
class NSQDOptions:
    """Everything an nsqd can be configured with (nsqd v1.3 defaults)."""

    node_id: int = field(default_factory=lambda: default_node_id())
    log_level: str = "info"
    log_prefix: str = "[nsqd] "

    # Loopback by default (fakensq is a test double; real nsqd binds 0.0.0.0).
    tcp_address: str = "127.0.0.1:4150"
    http_address: str = "127.0.0.1:4151"
    https_address: str = ""
    broadcast_address: str = field(default_factory=socket.gethostname)
    broadcast_tcp_port: int = 0
    broadcast_http_port: int = 0
    lookupd_tcp_addresses: list[str] = field(default_factory=list)
    auth_http_addresses: list[str] = field(default_factory=list)
    auth_http_request_method: str = "get"
    http_client_connect_timeout: float = 2.0
    http_client_request_timeout: float = 5.0

    # diskqueue
    data_path: str = ""
    mem_queue_size: int = 10000
    max_bytes_per_file: int = 100 * 1024 * 1024
    sync_every: int = 2500
    sync_timeout: float = 2.0

    queue_scan_interval: float = 0.1
    queue_scan_refresh_interval: float = 5.0
    queue_scan_selection_count: int = 20
    queue_scan_worker_pool_max: int = 4
    queue_scan_dirty_percent: float = 0.25

    # msg and command options
    msg_timeout: float = 60.0
    max_msg_timeout: float = 15 * 60.0
    max_msg_size: int = 1024 * 1024
    max_body_size: int = 5 * 1024 * 1024
    max_req_timeout: float = 60 * 60.0
    client_timeout: float = 60.0

    # client overridable configuration options
    max_heartbeat_interval: float = 60.0
    max_rdy_count: int = 2500
    max_output_buffer_size: int = 64 * 1024
    max_output_buffer_timeout: float = 30.0
    min_output_buffer_timeout: float = 0.025
    output_buffer_timeout: float = 0.25
    max_channel_consumers: int = 0

    # statsd integration
    statsd_address: str = ""
    statsd_prefix: str = "nsq.%s"
    statsd_interval: float = 60.0
    statsd_mem_stats: bool = True
    statsd_udp_packet_size: int = 508
    statsd_exclude_ephemeral: bool = False

    # e2e message latency
    e2e_processing_latency_window_time: float = 10 * 60.0
    e2e_processing_latency_percentiles: list[float] = field(default_factory=list)

    # TLS config
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_auth_policy: str = ""
    tls_root_ca_file: str = ""
    tls_required: int = TLS_NOT_REQUIRED
    tls_min_version: str = "tls1.0"

    # compression
    deflate: bool = True
    max_deflate_level: int = 6
    snappy: bool = True

    # fakensq only: the seed of every random choice (message ids, client choice
    # within a channel, sampling), so that runs repeat exactly.
    seed: int | None = None
    # fakensq only: also serve the HTTP aliases nsqd v1.3.0 removed (/put, /mput,
    # /create_topic, ...), for scripts written against older nsqds.  Off, as in
    # v1.3.0: they answer 404 NOT_FOUND.
    legacy_http_aliases: bool = False
    # fakensq only: what /config/data_path shows when it is not data_path (the
    # nsqd command given no --data-path works in the current directory, as
    # nsqd does, and shows the empty flag); None: data_path itself.
    data_path_shown: str | None = None

    def replace(self, **changes: Any) -> NSQDOptions:
        return dataclasses.replace(self, **changes)

    @property
    def default_heartbeat_interval(self) -> float:
        """nsqd's heartbeat interval for clients that do not ask: client-timeout / 2."""
        return self.client_timeout / 2
