"""``trionsq stat``: nsq_stat's table, from nsqds or through lookupd."""

from __future__ import annotations

import pytest

from fakensq import NSQD, Cluster
from trionsq.tools.stat import ChannelTotals, format_header, format_row

from .helpers import create_channel, publish, run_tool

HEADER = [
    "------rate------+----------------depth----------------+--------------metadata---------------",
    "ingress  egress |   total     mem    disk inflt   def |     req     t-o         msgs clients",
]


def test_header_and_row_layout_match_nsq_stat() -> None:
    assert format_header().splitlines() == HEADER
    now = ChannelTotals(
        depth=7, memory_depth=7, in_flight_count=2, message_count=30, client_count=1
    )
    before = ChannelTotals(depth=2, message_count=10)
    # 20 in over 2s: ingress 10/s; 20 - 5 (depth grew by 5) out: egress 7/s.
    assert format_row(now, before, 2.0) == (
        "     10       7 |       7       7       0     2     0 |       0       0           30       1"
    )


def test_stat_prints_count_rows(nsqd: NSQD) -> None:
    publish(nsqd.http_address, "t", [b"a", b"b", b"c"])
    create_channel(nsqd.http_address, "t", "c")
    result = run_tool(
        "stat",
        "--topic",
        "t",
        "--channel",
        "c",
        "--nsqd-http-address",
        nsqd.http_address,
        "--count",
        "2",
        "--interval",
        "50ms",
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.decode().splitlines()
    assert lines[:2] == HEADER
    assert len(lines) == 4
    for row in lines[2:]:
        cols = row.split()
        assert (cols[2], cols[8]) == ("|", "|")
        # total, mem, disk ... msgs, clients
        assert cols[3:6] + cols[11:] == ["3", "3", "0", "3", "0"]


@pytest.mark.nsq_cluster(nsqd=2, lookupd=1)
def test_stat_sums_the_nsqds_found_through_lookupd(nsq_cluster: Cluster) -> None:
    for address in nsq_cluster.nsqd_http_addresses:
        publish(address, "t", [b"a", b"b"])
        create_channel(address, "t", "c")
    result = run_tool(
        "stat",
        "--topic",
        "t",
        "--channel",
        "c",
        "--lookupd-http-address",
        nsq_cluster.lookupd_http_addresses[0],
        "--count",
        "1",
        "--interval",
        "10ms",
    )
    assert result.returncode == 0, result.stderr
    row = result.stdout.decode().splitlines()[2].split()
    assert row[3] == "4" and row[11] == "4"


def test_stat_unknown_channel_is_an_error(nsqd: NSQD) -> None:
    publish(nsqd.http_address, "t", [b"a"])
    result = run_tool(
        "stat",
        "--topic",
        "t",
        "--channel",
        "nope",
        "--nsqd-http-address",
        nsqd.http_address,
        "--count",
        "1",
    )
    assert result.returncode == 1
    assert "failed to find channel(nope) in stats metadata for topic(t)" in result.stderr.decode()
