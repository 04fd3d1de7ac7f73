"""The source's telemetry, on an agent: a process span per message set, and
the trace context envelope taken off each body (option ``trace_context``).

A set is what one task reads: its messages are processed together and
settled together (FIN when Spark commits the batch, REQ otherwise), so the
span is the semantic conventions' batch processing span: kind CONSUMER,
operation ``process``, ``messaging.batch.message_count``, a link to each
message's creation context (the envelope's), no message id.  It starts when
the set is handed to a task and ends when the set is resolved (outcome
``finished`` or ``requeued``), carrying the executor id as the agent's
consumers' metric points do (RDY, in flight, consumed, settled: their own
telemetry, read at collection).  A slot's prefetch loop makes no span.

Internal to the package.  Nothing here imports OpenTelemetry unless an SDK
is set up in the agent's process.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .. import telemetry, tracecontext
from ..message import Message
from ..telemetry import semconv as sc
from ..telemetry.consuming import ConsumerTelemetry, link
from ._held import Held
from ._options import SourceOptions

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from ..telemetry.otel import Instruments

__all__ = ["BATCH_ID", "ENVELOPE_PROBLEMS", "PARTITION_ID", "SourceTelemetry"]

log = logging.getLogger("trionsq.telemetry")

#: Spark's micro-batch id and the partition whose task read the set
BATCH_ID = "messaging.nsq.spark.batch_id"
PARTITION_ID = "messaging.nsq.spark.partition_id"
#: how many of the set's bodies had an unusable envelope (delivered whole)
ENVELOPE_PROBLEMS = "messaging.nsq.envelope.problems"

_perf_counter = time.perf_counter


class SourceTelemetry:
    """One query's telemetry on an agent (with nothing to record, its calls
    return at once: a set's cost, never a message's)."""

    def __init__(
        self, options: SourceOptions, executor_id: str, instruments: Instruments | None
    ) -> None:
        self.tracer = instruments.tracer if instruments is not None else None
        self.meters = instruments.meters if instruments is not None else None
        self.trace_context = options.trace_context
        self._name = f"{sc.PROCESS} {options.topic}"
        common = {
            sc.MESSAGING_SYSTEM: sc.SYSTEM,
            sc.OPERATION_NAME: sc.PROCESS,
            sc.DESTINATION_NAME: options.topic,
            sc.CONSUMER_GROUP_NAME: options.channel,
            sc.SPARK_EXECUTOR_ID: executor_id,
        }
        self._metric_attributes = common
        self._attributes = {
            **common,
            sc.OPERATION_TYPE: sc.PROCESS,
            sc.SUBSCRIPTION_NAME: options.channel,
        }
        # unwrap() and its logging, as a consumer's
        self._unwrapper = ConsumerTelemetry(
            None, options.topic, options.channel, trace_context=True
        )
        #: sets under way: set id -> (span or None, start)
        self._open: dict[int, tuple[Span | None, float]] = {}
        self._sdk_errors = 0

    @classmethod
    def start(
        cls,
        options: SourceOptions,
        executor_id: str,
        tracer_provider: Any = None,
        meter_provider: Any = None,
    ) -> SourceTelemetry:
        """The query's telemetry, with these providers (None: the process's
        global ones, as the agent's consumers take them)."""
        config = options.consumer_config().replace(
            tracer_provider=tracer_provider, meter_provider=meter_provider
        )
        return cls(options, executor_id, telemetry.instruments(config))

    def unwrapper(self) -> Callable[[Message], tracecontext.Unwrapped | None] | None:
        """What a slot calls on each message's arrival (None: nothing)."""
        return self.unwrap if self.trace_context else None

    def unwrap(self, message: Message) -> tracecontext.Unwrapped | None:
        """(``trace_context``, on arrival) Take the envelope off ``message``'s
        body; what it carried (None for a plain body)."""
        found = self._unwrapper.unwrap(message)
        if found.problem is tracecontext.Problem.NOT_ENVELOPED:
            return None
        return found

    def began(self, set_id: int, held: Sequence[Held], batch: object, partition: object) -> None:
        """A set is handed to a task (Spark's ``batch``, ``partition``)."""
        if self.tracer is None and self.meters is None:
            return
        if self.tracer is None:
            self._open[set_id] = (None, _perf_counter())
            return
        try:
            span = self._begin(held, batch, partition)
        except Exception:
            self._sdk_failed()
            span = None
        self._open[set_id] = (span, _perf_counter())

    def _sdk_failed(self) -> None:
        # An SDK that raises costs the span, never the set: the traceback
        # once per query, then a line at debug level.
        if self._sdk_errors == 0:
            log.exception("the nsq source: OpenTelemetry failed (the messages are not affected)")
        else:
            log.debug("the nsq source: OpenTelemetry failed again")
        self._sdk_errors += 1

    def _begin(self, held: Sequence[Held], batch: object, partition: object) -> Span:
        from opentelemetry import trace

        assert self.tracer is not None
        attributes: dict[str, Any] = dict(self._attributes)
        attributes[sc.BATCH_MESSAGE_COUNT] = len(held)
        if isinstance(batch, int):
            attributes[BATCH_ID] = batch
        if isinstance(partition, int):
            attributes[PARTITION_ID] = partition
        contexts: dict[str, tracecontext.Unwrapped] = {}
        problems = 0
        for item in held:
            found = item.context
            if found is None:
                continue
            if found.problem is not None:
                problems += 1
            elif found.traceparent:
                contexts.setdefault(found.traceparent, found)
        if problems:
            attributes[ENVELOPE_PROBLEMS] = problems
        return self.tracer.start_span(
            self._name,
            kind=trace.SpanKind.CONSUMER,
            attributes=attributes,
            links=[link(found) for found in contexts.values()],
        )

    def ended(self, set_id: int, outcome: str) -> None:
        """A set is resolved: ``finished`` (its batch committed) or ``requeued``."""
        opened = self._open.pop(set_id, None)
        if opened is None:
            return
        span, started = opened
        try:
            if span is not None:
                span.set_attribute(sc.OUTCOME, outcome)
                span.end()
            if self.meters is not None:
                elapsed = _perf_counter() - started
                self.meters.process_duration.record(elapsed, self._metric_attributes)
        except Exception:
            self._sdk_failed()
