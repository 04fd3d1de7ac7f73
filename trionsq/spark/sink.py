"""The sink: rows published to an NSQ topic with MPUB, from the executors.

Each task publishes its partition's value column in MPUB chunks (``batch_size``
messages, at most ``_MAX_CHUNK_BYTES`` of bodies each) and returns an
:class:`NSQCommitMessage` with its counts.  A publish that fails raises, so the
task fails and Spark retries it: delivery is at least once (a retried task
publishes its partition again, and NSQ has no transactions to roll back).

Connections are pooled per Python worker process (:func:`_publisher`): Spark
reuses its Python workers between tasks, and each keeps a trionsq Producer
running on a Trio thread, keyed by where and how it connects.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import trio
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, StringType, StructType

from ..connection import ConnectionClosedError, NSQConnectionError
from ..lookupd import parse_lookup_response
from ..producer import Producer
from ..telemetry.semconv import SPARK_EXECUTOR_ID
from ._executor import identify
from ._loop import LoopThread
from ._options import ConnectionOptions, NSQOptionError, SinkOptions

__all__ = ["NSQBatchWriter", "NSQCommitMessage", "NSQStreamWriter", "resolve_value_column"]

log = logging.getLogger("trionsq.spark")

#: Bodies per MPUB at most, in bytes (nsqd's max-body-size defaults to 5 MiB).
_MAX_CHUNK_BYTES = 1024 * 1024


@dataclass
class NSQCommitMessage(WriterCommitMessage):
    """What one task published."""

    partition_id: int
    messages: int
    bytes: int
    #: chunks published again on another nsqd after a lost connection
    failovers: int = 0


def resolve_value_column(schema: StructType, requested: str | None) -> str:
    """The column to publish: ``requested``, else ``value``, else ``body``;
    it must be binary or string."""
    names = schema.fieldNames()
    if requested is not None:
        matches = [n for n in names if n == requested] or [
            n for n in names if n.lower() == requested.lower()
        ]
        if not matches:
            raise NSQOptionError(
                f"option 'value_column': no column {requested!r} (columns: {', '.join(names)})"
            )
        name = matches[0]
    else:
        found = [n for n in ("value", "body") if n in names]
        if not found:
            raise NSQOptionError(
                "the nsq sink publishes a 'value' or 'body' column, and this DataFrame has "
                f"neither (columns: {', '.join(names)}); name one with option 'value_column'"
            )
        name = found[0]
    data_type = schema[name].dataType
    if not isinstance(data_type, BinaryType | StringType):
        raise NSQOptionError(
            f"column {name!r} is {data_type.simpleString()}: the nsq sink publishes binary or "
            "string values (cast it, or serialize rows, e.g. to_json(struct(*)))"
        )
    return name


# --- the per-process producer pool ------------------------------------------------


class _Publisher:
    """A trionsq Producer on a Trio thread of its own, failing over between nsqds.

    The nsqds are ``nsqd_tcp_addresses`` and, with ``lookupd_http_addresses``,
    every nsqd the lookupds list (``/nodes``, asked again when none answers).  A
    chunk whose connection is lost before nsqd's answer is published again on
    the next nsqd: it may then be there twice (NSQ cannot tell whether the lost
    MPUB was applied).
    """

    def __init__(self, connection: ConnectionOptions) -> None:
        self.connection = connection
        #: chunks published again after a lost connection (each may be duplicated)
        self.failovers = 0
        self._nursery: trio.Nursery | None = None
        self._producer: Producer | None = None
        self._producer_scope: trio.CancelScope | None = None
        self._addresses: tuple[str, ...] = ()
        self._loop = LoopThread("trionsq-spark-producer")
        self._loop.start()
        try:
            self._loop.start_service(self._serve)
        except BaseException:
            self._loop.close()
            raise

    @property
    def alive(self) -> bool:
        return self._loop.alive

    async def _serve(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    async def _run_producer(
        self,
        addresses: tuple[str, ...],
        *,
        task_status: trio.TaskStatus[tuple[Producer, trio.CancelScope]] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        config = self.connection.config(
            nsqd_tcp_addresses=addresses,
            lookupd_http_addresses=(),
            # the executor this worker belongs to, on every span and metric point
            telemetry_attributes={SPARK_EXECUTOR_ID: identify().executor_id},
        )
        async with Producer(config=config) as producer:
            with trio.CancelScope() as scope:
                task_status.started((producer, scope))
                await trio.sleep_forever()

    async def _find_nsqds(self) -> tuple[str, ...]:
        """The configured nsqds, then those the lookupds know of (in a stable order)."""
        static = self.connection.nsqd_tcp_addresses
        found: set[str] = set()
        lookupds = self.connection.lookupd_http_addresses
        if lookupds:
            async with httpx.AsyncClient(timeout=self.connection.connect_timeout) as client:
                for lookupd in lookupds:
                    try:
                        found |= await _nodes(client, lookupd)
                    except (httpx.HTTPError, ValueError) as exc:
                        log.warning("nsq sink: lookupd %s: %s", lookupd, exc)
        addresses = static + tuple(sorted(found - set(static)))
        if not addresses:
            raise NSQConnectionError(
                "no nsqd to publish to: the lookupds ("
                + ", ".join(lookupds)
                + ") list none (has any nsqd registered with them?)"
            )
        return addresses

    async def _current(self, refresh: bool) -> Producer:
        if self._producer is not None and not refresh:
            return self._producer
        addresses = await self._find_nsqds()
        if self._producer is not None and addresses == self._addresses:
            return self._producer
        if self._producer_scope is not None:
            self._producer_scope.cancel()
        assert self._nursery is not None
        self._producer, self._producer_scope = await self._nursery.start(
            self._run_producer, addresses
        )
        self._addresses = addresses
        return self._producer

    async def _publish(self, topic: str, bodies: list[bytes]) -> None:
        refresh = False
        attempts = 0
        while True:
            producer = await self._current(refresh)
            try:
                await producer.multi_publish(topic, bodies)
                return
            except NSQConnectionError as exc:
                attempts += 1
                if attempts >= max(3, 2 * len(self._addresses)):
                    raise
                # "No nsqd reachable": ask the lookupds again; a lost connection: the
                # producer moves on to the next nsqd by itself.
                refresh = not isinstance(exc, ConnectionClosedError)
                self.failovers += 1
                log.warning(
                    "nsq sink: %s; publishing the chunk of %d message(s) again on another "
                    "nsqd (it may be there twice)",
                    exc,
                    len(bodies),
                )
                await trio.sleep(min(1.0, 0.05 * attempts))

    def publish(self, topic: str, bodies: list[bytes]) -> None:
        self._loop.run(self._publish, topic, bodies)

    def close(self) -> None:
        self._loop.close(5.0)


async def _nodes(client: httpx.AsyncClient, lookupd: str) -> set[str]:
    """Every nsqd registered with ``lookupd`` (``/nodes``)."""
    base = lookupd if "://" in lookupd else f"http://{lookupd}"
    response = await client.get(base.rstrip("/") + "/nodes")
    response.raise_for_status()
    return parse_lookup_response(response.json())


_pool: dict[ConnectionOptions, _Publisher] = {}
_pool_lock = threading.Lock()
_pool_pid = os.getpid()


def _publisher(connection: ConnectionOptions) -> _Publisher:
    """This process's publisher for ``connection``, (re)started when needed."""
    global _pool_pid
    with _pool_lock:
        if _pool_pid != os.getpid():
            # A forked child inherits the dict but not the threads behind it.
            _pool.clear()
            _pool_pid = os.getpid()
        publisher = _pool.get(connection)
        if publisher is None or not publisher.alive:
            publisher = _pool[connection] = _Publisher(connection)
        return publisher


@atexit.register
def _close_pool() -> None:
    with _pool_lock:
        publishers = list(_pool.values())
        _pool.clear()
    for publisher in publishers:
        publisher.close()


# --- writing ------------------------------------------------------------------------


def _partition_id() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.partitionId() if context is not None else -1


def _write(options: SinkOptions, column: str, batches: Iterator[Any]) -> NSQCommitMessage:
    """Publish ``column`` of every Arrow batch; raise (failing the task) if nsqd refuses."""
    publisher = _publisher(options.connection)
    failovers = publisher.failovers
    topic = options.topic
    limit = options.batch_size
    chunk: list[bytes] = []
    chunk_bytes = 0
    messages = 0
    total_bytes = 0
    for batch in batches:
        for value in batch.column(batch.schema.get_field_index(column)).to_pylist():
            if value is None:
                raise ValueError(
                    f"nsq sink: column {column!r} has a null value; NSQ messages need a body "
                    "(filter nulls out first)"
                )
            body = value.encode("utf-8") if isinstance(value, str) else value
            if not body:
                raise ValueError(
                    f"nsq sink: column {column!r} has an empty value; NSQ rejects empty messages"
                )
            if chunk and (len(chunk) >= limit or chunk_bytes + len(body) > _MAX_CHUNK_BYTES):
                publisher.publish(topic, chunk)
                chunk = []
                chunk_bytes = 0
            chunk.append(body)
            chunk_bytes += len(body)
            messages += 1
            total_bytes += len(body)
    if chunk:
        publisher.publish(topic, chunk)
    return NSQCommitMessage(_partition_id(), messages, total_bytes, publisher.failovers - failovers)


def _warn_failovers(options: SinkOptions, messages: list[WriterCommitMessage | None]) -> None:
    failovers = sum(m.failovers for m in messages if isinstance(m, NSQCommitMessage))
    if failovers:
        log.warning(
            "nsq sink: %d chunk(s) were published again on another nsqd after a lost "
            "connection: up to %d message(s) of %s may be there twice",
            failovers,
            failovers * options.batch_size,
            options.topic,
        )


def _totals(messages: list[WriterCommitMessage | None]) -> tuple[int, int, int]:
    done = [m for m in messages if isinstance(m, NSQCommitMessage)]
    return len(done), sum(m.messages for m in done), sum(m.bytes for m in done)


class _Writer:
    """What the batch and the stream writers share: the tasks' write, the
    totals of a commit or an abort and their log lines; ``batch_id`` is the
    stream's micro-batch (None for a batch write)."""

    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        self.options = options
        self.column = resolve_value_column(schema, options.value_column)
        #: the counts reported by the last commit or abort: (tasks, messages, bytes)
        self.totals: tuple[int, int, int] | None = None

    def write(self, iterator: Iterator[Any]) -> NSQCommitMessage:
        return _write(self.options, self.column, iterator)

    def _committed(self, messages: list[WriterCommitMessage | None], batch_id: int | None) -> None:
        _warn_failovers(self.options, messages)
        self.totals = tasks, count, size = _totals(messages)
        log.info(
            "nsq sink: %spublished %d message(s) (%d bytes) to %s from %d task(s)",
            "" if batch_id is None else f"batch {batch_id} ",
            count,
            size,
            self.options.topic,
            tasks,
        )

    def _aborted(self, messages: list[WriterCommitMessage | None], batch_id: int | None) -> None:
        self.totals = tasks, count, size = _totals(messages)
        log.warning(
            "nsq sink: %s to %s aborted; %d task(s) had published %d message(s) "
            "(%d bytes), which stay published (%s)",
            "write" if batch_id is None else f"batch {batch_id}",
            self.options.topic,
            tasks,
            count,
            size,
            "NSQ has no transactions" if batch_id is None else "Spark retries the batch",
        )


class NSQBatchWriter(_Writer, DataSourceArrowWriter):
    """``df.write.format("nsq")``: every row's value is published to the topic."""

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self._committed(messages, None)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self._aborted(messages, None)


class NSQStreamWriter(_Writer, DataSourceStreamArrowWriter):
    """``writeStream.format("nsq")``: each micro-batch's values are published."""

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._committed(messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._aborted(messages, batchId)
