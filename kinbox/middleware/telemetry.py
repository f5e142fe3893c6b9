"""OpenTelemetry as a middleware: a span per partition batch and a few counters.

Counters (label ``topic``, the consumed topic, unless said otherwise):
``kinbox.events.received``, ``.applied``, ``.duplicate``, ``.dead_lettered``;
``kinbox.batches.failed`` (and ``kind``: ``handler``, ``store``,
``dead-letter``, ``envelope``); ``kinbox.dead_letters.undeliverable``, one
per try whose dead letter the broker did not take (``topic`` the dead-letter
topic, ``source_topic`` the consumed one).

Only the API is used, so without an SDK configured by the application these
are no-ops that cost next to nothing. :class:`Telemetry` is installed on
every :class:`~kinbox.app.App` unless ``App(middleware=[...])`` leaves it out;
``Telemetry(tracer_provider=..., meter_provider=...)`` uses providers of your
own instead of the global ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import Token
from typing import TYPE_CHECKING

from opentelemetry import context, metrics, trace
from opentelemetry.context import Context

from kinbox.describe import describe
from kinbox.middleware.base import Middleware

if TYPE_CHECKING:
    from kinbox.apply.outcome import BatchResult
    from kinbox.consume.envelope import Record


class Telemetry(Middleware):
    """Traces each partition batch (claim, handlers, commit) and counts its outcome.

    The span is current while the batch runs, so spans a handler starts are
    its children.

    Args:
        tracer_provider: where spans go; ``None``: the global provider.
        meter_provider: where metrics go; ``None``: the global provider.
    """

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
    ) -> None:
        self._tracer = trace.get_tracer("kinbox", tracer_provider=tracer_provider)
        meter = metrics.get_meter("kinbox", meter_provider=meter_provider)
        self._received = meter.create_counter(
            "kinbox.events.received", description="records consumed"
        )
        self._applied = meter.create_counter(
            "kinbox.events.applied", description="handlers committed"
        )
        self._duplicates = meter.create_counter(
            "kinbox.events.duplicate", description="deliveries suppressed by the inbox"
        )
        self._dead_lettered = meter.create_counter(
            "kinbox.events.dead_lettered", description="records sent to a dead-letter topic"
        )
        self._failures = meter.create_counter(
            "kinbox.batches.failed",
            description="partition batches that stopped at a failure, by kind "
            "(handler, store, dead-letter, envelope)",
        )
        self._undeliverable = meter.create_counter(
            "kinbox.dead_letters.undeliverable",
            description="tries whose dead letter the broker did not take; "
            "the partition waits at it",
        )
        # Batches of one partition never overlap, so the partition is a key.
        self._open: dict[tuple[str, int], tuple[trace.Span, Token[Context]]] = {}

    def before_batch(self, topic: str, partition: int, records: Sequence[Record]) -> None:
        """Start the batch's span and count the records received."""
        self._received.add(len(records), {"topic": topic})
        span = self._tracer.start_span(
            "kinbox.batch",
            kind=trace.SpanKind.CONSUMER,
            attributes={
                "messaging.system": "kafka",
                "messaging.destination.name": topic,
                "messaging.destination.partition.id": str(partition),
                "messaging.kafka.offset": records[0].offset,
                "messaging.batch.message_count": len(records),
            },
        )
        token = context.attach(trace.set_span_in_context(span))
        self._open[(topic, partition)] = (span, token)

    def after_batch(
        self,
        topic: str,
        partition: int,
        records: Sequence[Record],
        result: BatchResult,
        error: BaseException | None,
    ) -> None:
        """Count the outcome and end the span (an error status when the batch stopped)."""
        labels = {"topic": topic}
        self._applied.add(result.applied, labels)
        self._duplicates.add(result.duplicates, labels)
        self._dead_lettered.add(result.dead_lettered, labels)
        opened = self._open.pop((topic, partition), None)
        failure = result.failure
        cause = error if error is not None else (None if failure is None else failure.error)
        if failure is not None:
            self._failures.add(1, {**labels, "kind": failure.kind})
            if failure.dead_letter_topic is not None:
                self._undeliverable.add(
                    1, {"topic": failure.dead_letter_topic, "source_topic": topic}
                )
        elif error is not None:
            self._failures.add(1, {**labels, "kind": "error"})
        if opened is None:
            return
        span, token = opened
        context.detach(token)
        if cause is not None:
            span.set_status(trace.Status(trace.StatusCode.ERROR, describe(cause)))
            if error is not None:
                span.record_exception(error)
        span.end()
