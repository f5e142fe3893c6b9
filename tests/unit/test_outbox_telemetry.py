"""The relay's trace context and telemetry around a batch's send (no services)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NoOpTracerProvider, SpanKind

from kinbox.core.publisher import ACKED, Outcome, OutgoingRecord
from producer_outbox import trace_context
from producer_outbox.outbox_status import Backlog
from producer_outbox.records import OutboxRow, row_from_db, to_record
from producer_outbox.telemetry import RelayTelemetry
from producer_outbox.writer import RESERVED_HEADERS

pytestmark = pytest.mark.unit

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class Publisher:
    """Acknowledges every record but those of ``refuse``; keeps what it was given."""

    def __init__(self, refuse: str = "") -> None:
        self.refuse = refuse
        self.published: list[OutgoingRecord] = []

    def publish(self, records: Sequence[OutgoingRecord]) -> list[Outcome]:
        self.published += records
        return [
            Outcome("MSG_SIZE_TOO_LARGE: too big") if r.topic == self.refuse else ACKED
            for r in records
        ]

    def close(self) -> None:
        """Nothing to release."""


def publish(
    telemetry: RelayTelemetry, publisher: Publisher, rows: list[OutboxRow]
) -> list[Outcome]:
    """What a lane group does around a send: open the spans, send, count and end them."""
    records, spans = telemetry.start(rows, [to_record(r) for r in rows])
    outcomes = publisher.publish(records)
    telemetry.finish(rows, outcomes, spans, elapsed=0.01)
    return outcomes


def row(topic: str = "t", traceparent: str | None = TRACEPARENT, key: str = "k") -> OutboxRow:
    state = "v=1" if traceparent else None
    return OutboxRow(str(uuid.uuid4()), 1, topic, key, None, b"{}", {}, 0, traceparent, state)


def traceparent_of(context: trace.SpanContext) -> str:
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def headers(record: OutgoingRecord) -> dict[str, bytes | None]:
    return dict(record.headers)


def test_the_stored_context_becomes_the_records_headers_and_none_adds_none() -> None:
    traced = headers(to_record(row()))
    assert traced["traceparent"] == TRACEPARENT.encode() and traced["tracestate"] == b"v=1"
    assert "traceparent" not in headers(to_record(row(traceparent=None)))
    # the claim's columns, the trace context last (and optional for older callers)
    values: tuple[Any, ...] = (
        uuid.uuid4(),
        1,
        "t",
        None,
        None,
        "{}",
        None,
        {},
        0,
        TRACEPARENT,
        None,
    )
    assert row_from_db(values).traceparent == TRACEPARENT
    assert row_from_db(values[:9]).traceparent is None
    # a stored header may not shadow the ones the relay sets itself
    assert {"traceparent", "tracestate"} <= RESERVED_HEADERS


def test_the_current_span_is_what_enqueue_stores_and_no_span_stores_nothing() -> None:
    assert trace_context.current() is None
    provider = TracerProvider()
    with provider.get_tracer("app").start_as_current_span("CompleteLesson") as span:
        stored = trace_context.current()
    assert stored is not None
    context = span.get_span_context()
    assert stored[0] == traceparent_of(context)


def sdk() -> tuple[RelayTelemetry, InMemorySpanExporter, InMemoryMetricReader]:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    telemetry = RelayTelemetry("kinbox", tracer_provider, MeterProvider(metric_readers=[reader]))
    return telemetry, spans, reader


def points(reader: InMemoryMetricReader, name: str) -> list[Any]:
    data = reader.get_metrics_data()
    return [
        point
        for rm in (data.resource_metrics if data is not None else ())
        for sm in rm.scope_metrics
        for metric in sm.metrics
        if metric.name == name
        for point in metric.data.data_points
    ]


def test_a_traced_row_is_sent_in_a_producer_span_whose_context_the_record_carries() -> None:
    telemetry, spans, reader = sdk()
    publisher = Publisher(refuse="big")
    unsampled = TRACEPARENT[:-2] + "00"
    rows = [row(), row(traceparent=None), row(topic="big"), row(traceparent=unsampled)]
    outcomes = publish(telemetry, publisher, rows)
    assert [o.ok for o in outcomes] == [True, True, False, True]
    # One span per row enqueued in a sampled trace, its child; none for the
    # untraced row, nor for the one its producer did not sample
    sent, refused = spans.get_finished_spans()
    assert sent.name == "send t" and sent.kind is SpanKind.PRODUCER
    assert sent.parent is not None and f"{sent.parent.span_id:016x}" == "00f067aa0ba902b7"
    assert f"{sent.context.trace_id:032x}" == TRACEPARENT.split("-")[1]
    assert dict(sent.attributes or {}) == {
        "messaging.system": "kafka", "messaging.operation.type": "send",
        "messaging.operation.name": "send", "messaging.destination.name": "t",
        "messaging.message.id": str(rows[0].id), "messaging.kafka.message.key": "k",
    }  # fmt: skip
    assert (refused.attributes or {})["error.type"] == "MSG_SIZE_TOO_LARGE"
    assert refused.status.status_code is trace.StatusCode.ERROR
    # The record carries the send span's context (the consumer continues from it)
    first, untraced, _, not_sampled = (headers(r) for r in publisher.published)
    assert first["traceparent"] == traceparent_of(sent.context).encode()
    assert first["tracestate"] == b"v=1" and "traceparent" not in untraced
    assert not_sampled["traceparent"] == unsampled.encode()  # as stored
    # Every record tried is counted; the refused one with its error, by topic and kind
    by_error = {
        (
            dict(p.attributes)["messaging.destination.name"],
            dict(p.attributes).get("error.type"),
        ): p.value
        for p in points(reader, "messaging.client.sent.messages")
    }
    assert by_error == {("t", None): 3, ("big", "MSG_SIZE_TOO_LARGE"): 1}
    [failure] = points(reader, "kinbox.outbox.publish.failures")
    assert dict(failure.attributes) == {"topic": "big", "kind": "row"} and failure.value == 1
    [duration] = points(reader, "messaging.client.operation.duration")
    assert duration.count == 1


def test_the_gauges_read_what_the_upkeep_task_last_read() -> None:
    telemetry, _, reader = sdk()
    assert points(reader, "kinbox.outbox.pending") == []  # not read yet: no made-up zero
    telemetry._backlog = Backlog(pending=5, retrying=2, dead=1, oldest_pending_seconds=3.5)
    values = {
        name: [(dict(p.attributes), p.value) for p in points(reader, name)]
        for name in (
            "kinbox.outbox.pending",
            "kinbox.outbox.parked",
            "kinbox.outbox.oldest_pending.age",
        )
    }
    assert values == {
        "kinbox.outbox.pending": [({"schema": "kinbox"}, 5)],
        "kinbox.outbox.parked": [({"schema": "kinbox"}, 1)],
        "kinbox.outbox.oldest_pending.age": [({"schema": "kinbox"}, 3.5)],
    }


def test_without_an_sdk_the_stored_context_travels_unchanged() -> None:
    telemetry = RelayTelemetry("kinbox", NoOpTracerProvider(), NoOpMeterProvider())
    assert not telemetry.tracing and not telemetry.metering
    publisher = Publisher()
    publish(telemetry, publisher, [row()])
    assert headers(publisher.published[0])["traceparent"] == TRACEPARENT.encode()
