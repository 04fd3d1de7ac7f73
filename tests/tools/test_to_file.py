"""``trionsq to-file``: names, rotation, gzip, work dir, and a clean SIGTERM."""

from __future__ import annotations

import gzip
import os
import signal
import socket
import time
from pathlib import Path

import pytest

from fakensq import NSQD
from trionsq.tools.to_file import _topic_list

from ..support.stats import channel_stats
from ..support.waiting import wait_until, wait_until_blocking
from .helpers import drained, publish, run_tool, start_tool, stop_tool, stop_when_drained

HOST = socket.gethostname().split(".")[0]


def archive(nsqd: NSQD, out: Path, *extra: str) -> list[str]:
    return [
        "to-file",
        "--topic",
        "logs",
        "--nsqd-tcp-address",
        nsqd.tcp_address,
        "--output-dir",
        str(out),
        *extra,
    ]


def read_lines(paths: list[Path]) -> list[bytes]:
    lines: list[bytes] = []
    for path in paths:
        data = path.read_bytes()
        if path.suffix == ".gz":
            data = gzip.decompress(data)  # every member, concatenated
        lines.extend(data.splitlines())
    return lines


def test_default_filename_and_content(nsqd: NSQD, tmp_path: Path) -> None:
    tmp_path = tmp_path / "out"
    tmp_path.mkdir()
    bodies = [f"record {i}".encode() for i in range(500)]
    publish(nsqd.http_address, "logs", bodies)
    process = start_tool(*archive(nsqd, tmp_path, "--datetime-format", "%Y"))
    err = stop_when_drained(process, nsqd.http_address, "logs", "nsq_to_file", 500)
    assert "to-file logs done: written=500 finished=500" in err
    files = sorted(tmp_path.iterdir())
    # <REV> is dropped without gzip/rotation/work dir, as nsq_to_file does.
    assert [f.name for f in files] == [f"logs.{HOST}.{time.strftime('%Y')}.log"]
    assert read_lines(files) == bodies


def test_rotation_by_size_with_gzip(nsqd: NSQD, tmp_path: Path) -> None:
    tmp_path = tmp_path / "out"
    tmp_path.mkdir()
    bodies = [f"{i:05d}".encode() * 10 for i in range(400)]  # 51 bytes a line
    publish(nsqd.http_address, "logs", bodies)
    process = start_tool(
        *archive(
            nsqd,
            tmp_path,
            "--gzip",
            "--gzip-level",
            "9",
            "--rotate-size",
            "5000",
            "--filename-format",
            "<TOPIC>-<HOST><REV>.log",
        )
    )
    err = stop_when_drained(process, nsqd.http_address, "logs", "nsq_to_file", 400)
    files = sorted(tmp_path.iterdir())
    assert len(files) >= 4  # 20,400 bytes in files of ~5,000
    assert f"open=0 closed={len(files)}" in err  # counted as each is closed
    assert [f.name for f in files[:2]] == [
        f"logs-{HOST}-000000.log.gz",
        f"logs-{HOST}-000001.log.gz",
    ]
    assert sorted(read_lines(files)) == sorted(bodies)
    for f in files:
        assert len(gzip.decompress(f.read_bytes())) <= 5000 + 51


def test_rotation_by_time_even_without_traffic(nsqd: NSQD, tmp_path: Path) -> None:
    tmp_path = tmp_path / "out"
    tmp_path.mkdir()
    publish(nsqd.http_address, "logs", [b"first"])
    process = start_tool(
        *archive(nsqd, tmp_path, "--rotate-interval", "100ms", "--sync-interval", "50ms")
    )
    wait_until_blocking(lambda: len(list(tmp_path.iterdir())) >= 3, what="rotations")
    status, _, err = stop_tool(process)
    assert status == 0, err
    files = sorted(tmp_path.iterdir())
    assert files[0].read_bytes() == b"first\n"
    assert read_lines(files) == [b"first"]


def test_work_dir_files_move_to_output_dir_when_closed(nsqd: NSQD, tmp_path: Path) -> None:
    work, out = tmp_path / "work", tmp_path / "out"
    publish(nsqd.http_address, "logs", [b"a", b"b"])
    process = start_tool(*archive(nsqd, out, "--work-dir", str(work)))
    wait_until_blocking(
        lambda: drained(nsqd.http_address, "logs", "nsq_to_file", 2), what="all finished"
    )
    # In progress: the file is in the work dir only.
    assert len(list(work.iterdir())) == 1 and not any(out.iterdir())
    status, _, err = stop_tool(process, signal.SIGINT)
    assert status == 0, err
    assert not any(work.iterdir())
    (moved,) = out.iterdir()
    assert moved.name.startswith(f"logs.{HOST}-000000.")
    assert moved.read_bytes() == b"a\nb\n"


def test_sigterm_mid_stream_loses_nothing(nsqd: NSQD, tmp_path: Path) -> None:
    tmp_path = tmp_path / "out"
    tmp_path.mkdir()
    total = 3000
    bodies = [f"m{i}".encode() for i in range(total)]
    publish(nsqd.http_address, "logs", bodies)
    process = start_tool(*archive(nsqd, tmp_path, "--gzip", "--max-in-flight", "50"))

    def some_finished() -> bool:
        stats = channel_stats(nsqd.http_address, "logs", "nsq_to_file")
        return stats is not None and stats["depth"] < total - 200

    wait_until_blocking(some_finished, what="a part archived")
    status, _, err = stop_tool(process)
    assert status == 0, err
    archived = read_lines(sorted(tmp_path.iterdir()))
    assert len(archived) == len(set(archived))
    stats = channel_stats(nsqd.http_address, "logs", "nsq_to_file")
    assert stats is not None
    # What is not in the files is still in the channel (requeued), nothing in between.
    assert stats["in_flight_count"] == 0
    left = stats["depth"] + stats["deferred_count"]
    assert len(archived) + left == total, (len(archived), left)
    rest = run_tool(
        "tail",
        "--topic",
        "logs",
        "--channel",
        "nsq_to_file",
        "-n",
        str(left),
        "--nsqd-tcp-address",
        nsqd.tcp_address,
    )
    assert set(archived) | set(rest.stdout.splitlines()) == set(bodies)
    assert os.listdir(tmp_path)


def test_a_topics_answer_is_read_as_nsq_to_file_reads_it() -> None:
    """A list of strings (in the pre-1.0 envelope too); anything else is
    that nsqlookupd's error (Go's decoding into []string fails), never a
    crash of the tool; names are checked when archiving starts."""
    assert _topic_list({"topics": ["a", "bad name!"]}) == ["a", "bad name!"]
    assert _topic_list({"status_code": 200, "data": {"topics": ["a"]}}) == ["a"]
    assert _topic_list({}) == _topic_list({"topics": None}) == []
    for bad in ({"topics": "a"}, {"topics": ["a", 1]}, {"topics": [None]}, {"topics": {}}):
        with pytest.raises(ValueError, match="not a list of strings"):
            _topic_list(bad)
    with pytest.raises(ValueError, match="not a JSON object"):
        _topic_list(["a"])


async def test_the_table_counts_open_files_and_closed_ones(nsqd: NSQD, tmp_path: Path) -> None:
    # The live table said "files 0" while a file of 200,000 lines was open: it
    # counted closed files only.  Now it shows both.
    import trio

    from trionsq.tools.progress import Progress
    from trionsq.tools.to_file import FileOptions, _archive

    publish(nsqd.http_address, "logs", [b"a", b"b", b"c"])
    progress = Progress("to-file logs", ["written", "finished", "open", "closed"], live=False)
    stop = trio.Event()
    options = {"nsqd_tcp_addresses": [nsqd.tcp_address], "max_in_flight": 10}
    out = str(tmp_path / "out")  # tmp_path also holds the nsqd's data
    os.mkdir(out)
    files = FileOptions(output_dir=out, work_dir=out)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_archive, "logs", "archive", options, files, 0.05, stop, progress)
        await wait_until(lambda: progress.counts["finished"] >= 3, step=0.01)
        assert (progress.counts["open"], progress.counts["closed"]) == (1, 0)
        stop.set()
    assert (progress.counts["open"], progress.counts["closed"]) == (0, 1)
    assert len(os.listdir(out)) == 1
