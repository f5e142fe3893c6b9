"""The trace context an outbox row carries, from ``enqueue`` to the Kafka record's headers.

``enqueue`` stores the W3C trace context current in the business
transaction (:func:`current`) in the row's ``traceparent`` / ``tracestate``
columns; nothing when no span is current, so a producer that traces nothing
writes the row it always wrote. The relay continues that trace from the
stored context (:func:`parent`) and sends the context of its own ``send``
span; a relay that traces nothing sends the stored one unchanged
(:func:`headers`). Debezium's router copies the columns into the same
headers. Only the API is used: without an SDK there is never a current
span, and the columns stay NULL.
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.context import Context

from kinbox.core.otel.propagation import TRACEPARENT, TRACESTATE, as_parent, formatted, parse

COLUMNS = {TRACEPARENT: TRACEPARENT, TRACESTATE: TRACESTATE}
"""The outbox's trace-context columns and the record header each becomes."""

Stored = tuple[str, str | None]
"""``(traceparent, tracestate)`` as stored with a row."""


def current() -> Stored | None:
    """The current span's W3C context, to store with a row; ``None`` when no span is current."""
    context = trace.get_current_span().get_span_context()
    return formatted(context) if context.is_valid else None


def parent(traceparent: str, tracestate: str | None) -> Context | None:
    """A context whose parent is the stored one, or ``None`` if it is not a valid one."""
    span_context = parse(traceparent, tracestate)
    return None if span_context is None else as_parent(span_context)


def headers(traceparent: str | None, tracestate: str | None) -> list[tuple[str, bytes]]:
    """The record headers that carry a trace context (none for ``None``)."""
    if traceparent is None:
        return []
    found = [(TRACEPARENT, traceparent.encode("ascii", "replace"))]
    if tracestate:
        found.append((TRACESTATE, tracestate.encode("ascii", "replace")))
    return found
