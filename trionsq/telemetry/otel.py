"""What trionsq takes from OpenTelemetry's API: a tracer and the instruments.

Imported only when a client starts with telemetry on (``import trionsq`` never
imports OpenTelemetry; without the ``otel`` extra this module's import fails
and the clients run uninstrumented).  The providers are the ones a client's
:class:`~trionsq.config.Config` names, else the global ones, as they are when
the client starts.

What is "on" is decided there, once, so that a message costs nothing when
nothing would come of it: no tracer when no SDK provider is set (the API's
proxy or no-op one) or when the SDK's sampler is ``always_off`` (a span would
cost microseconds to be dropped); no instruments when no SDK meter provider
is set.  Counts (messages consumed and settled, RDY, in flight, backoff,
reconnects, errors) are observable instruments read from the clients' own
counters at each collection: nothing a message.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation

from . import counters
from . import semconv as sc

__all__ = ["Instruments", "Meters", "Observed", "resolve"]

_SCOPE = "trionsq"
_VERSION = "0.1.0"

#: a live client's observations for one collection: (value, attributes) pairs
Observed = Callable[[], Iterable[tuple[int | float, dict[str, Any]]]]


class Meters:
    """The instruments of one meter provider, made once (instruments are
    per provider; a client registers its observables for its lifetime)."""

    def __init__(self, meter: metrics.Meter) -> None:
        buckets = sc.DURATION_BUCKETS
        self.sent = meter.create_counter(
            sc.SENT_MESSAGES, "{message}", "Messages a producer sent (nsqd answered or failed)"
        )
        self.operation_duration = meter.create_histogram(
            sc.OPERATION_DURATION,
            "s",
            "Duration of a publish, from the call to nsqd's answer",
            explicit_bucket_boundaries_advisory=buckets,
        )
        self.process_duration = meter.create_histogram(
            sc.PROCESS_DURATION,
            "s",
            "Duration of a message's processing (a handler call, an async for iteration)",
            explicit_bucket_boundaries_advisory=buckets,
        )
        # name -> live registrations (a weak set each: a client gone is gone)
        self._observers: dict[str, weakref.WeakKeyDictionary[object, Observed]] = {}
        observable = (
            (meter.create_observable_counter, sc.CONSUMED_MESSAGES, "{message}",
             "Messages delivered to the consumer by nsqd"),
            (meter.create_observable_counter, sc.SETTLED_MESSAGES, "{message}",
             "Messages answered, by outcome (finished, requeued, given_up)"),
            (meter.create_observable_gauge, sc.RDY, "{message}",
             "The RDY count last sent on a connection"),
            (meter.create_observable_gauge, sc.IN_FLIGHT, "{message}",
             "A connection's messages received and not answered yet"),
            (meter.create_observable_gauge, sc.BACKOFF_LEVEL, "1",
             "A consumer's backoff level (0: not backing off)"),
        )  # fmt: skip
        for create, name, unit, description in observable:
            self._observers[name] = weakref.WeakKeyDictionary()
            create(name, [self._callback(name)], unit, description)
        meter.create_observable_counter(
            sc.RECONNECTS, [_reconnects], "{connection}", "Connections to an nsqd made again"
        )
        meter.create_observable_counter(
            sc.ERRORS, [_errors], "{error}", "Non-fatal errors from nsqd (E_FIN_FAILED...)"
        )

    def observe(self, owner: object, name: str, observed: Observed) -> None:
        """Report ``observed()`` under metric ``name`` while ``owner`` lives
        (or until :meth:`forget`)."""
        self._observers[name][owner] = observed

    def forget(self, owner: object) -> None:
        for observers in self._observers.values():
            observers.pop(owner, None)

    def _callback(self, name: str) -> Callable[[CallbackOptions], Iterator[Observation]]:
        observers = self._observers[name]

        def callback(options: CallbackOptions) -> Iterator[Observation]:
            # Clients with the same attributes (two consumers of one channel)
            # are added up: an observable reports one value per attribute set.
            sums: dict[frozenset[tuple[str, Any]], int | float] = {}
            for observed in list(observers.values()):
                for value, attributes in observed():
                    key = frozenset(attributes.items())
                    sums[key] = sums.get(key, 0) + value
            for key, value in sums.items():
                yield Observation(value, dict(key))

        return callback


def _reconnects(options: CallbackOptions) -> Iterator[Observation]:
    for address, count in list(counters.reconnects.items()):
        yield Observation(count, {sc.MESSAGING_SYSTEM: sc.SYSTEM, **sc.server_attributes(address)})


def _errors(options: CallbackOptions) -> Iterator[Observation]:
    for (address, code), count in list(counters.errors.items()):
        attributes = {sc.MESSAGING_SYSTEM: sc.SYSTEM, sc.ERROR_TYPE: code}
        yield Observation(count, {**attributes, **sc.server_attributes(address)})


@dataclass(frozen=True, slots=True)
class Instruments:
    """What a client records with: ``tracer`` is None when spans are off,
    ``meters`` when metrics are."""

    tracer: trace.Tracer | None
    meters: Meters | None


# One Meters per meter provider (weakly: a test's provider goes with it).
_meters: weakref.WeakKeyDictionary[object, Meters] = weakref.WeakKeyDictionary()


def _always_off(tracer: trace.Tracer) -> bool:
    """The SDK's tracer with the always_off sampler (OTEL_TRACES_SAMPLER=
    always_off): every span would be dropped.  Read from the sampler's public
    description; a tracer of another kind is taken as sampling."""
    sampler = getattr(tracer, "sampler", None)
    describe = getattr(sampler, "get_description", None)
    return callable(describe) and describe() == "AlwaysOffSampler"


def _tracer(provider: Any) -> trace.Tracer | None:
    if provider is None:
        provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None  # no SDK set: every span would be a no-op
    tracer = provider.get_tracer(_SCOPE, _VERSION, schema_url=sc.SCHEMA_URL)
    if isinstance(tracer, trace.NoOpTracer) or _always_off(tracer):
        return None
    return tracer  # type: ignore[no-any-return]


def _meter_set(provider: Any) -> Meters | None:
    if provider is None:
        provider = metrics.get_meter_provider()
    # The API's proxy (no SDK set yet) is not public: known by its name.
    if isinstance(provider, metrics.NoOpMeterProvider) or (
        type(provider).__name__ == "_ProxyMeterProvider"
    ):
        return None
    meters = _meters.get(provider)
    if meters is None:
        meter = provider.get_meter(_SCOPE, _VERSION, schema_url=sc.SCHEMA_URL)
        if isinstance(meter, metrics.NoOpMeter):
            return None
        meters = _meters[provider] = Meters(meter)
    return meters


def resolve(tracer_provider: Any, meter_provider: Any) -> Instruments | None:
    """The instruments for a client starting now; None when neither spans
    nor metrics would be recorded."""
    tracer = _tracer(tracer_provider)
    meters = _meter_set(meter_provider)
    if tracer is None and meters is None:
        return None
    return Instruments(tracer, meters)
