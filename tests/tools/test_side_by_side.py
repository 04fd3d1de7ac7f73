"""Each tool next to its NSQ v1.3.0 counterpart, on the same input, against the
real nsqd: the flags (names, types, defaults), the errors and exit statuses,
and what each one does (what nsq_tail prints, nsq_to_file's files, how
nsq_to_nsq and nsq_to_http route and filter, nsq_stat's table).

Skipped, with the reason, where the real binaries are absent (see
tests/reference.py); CI has them.
"""

from __future__ import annotations

import gzip
import http.server
import json
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests import reference
from tests.gousage import parse_usage

from ..support.ports import free_address
from ..support.stats import channel_stats
from ..support.waiting import wait_until_blocking
from .helpers import command, create_channel, drained, publish, run_here, run_tool, track
from .recorder import Recorder, recording

GO = {
    "tail": "nsq_tail",
    "to-file": "nsq_to_file",
    "pub": "to_nsq",
    "stat": "nsq_stat",
    "to-nsq": "nsq_to_nsq",
    "to-http": "nsq_to_http",
}
TIMEOUT = 30.0


def go_argv(tool: str, *args: str) -> list[str]:
    return [str(reference.require(GO[tool])), *args]


def run_go(tool: str, *args: str, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(go_argv(tool, *args), input=input, capture_output=True, timeout=TIMEOUT)


def start(argv: list[str], cwd: Path | None = None) -> subprocess.Popen[bytes]:
    return track(
        subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, cwd=cwd
        )
    )


def stop(process: subprocess.Popen[bytes]) -> tuple[int, bytes, bytes]:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        out, err = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise AssertionError(f"{process.args!r} did not leave after SIGTERM: {err!r}") from None
    return process.returncode, out, err


@pytest.fixture(scope="module")
def nsqd() -> Iterator[reference.RealDaemon]:
    reference.require("nsqd")
    with reference.running("nsqd", ["--log-level=warn"]) as daemon:
        yield daemon


@pytest.fixture
def nsqd_pair() -> Iterator[tuple[reference.RealDaemon, reference.RealDaemon]]:
    reference.require("nsqd")
    with (
        reference.running("nsqd", ["--log-level=warn"]) as first,
        reference.running("nsqd", ["--log-level=warn"]) as second,
    ):
        yield first, second


_counter = iter(range(1_000_000))


def fresh(prefix: str) -> str:
    """A topic name no other test of the module uses."""
    return f"{prefix}{next(_counter)}"


def fill(nsqd: reference.RealDaemon, topic: str, bodies: list[bytes], channels: list[str]) -> None:
    """Create the channels, publish, and wait until every channel holds all."""
    before = {}
    for channel in channels:
        create_channel(nsqd.http_address, topic, channel)
        stats = channel_stats(nsqd.http_address, topic, channel)
        before[channel] = stats["message_count"] if stats else 0
    publish(nsqd.http_address, topic, bodies)
    for channel in channels:

        def arrived(channel: str = channel) -> bool:
            stats = channel_stats(nsqd.http_address, topic, channel)
            return stats is not None and stats["message_count"] == before[channel] + len(bodies)

        wait_until_blocking(arrived, what=f"{topic}/{channel} filled")


# --- flags ---------------------------------------------------------------------


@pytest.mark.parametrize("tool", list(GO))
def test_every_flag_with_the_go_type_and_default(tool: str) -> None:
    go = run_go(tool, "--help")
    theirs = parse_usage(go.stderr.decode() + go.stdout.decode())
    assert theirs, go
    ours = parse_usage(run_here(tool, "--help").stdout.decode())
    for name, (kind, default) in theirs.items():
        assert name in ours, f"{tool} lacks -{name}"
        assert ours[name] == (kind, default), (name, ours[name], (kind, default))


FLAG_ERRORS = [
    ("tail", ["--bogus"]),
    ("tail", ["-n", "x"]),
    ("tail", ["-n=0x"]),
    ("tail", ["--print-topic=maybe"]),
    ("tail", ["--topic"]),
    ("tail", ["---topic=t"]),
    ("tail", ["--consumer-opt=nope,1"]),
    ("to-file", ["--rotate-size=1k"]),
    ("to-file", ["--rotate-interval=soon"]),
    ("to-file", ["--gzip=yes"]),
    ("pub", ["--rate=1.5"]),
    ("pub", ["--producer-opt=bogus"]),
    ("stat", ["--count=x"]),
    ("stat", ["--interval=2x"]),
    ("to-nsq", ["--mode"]),
    ("to-http", ["--sample=x"]),
    ("to-http", ["-n", "1e3"]),
]


@pytest.mark.parametrize(("tool", "args"), FLAG_ERRORS)
def test_flag_errors_as_go_s_flag_package(tool: str, args: list[str]) -> None:
    go, ours = run_go(tool, *args), run_here(tool, *args)
    assert (ours.returncode, go.returncode) == (2, 2), (ours, go)
    assert ours.stderr.decode().splitlines()[0] == go.stderr.decode().splitlines()[0]


def go_message(stderr: bytes) -> str:
    """The last log.Fatal line of a Go tool, without its timestamp."""
    line = stderr.decode().strip().splitlines()[-1]
    return re.sub(r"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d(\.\d+)? ", "", line)


VALUE_ERRORS = [
    ("tail", []),
    ("tail", ["--topic=t"]),
    ("tail", ["--nsqd-tcp-address=a:1"]),
    ("tail", ["--topic=t", "--nsqd-tcp-address=a:1", "--lookupd-http-address=b:1"]),
    ("to-file", []),
    ("to-file", ["--nsqd-tcp-address=a:1"]),
    ("to-file", ["--topic-pattern=x", "--nsqd-tcp-address=a:1"]),
    ("to-file", ["--topic=t", "--nsqd-tcp-address=a:1", "--lookupd-http-address=b:1"]),
    ("to-file", ["--topic=t", "--nsqd-tcp-address=a:1", "--gzip-level=12"]),
    ("to-file", ["--topic=t", "--channel=", "--nsqd-tcp-address=a:1"]),
    ("pub", []),
    ("pub", ["--topic=t"]),
    ("pub", ["--topic=t", "--nsqd-tcp-address=a:1", "--delimiter=ab"]),
    ("pub", ["--topic=t", "--nsqd-tcp-address=a:1", "--delimiter="]),
    ("stat", []),
    ("stat", ["--topic=t"]),
    ("stat", ["--topic=t", "--channel=c"]),
    ("stat", ["--topic=t", "--channel=c", "--nsqd-http-address=a:1", "--lookupd-http-address=b:1"]),
    ("stat", ["--topic=t", "--channel=c", "--nsqd-http-address=http://a:1"]),
    ("stat", ["--topic=t", "--channel=c", "--nsqd-http-address=a:1", "--interval=0"]),
    ("stat", ["--topic=t", "--channel=c", "--nsqd-http-address=a:1", "--count=0"]),
    ("to-nsq", []),
    ("to-nsq", ["--topic=t"]),
    ("to-nsq", ["--topic=t", "--nsqd-tcp-address=a:1"]),
    ("to-nsq", ["--topic=t", "--channel=", "--nsqd-tcp-address=a:1"]),
    ("to-nsq", ["--topic=bad!", "--nsqd-tcp-address=a:1", "--destination-nsqd-tcp-address=b:1"]),
    (
        "to-nsq",
        [
            "--topic=t",
            "--nsqd-tcp-address=a:1",
            "--destination-nsqd-tcp-address=b:1",
            "--destination-topic=bad!",
        ],
    ),
    ("to-http", []),
    ("to-http", ["--topic=t"]),
    ("to-http", ["--topic=t", "--nsqd-tcp-address=a:1"]),
    ("to-http", ["--topic=t", "--nsqd-tcp-address=a:1", "--get=http://x/%s", "--post=http://y/"]),
    ("to-http", ["--topic=t", "--nsqd-tcp-address=a:1", "--get=http://x/"]),
    ("to-http", ["--topic=t", "--nsqd-tcp-address=a:1", "--get=http://x/%s", "--content-type=a/b"]),
    ("to-http", ["--topic=t", "--nsqd-tcp-address=a:1", "--post=http://x/", "--content-type="]),
    ("to-http", ["--topic=t", "--nsqd-tcp-address=a:1", "--post=http://x/", "--header=X"]),
]


@pytest.mark.parametrize(("tool", "args"), VALUE_ERRORS)
def test_refused_values_as_the_go_tool(tool: str, args: list[str]) -> None:
    go, ours = run_go(tool, *args), run_here(tool, *args)
    assert (ours.returncode, go.returncode) == (1, 1), (ours, go)
    assert ours.stderr.decode().strip() == f"trionsq {tool}: error: {go_message(go.stderr)}"


UNREACHABLE = [
    ("tail", ["--topic=t", "--nsqd-tcp-address={dead}"], None),
    ("stat", ["--topic=t", "--channel=c", "--nsqd-http-address={dead}"], None),
    ("stat", ["--topic=t", "--channel=c", "--lookupd-http-address={dead}"], None),
    ("pub", ["--topic=t", "--nsqd-tcp-address={dead}"], b"one\n"),
    (
        "to-nsq",
        ["--topic=t", "--nsqd-tcp-address={dead}", "--destination-nsqd-tcp-address={dead}"],
        None,
    ),
    ("to-http", ["--topic=t", "--nsqd-tcp-address={dead}", "--post=http://{dead}/"], None),
]


@pytest.mark.parametrize(("tool", "args", "stdin"), UNREACHABLE)
def test_unreachable_nodes_exit_1_as_the_go_tool(
    tool: str, args: list[str], stdin: bytes | None
) -> None:
    dead = free_address()
    filled = [a.format(dead=dead) for a in args]
    go, ours = run_go(tool, *filled, input=stdin), run_tool(tool, *filled, input=stdin)
    assert (ours.returncode, go.returncode) == (1, 1), (ours, go)
    assert "connection refused" in go.stderr.decode().lower()
    assert dead in ours.stderr.decode() and "Traceback" not in ours.stderr.decode()


def test_pub_with_nothing_to_publish_never_connects_as_to_nsq() -> None:
    args = ["--topic=t", f"--nsqd-tcp-address={free_address()}"]
    go, ours = run_go("pub", *args, input=b""), run_tool("pub", *args, input=b"")
    assert (ours.returncode, go.returncode) == (0, 0), (ours, go)


def test_to_file_exits_on_an_unreachable_nsqd_where_nsq_to_file_idles(tmp_path: Path) -> None:
    # A documented difference: nsq_to_file logs the error and stays up,
    # archiving nothing; to-file says why and exits 1.
    args = ["--topic=t", f"--nsqd-tcp-address={free_address()}", f"--output-dir={tmp_path}"]
    go = start(go_argv("to-file", *args))
    try:
        ours = run_tool("to-file", *args)
        assert ours.returncode == 1 and b"cannot connect" in ours.stderr
        time.sleep(0.5)
        assert go.poll() is None
    finally:
        stop(go)


# --- nsq_tail ------------------------------------------------------------------


def test_tail_prints_what_nsq_tail_prints(nsqd: reference.RealDaemon) -> None:
    topic = fresh("tail")
    bodies = [f"message {i} with some text".encode() for i in range(50)]
    fill(nsqd, topic, bodies, ["go", "py"])
    args = [f"--topic={topic}", f"--nsqd-tcp-address={nsqd.tcp_address}", "-n", "50"]
    for flags in ([], ["--print-topic"]):
        if flags:
            fill(nsqd, topic, bodies, ["go", "py"])  # nsq_tail left its last one in flight
        go = run_go("tail", *args, "--channel=go", *flags)
        ours = run_tool("tail", *args, "--channel=py", *flags)
        assert ours.returncode == go.returncode == 0, (ours, go)
        assert ours.stdout == go.stdout
        first = f"{topic} | message 0 with some text" if flags else "message 0 with some text"
        assert ours.stdout.splitlines()[0] == first.encode()


def test_tail_prints_a_message_as_large_as_nsqd_allows_as_nsq_tail() -> None:
    """nsqd run with a larger --max-msg-size (which it does not tell its
    clients): a 2 MB message is read with the defaults by both (tail
    reconnected for ever on FrameTooLarge)."""
    reference.require("nsqd")
    flags = ["--log-level=warn", f"--max-msg-size={4 * 1024 * 1024}"]
    with reference.running("nsqd", flags) as nsqd:
        topic = fresh("large")
        body = bytes(range(33, 127)) * (2 * 1000 * 1000 // 94)
        fill(nsqd, topic, [body], ["go", "py"])
        args = [f"--topic={topic}", f"--nsqd-tcp-address={nsqd.tcp_address}", "-n", "1"]
        go = run_go("tail", *args, "--channel=go")
        ours = run_tool("tail", *args, "--channel=py")
        assert ours.returncode == go.returncode == 0, (ours.stderr, go.stderr)
        assert ours.stdout == go.stdout == body + b"\n"


# --- nsq_to_file ---------------------------------------------------------------


def start_both(
    tmp_path: Path, args: Callable[[str, Path], list[str]]
) -> tuple[tuple[Path, Path], list[subprocess.Popen[bytes]]]:
    """nsq_to_file (channel ``go``, into ``tmp_path/go``) and to-file (``py``,
    ``tmp_path/py``), each started with ``args(channel, folder)``."""
    dirs = tmp_path / "go", tmp_path / "py"
    processes = []
    for channel, out in zip(("go", "py"), dirs, strict=True):
        out.mkdir()
        argv = args(channel, out)
        processes.append(
            start(go_argv("to-file", *argv) if channel == "go" else command("to-file", *argv))
        )
    return dirs, processes


def archive_both(
    nsqd: reference.RealDaemon, topic: str, tmp_path: Path, total: int, *flags: str
) -> tuple[Path, Path]:
    """Run nsq_to_file and to-file on the same topic (channels go, py) until each
    channel is drained, then SIGTERM both; returns their output folders."""
    dirs, processes = start_both(
        tmp_path,
        lambda channel, out: [
            f"--topic={topic}",
            f"--channel={channel}",
            f"--nsqd-tcp-address={nsqd.tcp_address}",
            f"--output-dir={out}",
            "--sync-interval=100ms",
            *flags,
        ],
    )
    for channel in ("go", "py"):
        wait_until_blocking(
            lambda channel=channel: drained(nsqd.http_address, topic, channel, total),
            what=f"{channel} archived",
        )
    for process in processes:
        status, _, err = stop(process)
        assert status == 0, err
    return dirs


def file_contents(folder: Path) -> dict[str, list[bytes]]:
    out = {}
    for path in sorted(folder.iterdir()):
        data = path.read_bytes()
        out[path.name] = (gzip.decompress(data) if path.suffix == ".gz" else data).splitlines()
    return out


def test_to_file_names_and_contents_as_nsq_to_file(
    nsqd: reference.RealDaemon, tmp_path: Path
) -> None:
    topic = fresh("file")
    bodies = [f"line {i}".encode() for i in range(300)]
    fill(nsqd, topic, bodies, ["go", "py"])
    go, py = archive_both(nsqd, topic, tmp_path, 300, "--datetime-format=%Y")
    assert file_contents(py) == file_contents(go)
    assert list(file_contents(py).values()) == [bodies]


def test_to_file_gzip_and_rotation_by_size_as_nsq_to_file(
    nsqd: reference.RealDaemon, tmp_path: Path
) -> None:
    topic = fresh("gz")
    bodies = [f"{i:05d}".encode() * 8 for i in range(400)]  # 41 bytes a line
    fill(nsqd, topic, bodies, ["go", "py"])
    go, py = archive_both(
        nsqd,
        topic,
        tmp_path,
        400,
        "--gzip",
        "--rotate-size=3000",
        "--filename-format=<TOPIC>-<HOST><REV>.log",
        "--max-in-flight=1000",
    )
    ours, theirs = file_contents(py), file_contents(go)
    assert list(ours) == list(theirs)  # the same names, the same revisions
    assert len(ours) >= 5
    assert ours == theirs


def test_to_file_rotation_by_time_as_nsq_to_file(
    nsqd: reference.RealDaemon, tmp_path: Path
) -> None:
    topic = fresh("tick")
    fill(nsqd, topic, [b"first"], ["go", "py"])
    dirs, processes = start_both(
        tmp_path,
        lambda channel, out: [
            f"--topic={topic}",
            f"--channel={channel}",
            f"--nsqd-tcp-address={nsqd.tcp_address}",
            f"--output-dir={out}",
            "--rotate-interval=300ms",
            "--sync-interval=100ms",
            "--filename-format=<TOPIC><REV>.log",
        ],
    )
    for out in dirs:
        wait_until_blocking(lambda out=out: len(list(out.iterdir())) >= 3, what="three files")
    for process in processes:
        assert stop(process)[0] == 0
    for out in dirs:
        names = sorted(p.name for p in out.iterdir())
        assert names[:3] == [f"{topic}-00000{i}.log" for i in range(3)]
        assert (out / names[0]).read_bytes() == b"first\n"


def test_to_file_topic_pattern_picks_up_new_topics_as_nsq_to_file(tmp_path: Path) -> None:
    reference.require("nsqlookupd")
    with (
        reference.running("nsqlookupd") as lookupd,
        reference.running(
            "nsqd", [f"--lookupd-tcp-address={lookupd.tcp_address}", "--log-level=warn"]
        ) as nsqd,
    ):
        for topic in ("logs_a", "other"):
            fill(nsqd, topic, [f"{topic} 1".encode()], ["go", "py"])
        dirs, processes = start_both(
            tmp_path,
            lambda channel, out: [
                "--topic-pattern=^logs_",
                "--topic-refresh=500ms",
                f"--channel={channel}",
                f"--lookupd-http-address={lookupd.http_address}",
                f"--output-dir={out}",
                "--sync-interval=100ms",
                "--datetime-format=x",
            ],
        )
        try:
            for out in dirs:
                wait_until_blocking(lambda out=out: any(out.iterdir()), what="logs_a archived")
            fill(nsqd, "logs_b", [b"logs_b 1"], ["go", "py"])  # a new topic, found later
            for out in dirs:
                wait_until_blocking(lambda out=out: len(list(out.iterdir())) == 2, what="logs_b archived")
        finally:
            for process in processes:
                stop(process)
        go, py = (sorted(p.name.split(".")[0] for p in out.iterdir()) for out in dirs)
        assert py == go == ["logs_a", "logs_b"]
        assert file_contents(dirs[1]) == file_contents(dirs[0])


class ListingLookupd:
    """An nsqlookupd in front of a real one that also lists ``extra`` topics
    in ``/topics`` (the real nsqlookupd refuses an invalid name on REGISTER
    and on /topic/create, but a client takes what any lookupd answers)."""

    def __init__(self, upstream: str, extra: list[object]) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                # The Accept header chooses nsqlookupd's answer's shape (go-nsq
                # asks for the one without the pre-1.0 envelope).
                accept = self.headers["Accept"]
                request = urllib.request.Request(
                    f"http://{upstream}{self.path}", headers={"Accept": accept} if accept else {}
                )
                try:
                    with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
                        status, headers, body = answer.status, answer.headers, answer.read()
                except urllib.error.HTTPError as error:
                    status, headers, body = error.code, error.headers, error.read()
                if self.path.split("?")[0] == "/topics" and status == 200:
                    doc = json.loads(body)
                    inner = doc.get("data", doc)  # the envelope's, or the document
                    inner["topics"] = [*inner["topics"], *extra]
                    body = json.dumps(doc).encode()
                self.send_response(status)
                # go-nsq reads the body's shape from X-NSQ-Content-Type.
                for name in ("Content-Type", "X-NSQ-Content-Type"):
                    if headers[name]:
                        self.send_header(name, headers[name])
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http_address = f"127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def test_to_file_skips_a_bad_topic_name_from_lookupd_as_nsq_to_file(tmp_path: Path) -> None:
    """A name nsqlookupd lists that cannot be consumed is logged and left
    out; the other topics are archived, found later ones too, and the tool
    goes on (it ended with a ValueError traceback, archiving nothing more)."""
    reference.require("nsqlookupd")
    with (
        reference.running("nsqlookupd") as real,
        reference.running(
            "nsqd", [f"--lookupd-tcp-address={real.tcp_address}", "--log-level=warn"]
        ) as nsqd,
    ):
        lookupd = ListingLookupd(real.http_address, ["logs_bad name!"])
        fill(nsqd, "logs_a", [b"logs_a 1"], ["go", "py"])
        dirs, processes = start_both(
            tmp_path,
            lambda channel, out: [
                "--topic-pattern=^logs_",
                "--topic-refresh=500ms",
                f"--channel={channel}",
                f"--lookupd-http-address={lookupd.http_address}",
                f"--output-dir={out}",
                "--sync-interval=100ms",
                "--datetime-format=x",
            ],
        )
        try:
            for channel in ("go", "py"):
                wait_until_blocking(
                    lambda channel=channel: drained(nsqd.http_address, "logs_a", channel, 1),
                    what=f"logs_a archived by {channel}",
                )
            fill(nsqd, "logs_b", [b"logs_b 1"], ["go", "py"])  # found at a later refresh
            for channel in ("go", "py"):
                wait_until_blocking(
                    lambda channel=channel: drained(nsqd.http_address, "logs_b", channel, 1),
                    what=f"logs_b archived by {channel}",
                )
        finally:
            results = [stop(process) for process in processes]
            lookupd.close()
        go, py = (sorted(p.name.split(".")[0] for p in out.iterdir()) for out in dirs)
        assert py == go == ["logs_a", "logs_b"]
        assert file_contents(dirs[1]) == file_contents(dirs[0])
        for status, _, err in results:
            assert status == 0, err
            assert b"couldn't create logger for new topic logs_bad name!" in err, err
            assert b"Traceback" not in err


# --- nsq_to_nsq ----------------------------------------------------------------


def read_topic(nsqd: reference.RealDaemon, topic: str, channel: str, count: int) -> list[bytes]:
    """``count`` messages of ``topic`` (read through ``channel``, created before)."""
    if count == 0:
        return []
    result = run_tool(
        "tail",
        f"--topic={topic}",
        f"--channel={channel}",
        f"--nsqd-tcp-address={nsqd.tcp_address}",
        f"-n={count}",
    )
    assert result.returncode == 0, result
    return result.stdout.splitlines()


def topic_count(nsqd: reference.RealDaemon, topic: str) -> int:
    stats = channel_stats(nsqd.http_address, topic, "read")
    return 0 if stats is None else int(stats["message_count"])


def copy_both(
    source: reference.RealDaemon,
    destinations: list[reference.RealDaemon],
    topic: str,
    total: int,
    *flags: str,
) -> dict[str, list[int]]:
    """nsq_to_nsq and to-nsq copy ``topic`` (channels go, py) to topics
    ``<topic>_go``/``<topic>_py`` on the destinations; returns, per tool, how
    many messages each destination got."""
    counts: dict[str, list[int]] = {}
    for name in ("go", "py"):
        for destination in destinations:
            create_channel(destination.http_address, f"{topic}_{name}", "read")
        args = [
            f"--topic={topic}",
            f"--channel={name}",
            f"--nsqd-tcp-address={source.tcp_address}",
            f"--destination-topic={topic}_{name}",
            *(f"--destination-nsqd-tcp-address={d.tcp_address}" for d in destinations),
            *flags,
        ]
        process = start(go_argv("to-nsq", *args) if name == "go" else command("to-nsq", *args))
        try:
            wait_until_blocking(lambda name=name: drained(source.http_address, topic, name, total), what=name)
        finally:
            status, _, err = stop(process)
        assert status == 0, err
        counts[name] = [topic_count(d, f"{topic}_{name}") for d in destinations]
    return counts


@pytest.mark.parametrize("mode", ["round-robin", "hostpool"])
def test_to_nsq_routes_as_nsq_to_nsq(
    nsqd_pair: tuple[reference.RealDaemon, reference.RealDaemon], mode: str
) -> None:
    source, second = nsqd_pair
    topic = fresh("route")
    fill(source, topic, [f"m{i}".encode() for i in range(101)], ["go", "py"])
    counts = copy_both(source, [source, second], topic, 101, f"--mode={mode}")
    assert counts["py"] == counts["go"]
    assert sum(counts["py"]) == 101


JSON_INPUT = [
    b'{"type": "click", "user": "a", "n": 1}',
    b'{"type": "view", "user": "b", "n": 2.5}',
    b'{"user": "c"}',
    b"not json",
    b"[1, 2]",
    b'{"type": "click", "html": "<a&b>", "uni": "\xc3\xa9", "deep": {"z": 1, "a": [true, null]}}',
    b'{"type": 5, "n": 100000000000}',
    b'{"type": "5", "user": "d"}',
]


@pytest.mark.parametrize(
    "flags",
    [
        ["--require-json-field=type"],
        ["--require-json-field=type", "--whitelist-json-field=user", "--whitelist-json-field=n"],
        [
            "--whitelist-json-field=html",
            "--whitelist-json-field=uni",
            "--whitelist-json-field=deep",
        ],
    ],
)
def test_to_nsq_json_filters_as_nsq_to_nsq(nsqd: reference.RealDaemon, flags: list[str]) -> None:
    topic = fresh("json")
    fill(nsqd, topic, JSON_INPUT, ["go", "py"])
    counts = copy_both(nsqd, [nsqd], topic, len(JSON_INPUT), *flags)
    assert counts["py"] == counts["go"]
    ours = read_topic(nsqd, f"{topic}_py", "read", counts["py"][0])
    theirs = read_topic(nsqd, f"{topic}_go", "read", counts["go"][0])
    assert sorted(ours) == sorted(theirs)


@pytest.mark.parametrize("value", ["click", "5"])
def test_to_nsq_required_json_value_as_nsq_to_nsq(nsqd: reference.RealDaemon, value: str) -> None:
    topic = fresh("value")
    with_field = [b for b in JSON_INPUT if b.startswith(b'{"type"')]
    fill(nsqd, topic, with_field, ["go", "py"])
    counts = copy_both(
        nsqd,
        [nsqd],
        topic,
        len(with_field),
        "--require-json-field=type",
        f"--require-json-value={value}",
    )
    assert counts["py"] == counts["go"]
    ours = read_topic(nsqd, f"{topic}_py", "read", counts["py"][0])
    theirs = read_topic(nsqd, f"{topic}_go", "read", counts["go"][0])
    assert sorted(ours) == sorted(theirs)


# --- nsq_to_http ---------------------------------------------------------------


def deliver_both(
    nsqd: reference.RealDaemon,
    topic: str,
    total: int,
    make_flags: list[str],
    endpoints: int = 1,
    delay: float = 0.0,
) -> dict[str, list[Recorder]]:
    """nsq_to_http and to-http deliver ``topic`` (channels go, py) to their own
    recording endpoints; ``make_flags`` may hold ``{url0}``, ``{url1}``."""
    seen: dict[str, list[Recorder]] = {}
    for name in ("go", "py"):
        with contextlib_stack(endpoints, delay) as recorders:
            urls = {f"url{i}": r.url for i, r in enumerate(recorders)}
            args = [
                f"--topic={topic}",
                f"--channel={name}",
                f"--nsqd-tcp-address={nsqd.tcp_address}",
                "--consumer-opt=default_requeue_delay,0s",
                *(flag.format(**urls) for flag in make_flags),
            ]
            process = start(
                go_argv("to-http", *args) if name == "go" else command("to-http", *args)
            )
            try:
                wait_until_blocking(
                    lambda name=name: drained(nsqd.http_address, topic, name, total), what=name
                )
            finally:
                status, _, err = stop(process)
            assert status == 0, err
            seen[name] = recorders
    return seen


class contextlib_stack:
    def __init__(self, count: int, delay: float) -> None:
        self.managers = [recording(delay=delay) for _ in range(count)]

    def __enter__(self) -> list[Recorder]:
        return [m.__enter__() for m in self.managers]

    def __exit__(self, *exc: object) -> None:
        for m in reversed(self.managers):
            m.__exit__(None, None, None)


def test_to_http_post_with_headers_as_nsq_to_http(nsqd: reference.RealDaemon) -> None:
    topic = fresh("post")
    bodies = [f"body {i}".encode() for i in range(10)]
    fill(nsqd, topic, bodies, ["go", "py"])
    seen = deliver_both(
        nsqd,
        topic,
        10,
        [
            "--post={url0}/in?x=1",
            "--content-type=text/plain",
            "--header=X-Token: abc:d",
            "--header=X-B:e",
        ],
    )
    for name in ("go", "py"):
        (recorder,) = seen[name]
        assert sorted(r.body for r in recorder.requests) == sorted(bodies)
        for request in recorder.requests:
            assert (request.method, request.target) == ("POST", "/in?x=1")
            assert request.headers["Content-Type"] == "text/plain"
            assert (request.headers["X-Token"], request.headers["X-B"]) == ("abc:d", "e")


def test_to_http_get_escapes_as_nsq_to_http(nsqd: reference.RealDaemon) -> None:
    topic = fresh("get")
    bodies = [b"a b&c=d/e?f", "ünï".encode(), b"100%", b"+plus+"]
    fill(nsqd, topic, bodies, ["go", "py"])
    seen = deliver_both(nsqd, topic, len(bodies), ["--get={url0}/hit?data=%s&k=v"])
    targets = {name: sorted(r.target for r in seen[name][0].requests) for name in seen}
    assert targets["py"] == targets["go"]
    assert len(targets["py"]) == len(bodies)


@pytest.mark.parametrize("mode", ["round-robin", "hostpool"])
def test_to_http_routes_as_nsq_to_http(nsqd: reference.RealDaemon, mode: str) -> None:
    topic = fresh("hroute")
    fill(nsqd, topic, [f"m{i}".encode() for i in range(11)], ["go", "py"])
    seen = deliver_both(
        nsqd, topic, 11, ["--post={url0}/", "--post={url1}/", f"--mode={mode}", "-n=1"], endpoints=2
    )
    counts = {name: [len(r.requests) for r in seen[name]] for name in seen}
    assert counts["py"] == counts["go"]


def test_to_http_n_bounds_requests_under_way_as_nsq_to_http(nsqd: reference.RealDaemon) -> None:
    topic = fresh("conc")
    fill(nsqd, topic, [f"m{i}".encode() for i in range(12)], ["go", "py"])
    seen = deliver_both(nsqd, topic, 12, ["--post={url0}/", "-n=3"], delay=0.2)
    assert seen["py"][0].most_at_once == seen["go"][0].most_at_once == 3


@pytest.mark.parametrize("sample", ["0", "1"])
def test_to_http_sample_as_nsq_to_http(nsqd: reference.RealDaemon, sample: str) -> None:
    topic = fresh("sample")
    fill(nsqd, topic, [f"m{i}".encode() for i in range(20)], ["go", "py"])
    seen = deliver_both(nsqd, topic, 20, ["--post={url0}/", f"--sample={sample}"])
    assert len(seen["py"][0].requests) == len(seen["go"][0].requests) == int(sample) * 20


# --- nsq_stat ------------------------------------------------------------------


def test_stat_prints_nsq_stat_s_table(nsqd: reference.RealDaemon) -> None:
    topic = fresh("stat")
    fill(nsqd, topic, [b"a", b"b", b"c"], ["c"])
    args = [
        f"--topic={topic}",
        "--channel=c",
        f"--nsqd-http-address={nsqd.http_address}",
        "--count=2",
        "--interval=100ms",
    ]
    go, ours = run_go("stat", *args), run_tool("stat", *args)
    assert ours.returncode == go.returncode == 0, (ours, go)
    assert ours.stdout == go.stdout


def test_stat_unknown_channel_as_nsq_stat(nsqd: reference.RealDaemon) -> None:
    topic = fresh("nochan")
    fill(nsqd, topic, [b"a"], ["c"])
    args = [f"--topic={topic}", "--channel=nope", f"--nsqd-http-address={nsqd.http_address}"]
    go, ours = run_go("stat", *args), run_tool("stat", *args)
    assert (ours.returncode, go.returncode) == (1, 1), (ours, go)
    # nsq_stat's run-time errors start with "ERROR: "; ours are "error:" lines.
    assert go_message(go.stderr).removeprefix("ERROR: ") in ours.stderr.decode()
