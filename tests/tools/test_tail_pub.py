"""``trionsq pub`` and ``trionsq tail`` against a fakensq nsqd."""

from __future__ import annotations

import pytest

from fakensq import NSQD, Cluster

from ..support.stats import channel_stats, topic_depth
from .helpers import create_channel, publish, run_tool


def test_pub_publishes_stdin_lines_and_tail_prints_them_in_order(nsqd: NSQD) -> None:
    lines = [f"line {i}".encode() for i in range(300)]
    result = run_tool(
        "pub",
        "--topic",
        "events",
        "--nsqd-tcp-address",
        nsqd.tcp_address,
        input=b"\n".join(lines) + b"\n\n",  # the empty record is skipped
    )
    assert result.returncode == 0, result.stderr
    assert "published=300" in result.stderr.decode()  # the plain summary, stdout not a TTY
    assert topic_depth(nsqd.http_address, "events") == 300

    tail = run_tool(
        "tail",
        "--topic",
        "events",
        "--channel",
        "reader",
        "-n",
        "300",
        "--nsqd-tcp-address",
        nsqd.tcp_address,
    )
    assert tail.returncode == 0, tail.stderr
    assert tail.stdout.splitlines() == lines
    stats = channel_stats(nsqd.http_address, "events", "reader")
    assert stats is not None and stats["depth"] == 0


def test_pub_delimiter_and_rate(nsqd: NSQD) -> None:
    result = run_tool(
        "pub",
        "--topic",
        "csv",
        "--nsqd-tcp-address",
        nsqd.tcp_address,
        "--delimiter",
        ",",
        "--rate",
        "200",
        input=b"a,b,,c",
    )
    assert result.returncode == 0, result.stderr
    tail = run_tool(
        "tail",
        "--topic",
        "csv",
        "--channel",
        "c",
        "-n",
        "3",
        "--nsqd-tcp-address",
        nsqd.tcp_address,
    )
    assert tail.stdout == b"a\nb\nc\n"


def test_pub_goes_to_every_nsqd_like_to_nsq(nsqd_factory: object) -> None:
    first, second = nsqd_factory(), nsqd_factory()  # type: ignore[operator]
    result = run_tool(
        "pub",
        "--topic",
        "fan",
        "--nsqd-tcp-address",
        first.tcp_address,
        "--nsqd-tcp-address",
        second.tcp_address,
        input=b"x\ny\n",
    )
    assert result.returncode == 0, result.stderr
    assert topic_depth(first.http_address, "fan") == 2
    assert topic_depth(second.http_address, "fan") == 2


def test_tail_print_topic_over_several_topics(nsqd: NSQD) -> None:
    publish(nsqd.http_address, "alpha", [b"one", b"uno"])
    publish(nsqd.http_address, "beta", [b"two"])
    tail = run_tool(
        "tail",
        "--topic",
        "alpha",
        "--topic",
        "beta",
        "--print-topic",
        "-n",
        "2",  # as nsq_tail counts it: per topic, so alpha's two end the run
        "--nsqd-tcp-address",
        nsqd.tcp_address,
    )
    assert tail.returncode == 0, tail.stderr
    lines = tail.stdout.splitlines()
    assert lines[:1] != [] and {b"alpha | one", b"alpha | uno"} <= set(lines)
    assert set(lines) <= {b"alpha | one", b"alpha | uno", b"beta | two"}


def test_tail_default_channel_is_ephemeral(nsqd: NSQD) -> None:
    publish(nsqd.http_address, "eph", [b"m"])
    tail = run_tool("tail", "--topic", "eph", "-n", "1", "--nsqd-tcp-address", nsqd.tcp_address)
    assert tail.returncode == 0, tail.stderr
    assert tail.stdout == b"m\n"


@pytest.mark.nsq_cluster(nsqd=2, lookupd=1)
def test_tail_discovers_nsqds_through_lookupd(nsq_cluster: Cluster) -> None:
    for i, address in enumerate(nsq_cluster.nsqd_http_addresses):
        publish(address, "found", [f"from {i}".encode()])
        create_channel(address, "found", "t")
    tail = run_tool(
        "tail",
        "--topic",
        "found",
        "--channel",
        "t",
        "-n",
        "2",
        "--lookupd-http-address",
        nsq_cluster.lookupd_http_addresses[0],
    )
    assert tail.returncode == 0, tail.stderr
    assert sorted(tail.stdout.splitlines()) == [b"from 0", b"from 1"]
