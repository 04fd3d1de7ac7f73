"""A :class:`trionsq.Consumer` hosted on its own thread, for the front ends.

The consumer runs in iteration mode in the loop; a pump task hands every
message it yields, wrapped in the front end's message class (a subclass of
:class:`HandedMessage`), to ``deliver`` (a quick, non-blocking callable run in
the loop's thread: a put into a thread queue, or into the asyncio loop).
Settling a message from any thread claims it (the first of finish and requeue
wins, in one atomic step, so every thread agrees on the outcome) and puts it in an
:class:`~trionsq.hosting.handover.Inbox`, where a settler task applies it to the core
message in order.

Closing (:meth:`HostedConsumer.stop_delivery`, then :meth:`HostedConsumer.finish`)
keeps the core's promise of a prompt, lossless exit: nothing more is handed
out; what the front end received but never handed out is requeued at once; what
was handed out gets ``grace`` seconds to be settled (0 when nobody can settle it
any more), then is requeued (REQ 0, no backoff); only then does the core
consumer leave (CLS, flush, close).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import trio

from .. import telemetry
from ..config import Config
from ..consumer import Consumer, ConsumerStats
from ..message import Message
from .handover import Inbox
from .service import HostedService
from .trio_thread import LoopStoppedError, TrioThread

__all__ = ["HandedMessage", "HostedConsumer", "HostedConsumerState", "check_requeue_delay"]

# (the logger keeps its name from before the hosting package: configurations stay valid)
T = TypeVar("T")

log = logging.getLogger("trionsq.hosted")


#: messages the pump takes from the core's queue in one step of iteration
_DRAIN = 512

#: what ``_out.pop`` returns for a message claimed already
_UNCLAIMED: Any = object()


def check_requeue_delay(delay: float | None) -> None:
    """Raise ``ValueError`` unless ``delay`` is None or a number >= 0 (not a
    bool, not NaN): a front end's requeue() checks in the caller's thread, so
    the error is the caller's, not the loop's."""
    if delay is not None and (
        isinstance(delay, bool) or not isinstance(delay, int | float) or not delay >= 0
    ):
        raise ValueError(f"requeue delay must be a number >= 0, got {delay!r}")


class _Touch:
    """A TOUCH asked for ``message`` (FIN and REQ go through the inbox as the
    message itself, whose ``responded`` says which)."""

    __slots__ = ("message",)

    def __init__(self, message: HandedMessage) -> None:
        self.message = message


class HandedMessage:
    """A message as a front end hands it out; its settling is thread-safe.

    The first of finish and requeue wins (later calls of either do nothing, as
    with :class:`trionsq.Message`); the decision is taken at once, in the
    calling thread, and carried out by the client's loop.
    """

    __slots__ = ("_backoff", "_core", "_delay", "_hosted", "responded")

    def __init__(self, core: Message, hosted: HostedConsumer) -> None:
        # As few stores as can be: one of these is made for every message.
        self._core = core
        self._hosted = hosted
        #: ``"finished"``, ``"requeued"`` or ``None`` while unanswered
        self.responded: str | None = None

    @property
    def id(self) -> bytes:
        """The 16-byte message id."""
        return self._core.id

    @property
    def body(self) -> bytes:
        """The message's body."""
        return self._core.body

    @property
    def attempts(self) -> int:
        """Deliveries so far, this one included (1 the first time)."""
        return self._core.attempts

    @property
    def timestamp(self) -> int:
        """When nsqd received the message, in nanoseconds since the epoch."""
        return self._core.timestamp

    @property
    def address(self) -> str:
        """The nsqd (``host:port``) that delivered it."""
        return self._core.address

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} id={self.id.decode(errors='replace')} "
            f"attempts={self.attempts} body={self.body[:32]!r}"
            f"{'...' if len(self.body) > 32 else ''}>"
        )

    @property
    def has_responded(self) -> bool:
        return self.responded is not None

    @classmethod
    def hand_out(cls, cores: Iterable[Message], hosted: HostedConsumer, deliver: Deliver) -> None:
        """Wrap each of ``cores`` for the front end, count it handed out (and
        not claimed) by ``hosted`` and ``deliver`` it: the pump's step, in the
        loop's thread.  The fast constructor: no ``__init__`` call a message
        (the stores of ``__init__``, made here for a batch in one call)."""
        new, out = object.__new__, hosted._out
        for core in cores:
            message = new(cls)
            message._core = core
            message._hosted = hosted
            message.responded = None
            out[message] = None
            deliver(message)

    def _claim(self, responded: str) -> bool:
        """Take the decision (any thread); False if one was taken already.

        The claim is the removal of the message from the client's unclaimed
        set: ``dict.pop`` is one step under the GIL, so exactly one claim wins
        without a lock (a lock a message cost more than the rest of a FIN).
        """
        if self._hosted._out.pop(self, _UNCLAIMED) is _UNCLAIMED:
            return False
        self.responded = responded
        return True

    def _send(self, item: HandedMessage | _Touch) -> None:
        try:
            self._hosted.inbox.put(item)
        except LoopStoppedError as exc:
            # The client is gone: nsqd will time the message out and redeliver it.
            log.info("could not answer %r: %s", self, exc)

    def _finish(self) -> None:
        # (_claim and _send, inlined: every message is finished through here)
        hosted = self._hosted
        if hosted._out.pop(self, _UNCLAIMED) is _UNCLAIMED:
            return
        self.responded = "finished"
        inbox = hosted.inbox
        inbox.items.append(self)  # the message itself says what to do (put, inlined)
        if not inbox.awake:
            try:
                inbox.wake()
            except LoopStoppedError as exc:
                # The client is gone: nsqd will time the message out and redeliver it.
                log.info("could not answer %r: %s", self, exc)

    def _requeue(self, delay: float | None, backoff: bool) -> None:
        check_requeue_delay(delay)
        if self._claim("requeued"):
            # Read by the loop once the message reaches it, after these stores.
            self._delay = delay
            self._backoff = backoff
            self._requeued(delay)
            self._send(self)

    def _requeued(self, delay: float | None) -> None:
        """(claimed for a requeue) Its span, if any, gets the delay."""
        traced = self._hosted.telemetry
        if traced is not None:
            if delay is None:
                delay = self._hosted.config.requeue_delay(self._core.attempts)
            traced.requeued(self, delay)

    def _touch(self) -> None:
        if self.responded is None:
            traced = self._hosted.telemetry
            if traced is not None:
                traced.touched(self)
            self._send(_Touch(self))

    async def _apply(self) -> None:
        """In the loop: carry out the decision on the core message."""
        if self.responded == "finished":
            await self._core.finish()
        elif self.responded == "requeued":
            await self._core.requeue(self._delay, self._backoff)


#: ``deliver(message)``: hand a message to the front end (in the loop's thread).
Deliver = Callable[[HandedMessage], None]
#: ``give_up(message)``: the front end's give-up callback, awaited in the loop.
AsyncGiveUp = Callable[[HandedMessage], Awaitable[object]]


class HostedConsumer(HostedService):
    """A :class:`trionsq.Consumer` served on its own thread (see the module doc)."""

    def __init__(
        self,
        topic: str,
        channel: str,
        config: Config,
        *,
        wrap: type[HandedMessage],
        deliver: Deliver,
        on_end: Callable[[BaseException | None], None],
        give_up: AsyncGiveUp | None = None,
        end_of_batch: Callable[[], None] | None = None,
        after_batch: tuple[float, Callable[[], None]] | None = None,
        rng: random.Random | None = None,
        name: str = "trionsq-consumer",
        runner: TrioThread | None = None,
    ) -> None:
        # ``runner``: see HostedProducer
        super().__init__(config, name, runner)
        self._give_up = give_up
        # Spans of its own would be the pump's, not the application's: none.
        # The front end's telemetry takes the envelope off here (in _pump),
        # the front end makes the spans where the application's code runs.
        self.consumer = Consumer(
            topic,
            channel,
            config=self.config.replace(telemetry=False, trace_context=False),
            give_up=self._give_up_core if give_up is not None else None,
            rng=rng,
        )
        self.telemetry = telemetry.for_consumer(
            config,
            topic,
            channel,
            stats=lambda: self.consumer.stats,
            msg_timeout=lambda message: self.consumer.msg_timeout_of(message._core),
            ahead=True,
        )
        self._unwrap = (
            self.telemetry.unwrap_ahead
            if self.telemetry is not None and config.trace_context
            else None
        )
        self._wrap = wrap
        self._deliver = deliver
        self._end_of_batch = end_of_batch
        self._on_end = on_end
        self.inbox: Inbox[HandedMessage | _Touch] = Inbox(self.runner.run_sync_soon)
        # Handed out and not claimed yet (dict as an ordered set): the pump adds,
        # a claim (finish or requeue, any thread) pops; see HandedMessage._claim.
        self._out: dict[HandedMessage, None] = {}
        self._pump_scope = trio.CancelScope()
        self._in_batch = False
        self._batch_ended = trio.Event()
        self._batcher_scope = trio.CancelScope()
        #: (delay, callback): called ``delay`` seconds after a batch's end_of_batch
        #: (once for the batches ended meanwhile)
        self._after_batch = after_batch
        self._after_due = trio.Event()
        self._after_scope = trio.CancelScope()
        self._pump_done: trio.Event | None = None
        self._settled: trio.Event | None = None

    # --- life (from the front end's thread) ---

    # (start, launch and aclose: HostedService's; aclose makes the core consumer leave)

    # --- closing (coroutines run in the loop, in this order) ---

    async def stop_delivery(self) -> None:
        """Hand out nothing more; returns once the pump has stopped.

        The flow is paused first (RDY 0 everywhere), so that nsqd does not hand
        the messages requeued next straight back to this closing consumer.
        """
        self._pump_scope.cancel()
        await self.consumer.set_max_in_flight(0)
        if self._pump_done is not None:
            await self._pump_done.wait()

    async def finish(self, undelivered: Iterable[HandedMessage], grace: float) -> None:
        """Requeue ``undelivered`` at once, give the handed-out messages ``grace``
        seconds to be settled, requeue the rest, and close the core consumer."""
        for message in undelivered:
            await self._requeue_now(message)
        if self._out and grace > 0:
            with trio.move_on_after(grace):
                while self._out:
                    self._settled = trio.Event()
                    await self._settled.wait()
        if self._out:
            log.info("closing: requeueing %d unsettled message(s)", len(self._out))
            for message in list(self._out):
                await self._requeue_now(message)
        await self.aclose()

    async def _requeue_now(self, message: HandedMessage) -> None:
        if message._claim("requeued"):
            message._delay = 0
            message._backoff = False
            await message._apply()

    def request_close(self) -> None:
        """From any thread, without waiting: end everything (cancelling)."""
        self.runner.request_stop()

    # --- the service (in the loop) ---

    async def _serve(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        self._close_requested = trio.Event()
        self._served = trio.Event()
        self._pump_done = trio.Event()
        error: BaseException | None = None
        try:
            async with self.consumer:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._settler)
                    nursery.start_soon(self._pump)
                    if self._end_of_batch is not None:
                        nursery.start_soon(self._batcher)
                        if self._after_batch is not None:
                            nursery.start_soon(self._after_batches)
                    task_status.started()
                    await self._close_requested.wait()
                    self._pump_scope.cancel()
                    self._batcher_scope.cancel()
                    self._after_scope.cancel()
                    # Settles put before the close are applied before the core leaves.
                    self.inbox.close()
        except Exception as exc:
            error = exc
            raise
        finally:
            self._served.set()
            self._pump_done.set()
            self._on_end(error)
            self.runner.request_stop()

    async def _pump(self) -> None:
        assert self._pump_done is not None
        deliver, hand_out = self._deliver, self._wrap.hand_out
        batched = self._end_of_batch is not None
        consumer = self.consumer
        take_ready = consumer.take_ready
        try:
            with self._pump_scope:
                async for first in consumer:
                    # The rest of the read is taken here too, as __anext__'s
                    # fast path would hand it out, without a step of iteration
                    # each; the next step yields (and checks for cancellation)
                    # as usual.  (deliver only appends: nothing in between
                    # can close the consumer.)
                    messages = (first, *take_ready(_DRAIN))
                    if self._unwrap is not None:
                        for message in messages:
                            self._unwrap(message)
                    hand_out(messages, self, deliver)
                    if batched and not self._in_batch:
                        self._in_batch = True
                        self._batch_ended.set()
        finally:
            self._pump_done.set()

    async def _batcher(self) -> None:
        """Call ``end_of_batch`` once per run of deliveries: woken by the first
        delivery of a run, this task runs in the scheduler pass after the one in
        which the pump delivered them (the pump does not yield between them)."""
        assert self._end_of_batch is not None
        with self._batcher_scope:
            while True:
                await self._batch_ended.wait()
                self._batch_ended = trio.Event()
                self._in_batch = False
                self._end_of_batch()
                self._after_due.set()

    async def _after_batches(self) -> None:
        """Call ``after_batch``'s callback its delay after a batch ended."""
        assert self._after_batch is not None
        delay, callback = self._after_batch
        with self._after_scope:
            while True:
                await self._after_due.wait()
                self._after_due = trio.Event()
                await trio.sleep(delay)
                callback()

    async def _settler(self) -> None:
        inbox = self.inbox
        items = inbox.items
        out = self._out
        while True:
            await inbox.wait()
            if not items:
                return  # closed, and nothing left to apply
            # Answers are applied as Message.finish/requeue would, without a
            # coroutine each (this loop carries every answer; neither waits,
            # and the loop checks for cancellation once per batch, in wait()).
            while items:
                message = items.popleft()
                if isinstance(message, _Touch):
                    core = message.message._core
                    if not core.has_responded:
                        await core.touch()
                    continue
                if message.responded == "finished":
                    message._core.finish_now()
                else:
                    message._core.requeue_now(message._delay, message._backoff)
            if self._settled is not None and not out:
                self._settled.set()

    def settled(self) -> None:
        """A message handed out was settled in the loop's thread, past the
        inbox (the asyncio front end's settles in guest mode): the last one
        lets a close waiting for them (:meth:`finish`) go on."""
        if not self._out and self._settled is not None:
            self._settled.set()

    async def _give_up_core(self, core: Message) -> None:
        assert self._give_up is not None
        message = self._wrap(core, self)
        self._out[message] = None  # claimable by the callback
        try:
            await self._give_up(message)
        finally:
            self._out.pop(message, None)  # later calls do nothing
        # A decision taken in the callback goes first (the core FINs otherwise).
        if message.responded is not None:
            await message._apply()

    # --- state ---

    # Read from a front end's thread: in the loop while it runs (the core
    # consumer's state is the loop's), as it was left once the loop ended.

    @property
    def stats(self) -> ConsumerStats:
        """A snapshot of the core Consumer's counters."""
        return self._read(lambda: self.consumer.stats, lambda: self.consumer.stats)

    @property
    def connections(self) -> list[str]:
        """Addresses of the nsqds currently subscribed to (none once it ended)."""
        return self._read(lambda: self.consumer.connections, list)

    def _read(self, get: Callable[[], T], ended: Callable[[], T]) -> T:
        runner = self.runner
        if runner.alive:
            if runner.in_loop_thread:  # (a guest run's host thread: the loop's own)
                return get()
            try:
                return runner.run_sync(get)
            except LoopStoppedError:
                pass
        return ended()

    @property
    def unsettled(self) -> int:
        return len(self._out)


class HostedConsumerState:
    """A front end Consumer's state, read from its hosted consumer: the
    properties the blocking and the asyncio Consumer share."""

    _hosted: HostedConsumer

    @property
    def stats(self) -> ConsumerStats:
        """A snapshot of the underlying Consumer's counters."""
        return self._hosted.stats

    @property
    def connections(self) -> list[str]:
        """Addresses of the nsqds currently subscribed to."""
        return self._hosted.connections
