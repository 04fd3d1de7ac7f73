"""OpenTelemetry traces and metrics for trionsq's clients (optional: the
``otel`` extra, ``pip install trionsq[otel]``).

Nothing to call: a client whose :class:`~trionsq.config.Config` has
``telemetry=True`` (the default) records spans and metrics with the tracer
and meter providers it names (``tracer_provider``, ``meter_provider``), else
the global ones, as they are when the client starts.  With no SDK configured,
with the ``always_off`` sampler, or without OpenTelemetry installed, a client
runs its plain, uninstrumented path.  ``trace_context=True`` puts a W3C trace
context envelope around each body a producer sends and takes it off each one
a consumer receives (:mod:`trionsq.tracecontext`); it does not need
OpenTelemetry (without it the envelope carries no context).

See docs/observability.md for the spans, metrics and attributes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import counters
from .consuming import ConsumerTelemetry, creation_context
from .producing import ProducerTelemetry, carrying

if TYPE_CHECKING:
    from ..config import Config
    from ..consumer import ConsumerStats
    from .otel import Instruments

__all__ = [
    "ConsumerTelemetry",
    "ProducerTelemetry",
    "carrying",
    "counters",
    "creation_context",
    "for_consumer",
    "for_producer",
    "instruments",
]


def instruments(config: Config) -> Instruments | None:
    """The tracer and meters a client with ``config`` records with, if any."""
    if not config.telemetry:
        return None
    try:
        from . import otel
    except ImportError:  # the otel extra is not installed
        return None
    return otel.resolve(config.tracer_provider, config.meter_provider)


def for_consumer(
    config: Config,
    topic: str,
    channel: str,
    *,
    msg_timeout: Callable[[Any], float] | None = None,
    stats: Callable[[], ConsumerStats] | None = None,
    ahead: bool = False,
) -> ConsumerTelemetry | None:
    """A starting consumer's telemetry; None when it has nothing to do.
    ``ahead``: a front end's (see :meth:`ConsumerTelemetry.unwrap_ahead`)."""
    found = instruments(config)
    if found is None and not config.trace_context:
        return None
    return ConsumerTelemetry(
        found,
        topic,
        channel,
        trace_context=config.trace_context,
        attributes=dict(config.telemetry_attributes),
        msg_timeout=msg_timeout,
        stats=stats,
        ahead=ahead,
    )


def for_producer(config: Config, address: Callable[[], str | None]) -> ProducerTelemetry | None:
    """A starting producer's telemetry; None when it has nothing to do."""
    found = instruments(config)
    if found is None and not config.trace_context:
        return None
    return ProducerTelemetry(
        found,
        trace_context=config.trace_context,
        address=address,
        attributes=dict(config.telemetry_attributes),
    )
