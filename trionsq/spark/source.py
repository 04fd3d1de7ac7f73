"""The streaming source: an NSQ channel read on the executors, at least once.

Messages never pass through the driver.  The driver half (this reader, in the
process Spark runs the source in) runs a :class:`~trionsq.spark.coordinator.
Coordinator` on a Trio thread: it plans micro-batches and tells executors when a
batch is committed.  The executor half is :meth:`NSQStreamReader.read`, in each
task's Python worker: it asks its executor's agent (:mod:`trionsq.spark.agent`,
a process that holds the NSQ connections between micro-batches) for the
partition's messages and yields them as Arrow rows.  The agent keeps them
un-FINed, TOUCHed, until the coordinator says the batch was committed; if
anything dies first, nsqd delivers them again.  Duplicates are possible, losses
are not.  ``docs/spark.md`` has the whole design and its failure cases.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from ._agent_client import read_from_agent
from ._executor import identify
from ._held import arrow_schema, from_ipc
from ._loop import LoopThread
from ._options import NSQOptionError, SourceOptions
from ._phases import mark
from ._secure import QueryKeys
from .coordinator import Coordinator

__all__ = ["SCHEMA", "NSQInputPartition", "NSQSourceError", "NSQStreamReader", "arrow_schema"]

log = logging.getLogger("trionsq.spark")

#: The rows of the ``nsq`` source, one per message delivery.
SCHEMA = StructType(
    [
        StructField("body", BinaryType()),
        StructField("id", StringType()),
        StructField("timestamp", TimestampType()),
        StructField("attempts", IntegerType()),
        StructField("nsqd_address", StringType()),
        StructField("topic", StringType()),
    ]
)

#: Beyond the waits a read is allowed (connecting, max_batch_wait), how long a task
#: waits for its agent's answer before failing.
_READ_SLACK = 60.0


class NSQSourceError(RuntimeError):
    """A partition could not be read (the task fails with this reason; Spark retries)."""


def _batch(offset: object, what: str) -> int:
    """The batch number in an offset, checked (a checkpoint may be foreign).

    Earlier versions counted messages in ``{"seq": n}``; such a checkpoint still
    works: its number only has to grow.
    """
    if isinstance(offset, dict):
        value = offset.get("batch", offset.get("seq"))
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    raise NSQOptionError(
        f"{what} offset {offset!r} is not an nsq source offset: was this checkpoint "
        "written by another source?"
    )


class NSQInputPartition(InputPartition):
    """One task's share of a micro-batch: where to ask for it, never the messages."""

    def __init__(
        self,
        coordinator: tuple[str, int],
        keys: QueryKeys,
        batch: int,
        index: int,
        limit: int | None,
        cutoff_ns: int | None,
    ) -> None:
        super().__init__(index)
        self.coordinator = coordinator
        #: the query's token and TLS key (see docs/spark.md, "Security")
        self.keys = keys
        self.batch = batch
        self.index = index
        #: at most this many messages (None: what the executor's slot holds)
        self.limit = limit
        #: Trigger.AvailableNow: messages nsqd received later are not read
        self.cutoff_ns = cutoff_ns

    def __repr__(self) -> str:
        return f"NSQInputPartition(batch={self.batch}, index={self.index}, limit={self.limit})"


class NSQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Spark's view of an NSQ channel (see the module docstring).

    Created by :meth:`NSQDataSource.streamReader`.  The coordinator starts on first
    use in the process Spark runs the source in; the reader is also pickled to the
    executors, where only :meth:`read` runs.
    """

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._loop: LoopThread | None = None
        self._coordinator: Coordinator | None = None
        self._cutoff_ns: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Threads and sockets stay behind: executors only need the options.
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]

    # --- driver side ---

    def _started(self) -> tuple[LoopThread, Coordinator]:
        """The coordinator and its loop thread (started on first use)."""
        if self._loop is None or self._coordinator is None:
            mark("coordinator.starting")
            coordinator = Coordinator(self.options)
            mark("coordinator.keys_made")
            loop = LoopThread(f"trionsq-spark-coordinator-{self.options.topic}")
            loop.start()
            try:
                loop.start_service(coordinator.serve)
            except BaseException:
                loop.close()
                raise
            mark("coordinator.serving")
            self._loop, self._coordinator = loop, coordinator
        return self._loop, self._coordinator

    def initialOffset(self) -> dict[str, Any]:
        mark("source.initial_offset")
        return {"batch": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        per_trigger = self.options.max_messages_per_trigger
        return ReadAllAvailable() if per_trigger is None else ReadMaxRows(per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        mark("source.available_now")
        # "Available now" is what nsqd had received by now: later messages are held
        # back on the executors (and requeued when the query ends), so it finishes.
        self._cutoff_ns = time.time_ns()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = _batch(start, "start")
        if isinstance(limit, ReadMaxRows):
            rows: int | None = limit.max_rows
        elif isinstance(limit, ReadAllAvailable):
            rows = None
        else:
            rows = self.options.max_messages_per_trigger
        # Spark asks for the next batch only once the batch ending at ``start`` is
        # committed (and may never call commit() for it when the stream idles).
        mark("source.latest_offset", start=begin)
        loop, coordinator = self._started()
        end: int = loop.run(coordinator.latest, begin, rows, self._cutoff_ns is not None)
        mark("source.latest_offset.done", start=begin, end=end)
        return {"batch": end}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        _batch(start, "start")
        batch = _batch(end, "end")
        loop, coordinator = self._started()
        plan = loop.run_sync(coordinator.plan, batch)
        assert coordinator.address is not None
        mark("source.partitions", batch=batch, partitions=plan.partitions)
        return [
            NSQInputPartition(
                coordinator.address, coordinator.keys, batch, index, plan.limit, self._cutoff_ns
            )
            for index in range(plan.partitions)
        ]

    def commit(self, end: dict[str, Any]) -> None:
        mark("source.commit", batch=_batch(end, "end"))
        loop, coordinator = self._started()
        loop.run(coordinator.commit, _batch(end, "end"))

    def stop(self) -> None:
        loop, coordinator = self._loop, self._coordinator
        self._loop = self._coordinator = None
        if loop is None or coordinator is None:
            return
        try:
            loop.run(coordinator.stop)
        finally:
            loop.close()

    # --- executor side ---

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, NSQInputPartition):
            raise TypeError(f"not an nsq partition: {partition!r}")
        from pyspark import TaskContext

        context = TaskContext.get()
        mark("task.read", batch=partition.batch, partition=partition.index)
        request = {
            "op": "read",
            **partition.keys.fields(),
            "coordinator": list(partition.coordinator),
            "batch": partition.batch,
            "partition": partition.index,
            "stage": context.stageId() if context is not None else 0,
            "attempt": context.attemptNumber() if context is not None else 0,
            "task": context.taskAttemptId() if context is not None else 0,
            "limit": partition.limit,
            "cutoff": partition.cutoff_ns,
        }
        connection = self.options.connection
        timeout = 2 * connection.connect_timeout + self.options.max_batch_wait + _READ_SLACK
        try:
            header, payload = read_from_agent(identify(), request, self.options, timeout)
        except OSError as exc:
            raise NSQSourceError(f"nsq source: the executor's agent failed: {exc}") from None
        mark("task.rows", batch=partition.batch, partition=partition.index, rows=header.get("rows"))
        if "error" in header:
            raise NSQSourceError(f"nsq source: {header['error']}")
        yield from from_ipc(payload)
