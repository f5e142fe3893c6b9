"""OpenTelemetry instruments: a span per partition batch and a few counters.

Only the API is used, so without an SDK configured by the application these
are no-ops that cost next to nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import metrics, trace

_tracer = trace.get_tracer("kinbox")
_meter = metrics.get_meter("kinbox")

received = _meter.create_counter("kinbox.events.received", description="records consumed")
applied = _meter.create_counter("kinbox.events.applied", description="handlers committed")
duplicates = _meter.create_counter(
    "kinbox.events.duplicate", description="deliveries suppressed by the inbox"
)
dead_lettered = _meter.create_counter(
    "kinbox.events.dead_lettered", description="records sent to a dead-letter topic"
)
failures = _meter.create_counter(
    "kinbox.batches.failed", description="partition batches rolled back"
)


@contextmanager
def batch_span(topic: str, partition: int, first_offset: int, size: int) -> Iterator[trace.Span]:
    """Trace one partition batch (claim, handlers, commit)."""
    with _tracer.start_as_current_span(
        "kinbox.batch",
        kind=trace.SpanKind.CONSUMER,
        attributes={
            "messaging.system": "kafka",
            "messaging.destination.name": topic,
            "messaging.destination.partition.id": str(partition),
            "messaging.kafka.offset": first_offset,
            "messaging.batch.message_count": size,
        },
    ) as span:
        yield span
