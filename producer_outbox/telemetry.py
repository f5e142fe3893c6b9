"""The relay's spans and metrics, around the sending of each claimed batch.

**Spans.** A row enqueued in a sampled trace (:mod:`.trace_context`) gets a
PRODUCER span ``send <topic>`` in that trace, its child; the span's own
context goes on the record as ``traceparent`` / ``tracestate``, so the
consumer's ``process`` span continues from it. The span covers the row's
send (produce to the delivery reports of its key's rows: :mod:`.flight`)
and says how its row fared (``error.type`` on failure). A row with no stored
context, or one its producer did not sample, gets no span and its record
carries the stored context (if any) as it is: a span per row costs the relay
tens of microseconds (``docs/operations.md``, "Tracing and metrics"), which
only a trace someone will look at should pay. With no SDK configured no span
is made at all.

**Metrics** (names, units, descriptions in :mod:`kinbox.core.otel.semconv`):
``messaging.client.sent.messages`` (``error.type`` on the failed ones) and
``messaging.client.operation.duration`` (from a send to the delivery reports
of the rows settled together), from the conventions;
``kinbox.outbox.publish.failures`` by ``topic`` and ``kind`` (``row``: the
record's own failure, ``outage``, ``topic``: refused as a whole); and gauges
of the outbox, read by the upkeep task :meth:`RelayTelemetry.refresh` every
``metrics_interval`` (the same counts ``kinbox outbox status`` shows, without
the sent rows): ``kinbox.outbox.pending``, ``.retrying``, ``.parked``,
``.oldest_pending.age`` (label ``schema``) and ``kinbox.outbox.topic.failing``
(``schema``, ``topic``). The task runs only when an SDK's meter provider is
installed: no SDK, no extra query.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import Observation

from kinbox.core.otel import semconv as sc
from kinbox.core.otel.instruments import (
    counter,
    histogram,
    metrics_on,
    shared_gauge,
    tracing_on,
)
from kinbox.core.otel.propagation import as_parent, formatted, parse
from kinbox.core.publisher import Outcome, OutgoingRecord
from producer_outbox import trace_context
from producer_outbox.outbox_status import Backlog, read_backlog
from producer_outbox.records import OutboxRow
from producer_outbox.topics import FailingTopic, read_failing

_KAFKA_ERROR = re.compile(r"_?[A-Z][A-Z0-9_]*(?=: )")
_GAUGES = (sc.OUTBOX_PENDING, sc.OUTBOX_RETRYING, sc.OUTBOX_PARKED, sc.OUTBOX_OLDEST)


class RelayTelemetry:
    """Spans and metrics of one relay (one schema's outbox).

    Args:
        schema: the outbox's schema, the gauges' ``schema`` label.
        tracer_provider: where spans go; ``None``: the global provider.
        meter_provider: where metrics go; ``None``: the global provider.
    """

    def __init__(
        self,
        schema: str,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
    ) -> None:
        self._schema = schema
        self._tracer = trace.get_tracer("kinbox.outbox", tracer_provider=tracer_provider)
        self.tracing = tracing_on(tracer_provider)
        """Whether an SDK takes spans (decided once, when the relay is made)."""
        self.metering = metrics_on(meter_provider)
        """Whether an SDK takes measurements: only then does :meth:`refresh` need to run."""
        meter = metrics.get_meter("kinbox.outbox", meter_provider=meter_provider)
        self._sent = counter(meter, sc.SENT_MESSAGES)
        self._failures = counter(meter, sc.PUBLISH_FAILURES)
        self._duration = histogram(meter, sc.OPERATION_DURATION, sc.DURATION_BUCKETS)
        self._backlog: Backlog | None = None
        self._failing: list[FailingTopic] = []
        if self.metering:
            for spec in _GAUGES:
                shared_gauge(meter, spec).watch(self, _reading(spec))
            shared_gauge(meter, sc.OUTBOX_FAILING_TOPIC).watch(
                self, RelayTelemetry._observe_failing
            )

    def start(
        self, rows: Sequence[OutboxRow], records: Sequence[OutgoingRecord]
    ) -> tuple[Sequence[OutgoingRecord], dict[int, trace.Span]]:
        """Open the rows' ``send`` spans; return the records to send and the spans by index.

        A record whose row got a span carries the span's context instead of the
        stored one. :meth:`finish` ends the spans once the rows settle.
        """
        if not self.tracing:
            return records, {}
        spans: dict[int, trace.Span] = {}
        carried = list(records)
        for index, row in enumerate(rows):
            if row.traceparent is not None:
                span = self._send_span(row)
                if span is not None:
                    spans[index] = span
                    carried[index] = _carrying(records[index], span)
        return carried, spans

    def finish(
        self,
        rows: Sequence[OutboxRow],
        outcomes: Sequence[Outcome],
        spans: Mapping[int, trace.Span],
        elapsed: float,
    ) -> None:
        """Count settled ``rows`` (sent ``elapsed`` seconds ago) and end their spans.

        ``spans``: those :meth:`start` opened for these rows, by index in ``rows``.
        """
        if self.metering:
            self._count(rows, outcomes, elapsed)
        for index, span in spans.items():
            outcome = outcomes[index]
            if not outcome.ok:
                span.set_attribute(sc.ERROR_TYPE, _error_type(outcome))
                span.set_status(trace.Status(trace.StatusCode.ERROR, outcome.error))
            span.end()

    def _send_span(self, row: OutboxRow) -> trace.Span | None:
        """The row's ``send`` span, or ``None``: no valid stored context, or not sampled.

        A context its producer did not sample gets no span: under the
        default (parent-based) sampler the span would record nothing, yet
        making it costs about half a recorded one. The record then carries
        the stored context as it is, and the consumer follows its flags.
        """
        assert row.traceparent is not None
        stored = parse(row.traceparent, row.tracestate)
        if stored is None or not stored.trace_flags.sampled:
            return None
        attributes: dict[str, Any] = {
            sc.MESSAGING_SYSTEM: sc.KAFKA,
            sc.OPERATION_TYPE: sc.SEND,
            sc.OPERATION_NAME: sc.SEND,
            sc.DESTINATION: row.topic,
            sc.MESSAGE_ID: row.id,
        }
        if row.key is not None:
            attributes[sc.MESSAGE_KEY] = row.key
        return self._tracer.start_span(
            f"{sc.SEND} {row.topic}",
            context=as_parent(stored),
            kind=trace.SpanKind.PRODUCER,
            attributes=attributes,
        )

    def _count(
        self, rows: Sequence[OutboxRow], outcomes: Sequence[Outcome], elapsed: float
    ) -> None:
        # Tallied first, then one add per (topic, error): an instrument call
        # with attributes costs microseconds, and a batch is mostly one topic.
        sent: Counter[tuple[str, str | None]] = Counter()
        failed: Counter[tuple[str, str]] = Counter()
        for row, outcome in zip(rows, outcomes, strict=True):
            if outcome.held:
                continue  # never tried: it waited behind an earlier row of its key
            if outcome.ok:
                sent[(row.topic, None)] += 1
                continue
            sent[(row.topic, _error_type(outcome))] += 1
            kind = "topic" if outcome.topic_failure else "outage" if outcome.outage else "row"
            failed[(row.topic, kind)] += 1
        labels: dict[str, Any] = {sc.MESSAGING_SYSTEM: sc.KAFKA, sc.OPERATION_NAME: sc.SEND}
        topics = {row.topic for row in rows}
        if len(topics) == 1:
            labels[sc.DESTINATION] = next(iter(topics))
        self._duration.record(elapsed, labels)
        for (topic, error), n in sent.items():
            attributes = {**labels, sc.DESTINATION: topic}
            if error is not None:
                attributes[sc.ERROR_TYPE] = error
            self._sent.add(n, attributes)
        for (topic, kind), n in failed.items():
            self._failures.add(n, {sc.TOPIC: topic, sc.KIND: kind})

    def refresh(self, conn: Any) -> None:
        """Upkeep: read the outbox's backlog and failing topics for the gauges."""
        self._backlog = read_backlog(conn, self._schema)
        self._failing = read_failing(conn, self._schema)

    def _observe(self, spec: sc.Instrument) -> list[Observation]:
        backlog = self._backlog
        if backlog is None:
            return []  # not read yet: no point rather than a made-up zero
        value = {
            sc.OUTBOX_PENDING: backlog.pending,
            sc.OUTBOX_RETRYING: backlog.retrying,
            sc.OUTBOX_PARKED: backlog.dead,
            sc.OUTBOX_OLDEST: backlog.oldest_pending_seconds,
        }[spec]
        return [Observation(value, {"schema": self._schema})]

    def _observe_failing(self) -> list[Observation]:
        return [
            Observation(topic.failing_seconds, {"schema": self._schema, sc.TOPIC: topic.topic})
            for topic in self._failing
        ]


def _reading(spec: sc.Instrument) -> Callable[[RelayTelemetry], list[Observation]]:
    """A gauge callback reading ``spec`` from the relay it is handed (it holds no relay)."""

    def read(owner: RelayTelemetry) -> list[Observation]:
        return owner._observe(spec)

    return read


def _carrying(record: OutgoingRecord, span: trace.Span) -> OutgoingRecord:
    """``record`` with the trace headers of ``span`` instead of the stored ones."""
    kept = [(n, v) for n, v in record.headers if n not in trace_context.COLUMNS]
    carried = trace_context.headers(*formatted(span.get_span_context()))
    return OutgoingRecord(record.topic, record.key, record.value, [*kept, *carried])


def _error_type(outcome: Outcome) -> str:
    """The Kafka error's name (``MSG_SIZE_TOO_LARGE``), or the conventions' ``_OTHER``."""
    found = _KAFKA_ERROR.match(outcome.error or "")
    return found.group(0) if found else "_OTHER"
