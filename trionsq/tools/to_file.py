"""``trionsq to-file``: archive topics to files, as ``nsq_to_file``.

Each message body is written followed by a newline.  Messages are finished only
once written and synced: after a batch of ``--max-in-flight`` messages, when the
consumer is starved or idle, and every ``--sync-interval``.  With ``--gzip``
each sync ends a gzip member (the file is a valid concatenation of members), so
a crash loses nothing that was finished.

File names come from ``--filename-format`` (default
``<TOPIC>.<HOST><REV>.<DATETIME>.log``): ``<TOPIC>``, ``<HOST>`` (the short
host name, or ``--host-identifier``), ``<PID>``, ``<DATETIME>``
(``--datetime-format``, strftime) and ``<REV>`` (``-000000``, ``-000001``, ...:
bumped when a name is taken; required with gzip, rotation or a work dir).  A
file is rotated when ``<DATETIME>`` changes, after ``--rotate-interval``, or past
``--rotate-size`` bytes (uncompressed).  Files in progress live in
``--work-dir`` and are moved to ``--output-dir`` when closed.  SIGINT/SIGTERM
sync, finish and close everything, then exit 0.
"""

from __future__ import annotations

import argparse
import gzip
import logging
import math
import os
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import trio

from ..config import Config
from ..consumer import Consumer
from ..message import Message
from ..protocol.names import is_valid_topic_name
from .common import (
    ToolError,
    add_consumer_flags,
    add_http_client_flags,
    check_names,
    check_sources,
    consumer_options,
    require_sources,
)
from .flags import FlagSet
from .progress import Progress

__all__ = ["configure", "prepare", "run", "FileOptions", "FileLogger", "filename_template"]

HELP = "archive topics to files, with rotation and gzip (nsq_to_file)"

log = logging.getLogger("trionsq.tools.to_file")

DEFAULT_FORMAT = "<TOPIC>.<HOST><REV>.<DATETIME>.log"
#: How long without a new message before what was written is synced and finished.
IDLE_SYNC = 0.1
#: The share of a connection's RDY held at which a sync starts in the background
#: (the consumer is starved at 85%: nsqd then sends nothing more).
EARLY_SYNC = 0.5
#: Batches at least this large are synced on a worker thread (and early syncs
#: happen only when half the RDY is this many): for a small batch, the hop to a
#: thread and back costs more than it lets the loop do meanwhile.
THREADED_SYNC = 500


def configure(flags: FlagSet) -> None:
    add_consumer_flags(flags, channel_default="nsq_to_file")
    flags.string("output-dir", "/tmp", "directory to write output files to")
    flags.string("work-dir", "", "directory for in-progress files before moving to output-dir")
    flags.string(
        "filename-format",
        DEFAULT_FORMAT,
        "output filename format (<TOPIC>, <HOST>, <PID>, <DATETIME>, <REV> are replaced. "
        "<REV> is increased when file already exists)",
    )
    flags.string(
        "datetime-format",
        "%Y-%m-%d_%H",
        "strftime compatible format for <DATETIME> in filename format",
    )
    flags.string(
        "host-identifier",
        "",
        "value to output in log filename in place of hostname. <SHORT_HOST> and <HOSTNAME> "
        "are valid replacement tokens",
    )
    flags.bool("gzip", False, "gzip output files.")
    flags.int("gzip-level", 6, "gzip compression level (1-9, 1=BestSpeed, 9=BestCompression)")
    flags.duration("rotate-interval", 0.0, "rotate the file every duration", plain_seconds=True)
    flags.int(
        "rotate-size",
        0,
        "rotate the file when it grows bigger than rotate-size bytes",
        kind="rotate-size",
    )
    flags.bool("skip-empty-files", False, "skip writing empty files")
    flags.duration("sync-interval", 30.0, "sync file to disk every duration", plain_seconds=True)
    flags.string("topic-pattern", "", "only log topics matching the following pattern")
    flags.duration(
        "topic-refresh",
        60.0,
        "how frequently the topic list should be refreshed",
        plain_seconds=True,
    )
    flags.string("log-level", "info", "set log verbosity: debug, info, warn, error, or fatal")
    flags.string("log-prefix", "[nsq_to_file] ", "log message prefix")
    add_http_client_flags(flags, request_timeout=5.0)


@dataclass(frozen=True)
class FileOptions:
    """How files are named, rotated and compressed."""

    output_dir: str
    work_dir: str
    filename_format: str = DEFAULT_FORMAT
    datetime_format: str = "%Y-%m-%d_%H"
    host_identifier: str = ""
    gzip: bool = False
    gzip_level: int = 6
    rotate_interval: float = 0.0
    rotate_size: int = 0
    skip_empty_files: bool = False


def filename_template(opts: FileOptions, topic: str) -> str:
    """nsq_to_file's ``computeFilenameFormat``: the name with all but ``<DATETIME>``
    and ``<REV>`` replaced."""
    hostname = socket.gethostname()
    short = hostname.split(".")[0]
    identifier = short
    if opts.host_identifier:
        identifier = opts.host_identifier.replace("<SHORT_HOST>", short)
        identifier = identifier.replace("<HOSTNAME>", hostname)
    template = opts.filename_format
    needs_rev = opts.gzip or opts.rotate_size > 0 or opts.rotate_interval > 0
    if needs_rev or opts.work_dir != opts.output_dir:
        if "<REV>" not in template:
            raise ValueError(
                "missing <REV> in --filename-format when gzip, rotation, or work dir enabled"
            )
    else:
        template = template.replace("<REV>", "")
    template = template.replace("<TOPIC>", topic).replace("<HOST>", identifier)
    template = template.replace("<PID>", str(os.getpid()))
    if opts.gzip and not template.endswith(".gz"):
        template += ".gz"
    return template


@dataclass
class Prepared:
    consumer: dict[str, Any]
    files: FileOptions
    pattern: re.Pattern[str] | None


def prepare(args: argparse.Namespace) -> Prepared:
    if not args.channel:
        raise ToolError("--channel is required")
    if not args.nsqd_tcp_address and not args.lookupd_http_address:
        raise ToolError("--nsqd-tcp-address or --lookupd-http-address required.")
    require_sources(args)
    if not args.topics and not args.topic_pattern:
        raise ToolError("--topic or --topic-pattern required")
    if not args.topics and not args.lookupd_http_address:
        raise ToolError("--lookupd-http-address must be specified when no --topic specified")
    if not 1 <= args.gzip_level <= 9:
        raise ToolError(f"invalid --gzip-level value ({args.gzip_level}), should be 1-9")
    if args.sync_interval <= 0:
        raise ToolError("--sync-interval must be positive")
    if args.topic_refresh <= 0:
        raise ToolError("--topic-refresh must be positive")
    pattern = None
    if args.topic_pattern:
        try:
            pattern = re.compile(args.topic_pattern)
        except re.error as exc:
            raise ToolError(f"invalid --topic-pattern: {exc}") from None
    file_options = FileOptions(
        output_dir=args.output_dir,
        work_dir=args.work_dir or args.output_dir,
        filename_format=args.filename_format,
        datetime_format=args.datetime_format,
        host_identifier=args.host_identifier,
        gzip=args.gzip,
        gzip_level=args.gzip_level,
        rotate_interval=args.rotate_interval,
        rotate_size=args.rotate_size,
        skip_empty_files=args.skip_empty_files,
    )
    try:
        filename_template(file_options, "topic")
    except ValueError as exc:
        raise ToolError(str(exc)) from None
    for directory in dict.fromkeys([file_options.output_dir, file_options.work_dir]):
        try:
            Path(directory).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ToolError(f"cannot create {directory}: {exc}") from None
    check_names(args.topics, args.channel)
    return Prepared(consumer_options(args), file_options, pattern)


class FileLogger:
    """One topic's output file: naming, writing, syncing, rotating, closing.

    Synchronous and small: file writes are local and quick, and keeping them in
    the event loop keeps the order of writes and FINs obvious.  Writes are
    buffered in memory and reach the file (and the gzip stream) in one call per
    sync or rotation: a message is only worth a file write once it is about to
    be synced, and one large write costs what one small one does.
    """

    def __init__(self, opts: FileOptions, topic: str) -> None:
        self.opts = opts
        self.topic = topic
        self.template = filename_template(opts, topic)
        self.filename = ""  # the name with <DATETIME> replaced, <REV> not
        self.path: Path | None = None
        self.rev = 0
        self.opened_at = 0.0
        self.size = 0  # of the current file, uncompressed, buffered bytes included
        self.written = 0  # bytes written into the current file by us
        self.files_written = 0
        self.syncs = 0
        self._raw: IO[bytes] | None = None
        self._gzip: gzip.GzipFile | None = None
        self._buffer: list[bytes] = []
        self._named_at = -1
        self._current = ""
        self._check_at = 0.0  # when (time.time()) to ask needs_rotation again
        self._size_limit = opts.rotate_size if opts.rotate_size > 0 else math.inf
        #: called with +1 when a file is opened, -1 when it is closed (or dropped
        #: empty): the files open now, which the progress table shows
        self.on_open_count: Callable[[int], None] | None = None
        #: called with each file's final path once it is closed (and moved)
        self.on_closed: Callable[[Path], None] | None = None
        #: called after each sync
        self.on_synced: Callable[[], None] | None = None

    def current_filename(self) -> str:
        # Asked for every message: strftime once a second is enough (its
        # finest unit is the second).
        now = int(time.time())
        if now != self._named_at:
            self._named_at = now
            self._current = self.template.replace(
                "<DATETIME>", time.strftime(self.opts.datetime_format, time.localtime(now))
            )
        return self._current

    def needs_rotation(self) -> bool:
        if self._raw is None:
            return True
        if self.current_filename() != self.filename:
            return True
        if self.opts.rotate_interval > 0 and (
            time.monotonic() - self.opened_at > self.opts.rotate_interval
        ):
            return True
        return self.opts.rotate_size > 0 and self.size > self.opts.rotate_size

    def _open_file(self) -> None:
        """Close the current file and open the next name free (``updateFile``)."""
        self.close()
        filename = self.current_filename()
        self.rev = 0 if filename != self.filename else self.rev + 1
        self.filename = filename
        self.opened_at = time.monotonic()
        work = Path(self.opts.work_dir)
        output = Path(self.opts.output_dir)
        exclusive = self.opts.gzip or self.opts.rotate_interval > 0
        while True:
            name = filename.replace("<REV>", f"-{self.rev:06d}")
            path = work / name
            path.parent.mkdir(parents=True, exist_ok=True)
            if work != output:
                target = output / name
                target.parent.mkdir(parents=True, exist_ok=True)
                if target.exists():
                    self.rev += 1
                    continue
            flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_APPEND)
            try:
                fd = os.open(path, flags, 0o666)
            except FileExistsError:
                self.rev += 1
                continue
            raw = os.fdopen(fd, "ab")
            self.size = os.fstat(fd).st_size
            if self.opts.rotate_size > 0 and self.size > self.opts.rotate_size:
                raw.close()
                self.rev += 1
                continue
            break
        log.info("[%s] opening %s", self.topic, path)
        self._raw = raw
        self.path = path
        self.written = 0
        self._check_at = 0.0
        self._gzip = None  # opened by the first write
        if self.on_open_count is not None:
            self.on_open_count(1)

    def _new_gzip(self) -> gzip.GzipFile:
        assert self._raw is not None
        return gzip.GzipFile(fileobj=self._raw, mode="wb", compresslevel=self.opts.gzip_level)

    def write(self, body: bytes) -> None:
        """Add a message (and its newline) to the current file."""
        # Whether to rotate is asked once a second (a new <DATETIME>, or the
        # rotation interval) or past the size limit, not for every message.
        now = time.time()
        if self.size > self._size_limit or now >= self._check_at:
            if self.needs_rotation():
                self._open_file()
            self._check_at = math.floor(now) + 1.0
            if self.opts.rotate_interval > 0:
                left = self.opened_at + self.opts.rotate_interval - time.monotonic()
                self._check_at = min(self._check_at, now + max(0.0, left))
        self._buffer.append(body)
        size = len(body) + 1
        self.size += size
        self.written += size

    def _flush_buffer(self) -> None:
        if not self._buffer:
            return
        self._buffer.append(b"")  # the last newline
        data = b"\n".join(self._buffer)
        self._buffer.clear()
        if self.opts.gzip:
            if self._gzip is None:
                self._gzip = self._new_gzip()
            self._gzip.write(data)
        else:
            assert self._raw is not None
            self._raw.write(data)

    def sync(self, notify: bool = True) -> bool:
        """Make everything written so far durable (ends the gzip member);
        returns whether there was a file to sync.  Safe on a worker thread
        while the loop leaves this logger alone; ``notify=False`` leaves the
        call of :attr:`on_synced` to the caller (in the loop's thread)."""
        if self._raw is None:
            return False
        self._flush_buffer()
        if self._gzip is not None:
            # A complete member, with its checksum; the next one starts with
            # the next write, so a file cut after a sync holds whole members.
            self._gzip.close()
            self._gzip = None
        self._raw.flush()
        os.fsync(self._raw.fileno())
        self.syncs += 1
        if notify and self.on_synced is not None:
            self.on_synced()
        return True

    def close(self) -> None:
        """Sync, close, and move the file from the work dir to the output dir."""
        raw, path = self._raw, self.path
        self._check_at = 0.0  # the next write opens a file
        if raw is None or path is None:
            return
        self._flush_buffer()
        if self.opts.gzip and self._gzip is None and self.written == 0:
            if not self.opts.skip_empty_files and os.fstat(raw.fileno()).st_size == 0:
                self._gzip = self._new_gzip()  # an empty file is still valid gzip
        if self._gzip is not None:
            self._gzip.close()
            self._gzip = None
        raw.flush()
        os.fsync(raw.fileno())
        raw.close()
        self._raw = None
        if self.on_open_count is not None:
            self.on_open_count(-1)
        if self.opts.skip_empty_files and self.written == 0 and path.stat().st_size == 0:
            path.unlink()
            return
        self.files_written += 1
        work, output = Path(self.opts.work_dir), Path(self.opts.output_dir)
        final = path
        if work != output:
            relative = path.relative_to(work)
            rev = self.rev
            target = output / relative
            while True:
                try:
                    os.link(path, target)  # never overwrites
                except FileExistsError:
                    rev += 1
                    target = output / self.filename.replace("<REV>", f"-{rev:06d}")
                    continue
                path.unlink()
                final = target
                log.info("[%s] moved finished file %s to %s", self.topic, path, target)
                break
        if self.on_closed is not None:
            self.on_closed(final)

    def rotate_if_needed(self) -> None:
        """On a timer tick: rotate by time even when no message comes."""
        if self._raw is not None and self.needs_rotation():
            if self.opts.skip_empty_files:
                self.close()
            else:
                self._open_file()


class _Archiver:
    """Writes one topic's messages and finishes them in synced batches.

    nsq_to_file's rule: a message is finished only once the file holding it is
    synced, and a batch is synced when it reaches ``--max-in-flight``, on every
    ``--sync-interval`` tick, and when the consumer is starved
    (:meth:`Consumer.is_starved`: the messages handed out, which are those held
    here, reach 85% of the RDY last sent on a connection, so nsqd sends nothing
    more until some are finished).  When nothing arrives for :data:`IDLE_SYNC`
    seconds, what is held is synced too (nsq_to_file waits for its next tick).

    A sync (compressing, writing, ``fsync``) runs on a worker thread, where zlib
    and ``fsync`` release the GIL, while the event loop goes on receiving: the
    messages that arrive meanwhile wait in :attr:`backlog` (nothing touches the
    file during a sync) and are written once it is over.  To keep nsqd sending
    while a sync runs, one starts as soon as half of a connection's RDY is held
    (:data:`EARLY_SYNC`), not only once the consumer is starved; a sync that
    ends with another half-RDY batch waiting starts the next at once.  Syncing
    earlier than nsq_to_file is only ever more durable.
    """

    def __init__(
        self, consumer: Consumer, logger: FileLogger, batch: int, progress: Progress
    ) -> None:
        self.consumer = consumer
        self.logger = logger
        self.batch = batch
        self.progress = progress
        #: written into the logger's buffer, not synced yet
        self.pending: list[Message] = []
        #: received while a sync runs, not written yet
        self.backlog: list[Message] = []
        self.received = 0
        self._counted = 0  # of ``received``, in the progress counters
        #: messages held per nsqd, and 85% of its RDY, when the consumer may be
        #: starved (asking is_starved for every message costs more than writing
        #: it); the limits are refreshed after every sync, and when one is
        #: reached but the consumer is not starved (RDY grew meanwhile).
        self._held: dict[str, int] = {}
        self._limits: dict[str, float] = {}
        #: how many held messages are worth a sync in the background
        self._early = 1.0
        #: set when the sync running (on a worker thread) is over; None if none runs
        self._syncing: trio.Event | None = None
        self._nursery: trio.Nursery | None = None

    def _refresh_limits(self) -> None:
        connections = self.consumer.stats.connections.values()
        self._limits = {conn.address: max(1.0, conn.rdy * 0.85) for conn in connections}
        early = max(1.0, min((conn.rdy for conn in connections), default=1) * EARLY_SYNC)
        self._early = early if early >= THREADED_SYNC else math.inf

    @property
    def syncing(self) -> bool:
        return self._syncing is not None

    def add(self, message: Message) -> bool:
        """Take ``message`` (written now, or after the sync running); returns
        whether a sync must come before nsqd sends more."""
        self.received += 1
        if self._syncing is None:
            self.logger.write(message.body)
            self.pending.append(message)
        else:
            self.backlog.append(message)
        address = message.address
        held = self._held.get(address, 0) + 1
        self._held[address] = held
        if held >= self._limits.get(address, 1.0):
            if self.consumer.is_starved():
                return True
            self._refresh_limits()
        return len(self.pending) + len(self.backlog) >= self.batch

    def worth_syncing(self) -> bool:
        """Whether to start a sync in the background now."""
        return self._syncing is None and len(self.pending) >= self._early

    def start_sync(self) -> None:
        """Sync what is written on a worker thread, without waiting for it."""
        if self._syncing is not None or not self.pending or self._nursery is None:
            return
        self._syncing = trio.Event()
        self._nursery.start_soon(self._background_sync)

    async def _background_sync(self) -> None:
        while True:
            await self._sync_written()
            if not self.worth_syncing():
                return
            self._syncing = trio.Event()

    async def wait_for_sync(self) -> None:
        """Wait for the sync running, if any (its backlog is written after it)."""
        while self._syncing is not None:
            await self._syncing.wait()

    async def sync_and_finish(self) -> None:
        """Sync everything received so far, then FIN it."""
        await self.wait_for_sync()
        self._write_backlog()
        if not self.pending:
            return
        self._syncing = trio.Event()
        await self._sync_written()

    async def _sync_written(self) -> None:
        """Sync the file (on a worker thread), then FIN every message written
        before; then write the backlog.  Called with :attr:`_syncing` set.

        The shield keeps a cancellation from cutting a sync or its FINs in
        half: the thread runs to its end, and what it synced is finished.
        """
        assert self._syncing is not None
        self.progress.add("written", self.received - self._counted)
        self._counted = self.received
        pending, self.pending = self.pending, []
        try:
            with trio.CancelScope(shield=True):
                try:
                    if len(pending) >= THREADED_SYNC:
                        synced = await trio.to_thread.run_sync(self.logger.sync, False)
                    else:
                        synced = self.logger.sync(False)
                except OSError as exc:
                    self.pending = pending + self.pending  # requeued by the caller
                    raise ToolError(
                        f"{self.logger.topic}: cannot sync {self.logger.path}: {exc}"
                    ) from None
                if synced and self.logger.on_synced is not None:
                    self.logger.on_synced()
                for message in pending:
                    await message.finish()
                self.progress.add("finished", len(pending))
                for message in pending:
                    address = message.address
                    self._held[address] = self._held.get(address, 1) - 1
                self._refresh_limits()
        finally:
            syncing, self._syncing = self._syncing, None
            syncing.set()
        self._write_backlog()

    def _write_backlog(self) -> None:
        """Write what arrived during a sync (in the loop, no sync running)."""
        backlog = self.backlog
        written = 0
        try:
            for message in backlog:
                self.logger.write(message.body)
                written += 1
        finally:  # a message whose write failed stays in the backlog (requeued)
            self.pending.extend(backlog[:written])
            del backlog[:written]

    async def requeue_pending(self) -> None:
        """Written but not durable: back to nsqd (a duplicate, never a loss)."""
        with trio.CancelScope(shield=True):
            await self.wait_for_sync()
            self.progress.add("written", self.received - self._counted)
            self._counted = self.received
            self._held.clear()
            pending, self.pending = self.pending + self.backlog, []
            self.backlog = []
            for message in pending:
                await message.requeue(0, backoff=False)


async def _archive(
    topic: str,
    channel: str,
    options: dict[str, Any],
    files: FileOptions,
    sync_interval: float,
    stop: trio.Event,
    progress: Progress,
) -> None:
    logger = FileLogger(files, topic)
    logger.on_open_count = lambda change: progress.add("open", change)
    logger.on_closed = lambda path: progress.add("closed")
    logger.on_synced = lambda: progress.add("syncs")
    try:
        async with Consumer(topic, channel, **options) as consumer:
            archiver = _Archiver(consumer, logger, options["max_in_flight"], progress)
            try:
                async with trio.open_nursery() as nursery:
                    archiver._nursery = nursery
                    nursery.start_soon(_ticks, archiver, sync_interval)

                    async def on_stop() -> None:
                        await stop.wait()
                        nursery.cancel_scope.cancel()

                    nursery.start_soon(on_stop)
                    await _pump(consumer, archiver)
                    nursery.cancel_scope.cancel()
                # Stopping: what was written is synced and finished before the CLS.
                await archiver.sync_and_finish()
            except BaseException:
                await archiver.requeue_pending()
                raise
    finally:
        logger.close()


async def _pump(consumer: Consumer, archiver: _Archiver) -> None:
    """Write messages as they come; sync when a batch is due."""
    add = archiver.add
    async for message in consumer:
        try:
            due = add(message)
        except OSError as exc:
            with trio.CancelScope(shield=True):
                await message.requeue(0, backoff=False)
            raise ToolError(f"{archiver.logger.topic}: cannot write: {exc}") from None
        if archiver.syncing:
            if due:  # nsqd sends nothing more until the running sync's FINs
                await archiver.wait_for_sync()
                if archiver.worth_syncing():
                    archiver.start_sync()
        elif due or archiver.worth_syncing():
            archiver.start_sync()


async def _ticks(archiver: _Archiver, sync_interval: float) -> None:
    """Sync on every ``--sync-interval`` tick (rotating by time even without
    traffic), and when nothing arrived for :data:`IDLE_SYNC` seconds."""
    next_tick = trio.current_time() + sync_interval
    seen = archiver.received
    while True:
        await trio.sleep_until(min(next_tick, trio.current_time() + IDLE_SYNC))
        if trio.current_time() >= next_tick:
            next_tick = trio.current_time() + sync_interval
            await archiver.sync_and_finish()
            archiver.logger.rotate_if_needed()
        elif archiver.received == seen:
            await archiver.sync_and_finish()
        seen = archiver.received


async def run(args: argparse.Namespace, prepared: Prepared, stop: trio.Event) -> int:
    options = prepared.consumer
    await check_sources(Config(**options))
    progress = Progress(
        f"to-file {','.join(args.topics) or args.topic_pattern}",
        # "open": files being written now; "closed": files done (and moved)
        ["written", "finished", "open", "closed", "syncs"],
        rate_of="written",
        backlog=lambda: progress.counts["written"] - progress.counts["finished"],
    )
    async with trio.open_nursery() as display:
        display.start_soon(progress.run)
        async with trio.open_nursery() as nursery:
            archived: set[str] = set()

            def start(topics: list[str]) -> None:
                for topic in topics:
                    if topic in archived:
                        continue
                    if prepared.pattern is not None and not prepared.pattern.search(topic):
                        log.warning(
                            "skipping topic %s (doesn't match pattern %s)",
                            topic,
                            args.topic_pattern,
                        )
                        archived.add(topic)
                        continue
                    if not is_valid_topic_name(topic):
                        # What nsqlookupd listed cannot be consumed: told, and
                        # the others go on (nsq_to_file logs it at every
                        # refresh too, never adding it).
                        log.error(
                            "couldn't create logger for new topic %s: invalid topic name", topic
                        )
                        continue
                    archived.add(topic)
                    log.info("archiving topic %s", topic)
                    nursery.start_soon(
                        _archive,
                        topic,
                        args.channel,
                        options,
                        prepared.files,
                        args.sync_interval,
                        stop,
                        progress,
                    )

            start(list(dict.fromkeys(args.topics)))
            if not args.topics:
                nursery.start_soon(_discover, args, start, stop)
        display.cancel_scope.cancel()
    progress.summary()
    return 0


async def _discover(
    args: argparse.Namespace, start: Callable[[list[str]], None], stop: trio.Event
) -> None:
    """With ``--topic-pattern`` and no ``--topic``: ask nsqlookupd for the
    topics every ``--topic-refresh`` (and at once), and archive new ones."""
    import httpx

    timeout = httpx.Timeout(
        args.http_client_request_timeout, connect=args.http_client_connect_timeout
    )
    async with httpx.AsyncClient(timeout=timeout) as client, trio.open_nursery() as nursery:

        async def on_stop() -> None:
            await stop.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(on_stop)
        while True:
            topics: dict[str, None] = {}
            errors = []
            for address in args.lookupd_http_address:
                base = (address if "://" in address else f"http://{address}").rstrip("/")
                try:
                    response = await client.get(f"{base}/topics")
                    response.raise_for_status()
                    topics.update(dict.fromkeys(_topic_list(response.json())))
                except (httpx.HTTPError, ValueError) as exc:
                    errors.append(f"{address}: {exc or type(exc).__name__}")
            if errors and len(errors) == len(args.lookupd_http_address):
                log.error("could not retrieve topic list: %s", "; ".join(errors))
            start(sorted(topics))
            await trio.sleep(args.topic_refresh)


def _topic_list(doc: Any) -> list[str]:
    """The topics of a ``/topics`` answer (the pre-1.0 envelope too); a
    ValueError for anything else, as nsq_to_file's decoding into a list of
    strings fails (that nsqlookupd's answer is then left out)."""
    if isinstance(doc, dict) and "topics" not in doc and isinstance(doc.get("data"), dict):
        doc = doc["data"]
    if not isinstance(doc, dict):
        raise ValueError("the answer is not a JSON object")
    topics = doc.get("topics")
    if topics is None:
        return []
    if not isinstance(topics, list) or not all(isinstance(t, str) for t in topics):
        raise ValueError("topics is not a list of strings")
    return topics
