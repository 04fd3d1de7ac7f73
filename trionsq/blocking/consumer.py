"""The blocking Consumer: ``for message in consumer:``, or a handler on a pool of threads."""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from sniffio import thread_local as _sniffio

from ..config import Config
from ..hosting.consumer import HandedMessage, HostedConsumer, HostedConsumerState
from ..hosting.handover import Handout
from ..hosting.producer import ClientClosedError
from ..hosting.trio_thread import ForkedError, LoopStoppedError, check_not_in_trio
from ..lifecycle import (
    CLOSED,
    CLOSING,
    FORKED,
    NEW,
    OPEN,
    OPENING,
    BlockingClient,
    Lifecycle,
    Moves,
)

__all__ = ["Consumer", "Message"]

log = logging.getLogger("trionsq.blocking")

#: how long closing waits for an idle handler thread to notice the end
_IDLE_JOIN = 5.0
#: blocking waits wake this often (to let the main thread run signal handlers)
_SLICE = 0.25
#: a handler pool: a batch of messages wakes one thread; the others are woken
#: if messages of it are still waiting this long after (handlers that block).
#: Quick handlers drain a batch on one thread sooner than that, sparing the
#: switches of waking all (each woken thread costs its turns of the GIL).
_MORE_HANDLERS_AFTER = 0.001


class Message(HandedMessage):
    """One delivery of a message, settled from any thread.

    Exactly one of :meth:`finish` and :meth:`requeue` takes effect (the first);
    later calls of either do nothing.  They return at once: the client's loop
    sends the command.  Messages are never touched automatically.
    """

    __slots__ = ()

    def finish(self) -> None:
        """FIN: nsqd forgets the message."""
        self._finish()

    def requeue(self, delay: float | None = None, backoff: bool = True) -> None:
        """REQ: nsqd redelivers the message after ``delay`` seconds
        (``None``: ``default_requeue_delay`` times the attempts, capped at
        ``max_requeue_delay``); ``backoff=True`` counts it as a failure for the
        consumer's backoff."""
        self._requeue(delay, backoff)

    def touch(self) -> None:
        """TOUCH: reset nsqd's timeout for this message (while unanswered)."""
        self._touch()


#: ``handler(message)``: return to FIN, raise to REQ (with backoff).
Handler = Callable[[Message], object]
#: ``give_up(message)``: called (on a thread of its own) for messages past
#: ``max_attempts``; they are finished afterwards unless it settled them.
GiveUp = Callable[[Message], object]


class _End:
    """Put in the queue when iteration ends: stop() (error None) or a crash."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException | None) -> None:
        self.error = error


#: A blocking Consumer's life: started once (``opening`` while its loop
#: starts), closed once; forked in a child process of a ``fork()`` made while
#: it was open (its loop's thread is the parent's).
MOVES = Moves(
    "blocking.Consumer",
    NEW,
    {
        NEW: {OPENING, CLOSED},
        OPENING: {OPEN, CLOSED, FORKED},
        OPEN: {CLOSING, FORKED},
        CLOSING: {CLOSED, FORKED},
        FORKED: {CLOSED},
    },
    refusals={OPENING: "a Consumer can be started only once (it is {state})"},
)


class Consumer(HostedConsumerState, BlockingClient):
    """Consumes ``topic`` on ``channel``, for synchronous code.

    Iterate it (from any thread)::

        with trionsq.blocking.Consumer("topic", "channel", nsqd_tcp_addresses=[...]) as c:
            for message in c:
                ...
                message.finish()

    or give a ``handler``, run on a pool of ``concurrency`` threads (returning
    finishes the message, raising requeues it with backoff), and block in
    :meth:`run` until :meth:`stop` (from a handler, another thread or a signal
    handler) or Ctrl-C::

        with trionsq.blocking.Consumer("topic", "channel", handler=work, concurrency=4,
                                       lookupd_http_addresses=[...]) as c:
            c.run()

    With a handler, ``max_in_flight`` defaults to ``concurrency``.  Every other
    option is :class:`trionsq.Consumer`'s (:class:`~trionsq.Config`), and so are
    the guarantees: one trionsq Consumer does the work in a Trio loop on a thread
    of this object's own.

    Leaving the ``with`` (or :meth:`close`) hands out nothing more and requeues
    at once (REQ 0, no backoff) every message received and not handed out.
    Messages handed out through iteration and unsettled are requeued at once
    (the loop has been left); handlers still running get ``close_timeout``
    seconds, then their messages are requeued too (their late answers are
    ignored).  On ``KeyboardInterrupt`` nothing waits.  Then CLS, the
    connections close, and the loop's thread and the handler threads end (a
    handler still stuck in a blocking call after the close is logged and left
    to finish on its own; it cannot be interrupted).
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        *,
        handler: Handler | None = None,
        concurrency: int = 1,
        give_up: GiveUp | None = None,
        config: Config | None = None,
        rng: random.Random | None = None,
        **options: Any,
    ) -> None:
        if handler is not None and not callable(handler):
            raise TypeError("handler must be callable")
        if give_up is not None and not callable(give_up):
            raise TypeError("give_up must be callable")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be an int >= 1, got {concurrency!r}")
        if (
            handler is not None
            and "max_in_flight" not in options
            and (config is None or config.max_in_flight < concurrency)
        ):
            options["max_in_flight"] = concurrency
        config = Config(**options) if config is None else config.replace(**options)
        self._handler = handler
        self._concurrency = concurrency if handler is not None else 0
        self._user_give_up = give_up
        # Messages from the loop (a batch per read, one wake-up for it), and
        # the _End that stops the takers.
        self._queue: Handout[Message | _End] = Handout()
        self._stop_signal: queue.SimpleQueue[_End] = queue.SimpleQueue()
        self._hosted = HostedConsumer(
            topic,
            channel,
            config,
            wrap=Message,
            # No wake-up per message: _end_of_batch wakes the takers once a batch.
            deliver=self._queue.items.append,  # type: ignore[arg-type]  # wrap=Message
            end_of_batch=self._end_of_batch,
            # A handler pool: one thread is woken a batch, the others if the
            # batch is still waiting a moment later (slow handlers).
            after_batch=(_MORE_HANDLERS_AFTER, self._queue.wake) if handler else None,
            on_end=self._on_end,
            give_up=self._give_up if give_up is not None else None,
            rng=rng,
            name="trionsq-blocking-consumer",
        )
        self.topic = topic
        self.channel = channel
        self.config = self._hosted.consumer.config
        self._life = Lifecycle(MOVES)
        self._stopping = False
        self._threads: list[threading.Thread] = []
        self._busy: set[threading.Thread] = set()  # handler threads inside the handler
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<blocking.Consumer {self.topic}/{self.channel} {self._life.state.value}>"

    # --- life ---

    def start(self) -> Consumer:
        """Start the loop's thread (and the handler threads); returns the consumer."""
        check_not_in_trio("blocking.Consumer.start()")
        with self._lock:
            self._life.move(OPENING)
            try:
                self._hosted.start()
            except BaseException:
                self._life.move(CLOSED)
                raise
            self._hosted.runner.on_fork(self._after_fork_in_child)
            self._life.move(OPEN)
            traced = self._hosted.telemetry
            if traced is not None and self._handler is not None:
                self._handler = traced.wrap_sync_handler(self._handler)  # a span a call
            for index in range(self._concurrency):
                thread = threading.Thread(
                    target=self._handler_loop, name=f"trionsq-handler-{index}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
        return self

    def stop(self) -> None:
        """End iteration and :meth:`run` (safe from any thread and from a
        signal handler); the consumer closes when the ``with`` is left."""
        self._stopping = True
        end = _End(None)
        self._stop_signal.put(end)
        self._queue.put(end)

    def run(self, timeout: float | None = None) -> bool:
        """Block until :meth:`stop` is called (True) or ``timeout`` passes (False).

        For handler mode, where the work happens on the pool's threads.  If the
        consumer's loop fails, its error is raised here.
        """
        check_not_in_trio("blocking.Consumer.run()")
        self._check_open()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            # In slices: a signal aimed at another thread still gets its Python
            # handler run here soon (handlers run between the main thread's steps).
            left = _SLICE if deadline is None else min(_SLICE, deadline - time.monotonic())
            try:
                end = self._stop_signal.get(timeout=max(0.0, left))
                break
            except queue.Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    return False
        self._stop_signal.put(end)  # for any other waiter
        if end.error is not None:
            raise end.error
        return True

    def close(self, timeout: float | None = None, *, interrupted: bool = False) -> None:
        """Close as described in the class doc; ``interrupted=True`` skips the
        wait for running handlers (as on KeyboardInterrupt)."""
        check_not_in_trio("blocking.Consumer.close()")
        with self._lock:
            life = self._life
            if life.state is CLOSED:
                return
            if life.state is not OPEN:  # never started, or forked: nothing to end here
                life.move(CLOSED)
                return
            life.move(CLOSING)
            self._stopping = True
            hosted = self._hosted
            started = time.monotonic()
            try:
                hosted.runner.run(hosted.stop_delivery)
                undelivered = self._drain_queue()
                grace = 0.0 if interrupted or not self._threads else self.config.close_timeout
                hosted.runner.run(hosted.finish, undelivered, grace)
            except LoopStoppedError:
                pass  # the loop ended already (its error went to run() or iteration)
            finally:
                hosted.runner.close(timeout)
                life.move(CLOSED)
                self._end_threads(started)
                if hosted.telemetry is not None:
                    hosted.telemetry.close()  # here: the iterating thread's spans

    def _drain_queue(self) -> list[Message]:
        return [item for item in self._queue.take_all() if isinstance(item, Message)]

    def _end_threads(self, started: float) -> None:
        end = _End(None)
        self._queue.put(end)
        self._stop_signal.put(end)
        budget = self.config.close_timeout
        for thread in self._threads:
            if thread in self._busy:
                thread.join(max(0.0, budget - (time.monotonic() - started)))
            else:
                thread.join(_IDLE_JOIN)  # idle: it leaves as soon as it sees the end
            if thread.is_alive():
                log.warning("%s: a handler is still running after close; left behind", thread.name)

    def _leave(self, interrupted: bool) -> None:
        self.close(interrupted=interrupted)

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
        self._queue = Handout()
        self._stop_signal = queue.SimpleQueue()
        if self._life.state in (OPENING, OPEN, CLOSING):
            self._life.move(FORKED)

    def _end_of_batch(self) -> None:
        if self._handler is None:
            self._queue.wake()
        else:
            self._queue.wake(1)  # and the others, if need be, by after_batch

    def _on_end(self, error: BaseException | None) -> None:
        # In the loop's thread, as the consumer's service ends (closed, or crashed).
        if error is not None:
            log.error("the consumer's loop failed: %r", error)
            end = _End(error)
            self._stop_signal.put(end)
            self._queue.put(end)

    def _check_open(self) -> None:
        state = self._life.state
        if state is OPEN:
            return
        if state is NEW or state is OPENING:
            raise RuntimeError("start the Consumer first (with ... or .start())")
        if state is FORKED:
            raise ForkedError(
                "this Consumer was started before a fork(): its messages belong to the "
                "parent process; create and start a Consumer in this process"
            )
        raise ClientClosedError("the Consumer is closed")

    # --- iteration ---

    def __iter__(self) -> Iterator[Message]:
        if self._handler is not None:
            raise RuntimeError("a Consumer with a handler cannot be iterated")
        traced = self._hosted.telemetry  # instrumented: a span an iteration
        return self if traced is None else traced.iterate_sync(self)

    def __next__(self) -> Message:
        if self._life.state is not OPEN or self._stopping or _sniffio.name == "trio":
            return self._next_slowly()
        try:
            item = self._queue.items.popleft()  # the common case: one is ready
        except IndexError:
            return self._next_slowly()
        if type(item) is _End:
            self._queue.items.appendleft(item)
            return self._next_slowly()
        return item  # type: ignore[return-value]

    def _next_slowly(self) -> Message:
        state = self._life.state
        if state is not OPEN and state is not CLOSING:
            self._check_open()  # raises: not started, closed, forked
        if self._stopping:
            raise StopIteration
        check_not_in_trio("iterating a blocking.Consumer")
        get = self._queue.get
        while True:
            try:
                item = get(timeout=_SLICE)  # in slices, as in run()
                break
            except queue.Empty:
                if self._stopping:
                    raise StopIteration from None
        if isinstance(item, _End):
            self._queue.put(item)  # for other iterating threads
            if item.error is not None:
                raise item.error
            raise StopIteration
        return item

    # --- the handler pool ---

    def _handler_loop(self) -> None:
        handler = self._handler
        assert handler is not None
        get, items = self._queue.get, self._queue.items
        busy, me = self._busy, threading.current_thread()
        while True:
            try:
                item = items.popleft()  # the common case: one is ready
            except IndexError:
                item = get()
            if isinstance(item, _End):
                self._queue.put(item)
                return
            if self._stopping:
                item.requeue(0, backoff=False)  # not handed out: back at once
                continue
            busy.add(me)
            try:
                handler(item)
            except Exception as exc:
                log.warning("handler failed for %r: %r", item, exc, exc_info=True)
                item.requeue()
            except BaseException:
                item.requeue()
                raise
            else:
                item.finish()
            finally:
                busy.discard(me)

    async def _give_up(self, message: HandedMessage) -> None:
        assert self._user_give_up is not None
        await self._hosted.runner.run_in_thread(self._user_give_up, message)

    # --- control and state ---

    def wait_connected(self, timeout: float | None = None) -> None:
        """Block until at least one nsqd subscription is up (TimeoutError after
        ``timeout`` seconds)."""
        self._check_open()
        self._hosted.runner.run(self._hosted.consumer.wait_connected, timeout=timeout)

    def set_max_in_flight(self, max_in_flight: int) -> None:
        """Change ``max_in_flight`` at run time (0 pauses the flow)."""
        self._check_open()
        self._hosted.runner.run(self._hosted.consumer.set_max_in_flight, max_in_flight)

    def is_starved(self) -> bool:
        """See :meth:`trionsq.Consumer.is_starved`."""
        self._check_open()
        return self._hosted.runner.run_sync(self._hosted.consumer.is_starved)
