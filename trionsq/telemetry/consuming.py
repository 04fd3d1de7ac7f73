"""A consumer's telemetry: a process span around each handler call and each
``async for`` iteration, the process duration, the consumer's observable
counts, and the trace context envelope taken off each body.

A :class:`ConsumerTelemetry` exists only for a consumer that records
something (spans, metrics) or unwraps envelopes (``trace_context=True``);
otherwise the consumer runs exactly its uninstrumented path.  Nothing here
imports OpenTelemetry: it comes in through :mod:`trionsq.telemetry.otel`'s
objects when they exist.
"""

from __future__ import annotations

import inspect
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .. import tracecontext
from . import semconv as sc

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from ..consumer import ConsumerStats
    from ..message import Message
    from .otel import Instruments

__all__ = ["ConsumerTelemetry", "creation_context", "link"]

#: a message of trionsq's, or of a front end's
M = TypeVar("M")


def _finish_now(message: Message) -> None:
    message.finish_now()


def _requeue(message: Message) -> Awaitable[None]:
    return message.requeue()


log = logging.getLogger("trionsq.telemetry")

_perf_counter = time.perf_counter

#: the trace context the message processed in this task (thread) came with
_creation: ContextVar[tracecontext.Unwrapped | None] = ContextVar(
    "trionsq_creation_context", default=None
)


def creation_context() -> tracecontext.Unwrapped | None:
    """The trace context envelope's context (``traceparent``, ``tracestate``)
    of the message being processed here: in a handler call or the body of an
    ``async for``/``for`` iteration of a consumer with ``trace_context=True``
    whose message carried one; None otherwise.  (``trionsq to-nsq`` keeps a
    message's context on its copy with it.)"""
    return _creation.get()


class _Open:
    """A process span under way (or, with no tracer, its start time only)."""

    __slots__ = ("error", "span", "started", "token", "touched")

    def __init__(self, span: Span | None, token: object, started: float) -> None:
        self.span = span
        self.token = token
        self.started = started
        #: when nsqd's timeout for the message last started again (TOUCH)
        self.touched = started
        self.error: str | None = None


class ConsumerTelemetry:
    """Instrumentation of one consumer of ``topic``/``channel``.

    ``msg_timeout(message)`` is how long nsqd gives the message (its
    connection's negotiated timeout): a span that ends later than that after
    the message was handed out has the outcome ``timed_out`` (nsqd has
    redelivered it; its FIN or REQ fails with ``E_FIN_FAILED``).
    """

    def __init__(
        self,
        instruments: Instruments | None,
        topic: str,
        channel: str,
        *,
        trace_context: bool,
        attributes: Mapping[str, Any] | None = None,
        msg_timeout: Callable[[Any], float] | None = None,
        stats: Callable[[], ConsumerStats] | None = None,
        ahead: bool = False,
    ) -> None:
        self.tracer = instruments.tracer if instruments is not None else None
        self.meters = instruments.meters if instruments is not None else None
        self.topic = topic
        self.channel = channel
        self.trace_context = trace_context
        self._msg_timeout = msg_timeout or (lambda message: math.inf)
        self._name = f"{sc.PROCESS} {topic}"
        self._attributes: dict[str, Any] = {
            sc.MESSAGING_SYSTEM: sc.SYSTEM,
            sc.OPERATION_TYPE: sc.PROCESS,
            sc.OPERATION_NAME: sc.PROCESS,
            sc.DESTINATION_NAME: topic,
            sc.SUBSCRIPTION_NAME: channel,
            sc.CONSUMER_GROUP_NAME: channel,
            **(attributes or {}),
        }
        self._metric_attributes = {
            sc.MESSAGING_SYSTEM: sc.SYSTEM,
            sc.OPERATION_NAME: sc.PROCESS,
            sc.DESTINATION_NAME: topic,
            sc.CONSUMER_GROUP_NAME: channel,
            **(attributes or {}),
        }
        self._servers: dict[str, dict[str, str | int]] = {}
        #: spans under way, by message (a requeue's delay goes on its span)
        self._open: dict[Message, _Open] = {}
        self._warned_plain = False
        self._sdk_errors = 0
        # ahead (the front ends): bodies are unwrapped in the client's loop
        # (unwrap_ahead), spans begun in the application's thread or task;
        # what the envelope said waits here, by (nsqd, message id)
        self._ahead: dict[tuple[str, bytes], tracecontext.Unwrapped] | None = {} if ahead else None
        if self.meters is not None and stats is not None:
            self._observe(stats)

    # --- the consumer's hooks ---

    def wrap_handler(
        self,
        handler: Callable[[Any], Awaitable[object] | object],
        *,
        finish: Callable[[Any], None] = _finish_now,
        requeue: Callable[[Any], Awaitable[None] | None] = _requeue,
    ) -> Callable[[Any], Awaitable[None]]:
        """``handler`` in a process span (and its message unwrapped).  The
        message is answered here as the consumer's worker would (finished
        when the handler returns, requeued when it raises: the exception is
        recorded, then re-raised for the worker to log), so that the span
        sees the answer."""

        async def traced(message: Any) -> None:
            opened = self.begin(message, attach=True)
            try:
                result = handler(message)
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:
                self._failed(opened, exc)
                answered = requeue(message)
                if answered is not None:
                    await answered
                raise
            else:
                # what the worker does after a handler returns, done here
                # for the span to see it
                finish(message)
            finally:
                self.end(message)

        return traced

    def wrap_sync_handler(self, handler: Callable[[Any], object]) -> Callable[[Any], None]:
        """:meth:`wrap_handler` for a blocking handler (trionsq.blocking's
        messages: ``finish()`` and ``requeue()`` do not wait)."""

        def traced(message: Any) -> None:
            opened = self.begin(message, attach=True)
            try:
                handler(message)
            except Exception as exc:
                self._failed(opened, exc)
                message.requeue()
                raise
            else:
                message.finish()
            finally:
                self.end(message)

        return traced

    async def given_up(
        self, message: Message, give_up: Callable[[Message], Awaitable[None]]
    ) -> None:
        """``give_up(message)`` in a process span whose outcome is ``given_up``."""
        self.begin(message, attach=True)
        try:
            await give_up(message)
        finally:
            self.end(message, sc.GIVEN_UP)

    def iterate_sync(self, messages: Iterator[M]) -> Iterator[M]:
        """:meth:`iterate` for a blocking ``for`` loop."""
        return _SyncIteration(self, messages)

    def unwrap_ahead(self, message: Message) -> None:
        """(the front ends, in the client's loop) Take the envelope off
        ``message``; its context is kept for the span :meth:`begin` makes
        later, in the application's thread or task."""
        found = self.unwrap(message)
        if self._ahead is not None and (found.problem is not None or found.traceparent):
            self._ahead[message.address, message.id] = found

    def iterate(self, messages: AsyncIterator[M]) -> AsyncIterator[M]:
        """``async for`` over ``messages``, each iteration a process span,
        current in the loop's body; it ends when the loop asks for the next
        message (or the consumer is left)."""
        return _Iteration(self, messages)

    def requeued(self, message: Any, delay: float) -> None:
        """The consumer sends REQ for ``message`` with ``delay`` seconds."""
        opened = self._open.get(message)
        if opened is not None and opened.span is not None:
            opened.span.set_attribute(sc.REQUEUE_DELAY, delay)

    def touched(self, message: Any) -> None:
        """The consumer sends TOUCH for ``message``: nsqd's timeout starts
        again (a span is ``timed_out`` only if it passed since)."""
        opened = self._open.get(message)
        if opened is not None:
            opened.touched = _perf_counter()

    def close(self) -> None:
        """The consumer is leaving: end every span under way and stop
        reporting its counts."""
        for message in list(self._open):
            self.end(message)
        if self.meters is not None:
            self.meters.forget(self)
        if self._ahead is not None:
            self._ahead.clear()

    # --- spans ---

    def unwrap(self, message: Message) -> tracecontext.Unwrapped:
        """Take the envelope off ``message.body`` (left whole, and the
        problem logged, when it has none or an unusable one)."""
        found = tracecontext.unwrap(message.body)
        problem = found.problem
        if problem is None:
            message.body = found.body
        elif problem is tracecontext.Problem.NOT_ENVELOPED:
            if not self._warned_plain:
                self._warned_plain = True
                log.warning(
                    "%s/%s: a message without a trace context envelope (delivered as it "
                    "is; said once per consumer): %r",
                    self.topic,
                    self.channel,
                    message,
                )
        else:
            log.warning(
                "%s/%s: a message's trace context envelope is unusable (%s): delivered "
                "whole, as received: %r",
                self.topic,
                self.channel,
                problem.value,
                message,
            )
        return found

    def begin(self, message: Any, *, attach: bool) -> _Open:
        """Start ``message``'s process span (current in this task when
        ``attach``), after unwrapping its body.  Never raises: an SDK that
        fails costs the span, not the message (logged)."""
        try:
            return self._begin(message, attach)
        except Exception:
            self._sdk_failed()
            opened = self._open[message] = _Open(None, None, _perf_counter())
            return opened

    def end(self, message: Any, outcome: str | None = None) -> None:
        """End ``message``'s span: its outcome, the process duration.
        Never raises (see :meth:`begin`)."""
        try:
            self._end(message, outcome)
        except Exception:
            self._sdk_failed()

    def _sdk_failed(self) -> None:
        # The traceback once per consumer, then a line at debug level.
        if self._sdk_errors == 0:
            log.exception("%s/%s: OpenTelemetry failed (the message is not affected)",
                          self.topic, self.channel)  # fmt: skip
        else:
            log.debug("%s/%s: OpenTelemetry failed again", self.topic, self.channel)
        self._sdk_errors += 1

    def _begin(self, message: Any, attach: bool) -> _Open:
        if not self.trace_context:
            found = None
        else:
            if self._ahead is not None:
                found = self._ahead.pop((message.address, message.id), None)
            else:
                found = self.unwrap(message)
            if attach:
                _creation.set(found if found is not None and found.traceparent else None)
        tracer = self.tracer
        if tracer is None:
            opened = _Open(None, None, _perf_counter())
            self._open[message] = opened
            return opened
        from opentelemetry import context, trace

        attributes = dict(self._attributes)
        attributes[sc.MESSAGE_ID] = message.id.decode("ascii", "replace")
        attributes[sc.MESSAGE_BODY_SIZE] = len(message.body)
        attributes[sc.ATTEMPTS] = message.attempts
        server = self._servers.get(message.address)
        if server is None:
            server = self._servers[message.address] = sc.server_attributes(message.address)
        attributes.update(server)
        links = None
        if found is not None:
            if found.problem is not None:
                attributes[sc.ENVELOPE_PROBLEM] = found.problem.value
            elif found.traceparent:
                links = [link(found)]
        span = tracer.start_span(
            self._name, kind=trace.SpanKind.CONSUMER, attributes=attributes, links=links
        )
        token = context.attach(trace.set_span_in_context(span)) if attach else None
        opened = _Open(span, token, _perf_counter())
        self._open[message] = opened
        return opened

    def _failed(self, opened: _Open, exc: BaseException) -> None:
        opened.error = type(exc).__qualname__
        span = opened.span
        if span is not None:
            from opentelemetry.trace import Status, StatusCode

            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{opened.error}: {exc}"))

    def _end(self, message: Any, outcome: str | None) -> None:
        opened = self._open.pop(message, None)
        if opened is None:
            return
        if self.trace_context:
            _creation.set(None)
        now = _perf_counter()
        elapsed = now - opened.started
        if outcome is None:
            outcome = {"finished": sc.FINISHED, "requeued": sc.REQUEUED}.get(
                message.responded or "", sc.UNANSWERED
            )
            # (measured from the span's start: nsqd's clock started earlier,
            # at delivery, so a span said timed out surely was)
            if now - opened.touched >= self._msg_timeout(message):
                outcome = sc.TIMED_OUT
        span = opened.span
        if span is not None:
            from opentelemetry import context

            if opened.token is not None:
                context.detach(opened.token)  # type: ignore[arg-type]
            span.set_attribute(sc.OUTCOME, outcome)
            if opened.error is not None:
                span.set_attribute(sc.ERROR_TYPE, opened.error)
            span.end()
        if self.meters is not None:
            attributes = self._metric_attributes
            if opened.error is not None:
                attributes = {**attributes, sc.ERROR_TYPE: opened.error}
            self.meters.process_duration.record(elapsed, attributes)

    # --- metrics ---

    def _observe(self, stats: Callable[[], ConsumerStats]) -> None:
        assert self.meters is not None
        base = self._metric_attributes

        def consumed() -> Iterable[tuple[int, dict[str, Any]]]:
            yield stats().received, base

        def settled() -> Iterable[tuple[int, dict[str, Any]]]:
            now = stats()
            yield now.finished, {**base, sc.OUTCOME: sc.FINISHED}
            yield now.requeued, {**base, sc.OUTCOME: sc.REQUEUED}
            yield now.given_up, {**base, sc.OUTCOME: sc.GIVEN_UP}

        def per_connection(field: str) -> Callable[[], Iterable[tuple[int, dict[str, Any]]]]:
            def observed() -> Iterable[tuple[int, dict[str, Any]]]:
                for address, connection in stats().connections.items():
                    value: int = getattr(connection, field)
                    yield value, {**base, **sc.server_attributes(address)}

            return observed

        def backoff() -> Iterable[tuple[int, dict[str, Any]]]:
            yield stats().backoff_level, base

        self.meters.observe(self, sc.CONSUMED_MESSAGES, consumed)
        self.meters.observe(self, sc.SETTLED_MESSAGES, settled)
        self.meters.observe(self, sc.RDY, per_connection("rdy"))
        self.meters.observe(self, sc.IN_FLIGHT, per_connection("in_flight"))
        self.meters.observe(self, sc.BACKOFF_LEVEL, backoff)


def link(found: tracecontext.Unwrapped) -> Any:
    """The link to a message's creation context (its producer's span), from
    an envelope's valid ``traceparent``."""
    from opentelemetry.trace import Link, SpanContext, TraceFlags, TraceState

    _version, trace_id, span_id, flags = found.traceparent.split("-")[:4]
    tracestate = found.tracestate
    state = TraceState.from_header([tracestate]) if tracestate else None
    context = SpanContext(
        int(trace_id, 16),
        int(span_id, 16),
        is_remote=True,
        trace_flags=TraceFlags(int(flags, 16)),
        trace_state=state,
    )
    return Link(context)


class _Iteration(Generic[M]):
    """``async for`` over a consumer, each iteration in a process span."""

    def __init__(self, telemetry: ConsumerTelemetry, messages: AsyncIterator[M]) -> None:
        self._telemetry = telemetry
        self._messages = messages
        #: the message of the iteration under way (each iterating task has
        #: an iterator of its own: aiter(consumer))
        self._current: M | None = None

    def __aiter__(self) -> _Iteration[M]:
        return self

    async def __anext__(self) -> M:
        telemetry = self._telemetry
        previous = self._current
        if previous is not None:
            self._current = None
            telemetry.end(previous)
        message = await self._messages.__anext__()
        telemetry.begin(message, attach=True)
        self._current = message
        return message


class _SyncIteration(Generic[M]):
    """A blocking ``for`` over a consumer, each iteration in a process span."""

    def __init__(self, telemetry: ConsumerTelemetry, messages: Iterator[M]) -> None:
        self._telemetry = telemetry
        self._messages = messages
        self._current: M | None = None

    def __iter__(self) -> _SyncIteration[M]:
        return self

    def __next__(self) -> M:
        telemetry = self._telemetry
        previous = self._current
        if previous is not None:
            self._current = None
            telemetry.end(previous)
        message = next(self._messages)
        telemetry.begin(message, attach=True)
        self._current = message
        return message
