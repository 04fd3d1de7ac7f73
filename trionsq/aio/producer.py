"""The asyncio Producer: ``await producer.publish(...)`` in an asyncio program."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine, Generator, Iterable, Sequence
from typing import Any

from .. import producer as _core
from .. import telemetry
from ..config import Config
from ..hosting.producer import ClientClosedError, HostedProducer, HostedProducerState
from ..hosting.trio_thread import ForkedError, LoopStoppedError
from ..lifecycle import CLOSED, CLOSING, NEW, OPEN, OPENING, AsyncClient, Lifecycle, Moves
from ..protocol import commands
from ..publishing import ProducerStats
from ..transport import tcp_connector
from .direct import AioPublisher
from .guest import GuestRunner
from .lifecycle import LoopCalls, calls_for, enter, leave, new_runner, settle_future

__all__ = ["Producer", "PublishFuture"]

#: forks seen by this process (a producer opened before one is the parent's)
_forks = [0]
os.register_at_fork(after_in_child=lambda: _forks.__setitem__(0, _forks[0] + 1))


def _closed_error() -> ClientClosedError:
    return ClientClosedError("the Producer is closed")


class PublishFuture(asyncio.Future[None], Coroutine[Any, Any, None]):
    """The answer to one publish of an asyncio :class:`Producer`: an
    :class:`asyncio.Future`, completed with ``None`` once nsqd acknowledged the
    publish, or with the error the publish raises.

    The publish was handed over when the method was called: awaiting the
    future only waits for its answer.  ``asyncio.gather`` takes the future as
    it is (no :class:`asyncio.Task` per publish, which costs more than the
    publish itself); ``asyncio.create_task`` and ``TaskGroup.create_task``,
    which take only coroutines, take it too: it has a coroutine's methods
    (``send``, ``throw``, ``close``), which wait for the answer as ``await``
    does.
    """

    __slots__ = ()

    def send(self, value: None, /) -> Any:
        # What awaiting it does (Future.__await__), without making its
        # iterator: the future itself while pending (the Task then waits for
        # it), its outcome once done (its error raised).
        if self.done():
            raise StopIteration(self.result())
        self._asyncio_future_blocking = True
        return self

    def throw(self, typ: Any, val: Any = None, tb: Any = None, /) -> Any:
        steps: Generator[Any, None, None] = self.__await__()
        if val is None and tb is None:
            return steps.throw(typ)
        return steps.throw(typ, val, tb)

    def close(self) -> None:
        """Nothing to close: a publish, once handed over, is not taken back."""


class _Reply:
    """A publish's answer, carried into the asyncio loop."""

    __slots__ = ("calls", "future")

    def __init__(self, calls: LoopCalls, future: asyncio.Future[None]) -> None:
        self.calls = calls
        self.future = future

    def set_result(self, value: None) -> None:
        # Added without a wake-up: the producer's batcher wakes the asyncio
        # loop once for all the answers of a scheduler pass.
        self.calls.add((settle_future, (self.future, None, value)))

    def set_exception(self, error: BaseException) -> None:
        self.calls.future(self.future, error, None)


class _DirectReply:
    """A publish's answer in guest mode: completed from the Trio task that reads
    it, on the asyncio loop's thread (asyncio wakes the awaiter)."""

    __slots__ = ("future",)

    def __init__(self, future: asyncio.Future[None]) -> None:
        self.future = future

    def set_result(self, value: None) -> None:
        try:
            self.future.set_result(value)
        except asyncio.InvalidStateError:  # its awaiter gave up (cancelled it)
            pass

    def set_exception(self, error: BaseException) -> None:
        try:
            self.future.set_exception(error)
        except asyncio.InvalidStateError:
            pass


#: An asyncio Producer's life: entered once, closed once.
MOVES = Moves(
    "aio.Producer",
    NEW,
    {
        NEW: {OPENING, CLOSED},
        OPENING: {OPEN, CLOSED},
        OPEN: {CLOSING},
        CLOSING: {CLOSED},
    },
    refusals={OPENING: "a Producer can be entered only once"},
)


class Producer(HostedProducerState, AsyncClient):
    """Publishes to nsqd from asyncio code; each call's future completes once
    nsqd acknowledged.

    ::

        async with trionsq.aio.Producer(["127.0.0.1:4150"]) as producer:
            await producer.publish("topic", b"body")
            await asyncio.gather(*(producer.publish("topic", b) for b in bodies))

    It takes the options of :class:`trionsq.Producer` and keeps its guarantees.
    By default the asyncio loop publishes itself (:mod:`trionsq.aio.direct`:
    it writes the commands and reads the answers on a socket it watches, no
    Trio run).  With a ``connector`` of one's own (a Trio stream factory) a
    trionsq Producer does the work, in the Trio guest run of the asyncio loop
    (see :mod:`trionsq.aio`); with ``guest=False``, in a Trio loop on a thread
    this object starts when the ``async with`` is entered and joins before it
    is left.
    Concurrent publishes (from any tasks of the asyncio loop) share the
    connection and are pipelined, at most ``publish_window`` awaiting nsqd's
    answer at once.  nsqd's refusals raise their typed errors; a call on a closed
    producer raises :class:`~trionsq.hosting.producer.ClientClosedError`.

    ``publish``, ``multi_publish`` and ``deferred_publish`` are plain methods:
    each hands its publish over at the call and returns a
    :class:`PublishFuture` (``await producer.publish(...)`` reads as it would
    with a coroutine).  The publish starts at the call, not at the ``await``:
    a future never awaited still publishes; cancelling its await (or the
    future) stops the wait, and the publish, handed over already, is not
    taken back.  A call on a producer not entered, closed or forked raises at
    once.

    Leaving the ``async with`` (also by cancellation) lets the publishes in
    flight get their answers (up to ``close_timeout``), closes the connection and
    ends its Trio task (the last client of the guest run ends the run) or thread.
    """

    def __init__(
        self,
        nsqd_tcp_addresses: Sequence[str] | None = None,
        *,
        config: Config | None = None,
        guest: bool = True,
        **options: Any,
    ) -> None:
        self.config = _core.Producer(nsqd_tcp_addresses, config=config, **options).config
        self._guest = guest
        self._hosted: HostedProducer | None = None
        #: the loop's own publishing (trionsq.aio.direct), and it while open
        self._publisher: AioPublisher | None = None
        self._direct: AioPublisher | None = None
        self._forks = 0
        self._calls: LoopCalls | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._exited: asyncio.Future[None] | None = None
        self._life = Lifecycle(MOVES)

    def __repr__(self) -> str:
        state = self._life.state.value
        return f"<aio.Producer {state} {list(self.config.nsqd_tcp_addresses)}>"

    # --- life (AsyncClient: __aenter__, __aexit__ and aclose move it) ---

    async def _open(self) -> None:
        loop = asyncio.get_running_loop()
        if self._guest and self.config.connector is tcp_connector:
            # The loop does the publishing itself (trionsq.aio.direct).
            self._publisher = AioPublisher(loop, self.config, _closed_error)
            self._loop, self._forks = loop, _forks[0]
            self._direct = self._publisher
        else:
            await self._open_hosted(loop)
        traced = telemetry.for_producer(self.config, lambda: self.address)
        if traced is not None:
            traced.instrument_aio(self)  # its publish methods, on this instance

    async def _open_hosted(self, loop: asyncio.AbstractEventLoop) -> None:
        """A Trio Producer publishes: in the loop's guest run (a connector of
        one's own, a Trio stream), or on a thread of its own (guest=False)."""
        name = "trionsq-asyncio-producer"
        runner = new_runner(name, self._guest)
        calls = calls_for(runner, loop) if runner is not None else LoopCalls(loop)
        hosted = HostedProducer(
            self.config,
            name=name,
            # in guest mode each answer completes its future at once; after a
            # run of them, Trio lets the woken tasks publish before it waits
            end_of_batch=runner.yield_to_host
            if isinstance(runner, GuestRunner)
            else calls.schedule,
            runner=runner,
        )
        self._exited = await enter(hosted, calls)
        self._loop, self._calls, self._hosted = loop, calls, hosted

    async def _close(self, interrupted: bool) -> None:
        """Let the publishes in flight get their answers (up to
        ``close_timeout``), then close (see the class doc)."""
        publisher, self._direct = self._publisher, None
        if publisher is not None:
            if _forks[0] != self._forks:
                publisher.forget()  # the parent's connection: left alone
                return
            await publisher.close(self.config.close_timeout, wait=not interrupted)
            return
        hosted, exited = self._hosted, self._exited
        if hosted is None or exited is None:
            return  # closed while it was being entered, before it started
        try:
            await leave(hosted.runner, exited, hosted.request_close)
        finally:
            hosted.fail_leftovers()

    @property
    def stats(self) -> ProducerStats:
        """The producer's counters (see :class:`trionsq.ProducerStats`)."""
        publisher = self._publisher
        if publisher is not None:
            return publisher.stats()
        return HostedProducerState.stats.fget(self)  # type: ignore[attr-defined,no-any-return]

    @property
    def address(self) -> str | None:
        """The nsqd currently connected to, if any."""
        publisher = self._publisher
        if publisher is not None:
            return publisher.address
        return HostedProducerState.address.fget(self)  # type: ignore[attr-defined,no-any-return]

    @property
    def closed(self) -> bool:
        """Whether the producer is closed or being closed (publishing is over)."""
        state = self._life.state
        return state is CLOSED or state is CLOSING

    def _job(self, method: str, args: tuple[Any, ...]) -> PublishFuture:
        hosted, calls, loop = self._hosted, self._calls, self._loop
        state = self._life.state
        if self._direct is not None and self._forks != _forks[0]:
            raise ForkedError("this Producer was opened before a fork(); open one in this process")
        if state is not OPEN or hosted is None or calls is None or loop is None:
            if state is CLOSED or state is CLOSING:
                raise ClientClosedError("the Producer is closed")
            raise RuntimeError("use the Producer inside 'async with'")
        if hosted.runner.forked:
            raise ForkedError("this Producer was opened before a fork(); open one in this process")
        future = PublishFuture(loop=loop)
        reply = _DirectReply(future) if self._guest else _Reply(calls, future)
        try:
            hosted.inbox.put((method, args, reply))
        except LoopStoppedError as exc:
            raise ClientClosedError("the Producer's loop has stopped") from exc
        return future

    # Plain methods, not coroutines: a coroutine would cost an asyncio Task
    # each in asyncio.gather, more than the publish itself.

    def publish(self, topic: str, body: bytes) -> PublishFuture:
        """PUB one message, handed over now; the future completes once nsqd
        acknowledged it (``await producer.publish(topic, body)``)."""
        direct = self._direct
        if direct is None or self._forks != _forks[0]:
            return self._job("publish", (topic, body))
        future = PublishFuture(loop=self._loop)
        core = direct.core
        if type(body) is bytes and body and type(topic) is str and topic in core.valid_topics:
            # core.pub's checks passed already (a topic checked before, a
            # non-empty bytes body): the path of nearly every PUB
            data = commands.pub(topic, body)
        else:
            try:
                data = core.pub(topic, body)
            except Exception as exc:  # refused before reaching nsqd: the future says it
                future.set_exception(exc)
                return future
        direct.publish(data, 0, _DirectReply(future))
        return future

    def multi_publish(self, topic: str, bodies: Iterable[bytes]) -> PublishFuture:
        """MPUB several messages atomically (see :meth:`publish`)."""
        direct = self._direct
        if direct is None or self._forks != _forks[0]:
            return self._job("multi_publish", (topic, list(bodies)))
        future = PublishFuture(loop=self._loop)
        try:
            data, batch = direct.core.mpub(topic, list(bodies))
        except Exception as exc:
            future.set_exception(exc)
            return future
        direct.publish(data, batch, _DirectReply(future))
        return future

    def deferred_publish(self, topic: str, body: bytes, delay: float) -> PublishFuture:
        """DPUB: the message becomes visible after ``delay`` seconds (see
        :meth:`publish`)."""
        direct = self._direct
        if direct is None or self._forks != _forks[0]:
            return self._job("deferred_publish", (topic, body, delay))
        future = PublishFuture(loop=self._loop)
        try:
            data = direct.core.dpub(topic, body, delay)
        except Exception as exc:
            future.set_exception(exc)
            return future
        direct.publish(data, 0, _DirectReply(future))
        return future
