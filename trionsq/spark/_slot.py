"""A slot: one partition's NSQ connections and RDY budget, on an agent.

Every task of a query that runs on an executor takes its messages from a slot of
that executor's agent; concurrent tasks get different slots, so each partition
has a RDY budget of its own.  A slot holds ``connections_per_nsqd`` trionsq
Consumers (each one connection per nsqd), prefetching up to its budget: what
arrives waits in :attr:`Slot.buffer` for the next task, held un-FINed.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable
from contextlib import AsyncExitStack

import trio

from ..consumer import Consumer
from ..message import Message
from ..telemetry.semconv import SPARK_EXECUTOR_ID
from ..tracecontext import Unwrapped
from ._held import Held
from ._options import SourceOptions

__all__ = ["NoConnectionError", "Slot"]

log = logging.getLogger("trionsq.spark.agent")

#: A take closes once no message has arrived for this long (well above the 25 ms
#: output buffer timeout the consumers ask nsqd for)...
QUIET = 0.1
#: ... or this long in a slot's first second: its new connections start at RDY 1
#: and only get their share once a first message has come and gone.
QUIET_AT_START = 0.3
#: A take returns at once when this many messages wait (or half the slot's budget,
#: if less): a batch that big pays Spark's fixed cost per batch well, and waiting
#: for more (half of a big budget) only delays it.
TAKE_AT_ONCE = 30_000
#: How often the budget follows the connections' max-rdy-count and the sizes seen.
_BUDGET_EVERY = 0.5
#: Each consumer's max_in_flight until the first messages have been measured.
_FIRST_LIMIT = 16
#: Message counts at which the budget is set again without waiting.
_SAMPLES = frozenset({1, 16, 256, 4096})


class NoConnectionError(ConnectionError):
    """A read found no nsqd connection up after the connect timeout."""


class Slot:
    """Consumers, their prefetch buffer, and the take that hands it to a task."""

    def __init__(
        self,
        index: int,
        options: SourceOptions,
        user_agent: str,
        on_arrival: Callable[[], None],
        executor_id: str = "driver",
    ) -> None:
        self.index = index
        self.options = options
        self._user_agent = user_agent
        #: Spark's executor id, on the consumers' spans and metric points
        self._executor_id = executor_id
        #: takes the trace context envelope off a body (option trace_context)
        self.unwrap: Callable[[Message], Unwrapped | None] | None = None
        self._on_arrival = on_arrival
        self.consumers: list[Consumer] = []
        #: received, eligible for the next take, in arrival order
        self.buffer: deque[Held] = deque()
        #: past the Trigger.AvailableNow cutoff: held back until the query ends
        self.later: deque[Held] = deque()
        #: messages taken from this slot into sets not resolved yet
        self.in_sets = 0
        self.cutoff_ns: int | None = None
        self.busy = False
        self.last_used = trio.current_time()
        self.last_arrival = -math.inf
        #: when a consumer's max_in_flight was last raised (room for nsqd to send)
        self.budget_raised = -math.inf
        self._now = self.started_at = trio.current_time()
        self._received = 0
        self._received_bytes = 0
        self._budget_due = trio.Event()
        self._wanted = math.inf
        self._arrived: trio.Event | None = None
        self._closing = trio.Event()
        self._closed = trio.Event()
        #: each consumer's max_in_flight
        self._limits: list[int] = []

    # --- budget ---

    def capacity(self) -> int:
        """How many messages this slot may hold in flight right now."""
        total = 0
        for consumer, limit in zip(self.consumers, self._limits, strict=True):
            granted = sum(c.max_rdy_count for c in consumer.stats.connections.values())
            total += min(limit, granted)
        return total

    def _initial_limit(self) -> int:
        groups = self.options.connections_per_nsqd
        explicit = self.options.max_in_flight
        share = None if explicit is None else max(1, math.ceil(explicit / groups))
        # Until the first messages show how big they are (max_bytes_in_flight), and
        # nsqd how much it grants: a little, raised as soon as they do.
        return min(share or _FIRST_LIMIT, _FIRST_LIMIT)

    def _byte_cap(self) -> int | None:
        """Messages per consumer that keep the slot within ``max_bytes_in_flight``,
        at the bodies' average size so far (None until a message has come)."""
        if not self._received:
            return None
        average = max(1.0, self._received_bytes / self._received)
        per_slot = self.options.max_bytes_in_flight / average
        return max(1, int(per_slot / max(1, len(self.consumers))))

    async def _follow_budget(self) -> None:
        """Each consumer's max_in_flight: what its nsqds grant (their max-rdy-count),
        or ``max_in_flight``'s share, within ``max_bytes_in_flight``."""
        explicit = self.options.max_in_flight
        while True:
            self._budget_due = trio.Event()
            cap = self._byte_cap()
            for index, consumer in enumerate(self.consumers):
                if explicit is not None:
                    target = max(1, math.ceil(explicit / len(self.consumers)))
                else:
                    target = sum(c.max_rdy_count for c in consumer.stats.connections.values())
                if cap is not None:
                    target = min(target, cap)
                current = self._limits[index]
                # Follow big moves only: a RDY change costs a round of commands.
                if target and (target < current or target > current * 1.1):
                    self._limits[index] = target
                    await consumer.set_max_in_flight(target)
                    if target > current:
                        self.budget_raised = trio.current_time()
            with trio.move_on_after(_BUDGET_EVERY):
                await self._budget_due.wait()

    # --- life ---

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect, prefetch until :meth:`close`, then requeue what is not in a set."""
        options = self.options
        limit = self._initial_limit()
        config = options.consumer_config().replace(
            max_in_flight=limit,
            user_agent=self._user_agent,
            telemetry_attributes={SPARK_EXECUTOR_ID: self._executor_id},
        )
        try:
            async with AsyncExitStack() as stack:
                for _ in range(options.connections_per_nsqd):
                    consumer = Consumer(options.topic, options.channel, config=config)
                    self.consumers.append(await stack.enter_async_context(consumer))
                    self._limits.append(limit)
                async with trio.open_nursery() as nursery:
                    self._now = trio.current_time()
                    nursery.start_soon(self._clock)
                    for consumer in self.consumers:
                        nursery.start_soon(self._receive, consumer)
                    nursery.start_soon(self._follow_budget)
                    task_status.started()
                    await self._closing.wait()
                    nursery.cancel_scope.cancel()
                await self.requeue_unbatched()
        finally:
            self._closed.set()

    async def close(self) -> None:
        self._closing.set()
        await self._closed.wait()

    async def requeue_unbatched(self) -> int:
        """REQ (no delay) what this slot holds outside sets."""
        held = [*self.buffer, *self.later]
        self.buffer.clear()
        self.later.clear()
        for item in held:
            await item.message.requeue(0, backoff=False)
        return len(held)

    async def _clock(self) -> None:
        """A coarse clock for arrivals (reading Trio's per message costs more than
        the rest of the bookkeeping); TOUCHes leave far more margin than 10 ms."""
        while True:
            self._now = trio.current_time()
            await trio.sleep(0.01)

    async def _receive(self, consumer: Consumer) -> None:
        buffer, later = self.buffer, self.later
        unwrap = self.unwrap
        # The consumer's own iteration, not its instrumented one: prefetching
        # is not processing (a set's span is, see _telemetry).
        next_message = consumer.__anext__
        while True:
            try:
                message = await next_message()
            except StopAsyncIteration:
                return
            now = self._now
            held = Held(message, now)
            if unwrap is not None:
                held.context = unwrap(message)
            self._received += 1
            self._received_bytes += len(message.body)
            if self._received in _SAMPLES:
                self._budget_due.set()  # the first sizes: set the budget at once
            cutoff = self.cutoff_ns
            if cutoff is not None and message.timestamp > cutoff:
                later.append(held)
                continue
            buffer.append(held)
            self.last_arrival = now
            waiter = self._arrived
            if waiter is not None and (len(buffer) >= self._wanted or len(buffer) == 1):
                waiter.set()
            if len(buffer) == 1:
                self._on_arrival()

    def set_cutoff(self, cutoff_ns: int | None) -> None:
        """Trigger.AvailableNow: only messages nsqd received up to ``cutoff_ns`` are taken."""
        if cutoff_ns == self.cutoff_ns:
            return
        self.cutoff_ns = cutoff_ns
        if cutoff_ns is None:
            self.buffer.extend(self.later)
            self.later.clear()
            return
        keep = [h for h in self.buffer if h.message.timestamp <= cutoff_ns]
        self.later.extend(h for h in self.buffer if h.message.timestamp > cutoff_ns)
        self.buffer.clear()
        self.buffer.extend(keep)

    # --- taking ---

    def prune(self) -> int:
        """Forget prefetched messages whose connection is gone: nsqd gives them out
        again, and a FIN could not reach it anyway."""
        connected = self.connected()
        dropped = 0
        for queue in (self.buffer, self.later):
            if any(h.message.address not in connected for h in queue):
                keep = [h for h in queue if h.message.address in connected]
                dropped += len(queue) - len(keep)
                queue.clear()
                queue.extend(keep)
        if dropped:
            log.info("slot %d: dropped %d message(s) of lost connections", self.index, dropped)
        return dropped

    def connected(self) -> set[str]:
        return {address for c in self.consumers for address in c.connections}

    async def wait_connected(self) -> None:
        """Wait until one of the consumers has an nsqd connection."""
        async with trio.open_nursery() as nursery:

            async def one(consumer: Consumer) -> None:
                await consumer.wait_connected()
                nursery.cancel_scope.cancel()

            for consumer in self.consumers:
                nursery.start_soon(one, consumer)

    async def take(self, limit: int | None, max_wait: float) -> list[Held]:
        """Up to ``limit`` buffered messages (or all this slot may hold).

        Returns at once when :data:`TAKE_AT_ONCE` messages, or half of the slot's
        budget, are buffered (taking all that is there): the rest of the budget
        then prefetches the next batch while this one is written, so a steady
        stream never waits here.  Otherwise waits up to ``max_wait`` for more, and
        returns early once deliveries pause.
        """
        self.prune()
        buffer = self.buffer
        began = trio.current_time()
        deadline = began + max_wait
        quiet = QUIET if began - self.started_at > 1.0 else QUIET_AT_START
        try:
            while True:
                # The budget grows as connections come up and sizes are measured.
                capacity = self.capacity()
                room = capacity - self.in_sets - len(self.later)
                wanted = max(0, room if limit is None else min(limit, room))
                enough = min(wanted, max(1, capacity // 2), TAKE_AT_ONCE)
                self._wanted = max(1, enough)
                held = len(buffer)
                now = trio.current_time()
                if held >= enough or now >= deadline:
                    break
                quiet_since = max(self.last_arrival, began)
                if held and now - quiet_since >= quiet:
                    break
                wake = deadline if not held else min(deadline, quiet_since + quiet)
                self._arrived = trio.Event()
                with trio.move_on_at(min(wake, now + _BUDGET_EVERY)):
                    await self._arrived.wait()
        finally:
            self._arrived = None
            self._wanted = math.inf
        count = min(wanted, len(buffer))
        taken = [buffer.popleft() for _ in range(count)]
        self.in_sets += len(taken)
        self.last_used = trio.current_time()
        return taken
