"""Client throughput and cost against the real nsqd v1.3.0, as ratios to a raw socket loop.

The server is the real nsqd (found by tests/reference.py: ``NSQ_BIN``, else
``shared/reference/nsq-bin`` above the checkout; without it the script says so
and stops), so what differs between rows is the client alone.  Every case runs
in a fresh process of its own (the Go tools are their own processes), which
reports how long its timed part took, in wall-clock seconds and in CPU seconds
of the whole process (every thread, kernel time included: what a message costs
the client).  Bodies are 100 bytes.

The baseline is :mod:`rawsocket`: a plain blocking-socket loop (no event loop,
no object per message).  Rounds interleave the cases, their order rotating, so
a burst of load on the shared machine hurts them alike; every figure is the
median over rounds of the ratio of a case's rate to the baseline's in the same
round.  Two ratios are given: of wall-clock rates (speed: the targets) and of
CPU rates (messages per CPU second: the cost of a message, far steadier when
other programs share the machine).  Columns: ``msg/s`` the median rate,
``us/msg`` the client's median CPU time per message, ``srv us`` the server's
(nsqd's, all its threads), ``wall`` and ``cpu`` the two ratios.

Every run is checked against nsqd's ``/stats``: a drained channel has exactly N
messages sent, none in flight, requeued or timed out, the client finished N; a
published topic holds exactly N messages.  A case that fails its check stops
the script.

Sections (``--sections``, all by default):

- ``consume``: drain N pre-filled messages (max_in_flight / RDY 2500), FIN
  each: the raw loop; trionsq with ``async for`` and with an async handler (and
  a sync one); a minimal Trio loop; pynsq; Go's ``bench_reader``.
- ``publish``: pipelined PUB with 256 unanswered (raw: each read's OKs replaced
  by as many PUBs; trionsq: 256 tasks publishing on one Producer; pynsq: 256
  callbacks chaining) and sequential MPUB of 100 (raw, trionsq, pynsq, Go's
  ``bench_writer -batch-size=100``), whose runs move ``MPUB_SCALE`` (4) times
  ``--publishes`` messages (one round trip per 100: a longer run is steadier).
- ``features``: the consume drain over TLS, snappy and deflate, trionsq and
  the raw loop (TLS, deflate), against the plain drains of the same round.
- ``connections``: trionsq's CPU per message draining N messages spread over
  1, 10 and 50 real nsqds (``--connections``), beside the raw loop draining
  the same nsqds (one ``select`` loop, the same RDY each: the floor); a
  second, small drain (``--connections-small``) in the same rounds splits it
  into the marginal CPU a message and the fixed CPU a connection.
- ``fakensq``: the same drains and publishes with fakensq's nsqd (run as its
  command-line daemon) as the server: its end-to-end rate as a ratio to nsqd's.
- ``memory`` (only when named, a few minutes): a trionsq consumer drains
  ``--memory-messages`` (10 million) while a feeder process keeps nsqd's
  backlog bounded; RSS, live objects and allocated blocks every million.

    python benchmarks/bench_client.py [--messages N] [--rounds R] [--sections consume,publish]
    python benchmarks/bench_client.py --sections memory [--memory-messages N]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import rawsocket  # noqa: E402

from tests import reference  # noqa: E402
from tests.support.ports import free_port  # noqa: E402

BODY = b"x" * 100
#: the consumers' max_in_flight (and the raw loop's RDY): nsqd's max_rdy_count
IN_FLIGHT = 2500
#: unanswered PUBs in the pipelined runs (the Producer's default window)
PIPELINE = 256
#: messages per MPUB
BATCH = 100
#: the sequential MPUB runs move this many times ``--publishes``: a run of
#: 100,000 is only 1,000 round trips (0.15 s on a quiet machine), short
#: enough for one garbage collection in nsqd, or a move of either process to
#: the other core, to swing a round's ratio; 4 times as many steady it.
MPUB_SCALE = 4
CHANNEL = "c"
#: nsqd's flags (and --mem-queue-size, see nsqd_daemon).  The output buffer
#: timeout: nsqd flushes what it has buffered for a client (under 16 KB) only
#: at this ticker's tick once the channel runs dry, so a drain's last messages
#: wait for it: with nsqd's default, 250 ms, a random 0 to 250 ms was added to
#: every drain (a quarter of a 200,000 message run), the main swing between
#: runs.  25 ms is the least a client may ask for (nsqd's
#: --min-output-buffer-timeout); the clients that ask for their own (pynsq)
#: are given it too, Go's bench_reader is timed until nsqd has sent all.
OUTPUT_BUFFER_TIMEOUT_MS = 25
NSQD_FLAGS = ["--max-rdy-count=2500", f"--output-buffer-timeout={OUTPUT_BUFFER_TIMEOUT_MS}ms"]
#: nsqd's memory queue, per topic and per channel: room for a run's messages
#: (no disk queue in the measurements).  nsqd allocates it whole, 8 bytes a
#: message, for every topic and channel: 100 million cost 1.7 GB each.
MEM_QUEUE = 2_000_000


# --- the cases (each runs in a child process: ``--child CASE``) -------------


class Job(NamedTuple):
    addresses: list[str]
    topic: str
    count: int
    feature: str  # "", "tls", "snappy" or "deflate"
    ca: str  # the CA's PEM file for TLS


def _ssl_context(job: Job) -> Any:
    import ssl

    return ssl.create_default_context(cafile=job.ca)


def _raw_link(job: Job) -> dict[str, Any]:
    if job.feature == "tls":
        return {"tls": _ssl_context(job)}
    if job.feature == "deflate":
        return {"deflate": 6}
    if job.feature:
        raise SystemExit(f"the raw loop has no {job.feature}")
    return {}


def _trionsq_options(job: Job) -> dict[str, Any]:
    if job.feature == "tls":
        return {"tls": _ssl_context(job)}
    if job.feature in ("snappy", "deflate"):
        return {job.feature: True}
    return {}


def raw_consume_many(job: Job) -> None:
    """The raw loop over every address, max_in_flight spread evenly."""
    rdy = max(1, IN_FLIGHT // len(job.addresses))
    rawsocket.consume_many(job.addresses, job.topic, CHANNEL, job.count, rdy)


def raw_consume(job: Job) -> None:
    rawsocket.consume(job.addresses[0], job.topic, CHANNEL, job.count, IN_FLIGHT, **_raw_link(job))


def raw_pipelined(job: Job) -> None:
    rawsocket.publish_pipelined(job.addresses[0], job.topic, BODY, job.count, PIPELINE)


def raw_mpub(job: Job) -> None:
    rawsocket.publish_mpub(job.addresses[0], job.topic, BODY, job.count, BATCH)


def trio_raw_consume(job: Job) -> None:
    import rawclient
    import trio

    trio.run(rawclient.consume, job.addresses[0], job.topic, CHANNEL, job.count, IN_FLIGHT)


def trionsq_iterate(job: Job) -> None:
    import trio

    import trionsq

    async def main() -> None:
        received = 0
        async with trionsq.Consumer(
            job.topic,
            CHANNEL,
            nsqd_tcp_addresses=job.addresses,
            max_in_flight=IN_FLIGHT,
            **_trionsq_options(job),
        ) as consumer:
            async for message in consumer:
                await message.finish()
                received += 1
                if received == job.count:
                    break

    trio.run(main)


def _trionsq_handler(job: Job, asynchronous: bool) -> None:
    import trio

    import trionsq

    async def main() -> None:
        done = trio.Event()
        received = 0

        def count(message: trionsq.Message) -> None:
            nonlocal received
            received += 1
            if received == job.count:
                done.set()

        async def handler(message: trionsq.Message) -> None:
            count(message)

        async with trionsq.Consumer(
            job.topic,
            CHANNEL,
            handler=handler if asynchronous else count,
            nsqd_tcp_addresses=job.addresses,
            max_in_flight=IN_FLIGHT,
            **_trionsq_options(job),
        ):
            await done.wait()

    trio.run(main)


def trionsq_handler(job: Job) -> None:
    _trionsq_handler(job, asynchronous=True)


def trionsq_sync_handler(job: Job) -> None:
    _trionsq_handler(job, asynchronous=False)


def trionsq_pipelined(job: Job) -> None:
    import trio

    import trionsq

    async def main() -> None:
        async with trionsq.Producer(job.addresses, **_trionsq_options(job)) as producer:

            async def worker(share: int) -> None:
                for _ in range(share):
                    await producer.publish(job.topic, BODY)

            async with trio.open_nursery() as nursery:
                for share in _shares(job.count, PIPELINE):
                    nursery.start_soon(worker, share)

    trio.run(main)


def trionsq_mpub(job: Job) -> None:
    import trio

    import trionsq

    async def main() -> None:
        async with trionsq.Producer(job.addresses, **_trionsq_options(job)) as producer:
            batch = [BODY] * BATCH
            for start in range(0, job.count, BATCH):
                size = min(BATCH, job.count - start)
                await producer.multi_publish(job.topic, batch if size == BATCH else batch[:size])

    trio.run(main)


def pynsq_consume(job: Job) -> None:
    import nsq
    import tornado.ioloop

    loop = tornado.ioloop.IOLoop.current()
    received = 0

    def handler(message: Any) -> bool:
        nonlocal received
        received += 1
        if received == job.count:
            loop.add_callback(stop)
        return True  # pynsq FINs it

    def stop() -> None:
        reader.close()
        loop.stop()

    reader = nsq.Reader(
        topic=job.topic,
        channel=CHANNEL,
        message_handler=handler,
        nsqd_tcp_addresses=job.addresses,
        max_in_flight=IN_FLIGHT,
        output_buffer_timeout=OUTPUT_BUFFER_TIMEOUT_MS,
    )
    loop.start()


def _pynsq_publish(job: Job, batch: int) -> None:
    import nsq
    import tornado.ioloop

    loop = tornado.ioloop.IOLoop.current()
    writer = nsq.Writer(job.addresses)
    sent = done = 0
    failures: list[object] = []

    def publish_next() -> None:
        nonlocal sent
        size = min(batch, job.count - sent)
        sent += size
        if batch == 1:
            writer.pub(job.topic, BODY, answered)
        else:
            writer.mpub(job.topic, [BODY] * size, answered)

    def answered(conn: Any, data: Any) -> None:
        nonlocal done
        if isinstance(data, Exception):
            failures.append(data)
            loop.stop()
            return
        done += batch
        if sent < job.count:
            publish_next()
        elif done >= job.count:
            loop.stop()

    def start() -> None:
        if not writer.conns:  # connecting
            loop.call_later(0.001, start)
            return
        for _ in range(PIPELINE if batch == 1 else 1):
            if sent < job.count:
                publish_next()

    loop.add_callback(start)
    loop.start()
    if failures:
        raise SystemExit(f"pynsq: {failures[0]!r}")


def pynsq_pipelined(job: Job) -> None:
    _pynsq_publish(job, 1)


def pynsq_mpub(job: Job) -> None:
    _pynsq_publish(job, BATCH)


CASES: dict[str, Callable[[Job], None]] = {
    "raw_consume": raw_consume,
    "raw_pipelined": raw_pipelined,
    "raw_mpub": raw_mpub,
    "trio_raw_consume": trio_raw_consume,
    "raw_consume_many": raw_consume_many,
    "trionsq_iterate": trionsq_iterate,
    "trionsq_handler": trionsq_handler,
    "trionsq_sync_handler": trionsq_sync_handler,
    "trionsq_pipelined": trionsq_pipelined,
    "trionsq_mpub": trionsq_mpub,
    "pynsq_consume": pynsq_consume,
    "pynsq_pipelined": pynsq_pipelined,
    "pynsq_mpub": pynsq_mpub,
}


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def child(case: str, job: Job) -> None:
    """Run one case and print its timings as the last line (JSON)."""
    run = CASES[case]
    # Imported before the clock starts (about 0.1 s of CPU: 1 us a message of
    # a 100,000 message run), whatever the case uses.
    import nsq  # noqa: F401
    import rawclient  # noqa: F401
    import tornado.ioloop  # noqa: F401
    import trio  # noqa: F401

    import trionsq  # noqa: F401

    gc.collect()
    wall, cpu = time.perf_counter(), _cpu_seconds()
    system = resource.getrusage(resource.RUSAGE_SELF).ru_stime
    run(job)
    wall, cpu = time.perf_counter() - wall, _cpu_seconds() - cpu
    usage = resource.getrusage(resource.RUSAGE_SELF)
    system = usage.ru_stime - system
    peak = usage.ru_maxrss * 1024
    print(json.dumps({"wall": wall, "cpu": cpu, "system": system, "peak_rss": peak}))


# --- the daemons and their checks -------------------------------------------


class Took(NamedTuple):
    wall: float
    cpu: float
    count: int
    server_cpu: float = 0.0  # the nsqd's CPU seconds over the run
    system: float = 0.0  # of ``cpu``, the seconds the kernel worked for the client


class Nsqd:
    """A running nsqd (real, or fakensq's command), with its HTTP API at hand."""

    def __init__(self, daemon: reference.RealDaemon) -> None:
        self.daemon = daemon
        self.tcp = daemon.tcp_address
        self.http = httpx.Client(base_url=f"http://{daemon.http_address}", timeout=60)

    def close(self) -> None:
        self.http.close()

    def cpu(self) -> float:
        """The daemon's CPU seconds so far (user and system, every thread)."""
        process = self.daemon.process
        assert process is not None
        try:
            with open(f"/proc/{process.pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0  # no /proc: the column shows 0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def topic(self, name: str) -> dict[str, Any]:
        stats = self.http.get("/stats", params={"format": "json", "topic": name}).json()
        for topic in stats.get("topics") or []:
            if topic["topic_name"] == name:
                return dict(topic)
        return {}

    def channel(self, topic: str) -> dict[str, Any]:
        for channel in self.topic(topic).get("channels") or []:
            if channel["channel_name"] == CHANNEL:
                return dict(channel)
        return {}

    def create(self, topic: str, channel: bool) -> None:
        self.http.post("/topic/create", params={"topic": topic}).raise_for_status()
        if channel:
            self.http.post(
                "/channel/create", params={"topic": topic, "channel": CHANNEL}
            ).raise_for_status()

    def delete(self, topic: str) -> None:
        self.http.post("/topic/delete", params={"topic": topic}).raise_for_status()

    def prefill(self, topic: str, count: int) -> None:
        """The channel holding ``count`` messages before anything is timed."""
        self.create(topic, channel=True)
        rawsocket.publish_mpub(self.tcp, topic, BODY, count, 1000)
        # nsqd copies the topic's messages into the channel in the background.
        _wait(lambda: self.channel(topic).get("depth") == count, 120, f"{topic}: prefill")

    def check_drained(self, topic: str, count: int) -> None:
        _wait(
            lambda: self.channel(topic).get("in_flight_count") == 0,
            60,
            f"{topic}: messages still in flight",
        )
        channel = self.channel(topic)
        expected = {"depth": 0, "message_count": count, "requeue_count": 0, "timeout_count": 0}
        got = {key: channel.get(key) for key in expected}
        if got != expected:
            raise AssertionError(f"{topic}: the channel has {got}, expected {expected}")

    def check_published(self, topic: str, count: int) -> None:
        got = self.topic(topic).get("message_count")
        if got != count:
            raise AssertionError(f"{topic}: nsqd counted {got} messages, expected {count}")


def _wait(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out: {what}")
        time.sleep(0.01)  # polling another process


@contextmanager
def nsqd_daemon(
    flags: Sequence[str] = (),
    fake: bool = False,
    shims: Path | None = None,
    mem_queue: int = MEM_QUEUE,
) -> Iterator[Nsqd]:
    """A started nsqd; ``fake`` runs fakensq's nsqd command instead (its shim)."""
    flags = [*NSQD_FLAGS, f"--mem-queue-size={mem_queue}", *flags]
    daemon = reference.RealDaemon("nsqd", flags)
    if fake:
        assert shims is not None
        daemon.binary = shims / "nsqd"
    with daemon:
        nsqd = Nsqd(daemon)
        try:
            yield nsqd
        finally:
            nsqd.close()


def run_child(
    case: str, nsqds: Sequence[Nsqd], topic: str, count: int, feature: str, ca: str
) -> Took:
    argv = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        case,
        "--addresses",
        ",".join(n.tcp for n in nsqds),
        "--topic",
        topic,
        "--count",
        str(count),
        "--feature",
        feature,
        "--ca",
        ca,
    ]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{case} failed ({out.returncode}): {out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return Took(result["wall"], result["cpu"], count, system=result["system"])


def _rusage_seconds(usage: resource.struct_rusage) -> float:
    return usage.ru_utime + usage.ru_stime


def go_reader(nsqd: Nsqd, topic: str, count: int) -> Took:
    """Go's bench_reader (one connection: GOMAXPROCS=1) draining the channel.

    It flushes its writes only in the last quarter of each RDY's worth of
    messages, so the FINs of the messages after its last flush are never
    written: the clock stops when nsqd has sent it every message, and the check
    is that nsqd sent exactly ``count`` and got every FIN but those.
    """
    binary = reference.binary("bench_reader")
    assert binary is not None
    argv = [
        str(binary),
        f"-nsqd-tcp-address={nsqd.tcp}",
        f"-topic={topic}",
        f"-channel={CHANNEL}",
        f"-size={len(BODY)}",
        f"-rdy={IN_FLIGHT}",
        "-runfor=10m",
    ]
    env = {**os.environ, "GOMAXPROCS": "1"}
    start = time.perf_counter()
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:

        def sent() -> int:
            clients = nsqd.channel(topic).get("clients") or []
            return sum(client.get("message_count", 0) for client in clients)

        _wait(lambda: sent() >= count, 300, f"{topic}: bench_reader drain")
        wall = time.perf_counter() - start

        def finished() -> int:
            clients = nsqd.channel(topic).get("clients") or []
            return sum(client.get("finish_count", 0) for client in clients)

        _wait(lambda: finished() >= count - _go_unflushed(count), 30, f"{topic}: bench_reader FINs")
        channel = nsqd.channel(topic)
        if (channel.get("depth"), sent(), finished()) != (0, count, count - _go_unflushed(count)):
            raise AssertionError(f"{topic}: bench_reader left {channel}")
    finally:
        process.kill()
        _, _, usage = os.wait4(process.pid, 0)
        process.returncode = -9
    return Took(wall, _rusage_seconds(usage), count)


def _go_unflushed(count: int) -> int:
    """How many of bench_reader's last FINs stay unwritten (see go_reader)."""
    rest = count % IN_FLIGHT
    return 0 if rest > IN_FLIGHT * 0.75 else rest + 1


_GO_DURATION = re.compile(r"duration: ([0-9.]+)(ms|s|µs)")


def go_writer(nsqd: Nsqd, topic: str, runfor: float) -> Took:
    """Go's bench_writer (one connection: GOMAXPROCS=1), MPUB of BATCH, for
    ``runfor`` seconds; how many it published is nsqd's count."""
    binary = reference.binary("bench_writer")
    assert binary is not None
    argv = [
        str(binary),
        f"-nsqd-tcp-address={nsqd.tcp}",
        f"-topic={topic}",
        f"-size={len(BODY)}",
        f"-batch-size={BATCH}",
        f"-runfor={runfor}s",
    ]
    env = {**os.environ, "GOMAXPROCS": "1"}
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert process.stdout is not None
    output = process.stdout.read().decode(errors="replace")
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"bench_writer failed: {output[-2000:]}")
    match = _GO_DURATION.search(output)
    if match is None:
        raise RuntimeError(f"bench_writer said: {output[-2000:]}")
    wall = float(match.group(1)) / {"s": 1, "ms": 1e3, "µs": 1e6}[match.group(2)]
    count = int(nsqd.topic(topic).get("message_count") or 0)
    if count == 0 or count % BATCH:
        raise AssertionError(f"{topic}: bench_writer published {count} messages")
    return Took(wall, _rusage_seconds(usage), count)


# --- rounds and tables ------------------------------------------------------


class Case(NamedTuple):
    label: str
    kind: str  # "consume" or "publish"
    run: Callable[[Nsqd, str, int], Took]  # (nsqd, topic, count) -> timings
    scale: float = 1.0  # fraction of the section's count (slow clients move fewer)
    checked: bool = False  # the run checks nsqd's counts itself


def child_case(name: str, feature: str = "", ca: str = "") -> Callable[[Nsqd, str, int], Took]:
    def run(nsqd: Nsqd, topic: str, count: int) -> Took:
        return run_child(name, [nsqd], topic, count, feature, ca)

    return run


class Series(NamedTuple):
    wall: list[float]  # messages per second, one per round
    cpu: list[float]  # messages per CPU second of the client
    server: list[float]  # the nsqd's CPU seconds per message


_topics = 0


def _topic() -> str:
    global _topics
    _topics += 1
    return f"bench_{os.getpid()}_{_topics}"


def measure(nsqd: Nsqd, case: Case, count: int) -> Took:
    count = max(1, int(count * case.scale))
    topic = _topic()
    if case.kind == "consume":
        nsqd.prefill(topic, count)
        server = nsqd.cpu()
        took = case.run(nsqd, topic, count)
        if not case.checked:
            nsqd.check_drained(topic, count)
    else:
        nsqd.create(topic, channel=False)
        server = nsqd.cpu()
        took = case.run(nsqd, topic, count)
        nsqd.check_published(topic, took.count)
    took = took._replace(server_cpu=nsqd.cpu() - server)
    nsqd.delete(topic)
    return took


def rounds(
    cases: dict[str, tuple[Nsqd, Case]], count: int, runs: int, title: str
) -> dict[str, Series]:
    """Every case once a round, in a rotating order."""
    series = {name: Series([], [], []) for name in cases}
    names = list(cases)
    for round_ in range(runs):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            nsqd, case = cases[name]
            took = measure(nsqd, case, count)
            series[name].wall.append(took.count / took.wall)
            series[name].cpu.append(took.count / max(took.cpu, 1e-9))
            series[name].server.append(took.server_cpu / took.count)
        print(f"  {title}: round {round_ + 1}/{runs} done", file=sys.stderr, flush=True)
    return series


class Row(NamedTuple):
    name: str
    baseline: str = ""  # the series it is divided by ('' for none)
    target: float | None = None


def _median_ratio(case: list[float], base: list[float]) -> float:
    return statistics.median(c / b for c, b in zip(case, base, strict=True))


def table(
    title: str, cases: dict[str, tuple[Nsqd, Case]], series: dict[str, Series], rows: list[Row]
) -> list[str]:
    """Print a section's table; returns the targets missed."""
    print(title)
    head = f"{'msg/s':>9} {'us/msg':>7} {'srv us':>6} {'wall':>6} {'cpu':>6}"
    print(f"  {'case':<44} {head}  {'target':<10} against")
    missed = []
    for row in rows:
        s = series[row.name]
        label = cases[row.name][1].label
        rate = statistics.median(s.wall)
        cost = 1e6 / statistics.median(s.cpu)
        server = 1e6 * statistics.median(s.server)
        figures = f"{rate:>9,.0f} {cost:>7.2f} {server:>6.2f}"
        if not row.baseline:
            print(f"  {label:<44} {figures} {'':>6} {'':>6}  {'':<10} (baseline)")
            continue
        base = series[row.baseline]
        wall = _median_ratio(s.wall, base.wall)
        cpu = _median_ratio(s.cpu, base.cpu)
        verdict = ""
        if row.target is not None:
            ok = wall >= row.target
            verdict = f">={row.target:.1f} {'ok' if ok else 'MISSED'}"
            if not ok:
                missed.append(f"{label}: {wall:.2f} < {row.target}")
        against = cases[row.baseline][1].label
        print(f"  {label:<44} {figures} {wall:6.2f} {cpu:6.2f}  {verdict:<10} {against}")
    sys.stdout.flush()
    return missed


# --- sections ---------------------------------------------------------------


def consume_section(nsqd: Nsqd, args: argparse.Namespace) -> list[str]:
    cases = {
        "raw": (nsqd, Case("raw socket loop", "consume", child_case("raw_consume"))),
        "iterate": (nsqd, Case("trionsq, async for", "consume", child_case("trionsq_iterate"))),
        "handler": (
            nsqd,
            Case("trionsq, async handler", "consume", child_case("trionsq_handler")),
        ),
        "sync": (
            nsqd,
            Case("trionsq, sync handler", "consume", child_case("trionsq_sync_handler")),
        ),
        "trio": (
            nsqd,
            Case("minimal Trio loop (rawclient)", "consume", child_case("trio_raw_consume")),
        ),
        "pynsq": (
            nsqd,
            Case("pynsq Reader", "consume", child_case("pynsq_consume"), scale=0.1),
        ),
    }
    if reference.binary("bench_reader") is not None:
        cases["go"] = (
            nsqd,
            Case("Go bench_reader (1 connection)", "consume", go_reader, checked=True),
        )
    series = rounds(cases, args.messages, args.rounds, "consume")
    return table(
        f"consume: drain {args.messages:,} pre-filled messages, FIN each, RDY {IN_FLIGHT}, "
        f"median of {args.rounds} per-round ratios",
        cases,
        series,
        [
            Row("raw"),
            Row("iterate", "raw", 0.6),
            Row("handler", "raw", 0.6),
            Row("sync", "raw"),
            Row("trio", "raw"),
            Row("pynsq", "raw"),
            *([Row("go", "raw")] if "go" in cases else []),
        ],
    )


def go_writer_case(runfor: float) -> Callable[[Nsqd, str, int], Took]:
    def run(nsqd: Nsqd, topic: str, count: int) -> Took:
        return go_writer(nsqd, topic, runfor)

    return run


def publish_section(nsqd: Nsqd, args: argparse.Namespace) -> list[str]:
    cases = {
        "raw_pipe": (
            nsqd,
            Case(f"raw PUB, {PIPELINE} unanswered", "publish", child_case("raw_pipelined")),
        ),
        "pipe": (
            nsqd,
            Case(f"trionsq PUB, {PIPELINE} tasks", "publish", child_case("trionsq_pipelined")),
        ),
        "pynsq_pipe": (
            nsqd,
            Case(
                f"pynsq PUB, {PIPELINE} unanswered",
                "publish",
                child_case("pynsq_pipelined"),
                scale=0.25,
            ),
        ),
        "raw_mpub": (
            nsqd,
            Case(
                f"raw MPUB x{BATCH}, sequential",
                "publish",
                child_case("raw_mpub"),
                scale=MPUB_SCALE,
            ),
        ),
        "mpub": (
            nsqd,
            Case(
                f"trionsq MPUB x{BATCH}, sequential",
                "publish",
                child_case("trionsq_mpub"),
                scale=MPUB_SCALE,
            ),
        ),
        "pynsq_mpub": (
            nsqd,
            Case(
                f"pynsq MPUB x{BATCH}, sequential",
                "publish",
                child_case("pynsq_mpub"),
                scale=MPUB_SCALE,
            ),
        ),
    }
    if reference.binary("bench_writer") is not None:
        cases["go_mpub"] = (
            nsqd,
            Case(
                f"Go bench_writer x{BATCH} (1 connection)",
                "publish",
                go_writer_case(args.go_runfor),
            ),
        )
    series = rounds(cases, args.publishes, args.rounds, "publish")
    return table(
        f"publish: {args.publishes:,} messages (sequential MPUB: "
        f"{args.publishes * MPUB_SCALE:,}), median of {args.rounds} per-round ratios",
        cases,
        series,
        [
            Row("raw_pipe"),
            Row("pipe", "raw_pipe", 0.9),
            Row("pynsq_pipe", "raw_pipe"),
            Row("raw_mpub"),
            Row("mpub", "raw_mpub", 0.8),
            Row("pynsq_mpub", "raw_mpub"),
            *([Row("go_mpub", "raw_mpub")] if "go_mpub" in cases else []),
        ],
    )


def features_section(nsqd: Nsqd, ca: str, args: argparse.Namespace) -> list[str]:
    def case(label: str, name: str, feature: str) -> tuple[Nsqd, Case]:
        return nsqd, Case(label, "consume", child_case(name, feature, ca))

    cases = {
        "raw": case("raw socket loop", "raw_consume", ""),
        "raw_tls": case("raw socket loop, TLS", "raw_consume", "tls"),
        "raw_deflate": case("raw socket loop, deflate", "raw_consume", "deflate"),
        "plain": case("trionsq, async for", "trionsq_iterate", ""),
        "tls": case("trionsq, async for, TLS", "trionsq_iterate", "tls"),
        "snappy": case("trionsq, async for, snappy", "trionsq_iterate", "snappy"),
        "deflate": case("trionsq, async for, deflate", "trionsq_iterate", "deflate"),
    }
    series = rounds(cases, args.messages, args.rounds, "features")
    return table(
        f"features: drain {args.messages:,} messages over TLS, snappy, deflate, "
        f"median of {args.rounds} per-round ratios",
        cases,
        series,
        [
            Row("raw"),
            Row("raw_tls", "raw"),
            Row("raw_deflate", "raw"),
            Row("plain", "raw"),
            Row("tls", "raw"),
            Row("tls", "plain"),
            Row("snappy", "plain"),
            Row("deflate", "plain"),
            Row("deflate", "raw_deflate"),
        ],
    )


def _drain_spread(case: str, group: list[Nsqd], count: int) -> Took:
    """One child draining ``count`` messages spread evenly over ``group``, checked."""
    topic = _topic()
    shares = _shares(count, len(group))
    for nsqd, share in zip(group, shares, strict=True):
        nsqd.prefill(topic, share)
    took = run_child(case, group, topic, count, "", "")
    for nsqd, share in zip(group, shares, strict=True):
        nsqd.check_drained(topic, share)
        nsqd.delete(topic)
    return took


class _Line(NamedTuple):
    """One round's fit of CPU seconds against messages, at one width."""

    total: float  # CPU seconds a message over the full run
    slope: float  # CPU seconds a further message (the marginal cost)
    fixed: float  # CPU seconds of a run of no messages (per process and connections)
    rate: float  # messages a wall-clock second over the full run
    system: float  # of ``slope``, the kernel's CPU seconds (system calls, loopback TCP)


def _fit(small: Took, full: Took) -> _Line:
    extra = full.count - small.count
    slope = (full.cpu - small.cpu) / extra
    return _Line(
        full.cpu / full.count,
        slope,
        small.cpu - slope * small.count,
        full.count / full.wall,
        (full.system - small.system) / extra,
    )


def connections_section(args: argparse.Namespace) -> list[str]:
    """trionsq's CPU per message as the messages come from more nsqds, split
    into what a message costs and what a connection costs.

    ``max_in_flight`` 2500 over n nsqds is a RDY of 2500 / n each: nsqd sends
    a connection at most that many messages before it needs their FINs, so a
    read, a send of FINs and their system calls are shared by fewer messages
    as n grows, and the client's process is woken by (and wakes) n servers.
    The raw loop over the same n nsqds (:func:`rawsocket.consume_many`: one
    ``select`` loop, the same RDY each) shows what this costs any Python
    client: the floor a client over n connections cannot go below.

    Each width drains two counts in every round (``--messages`` and
    ``--connections-small``, by default 1% of it), trionsq and the raw loop
    alike, in alternating order; a straight line through the two CPU times
    splits a run's cost in two: the **marginal** CPU a message (the slope:
    what each further message costs, reads and FINs included) and the
    **fixed** CPU of the run (the intercept: what a drain of no messages
    would cost: the process's own start, then connecting to every nsqd,
    IDENTIFY, SUB, RDY, and leaving: CLS, CLOSE_WAIT, closing).

    Columns: ``msg/s`` the full run's rate; ``us/msg`` its CPU a message
    (the issue's measure: fixed and marginal together); ``marg us`` the
    marginal CPU a message; ``fixed ms`` the fixed CPU of a run; ``ms/conn``
    that divided by the nsqds (at 1 nsqd it holds the process's own start
    too); ``+ms/conn`` what each nsqd beyond the first width's adds to the
    fixed CPU (the cost of a connection itself); ``us/msg vs raw`` trionsq's
    ``us/msg`` over the raw loop's.  Each figure is the median over rounds of
    that round's fit; each ``vs 1`` column the median of the per-round ratios
    to the first width (``--connections``, 1 by default).  Every run is
    checked against each nsqd's ``/stats``.

    A second table splits the marginal CPU a message into ``user`` (the
    process's own work: the client's code) and ``system`` (the kernel's on
    its behalf: reads, writes, waits, and on loopback the TCP work of handing
    its FINs to nsqd), from the same fit of ``getrusage``'s two clocks.
    """
    widths = [int(n) for n in args.connections.split(",")]
    small = args.connections_small or max(args.messages // 100, max(widths))
    if not max(widths) <= small < args.messages:
        raise SystemExit(
            f"--connections-small {small} must be at least {max(widths)} (one message an "
            f"nsqd) and below --messages {args.messages}"
        )
    cases = ("trionsq_iterate", "raw_consume_many")
    with ExitStack() as stack:
        # Each holds at most a run's messages (50 of them: keep their memory small).
        queue = args.messages + 1000
        nsqds = [stack.enter_context(nsqd_daemon(mem_queue=queue)) for _ in range(max(widths))]
        lines: dict[tuple[str, int], list[_Line]] = {(c, n): [] for c in cases for n in widths}
        for round_ in range(args.rounds):
            shift = round_ % len(widths)
            counts = (small, args.messages) if round_ % 2 == 0 else (args.messages, small)
            for width in widths[shift:] + widths[:shift]:
                group = nsqds[:width]
                took: dict[tuple[str, int], Took] = {}
                for count in counts:
                    for case in cases if count == small else cases[::-1]:
                        took[case, count] = _drain_spread(case, group, count)
                for case in cases:
                    lines[case, width].append(_fit(took[case, small], took[case, args.messages]))
            print(f"  connections: round {round_ + 1}/{args.rounds} done", file=sys.stderr)
    first = widths[0]

    def median(case: str, width: int, figure: Callable[[_Line], float]) -> float:
        return statistics.median(figure(line) for line in lines[case, width])

    def versus(
        case: str, width: int, figure: Callable[[_Line, int], float], other: str = ""
    ) -> float:
        """Median of the per-round ratios to the first width (or to ``other`` case)."""
        base, base_width = (lines[other, width], width) if other else (lines[case, first], first)
        ratios = []
        for line, base_line in zip(lines[case, width], base, strict=True):
            divisor = figure(base_line, base_width)
            if divisor:
                ratios.append(figure(line, width) / divisor)
        return statistics.median(ratios) if ratios else math.nan

    def total(line: _Line, width: int) -> float:
        return line.total

    def slope(line: _Line, width: int) -> float:
        return line.slope

    def per_connection(line: _Line, width: int) -> float:
        return line.fixed / width

    print(
        f"connections: {args.messages:,} and {small:,} messages spread over n nsqds, drained "
        f"by trionsq (async for, max_in_flight {IN_FLIGHT}) and by the raw loop (one select "
        f"loop, RDY {IN_FLIGHT} / n each), median of {args.rounds} rounds"
    )
    print(
        f"  {'':<8} {'nsqds':>5} {'msg/s':>9} {'us/msg':>7} {'vs 1':>5} "
        f"{'marg us':>8} {'vs 1':>5} {'fixed ms':>9} {'ms/conn':>8} {'vs 1':>5} "
        f"{'+ms/conn':>9} {'us/msg vs raw':>14}"
    )
    for case, label in zip(cases, ("trionsq", "raw loop"), strict=True):
        for width in widths:
            # What each connection beyond the first widths' adds to the fixed cost.
            extra = (
                statistics.median(
                    (a.fixed - b.fixed) / (width - first)
                    for a, b in zip(lines[case, width], lines[case, first], strict=True)
                )
                if width != first
                else math.nan
            )
            raw = f"{versus(case, width, total, cases[1]):>14.2f}" if case != cases[1] else ""
            print(
                f"  {label:<8} {width:>5} {median(case, width, lambda x: x.rate):>9,.0f} "
                f"{1e6 * median(case, width, lambda x: x.total):>7.2f} "
                f"{versus(case, width, total):>5.2f} "
                f"{1e6 * median(case, width, lambda x: x.slope):>8.2f} "
                f"{versus(case, width, slope):>5.2f} "
                f"{1e3 * median(case, width, lambda x: x.fixed):>9.2f} "
                f"{1e3 * median(case, width, lambda x: x.fixed) / width:>8.3f} "
                f"{versus(case, width, per_connection):>5.2f} "
                f"{f'{1e3 * extra:.3f}' if width != first else '-':>9} {raw}"
            )
    # The marginal CPU split in two: the process's own work (Python, the
    # client's code) and the kernel's on its behalf (each read, write and
    # wait, and on loopback the TCP work of delivering the FINs to nsqd).
    # At RDY 2500 / n a read and a write are shared by fewer messages as n
    # grows, which any client pays in kernel time (the raw loop's rows).
    print(
        "  marginal CPU a message, split: user (the process's own work) and system "
        "(the kernel's, for its reads, writes and waits)"
    )
    print(f"  {'':<8} {'nsqds':>5} {'user us':>8} {'vs 1':>5} {'system us':>10} {'vs 1':>5}")

    def user(line: _Line, width: int) -> float:
        return line.slope - line.system

    def system(line: _Line, width: int) -> float:
        return line.system

    for case, label in zip(cases, ("trionsq", "raw loop"), strict=True):
        for width in widths:
            print(
                f"  {label:<8} {width:>5} {1e6 * median(case, width, lambda x: user(x, 0)):>8.2f} "
                f"{versus(case, width, user):>5.2f} "
                f"{1e6 * median(case, width, lambda x: x.system):>10.2f} "
                f"{versus(case, width, system):>5.2f}"
            )
    sys.stdout.flush()
    return []


def fakensq_section(real: Nsqd, fake: Nsqd, args: argparse.Namespace) -> list[str]:
    cases: dict[str, tuple[Nsqd, Case]] = {}
    for server, nsqd in (("nsqd", real), ("fakensq", fake)):
        cases[f"{server}_raw"] = (
            nsqd,
            Case(f"{server}: raw loop drains", "consume", child_case("raw_consume")),
        )
        cases[f"{server}_iterate"] = (
            nsqd,
            Case(f"{server}: trionsq async for drains", "consume", child_case("trionsq_iterate")),
        )
        cases[f"{server}_pipe"] = (
            nsqd,
            Case(
                f"{server}: raw PUB, {PIPELINE} unanswered", "publish", child_case("raw_pipelined")
            ),
        )
        cases[f"{server}_mpub"] = (
            nsqd,
            Case(f"{server}: raw MPUB x{BATCH}", "publish", child_case("raw_mpub")),
        )
    series = rounds(cases, args.messages, args.rounds, "fakensq")
    return table(
        f"fakensq's nsqd against the real one, {args.messages:,} messages, "
        f"median of {args.rounds} per-round ratios (wall: fakensq's rate over nsqd's)",
        cases,
        series,
        [
            Row("nsqd_raw"),
            Row("fakensq_raw", "nsqd_raw"),
            Row("nsqd_iterate"),
            Row("fakensq_iterate", "nsqd_iterate"),
            Row("nsqd_pipe"),
            Row("fakensq_pipe", "nsqd_pipe"),
            Row("nsqd_mpub"),
            Row("fakensq_mpub", "nsqd_mpub"),
        ],
    )


def _shares(count: int, parts: int) -> list[int]:
    share, extra = divmod(count, parts)
    return [share + (1 if i < extra else 0) for i in range(parts)]


def _certificates(folder: Path) -> tuple[list[str], str]:
    """nsqd's TLS flags (a certificate for 127.0.0.1) and the CA's file."""
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    cert.private_key_pem.write_to_path(str(folder / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(folder / "cert.pem"))
    flags = [f"--tls-cert={folder / 'cert.pem'}", f"--tls-key={folder / 'key.pem'}"]
    # With a certificate nsqd also serves HTTPS, by default on 0.0.0.0:4152:
    # a second benchmark (or test) running at the same time could not start.
    flags.append(f"--https-address=127.0.0.1:{free_port()}")
    return flags, str(folder / "ca.pem")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000, help="messages per drain")
    parser.add_argument("--publishes", type=int, default=200_000, help="messages per publish run")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--sections", default="consume,publish,features,connections,fakensq", help="which tables"
    )
    parser.add_argument("--connections", default="1,10,50", help="nsqd counts to spread over")
    parser.add_argument(
        "--connections-small",
        type=int,
        default=0,
        help="the connections section's small drain (default: 1%% of --messages)",
    )
    parser.add_argument("--go-runfor", type=float, default=1.0, help="bench_writer's run, s")
    parser.add_argument("--memory-messages", type=int, default=10_000_000)
    parser.add_argument("--child", choices=sorted(CASES), help=argparse.SUPPRESS)
    parser.add_argument("--addresses", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--feature", default="", help=argparse.SUPPRESS)
    parser.add_argument("--ca", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(
            args.child,
            Job(args.addresses.split(","), args.topic, args.count, args.feature, args.ca),
        )
        return 0
    if reference.binary("nsqd") is None:
        print(f"no real nsqd: {reference.skip_reason()}; nothing measured")
        return 0
    sections = set(args.sections.split(","))
    missed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-client-") as folder:
        tls_flags, ca = _certificates(Path(folder))
        if sections & {"consume", "publish", "features", "fakensq"}:
            queue = max(MEM_QUEUE, args.messages + 1000, args.publishes * MPUB_SCALE + 1000)
            with nsqd_daemon(tls_flags, mem_queue=queue) as nsqd:
                if "consume" in sections:
                    missed += consume_section(nsqd, args)
                if "publish" in sections:
                    missed += publish_section(nsqd, args)
                if "features" in sections:
                    missed += features_section(nsqd, ca, args)
                if "fakensq" in sections:
                    shims = Path(folder) / "shims"
                    subprocess.run(
                        [sys.executable, "-m", "fakensq", "shims", str(shims)], check=True
                    )
                    with nsqd_daemon(fake=True, shims=shims, mem_queue=queue) as fake:
                        missed += fakensq_section(nsqd, fake, args)
        if "connections" in sections:
            missed += connections_section(args)
        if "memory" in sections:
            import memory_client

            memory_client.run(args.memory_messages)
    if missed:
        print("targets missed: " + "; ".join(missed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
