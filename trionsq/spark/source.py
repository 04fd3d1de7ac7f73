"""The streaming source: an NSQ channel read into micro-batches, at least once.

NSQ has no offsets to replay from, and a FIN must travel on the connection that
received the message, so the consumer cannot live on the executors.  It lives on
the driver, in the process Spark runs the source in: a trionsq
:class:`~trionsq.Consumer` on a Trio thread of its own (:class:`_DriverConsumer`),
started on first use.  It holds every message it receives un-FINed, answers
heartbeats and TOUCHes what it has held for half of ``msg_timeout``.

Offsets are a running sequence number, ``{"seq": n}``.  ``latestOffset`` numbers
the held messages into the next batch; ``partitions`` ships that batch's rows to
the executors inside the input partitions themselves; the messages are FINed
only once Spark has committed the batch to the sink (``commit(end)``, or the next
``latestOffset(start)``, which Spark calls only after the batch ending at
``start`` is committed).  A query that dies before that leaves its messages
un-FINed, and nsqd delivers them again: duplicates are possible, losses are not.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

import trio
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

from ..consumer import Consumer
from ..message import Message
from ._loop import LoopStoppedError, LoopThread
from ._options import NSQOptionError, SourceOptions

#: pyarrow ships no type information: its objects are ``Any`` here.
RecordBatch = Any


def _pyarrow() -> Any:
    import pyarrow  # type: ignore[import-untyped]

    return pyarrow


__all__ = ["SCHEMA", "NSQInputPartition", "NSQStreamReader"]

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

#: A batch is closed early once no message has arrived for this long (well above
#: the 25 ms output buffer timeout the consumer asks nsqd for).
_QUIET = 0.1
_CONNECT_WAIT = 5.0
_CLOSE_TIMEOUT = 15.0
_NOT_WAITING = 1 << 62


def _seq(offset: object, what: str) -> int:
    """The sequence number in an offset, checked (a checkpoint may be foreign)."""
    seq = offset.get("seq") if isinstance(offset, dict) else None
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
        raise NSQOptionError(
            f"{what} offset {offset!r} is not an nsq source offset: was this checkpoint "
            "written by another source?"
        )
    return seq


class NSQInputPartition(InputPartition):
    """One task's share of a micro-batch: the messages themselves, column by column."""

    def __init__(
        self,
        topic: str,
        bodies: list[bytes],
        ids: list[str],
        timestamps: list[int],
        attempts: list[int],
        addresses: list[str],
    ) -> None:
        super().__init__(None)
        self.topic = topic
        self.bodies = bodies
        self.ids = ids
        #: nsqd's timestamps, in nanoseconds since the epoch
        self.timestamps = timestamps
        self.attempts = attempts
        self.addresses = addresses

    def __repr__(self) -> str:  # the default would print every body
        return f"NSQInputPartition(topic={self.topic!r}, messages={len(self.bodies)})"

    def to_arrow(self) -> RecordBatch:
        pa = _pyarrow()

        return pa.RecordBatch.from_arrays(
            [
                pa.array(self.bodies, pa.binary()),
                pa.array(self.ids, pa.string()),
                # Spark's timestamps are microseconds; nsqd's are nanoseconds.
                pa.array([t // 1000 for t in self.timestamps], pa.timestamp("us", tz="UTC")),
                pa.array(self.attempts, pa.int32()),
                pa.array(self.addresses, pa.string()),
                pa.array([self.topic] * len(self.bodies), pa.string()),
            ],
            schema=arrow_schema(),
        )


def arrow_schema() -> Any:
    """:data:`SCHEMA` as Arrow, exactly as Spark checks a returned batch against it."""
    pa = _pyarrow()

    return pa.schema(
        [
            pa.field("body", pa.binary()),
            pa.field("id", pa.string()),
            pa.field("timestamp", pa.timestamp("us", tz="UTC")),
            pa.field("attempts", pa.int32()),
            pa.field("nsqd_address", pa.string()),
            pa.field("topic", pa.string()),
        ]
    )


class _Held:
    """A message held un-FINed, with its place in the stream once batched."""

    __slots__ = ("message", "seq", "touched")

    def __init__(self, message: Message, now: float) -> None:
        self.message = message
        self.seq = 0
        #: when nsqd's timeout for it last started (delivery or TOUCH), monotonic
        self.touched = now


class _DriverConsumer:
    """A trionsq Consumer on a Trio thread, holding messages for Spark's batches.

    Shared state is guarded by one lock (``_cond``): the Trio thread appends what
    arrives, Spark's thread moves messages into batches; FIN, REQ and TOUCH are
    always sent from the Trio thread, through :class:`LoopThread`.
    """

    def __init__(self, options: SourceOptions, cutoff_ns: int | None) -> None:
        self.options = options
        #: Trigger.AvailableNow: only messages nsqd received before this are batched
        self.cutoff_ns = cutoff_ns
        self._loop = LoopThread(f"trionsq-spark-source-{options.topic}")
        self._cond = threading.Condition()
        self._pending: deque[_Held] = deque()  # received, not batched yet
        self._batched: deque[_Held] = deque()  # in planned batches, by seq
        self._later: deque[_Held] = deque()  # past the AvailableNow cutoff
        self._seq = 0
        self._last_arrival = 0.0
        self._wanted = _NOT_WAITING
        self._consumer: Consumer | None = None
        self._closing: trio.Event | None = None
        self._done: trio.Event | None = None
        self._warned_budget = False

    # --- lifecycle (Spark's thread) ---

    def start(self) -> None:
        self._loop.start()
        try:
            self._loop.start_service(self._serve)
        except BaseException:
            self._loop.close()
            raise
        try:
            self._loop.run(self._wait_connected)
        except trio.TooSlowError:
            log.warning(
                "nsq source %s/%s: not connected to any nsqd after %.0fs; still trying",
                self.options.topic,
                self.options.channel,
                _CONNECT_WAIT,
            )

    async def _wait_connected(self) -> None:
        assert self._consumer is not None
        with trio.fail_after(_CONNECT_WAIT):
            await self._consumer.wait_connected()

    def close(self) -> None:
        """Requeue everything held (none of it was committed), close, end the thread."""
        if self._loop.alive:
            try:
                self._loop.run(self._shutdown)
            except LoopStoppedError:
                pass
        self._loop.close(_CLOSE_TIMEOUT)

    # --- the Trio side ---

    async def _serve(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        self._closing = trio.Event()
        self._done = trio.Event()
        options = self.options
        try:
            async with Consumer(
                options.topic, options.channel, config=options.consumer_config()
            ) as consumer:
                self._consumer = consumer
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._receive, consumer)
                    nursery.start_soon(self._touch_loop)
                    task_status.started()
                    await self._closing.wait()
                    nursery.cancel_scope.cancel()
                with self._cond:
                    held = [*self._batched, *self._pending, *self._later]
                    self._batched.clear()
                    self._pending.clear()
                    self._later.clear()
                for item in held:
                    await item.message.requeue(0, backoff=False)
                if held:
                    log.info(
                        "nsq source %s/%s: requeued %d uncommitted message(s)",
                        options.topic,
                        options.channel,
                        len(held),
                    )
        finally:
            self._done.set()

    async def _shutdown(self) -> None:
        assert self._closing is not None and self._done is not None
        self._closing.set()
        with trio.move_on_after(_CLOSE_TIMEOUT):
            await self._done.wait()

    async def _receive(self, consumer: Consumer) -> None:
        cond = self._cond
        async for message in consumer:
            now = time.monotonic()
            held = _Held(message, now)
            with cond:
                cutoff = self.cutoff_ns
                if cutoff is not None and message.timestamp > cutoff:
                    self._later.append(held)
                    continue
                self._pending.append(held)
                self._last_arrival = now
                # Wake a waiting take() when its batch is full, or at the first arrival
                # (from then on it times the pause in deliveries itself).
                if len(self._pending) >= self._wanted or len(self._pending) == 1:
                    cond.notify_all()

    async def _touch_loop(self) -> None:
        """TOUCH what has been held for half of msg_timeout, so nsqd keeps it ours."""
        timeout = self.options.msg_timeout
        while True:
            await trio.sleep(timeout / 4)
            now = time.monotonic()
            with self._cond:
                due = [
                    held
                    for queue in (self._batched, self._pending, self._later)
                    for held in queue
                    if now - held.touched >= timeout / 2
                ]
            for held in due:
                held.touched = now
                await held.message.touch()

    @staticmethod
    async def _finish(done: list[_Held]) -> None:
        for held in done:
            await held.message.finish()

    def _budget(self) -> int:
        """How many messages can be in flight at once (runs in the Trio thread)."""
        assert self._consumer is not None
        connections = self._consumer.stats.connections.values()
        rdy_budget = sum(c.max_rdy_count for c in connections)
        max_in_flight = self.options.max_in_flight
        if rdy_budget and rdy_budget < max_in_flight:
            if not self._warned_budget:
                self._warned_budget = True
                log.warning(
                    "nsq source %s/%s: max_in_flight=%d exceeds the RDY budget of its %d "
                    "connection(s) (sum of nsqd's max-rdy-count: %d); batches are capped at %d",
                    self.options.topic,
                    self.options.channel,
                    max_in_flight,
                    len(connections),
                    rdy_budget,
                    rdy_budget,
                )
            return rdy_budget
        return max_in_flight

    # --- Spark's side ---

    def finish_through(self, seq: int) -> None:
        """FIN every batched message numbered ``seq`` or less: Spark committed them."""
        done: list[_Held] = []
        with self._cond:
            batched = self._batched
            while batched and batched[0].seq <= seq:
                done.append(batched.popleft())
        if done:
            self._loop.run(self._finish, done)

    def take(self, start: int, limit: int | None) -> int:
        """Number the next batch after ``start`` (at most ``limit`` messages, or all
        that are held) and return its end.

        Waits up to ``max_batch_wait`` for the batch to fill: until ``limit`` (capped
        by the RDY budget) messages are held, or no message has arrived for a moment.
        """
        budget = self._loop.run_sync(self._budget)
        wanted = budget if limit is None else min(limit, budget)
        cond = self._cond
        with cond:
            if self._batched:
                # Spark plans from ``start`` again: the batch it was offered after it
                # never ran.  Offer the same messages again, first.
                self._pending.extendleft(reversed(self._batched))
                self._batched.clear()
            self._seq = start
            began = time.monotonic()
            deadline = began + self.options.max_batch_wait
            self._wanted = wanted
            try:
                while True:
                    held = len(self._pending)
                    if held >= wanted:
                        break
                    now = time.monotonic()
                    quiet_since = max(self._last_arrival, began)
                    if held and now - quiet_since >= _QUIET:
                        break
                    if now >= deadline:
                        break
                    if not self._loop.alive:
                        raise LoopStoppedError("the nsq source's consumer stopped") from (
                            self._loop.error
                        )
                    wait = deadline - now
                    if held:
                        wait = min(wait, quiet_since + _QUIET - now)
                    cond.wait(max(wait, 0.001))
            finally:
                self._wanted = _NOT_WAITING
            count = len(self._pending) if limit is None else min(limit, len(self._pending))
            pending = self._pending
            batched = self._batched
            for _ in range(count):
                held_message = pending.popleft()
                self._seq += 1
                held_message.seq = self._seq
                batched.append(held_message)
            return self._seq

    def batch(self, start: int, end: int) -> list[_Held]:
        with self._cond:
            return [held for held in self._batched if start < held.seq <= end]


class NSQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Spark's view of an NSQ channel (see the module docstring for the protocol).

    Created by :meth:`NSQDataSource.streamReader`; the consumer is opened on first
    use in the process Spark runs the source in (the reader is also pickled to
    the executors, where only :meth:`read` runs).
    """

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._consumer: _DriverConsumer | None = None
        self._cutoff_ns: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Threads and locks stay behind: executors only need the options.
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]

    def _driver_consumer(self) -> _DriverConsumer:
        if self._consumer is None:
            consumer = _DriverConsumer(self.options, self._cutoff_ns)
            consumer.start()
            self._consumer = consumer
        return self._consumer

    def initialOffset(self) -> dict[str, Any]:
        return {"seq": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.options.max_messages_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        # "Available now" is what nsqd had received by now: later messages are
        # held back (and requeued when the query ends), so the query finishes.
        self._cutoff_ns = time.time_ns()
        if self._consumer is not None:
            self._consumer.cutoff_ns = self._cutoff_ns

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        start_seq = _seq(start, "start")
        consumer = self._driver_consumer()
        # Spark asks for the next batch only once the batch ending at ``start`` is
        # committed (and may never call commit() for it when the stream idles).
        consumer.finish_through(start_seq)
        if isinstance(limit, ReadMaxRows):
            rows: int | None = limit.max_rows
        elif isinstance(limit, ReadAllAvailable):
            rows = None
        else:
            rows = self.options.max_messages_per_trigger
        return {"seq": consumer.take(start_seq, rows)}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        start_seq, end_seq = _seq(start, "start"), _seq(end, "end")
        held = self._consumer.batch(start_seq, end_seq) if self._consumer is not None else []
        if len(held) < end_seq - start_seq:
            # A batch planned by an earlier run of the query, replayed after a restart:
            # its messages were never FINed, so nsqd delivers them again, in a later batch.
            log.info(
                "nsq source %s/%s: batch (%d, %d] was planned by an earlier run; its %d "
                "uncommitted message(s) come again from nsqd",
                self.options.topic,
                self.options.channel,
                start_seq,
                end_seq,
                end_seq - start_seq - len(held),
            )
        if not held:
            return []
        count = min(self.options.num_partitions, len(held))
        size, extra = divmod(len(held), count)
        partitions: list[InputPartition] = []
        begin = 0
        for index in range(count):
            stop = begin + size + (1 if index < extra else 0)
            chunk = [h.message for h in held[begin:stop]]
            begin = stop
            partitions.append(
                NSQInputPartition(
                    self.options.topic,
                    [m.body for m in chunk],
                    [m.id.decode("ascii", "replace") for m in chunk],
                    [m.timestamp for m in chunk],
                    [m.attempts for m in chunk],
                    [m.address for m in chunk],
                )
            )
        return partitions

    def read(self, partition: InputPartition) -> Iterator[RecordBatch]:
        if not isinstance(partition, NSQInputPartition):
            raise TypeError(f"not an nsq partition: {partition!r}")
        if partition.bodies:
            yield partition.to_arrow()

    def commit(self, end: dict[str, Any]) -> None:
        if self._consumer is not None:
            self._consumer.finish_through(_seq(end, "end"))

    def stop(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()
