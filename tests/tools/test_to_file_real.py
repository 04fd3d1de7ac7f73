"""``trionsq to-file`` against the real nsqd v1.3.0: a SIGKILL loses nothing, and
syncs come in batches (the consumer is starved only by what the tool holds)."""

from __future__ import annotations

import collections
import gzip
import signal
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import reference

from ..support.stats import channel_stats
from ..support.waiting import wait_until_blocking
from .helpers import create_channel, drained, publish, start_tool, stop_tool


@pytest.fixture
def real_nsqd() -> Iterator[reference.RealDaemon]:
    reference.require("nsqd")
    # A killed consumer's messages come back after --msg-timeout: keep it short.
    with reference.running("nsqd", ["--msg-timeout=2s", "--log-level=warn"]) as nsqd:
        yield nsqd


def prefill(nsqd: reference.RealDaemon, bodies: list[bytes]) -> None:
    """Publish to the channel, and wait until nsqd has moved them all into it."""
    create_channel(nsqd.http_address, "logs", "nsq_to_file")
    publish(nsqd.http_address, "logs", bodies)

    def arrived() -> bool:
        stats = channel_stats(nsqd.http_address, "logs", "nsq_to_file")
        return stats is not None and stats["message_count"] == len(bodies)

    wait_until_blocking(arrived, what="the messages in the channel")


def read_members(path: Path) -> list[bytes]:
    """The lines of a file; for gzip, of every whole member (a cut member at the
    end, as a SIGKILL may leave, is not data that was synced)."""
    data = path.read_bytes()
    if path.suffix != ".gz":
        return data.splitlines()
    lines: list[bytes] = []
    while data:
        member = zlib.decompressobj(wbits=31)
        out = member.decompress(data)
        if not member.eof:
            break
        lines.extend(out.splitlines())
        data = member.unused_data
    return lines


def archive_args(nsqd: reference.RealDaemon, out: Path, *extra: str) -> list[str]:
    return [
        "to-file",
        "--topic=logs",
        f"--nsqd-tcp-address={nsqd.tcp_address}",
        f"--output-dir={out}",
        *extra,
    ]


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
def test_sigkill_mid_stream_then_restart_loses_nothing(
    real_nsqd: reference.RealDaemon, tmp_path: Path, compress: bool
) -> None:
    total, in_flight = 20_000, 500
    bodies = [f"m{i:06d}".encode() for i in range(total)]
    prefill(real_nsqd, bodies)
    args = archive_args(
        real_nsqd, tmp_path, f"--max-in-flight={in_flight}", *(["--gzip"] if compress else [])
    )
    first = start_tool(*args)

    def some_finished() -> bool:
        stats = channel_stats(real_nsqd.http_address, "logs", "nsq_to_file")
        assert stats is not None
        return bool(total - stats["depth"] - stats["in_flight_count"] >= 3 * in_flight)

    wait_until_blocking(some_finished, what="a part archived")
    first.kill()  # SIGKILL: no sync, no FIN, no CLS
    first.communicate()
    # What the killed run left on disk, file by file.
    before = {path: read_members(path) for path in tmp_path.iterdir()}
    assert before, "the first run wrote nothing"

    second = start_tool(*args)
    wait_until_blocking(
        lambda: drained(real_nsqd.http_address, "logs", "nsq_to_file", total),
        limit=60,
        what="the rest archived after the restart",
    )
    status, _, err = stop_tool(second)
    assert status == 0, err

    lines = [line for path in sorted(tmp_path.iterdir()) for line in read_members(path)]
    assert set(lines) == set(bodies)  # every message in some file
    counts = collections.Counter(lines)
    duplicated = {line for line, n in counts.items() if n > 1}
    assert all(counts[line] == 2 for line in duplicated)
    # Duplicates only from after the last sync of the killed run: messages it
    # wrote (in its last unsynced batch) but never finished, redelivered.
    tail = [line for kept in before.values() for line in kept[-in_flight:]]
    assert duplicated <= set(tail), sorted(duplicated - set(tail))[:5]
    assert len(duplicated) <= in_flight
    stats = channel_stats(real_nsqd.http_address, "logs", "nsq_to_file")
    assert stats is not None and stats["depth"] == stats["in_flight_count"] == 0


def test_syncs_come_in_batches_at_a_large_max_in_flight(
    real_nsqd: reference.RealDaemon, tmp_path: Path
) -> None:
    # The consumer is starved when the messages the tool holds reach 85% of the
    # connection's RDY; those it received but has not handed out yet do not
    # count, so a large --max-in-flight means few syncs, not one per message.
    total, in_flight = 40_000, 8000
    prefill(real_nsqd, [f"r{i}".encode() for i in range(total)])
    process = start_tool(
        *archive_args(
            real_nsqd, tmp_path, f"--max-in-flight={in_flight}", "--sync-interval=1h", "--gzip"
        )
    )
    wait_until_blocking(
        lambda: drained(real_nsqd.http_address, "logs", "nsq_to_file", total),
        limit=60,
        what="all archived",
    )
    status, _, err = stop_tool(process, signal.SIGINT)
    assert status == 0, err
    summary = next(line for line in err.splitlines() if " done: " in line)
    syncs = int(summary.split("syncs=")[1].split()[0].replace(",", ""))
    # 40,000 / (0.85 * 2,500, nsqd's default max RDY) = 19 batches, plus idle
    # syncs where the stream paused; per message it would be thousands.
    assert 1 <= syncs <= 60, summary
    (path,) = tmp_path.iterdir()
    assert len(gzip.decompress(path.read_bytes()).splitlines()) == total
