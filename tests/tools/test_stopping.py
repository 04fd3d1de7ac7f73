"""Every tool leaves promptly on SIGTERM/SIGINT, requeuing what it could not
deliver; a second signal leaves at once.  And to-http does not stall with a
large --max-in-flight (the reported stall: 2,000 messages at 2,500 in flight)."""

from __future__ import annotations

import select
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fakensq import NSQD

from ..support.stats import channel_stats
from ..support.waiting import wait_until_blocking
from .helpers import command, create_channel, drained, publish, start_tool, stop_tool, track
from .recorder import recording

#: Generous for a loaded machine; a stuck tool never leaves at all.
PROMPT = 5.0


def stop_within(process: subprocess.Popen[bytes], seconds: float, sig: int) -> tuple[int, str]:
    started = time.monotonic()
    status, _, err = stop_tool(process, sig)
    elapsed = time.monotonic() - started
    assert elapsed < seconds, f"left {elapsed:.1f}s after the signal: {err}"
    return status, err


def wait_subscribed(nsqd: NSQD, topic: str, channel: str) -> None:
    def subscribed() -> bool:
        stats = channel_stats(nsqd.http_address, topic, channel)
        return stats is not None and stats["client_count"] > 0

    wait_until_blocking(subscribed, what="the tool subscribed")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize(
    ("tool", "channel", "extra"),
    [
        ("tail", "t", []),
        ("to-file", "nsq_to_file", ["--output-dir={tmp}"]),
        ("to-nsq", "nsq_to_nsq", ["--destination-nsqd-tcp-address={nsqd}"]),
        ("to-http", "nsq_to_http", ["--post=http://127.0.0.1:9/"]),
    ],
)
def test_consumers_leave_promptly_when_idle(
    nsqd: NSQD, tmp_path: Path, tool: str, channel: str, extra: list[str], sig: int
) -> None:
    args = [a.format(tmp=tmp_path, nsqd=nsqd.tcp_address) for a in extra]
    process = start_tool(
        tool,
        "--topic=quiet",
        f"--channel={channel}",
        f"--nsqd-tcp-address={nsqd.tcp_address}",
        *args,
    )
    wait_subscribed(nsqd, "quiet", channel)
    status, err = stop_within(process, PROMPT, sig)
    assert status == 0, err


def test_stat_and_pub_leave_promptly(nsqd: NSQD) -> None:
    create_channel(nsqd.http_address, "t", "c")
    stat = start_tool(
        "stat", "--topic=t", "--channel=c", f"--nsqd-http-address={nsqd.http_address}"
    )
    # Running (not still starting, before it handles signals): it printed.
    assert stat.stdout is not None
    ready, _, _ = select.select([stat.stdout], [], [], 30)
    assert ready and stat.stdout.readline().startswith(b"---")
    assert stop_within(stat, PROMPT, signal.SIGTERM)[0] == 0
    pub = track(
        subprocess.Popen(
            command("pub", "--topic=t", f"--nsqd-tcp-address={nsqd.tcp_address}"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    )
    assert pub.stdin is not None
    pub.stdin.write(b"one\ntwo\n")
    pub.stdin.flush()
    wait_until_blocking(
        lambda: (channel_stats(nsqd.http_address, "t", "c") or {}).get("depth") == 2
    )
    status, err = stop_within(pub, PROMPT, signal.SIGTERM)  # stdin still open
    assert status == 0, err


def test_to_http_requeues_what_a_hanging_endpoint_holds_and_leaves(nsqd: NSQD) -> None:
    publish(nsqd.http_address, "hang", [f"m{i}".encode() for i in range(20)])
    with recording(delay=60) as endpoint:
        process = start_tool(
            "to-http",
            "--topic=hang",
            f"--nsqd-tcp-address={nsqd.tcp_address}",
            f"--post={endpoint.url}/",
            "-n=3",
        )
        wait_until_blocking(lambda: endpoint.under_way == 3, what="three requests under way")
        status, err = stop_within(process, PROMPT, signal.SIGTERM)
        assert status == 0, err
    stats = channel_stats(nsqd.http_address, "hang", "nsq_to_http")
    assert stats is not None
    assert (stats["depth"], stats["in_flight_count"]) == (20, 0), (stats, err)  # all back


def test_a_second_signal_leaves_at_once(nsqd: NSQD) -> None:
    publish(nsqd.http_address, "hang2", [f"m{i}".encode() for i in range(5)])
    with recording(delay=60) as endpoint:
        process = start_tool(
            "to-http",
            "--topic=hang2",
            f"--nsqd-tcp-address={nsqd.tcp_address}",
            f"--post={endpoint.url}/",
        )
        wait_until_blocking(lambda: endpoint.under_way == 4, what="requests under way")
        process.send_signal(signal.SIGTERM)
        status, err = stop_within(process, PROMPT, signal.SIGTERM)
        assert status in (0, 130), err
    stats = channel_stats(nsqd.http_address, "hang2", "nsq_to_http")
    assert stats is not None and stats["in_flight_count"] == 0


def test_to_http_does_not_stall_at_a_large_max_in_flight(nsqd_factory: Callable[..., NSQD]) -> None:
    nsqd = nsqd_factory()
    publish(nsqd.http_address, "many", [f"m{i}".encode() for i in range(2000)])
    with recording() as endpoint:
        process = start_tool(
            "to-http",
            "--topic=many",
            f"--nsqd-tcp-address={nsqd.tcp_address}",
            f"--post={endpoint.url}/",
            "--max-in-flight=2500",
        )
        wait_until_blocking(
            lambda: drained(nsqd.http_address, "many", "nsq_to_http", 2000), what="delivered"
        )
        status, err = stop_within(process, PROMPT, signal.SIGTERM)
        assert status == 0, err
        assert len(endpoint.requests) == 2000
