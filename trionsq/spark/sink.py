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

import trio
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, StringType, StructType

from ..producer import Producer
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
    """A trionsq Producer on a Trio thread of its own."""

    def __init__(self, connection: ConnectionOptions) -> None:
        self.connection = connection
        self._loop = LoopThread("trionsq-spark-producer")
        self._loop.start()
        try:
            self._producer: Producer = self._loop.start_service(self._serve)
        except BaseException:
            self._loop.close()
            raise

    @property
    def alive(self) -> bool:
        return self._loop.alive

    async def _serve(
        self, *, task_status: trio.TaskStatus[Producer] = trio.TASK_STATUS_IGNORED
    ) -> None:
        async with Producer(config=self.connection.config()) as producer:
            task_status.started(producer)
            await trio.sleep_forever()

    def publish(self, topic: str, bodies: list[bytes]) -> None:
        self._loop.run(self._producer.multi_publish, topic, bodies)

    def close(self) -> None:
        self._loop.close(5.0)


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
    return NSQCommitMessage(_partition_id(), messages, total_bytes)


def _totals(messages: list[WriterCommitMessage | None]) -> tuple[int, int, int]:
    done = [m for m in messages if isinstance(m, NSQCommitMessage)]
    return len(done), sum(m.messages for m in done), sum(m.bytes for m in done)


class NSQBatchWriter(DataSourceArrowWriter):
    """``df.write.format("nsq")``: every row's value is published to the topic."""

    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        self.options = options
        self.column = resolve_value_column(schema, options.value_column)
        #: the counts reported by the last :meth:`commit` or :meth:`abort`
        self.totals: tuple[int, int, int] | None = None

    def write(self, iterator: Iterator[Any]) -> NSQCommitMessage:
        return _write(self.options, self.column, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self.totals = tasks, count, size = _totals(messages)
        log.info(
            "nsq sink: published %d message(s) (%d bytes) to %s from %d task(s)",
            count,
            size,
            self.options.topic,
            tasks,
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self.totals = tasks, count, size = _totals(messages)
        log.warning(
            "nsq sink: write to %s aborted; %d task(s) had published %d message(s) "
            "(%d bytes), which stay published (NSQ has no transactions)",
            self.options.topic,
            tasks,
            count,
            size,
        )


class NSQStreamWriter(DataSourceStreamArrowWriter):
    """``writeStream.format("nsq")``: each micro-batch's values are published."""

    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        self.options = options
        self.column = resolve_value_column(schema, options.value_column)
        self.totals: tuple[int, int, int] | None = None

    def write(self, iterator: Iterator[Any]) -> NSQCommitMessage:
        return _write(self.options, self.column, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self.totals = tasks, count, size = _totals(messages)
        log.info(
            "nsq sink: batch %d published %d message(s) (%d bytes) to %s from %d task(s)",
            batchId,
            count,
            size,
            self.options.topic,
            tasks,
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self.totals = tasks, count, size = _totals(messages)
        log.warning(
            "nsq sink: batch %d to %s aborted; %d task(s) had published %d message(s) "
            "(%d bytes), which stay published (Spark retries the batch)",
            batchId,
            self.options.topic,
            tasks,
            count,
            size,
        )
