"""A record's creation context: the W3C trace context its producer put in its headers.

kinbox's outbox relay (and Debezium's router, through the outbox's
``traceparent`` / ``tracestate`` columns) write W3C Trace Context headers, so
that is what kinbox reads, whatever ``OTEL_PROPAGATORS`` says: a record's
``traceparent`` header (and ``tracestate``, if present) is its *creation
context* in the messaging conventions' sense. A header that is missing or
malformed is no context, never an error: the headers are whatever a producer
wrote, and telemetry must not fail an event.
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

Headers = Sequence[tuple[str, bytes | None]]

_PROPAGATOR = TraceContextTextMapPropagator()
_FIELDS = ("traceparent", "tracestate")


class _HeaderGetter(Getter[Headers]):
    """Reads Kafka headers (a name may repeat; values are bytes) for the propagator."""

    def get(self, carrier: Headers, key: str) -> list[str] | None:
        found = [
            value.decode("latin-1") for name, value in carrier if name == key and value is not None
        ]
        return found or None

    def keys(self, carrier: Headers) -> list[str]:
        return [name for name, _ in carrier]


_GETTER = _HeaderGetter()


def creation_context(headers: Headers) -> trace.SpanContext | None:
    """The span context in ``headers``' ``traceparent`` (with ``tracestate``), if valid."""
    # Cheap first: most records of an untraced producer carry no such header.
    if not any(name == "traceparent" for name, _ in headers):
        return None
    context = _PROPAGATOR.extract(headers, getter=_GETTER)
    span_context = trace.get_current_span(context).get_span_context()
    return span_context if span_context.is_valid else None


def as_parent(span_context: trace.SpanContext) -> Context:
    """A context whose current span is ``span_context``: a parent for a new span."""
    return trace.set_span_in_context(trace.NonRecordingSpan(span_context))


def inject(context: Context | None = None) -> dict[str, str]:
    """The ``traceparent`` / ``tracestate`` of ``context`` (default: the current one), if any."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=context)
    return {name: carrier[name] for name in _FIELDS if carrier.get(name)}
