"""W3C Trace Context in Kafka headers and outbox columns: a record's creation context.

kinbox's outbox relay (and Debezium's router, through the outbox's
``traceparent`` / ``tracestate`` columns) write W3C Trace Context
(https://www.w3.org/TR/trace-context/), so that is what kinbox reads and
writes, whatever ``OTEL_PROPAGATORS`` says: a record's ``traceparent``
header (with ``tracestate``, if present) is its *creation context* in the
messaging conventions' sense.

``traceparent`` is ``version-traceid-parentid-flags``: two, 32, 16 and two
lowercase hex digits. Version ``ff`` and all-zero ids are invalid; version
``00`` has exactly those four fields, a later version may append more. A
value that is missing or malformed is no context, never an error: headers
are whatever a producer wrote, and telemetry must not fail an event.

Parsed and formatted here rather than through the SDK's propagator: the
relay does it for every traced row, and the propagator's generic carrier
machinery cost several times the span itself there.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanContext, TraceFlags, TraceState

Headers = Sequence[tuple[str, bytes | None]]

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")


def parse(traceparent: str, tracestate: str | None = None) -> SpanContext | None:
    """The remote span context ``traceparent`` (and ``tracestate``) describe, if valid."""
    found = _TRACEPARENT.fullmatch(traceparent.strip(" \t"))
    if found is None:
        return None
    version, trace_id, span_id, flags, rest = found.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None
    context = SpanContext(
        int(trace_id, 16),
        int(span_id, 16),
        is_remote=True,
        trace_flags=TraceFlags(int(flags, 16)),
        trace_state=TraceState.from_header([tracestate]) if tracestate else None,
    )
    return context if context.is_valid else None


def creation_context(headers: Headers) -> SpanContext | None:
    """The span context of ``headers``' first ``traceparent`` (with its ``tracestate``)."""
    traceparent: str | None = None
    states: list[str] = []
    for name, value in headers:
        if value is None:
            continue
        if name == TRACEPARENT and traceparent is None:
            traceparent = value.decode("latin-1")
        elif name == TRACESTATE:
            states.append(value.decode("latin-1"))
    if traceparent is None:
        return None
    return parse(traceparent, ",".join(states) or None)


def formatted(context: SpanContext) -> tuple[str, str | None]:
    """``(traceparent, tracestate)`` of ``context`` (``None`` for an empty trace state)."""
    traceparent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    return traceparent, context.trace_state.to_header() or None


def as_parent(span_context: SpanContext) -> Context:
    """A context whose current span is ``span_context``: a parent for a new span."""
    return trace.set_span_in_context(trace.NonRecordingSpan(span_context))
