"""A producer's telemetry: a PRODUCER span per publish, multi-publish and
deferred publish, the sent-messages counter and the operation duration, and
the trace context envelope put around each body (``trace_context=True``).

A producer that records nothing and wraps nothing gets no
:class:`ProducerTelemetry` and keeps its own methods.  One that does has its
``publish``, ``multi_publish`` and ``deferred_publish`` replaced, on the
instance, by these wrappers around them (:meth:`ProducerTelemetry.instrument`):
one place for every producer, whatever its I/O.  Nothing here imports
OpenTelemetry unless a tracer or meters exist.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .. import tracecontext
from ..protocol.errors import NSQErrorResponse
from . import semconv as sc

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from .otel import Instruments

__all__ = ["ProducerTelemetry", "carrying"]

log = logging.getLogger("trionsq.telemetry")

_perf_counter = time.perf_counter

#: the API's method names, the operation names the spans carry
PUBLISH = "publish"
MULTI_PUBLISH = "multi_publish"
DEFERRED_PUBLISH = "deferred_publish"


class _Answer(Protocol):
    """A publish's future (:class:`concurrent.futures.Future` or
    :class:`asyncio.Future`), as the wrappers read it once done."""

    def cancelled(self) -> bool: ...

    def exception(self) -> BaseException | None: ...

    def add_done_callback(self, fn: Callable[[Any], object], /) -> None: ...


AnswerT = TypeVar("AnswerT", bound=_Answer)


#: the contexts the bodies of the publish under way in this task carry on
_carried: ContextVar[Sequence[tracecontext.Unwrapped | None] | None] = ContextVar(
    "trionsq_carried_contexts", default=None
)


@contextmanager
def carrying(contexts: Sequence[tracecontext.Unwrapped | None]) -> Iterator[None]:
    """The publishes made in this block (in this task or thread) carry on
    the trace contexts their bodies came with, one each, in order (None: a
    body with none): with ``trace_context``, a body's envelope holds its own
    context instead of the publish span's, and the span links to each
    (:func:`trionsq.telemetry.creation_context` gives a consumed message's)."""
    token = _carried.set(contexts)
    try:
        yield
    finally:
        _carried.reset(token)


def error_type(exc: BaseException) -> str:
    """``error.type``: nsqd's error code for its refusals, else the class."""
    if isinstance(exc, NSQErrorResponse):
        return exc.code
    return type(exc).__qualname__


def _is_body(body: object) -> bool:
    """A body the producer would send (else the original call raises its
    own error: an empty or non-bytes body is never wrapped into a valid one)."""
    return isinstance(body, bytes | bytearray | memoryview) and len(body) > 0


class _Publish:
    """One publish under way: its span (if any), start time, envelope context."""

    __slots__ = (
        "attributes",
        "carried",
        "count",
        "span",
        "started",
        "traceparent",
        "tracestate",
        "wrapped",
    )

    def __init__(self) -> None:
        self.span: Span | None = None
        #: the bodies' own contexts (see :func:`carrying`), and how many of
        #: the bodies were wrapped so far
        self.carried: Sequence[tracecontext.Unwrapped | None] | None = None
        self.wrapped = 0
        self.traceparent = ""
        self.tracestate = ""
        self.count = 1
        self.started = 0.0
        self.attributes: dict[str, Any] = {}


class ProducerTelemetry:
    """Instrumentation of one producer.  ``address()`` is the nsqd it is
    connected to (``host:port``), if any."""

    def __init__(
        self,
        instruments: Instruments | None,
        *,
        trace_context: bool,
        address: Callable[[], str | None],
        attributes: Mapping[str, Any] | None = None,
    ) -> None:
        self.tracer = instruments.tracer if instruments is not None else None
        self.meters = instruments.meters if instruments is not None else None
        self.trace_context = trace_context
        self._address = address
        # OpenTelemetry is importable (and set up) only with instruments
        self._otel = instruments is not None
        self._sdk_errors = 0
        self._extra = dict(attributes or {})

    # --- around a publish ---

    def start(self, operation: str, topic: object, count: int, delay: object = None) -> _Publish:
        """Start a publish's span (if spans are on) and find its context.
        Never raises: an SDK that fails costs the span, not the publish."""
        try:
            return self._start(operation, topic, count, delay)
        except Exception:
            self._sdk_failed()
            publish = _Publish()
            publish.count = count
            publish.carried = _carried.get()
            publish.started = _perf_counter()
            return publish

    def end(self, publish: _Publish, exc: BaseException | None) -> None:
        """End a publish's span; count it.  Never raises (see :meth:`start`)."""
        try:
            self._end(publish, exc)
        except Exception:
            self._sdk_failed()

    def _sdk_failed(self) -> None:
        # The traceback once per producer, then a line at debug level.
        if self._sdk_errors == 0:
            log.exception("OpenTelemetry failed (the publish is not affected)")
        else:
            log.debug("OpenTelemetry failed again")
        self._sdk_errors += 1

    def _start(self, operation: str, topic: object, count: int, delay: object) -> _Publish:
        publish = _Publish()
        publish.count = count
        attributes = publish.attributes
        attributes[sc.MESSAGING_SYSTEM] = sc.SYSTEM
        attributes[sc.OPERATION_NAME] = operation
        attributes[sc.DESTINATION_NAME] = str(topic)
        attributes.update(self._extra)
        address = self._address()
        if address is not None:
            attributes.update(sc.server_attributes(address))
        carried = publish.carried = _carried.get()
        tracer = self.tracer
        if tracer is not None:
            from opentelemetry import trace

            span_attributes = {**attributes, sc.OPERATION_TYPE: sc.SEND}
            if operation == MULTI_PUBLISH:
                span_attributes[sc.BATCH_MESSAGE_COUNT] = count
            elif isinstance(delay, int | float):
                span_attributes[sc.DEFER_DELAY] = delay
            links = None
            if carried:
                from .consuming import link

                found = {c.traceparent: c for c in carried if c is not None and c.traceparent}
                links = [link(c) for c in found.values()]
            publish.span = span = tracer.start_span(
                f"{operation} {topic}",
                kind=trace.SpanKind.PRODUCER,
                attributes=span_attributes,
                links=links,
            )
            context = span.get_span_context()
        elif self.trace_context and self._otel:
            from opentelemetry import trace

            # no span of ours: the caller's own, if it has one
            context = trace.get_current_span().get_span_context()
        else:
            context = None
        if self.trace_context and context is not None and context.is_valid:
            publish.traceparent = (
                f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
            )
            publish.tracestate = context.trace_state.to_header()
        publish.started = _perf_counter()
        return publish

    def wrap(self, publish: _Publish, body: Any) -> Any:
        """``body`` (the publish's next one) in the envelope, with
        ``trace_context``: its own context when it carries one (see
        :func:`carrying`), else the publish span's (or the caller's)."""
        if not self.trace_context:
            return body
        parent, state = publish.traceparent, publish.tracestate
        carried = publish.carried
        if carried is not None:
            index = publish.wrapped
            publish.wrapped = index + 1
            own = carried[index] if index < len(carried) else None
            if own is not None and own.traceparent:
                parent, state = own.traceparent, own.tracestate
        if not _is_body(body):
            return body
        return tracecontext.wrap(bytes(body), parent, state)

    def _end(self, publish: _Publish, exc: BaseException | None) -> None:
        elapsed = _perf_counter() - publish.started
        attributes = publish.attributes
        if sc.SERVER_ADDRESS not in attributes:
            address = self._address()  # connected by this publish
            if address is not None:
                attributes.update(sc.server_attributes(address))
        if exc is not None:
            attributes[sc.ERROR_TYPE] = error_type(exc)
        span = publish.span
        if span is not None:
            span.set_attributes(attributes)
            if exc is not None:
                from opentelemetry.trace import Status, StatusCode

                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, f"{attributes[sc.ERROR_TYPE]}: {exc}"))
            span.end()
        meters = self.meters
        if meters is not None:
            meters.sent.add(publish.count, attributes)
            meters.operation_duration.record(elapsed, attributes)

    # --- the wrappers ---

    def instrument(self, producer: Any) -> None:
        """Replace a :class:`trionsq.Producer`'s publish methods (async) on
        the instance."""
        publish = producer.publish
        multi_publish = producer.multi_publish
        deferred_publish = producer.deferred_publish

        async def traced_publish(topic: str, body: bytes) -> None:
            traced = self.start(PUBLISH, topic, 1)
            try:
                await publish(topic, self.wrap(traced, body))
            except BaseException as exc:
                self.end(traced, exc)
                raise
            self.end(traced, None)

        async def traced_multi_publish(topic: str, bodies: Iterable[bytes]) -> None:
            data = bodies if type(bodies) is list else list(bodies)
            traced = self.start(MULTI_PUBLISH, topic, len(data))
            try:
                await multi_publish(topic, [self.wrap(traced, body) for body in data])
            except BaseException as exc:
                self.end(traced, exc)
                raise
            self.end(traced, None)

        async def traced_deferred_publish(topic: str, body: bytes, delay: float) -> None:
            traced = self.start(DEFERRED_PUBLISH, topic, 1, delay)
            try:
                await deferred_publish(topic, self.wrap(traced, body), delay)
            except BaseException as exc:
                self.end(traced, exc)
                raise
            self.end(traced, None)

        producer.publish = traced_publish
        producer.multi_publish = traced_multi_publish
        producer.deferred_publish = traced_deferred_publish

    def instrument_blocking(self, producer: Any) -> None:
        """Replace a :class:`trionsq.blocking.Producer`'s publish methods
        (the blocking ones and the ``*_async`` ones, whose span ends when
        their future completes) on the instance."""
        for name in ("publish", "multi_publish", "deferred_publish"):
            setattr(producer, name, self._blocking(name, getattr(producer, name)))
            method = getattr(producer, f"{name}_async")
            setattr(
                producer,
                f"{name}_async",
                self._future(name, method, concurrent.futures.CancelledError),
            )

    def instrument_aio(self, producer: Any) -> None:
        """Replace a :class:`trionsq.aio.Producer`'s publish methods (plain
        methods returning an :class:`asyncio.Future`) on the instance: the
        wrappers return the future as it is, and the span ends when it
        completes (nsqd's answer), not when the call returns; no coroutine
        or task is added around the publish."""
        for name in ("publish", "multi_publish", "deferred_publish"):
            method = getattr(producer, name)
            setattr(producer, name, self._future(name, method, asyncio.CancelledError))

    def _prepare(self, operation: str, args: tuple[Any, ...]) -> tuple[_Publish, tuple[Any, ...]]:
        """Start the span of ``operation(*args)``; the arguments with the
        body (or bodies) wrapped."""
        topic, payload, *rest = args
        if operation == MULTI_PUBLISH:
            data = list(payload)
            traced = self.start(operation, topic, len(data))
            return traced, (topic, [self.wrap(traced, body) for body in data], *rest)
        traced = self.start(operation, topic, 1, *rest)
        return traced, (topic, self.wrap(traced, payload), *rest)

    def _blocking(self, operation: str, method: Callable[..., None]) -> Callable[..., None]:
        def traced_call(*args: Any, **options: Any) -> None:
            traced, args = self._prepare(operation, args)
            try:
                method(*args, **options)
            except BaseException as exc:
                self.end(traced, exc)
                raise
            self.end(traced, None)

        return traced_call

    def _future(
        self,
        operation: str,
        method: Callable[..., AnswerT],
        cancelled: type[BaseException],
    ) -> Callable[..., AnswerT]:
        """A wrapper of ``method`` (which returns the publish's future): the
        span starts at the call and ends when the future completes;
        ``cancelled`` is the error recorded for a future cancelled."""

        def traced_call(*args: Any) -> AnswerT:
            traced, args = self._prepare(operation, args)
            try:
                future = method(*args)
            except BaseException as exc:
                self.end(traced, exc)
                raise

            def done(future: AnswerT) -> None:
                error = cancelled() if future.cancelled() else future.exception()
                self.end(traced, error)

            future.add_done_callback(done)
            return future

        return traced_call
