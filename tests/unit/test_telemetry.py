"""Telemetry's spans and metrics, read back through the SDK's in-memory exporters (no services)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NoOpTracerProvider, SpanKind

from kinbox.app import App
from kinbox.consume.runner import Runner
from kinbox.core.config import Settings
from kinbox.core.errors import ConfigurationError, DeadLetter
from kinbox.core.event import Event
from kinbox.core.lag import LagBoard
from kinbox.core.otel.instruments import metrics_on, tracing_on
from kinbox.core.record import Record
from kinbox.middleware.telemetry import Telemetry
from kinbox.testing import FakePublisher, FakeStore, FakeTransport, InlineExecutor, record

pytestmark = pytest.mark.unit

T = "orders"
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


def traced(offset: int, event_id: str, trace_id: str = TRACE, key: bytes | None = None) -> Record:
    """A record whose producer put its trace context in ``traceparent`` (and ``tracestate``)."""
    headers = [
        ("event-id", event_id.encode()),
        ("traceparent", f"00-{trace_id}-{PARENT}-01".encode()),
        ("tracestate", b"vendor=x"),
    ]
    plain = record(T, 0, offset, event_id, headers=headers)
    return Record(plain.topic, 0, offset, key, plain.value, plain.headers, plain.timestamp)


@dataclass
class Sdk:
    """An SDK's providers with in-memory readers, as an application would install them."""

    spans: InMemorySpanExporter
    reader: InMemoryMetricReader
    telemetry: Telemetry
    tracer_provider: TracerProvider

    def finished(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if name is None or s.name == name]

    def points(self, name: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        found: list[Any] = []
        for rm in data.resource_metrics if data is not None else ():
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name == name:
                        found += list(metric.data.data_points)
        return found


def sdk(trace_context: str | None = None) -> Sdk:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    telemetry = Telemetry(
        tracer_provider=tracer_provider,
        meter_provider=MeterProvider(metric_readers=[reader]),
        trace_context=trace_context,
    )
    return Sdk(spans, reader, telemetry, tracer_provider)


def run(
    app: App, *records: Record, settings: Settings | None = None, lag: LagBoard | None = None
) -> FakeStore:
    """Run ``app`` over ``records`` with fakes for one poll, then stop."""
    transport, store = FakeTransport(), FakeStore()
    for item in records:
        transport.append(item)
    config = settings or Settings(database_url="postgresql:///x", group_id="g").validate()
    runner = Runner(
        app, config, transport, store, publisher=FakePublisher(), lag=lag,
        executor=InlineExecutor(),
    )  # fmt: skip
    real_poll = transport.poll

    def poll_once(max_messages: int, timeout: float) -> list[Record]:
        runner.stop()
        return real_poll(max_messages, timeout)

    transport.poll = poll_once  # type: ignore[method-assign]
    runner.run()
    return store


def each_app(telemetry: Sdk, fail: str | None = None, **settings: Any) -> App:
    """A per-event handler that runs its statement in a span of its own, as a traced app would."""
    app = App(group_id="g", middleware=[telemetry.telemetry], **settings)
    tracer = telemetry.tracer_provider.get_tracer("app")

    @app.handler(T)
    def apply(event: Event, tx: Any) -> None:
        with tracer.start_as_current_span("INSERT lesson_progress"):
            if event.id == fail:
                raise DeadLetter("poison")
            tx.effects.append(event.id)

    return app


def parent_of(span: ReadableSpan) -> str | None:
    return None if span.parent is None else format(span.parent.span_id, "016x")


def span_id(span: ReadableSpan) -> str:
    return format(span.context.span_id, "016x")


def test_a_handler_call_is_a_consumer_span_continuing_the_producers_trace() -> None:
    # Given a record carrying its producer's trace context, and a handler of one event
    telemetry = sdk()
    app = each_app(telemetry)
    # When the worker applies it
    run(app, traced(0, "e1", key=b"user-1"))
    # Then its handler ran in a `process orders` CONSUMER span in the producer's trace
    [span] = telemetry.finished(f"process {T}")
    [batch] = telemetry.finished("kinbox.batch")
    assert span.kind is SpanKind.CONSUMER
    assert format(span.context.trace_id, "032x") == TRACE and parent_of(span) == PARENT
    assert dict(span.attributes or {}) == {
        "messaging.system": "kafka",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": T,
        "messaging.destination.partition.id": "0",
        "messaging.consumer.group.name": "g",
        "messaging.kafka.offset": 0,
        "messaging.kafka.message.key": "user-1",
        "messaging.message.id": "e1",
        "kinbox.duplicate": False,
        "kinbox.attempt": 1,
    }
    # ... linking the producer's context and the batch's span (the ambient one)
    linked = {format(link.context.span_id, "016x") for link in span.links}
    assert linked == {PARENT, span_id(batch)}
    assert span.links[0].context.trace_state.get("vendor") == "x"


def test_link_mode_keeps_the_handler_under_the_batch_and_links_the_producer() -> None:
    telemetry = sdk()
    app = each_app(telemetry, trace_context="link")
    run(app, traced(0, "e1"), settings=app.settings({"database_url": "postgresql:///x"}))
    [span] = telemetry.finished(f"process {T}")
    [batch] = telemetry.finished("kinbox.batch")
    assert parent_of(span) == span_id(batch) and span.context.trace_id == batch.context.trace_id
    assert [format(link.context.span_id, "016x") for link in span.links] == [PARENT]


def test_the_app_setting_reaches_telemetry_and_a_bad_value_is_refused() -> None:
    assert App(group_id="g", trace_context="link").settings().trace_context == "link"
    with pytest.raises(ConfigurationError, match="trace_context='sideways'"):
        Settings(database_url="x", group_id="g", trace_context="sideways").validate()
    env = {"KINBOX_TRACE_CONTEXT": "parent"}
    assert Settings.load(env=env).trace_context == "parent"


def test_claim_and_commit_are_children_of_the_batch_and_duplicates_are_its_events() -> None:
    # Given a batch in which one record repeats an id (a producer retry)
    telemetry = sdk()
    app = each_app(telemetry)
    store = run(app, traced(0, "e1"), traced(1, "e1", trace_id="a" * 32), traced(2, "e2"))
    assert store.effects == ["e1", "e2"]
    [batch] = telemetry.finished("kinbox.batch")
    [claim] = telemetry.finished("kinbox.claim")
    [commit] = telemetry.finished("kinbox.commit")
    # Then the claim and the COMMIT are children of the batch's span, in order
    assert parent_of(claim) == parent_of(commit) == span_id(batch)
    assert claim.end_time is not None and commit.start_time is not None
    assert claim.end_time <= commit.start_time
    assert (claim.attributes or {})["kinbox.claim.fresh"] == 2
    # ... the duplicate never reached a handler: no process span, but an event
    # on the batch and a link to its producer's context
    assert len(telemetry.finished(f"process {T}")) == 2
    [duplicate] = [e for e in batch.events if e.name == "kinbox.duplicate"]
    assert dict(duplicate.attributes or {}) == {
        "messaging.message.id": "e1", "messaging.kafka.offset": 1, "kinbox.duplicate": True,
    }  # fmt: skip
    assert [format(link.context.trace_id, "032x") for link in batch.links] == ["a" * 32]
    attributes = dict(batch.attributes or {})
    assert attributes["kinbox.batch.duplicates"] == 1 and attributes["kinbox.batch.applied"] == 2
    assert batch.kind is SpanKind.INTERNAL


def test_a_redone_batch_calls_the_handler_again_each_call_its_own_span() -> None:
    # Given a batch whose second event the handler dead-letters
    telemetry = sdk()
    app = each_app(telemetry, fail="bad")
    store = run(app, traced(0, "ok"), traced(1, "bad"))
    assert store.effects == ["ok"]
    spans = telemetry.finished(f"process {T}")
    # Then: ok, bad (raised: the optimistic pass is abandoned), then ok again
    # in the careful pass, and once more in the redo after the dead letter
    # went out; bad is dead-lettered without running again
    ids = [(s.attributes or {})["messaging.message.id"] for s in spans]
    assert ids == ["ok", "bad", "ok", "ok"]
    failed = spans[1]
    assert (failed.attributes or {})["error.type"] == "kinbox.core.errors.DeadLetter"
    assert failed.status.status_code is trace.StatusCode.ERROR
    assert {(s.attributes or {})["kinbox.attempt"] for s in spans} == {1}
    [batch] = telemetry.finished("kinbox.batch")
    [letter] = [e for e in batch.events if e.name == "kinbox.dead_letter"]
    assert (letter.attributes or {})["messaging.kafka.offset"] == 1
    # ... and the handler's own spans are children of the call they ran in
    own = telemetry.finished("INSERT lesson_progress")
    assert [parent_of(s) for s in own] == [span_id(s) for s in spans]


def test_a_batch_handler_gets_one_span_linking_every_events_producer() -> None:
    telemetry = sdk()
    app = App(group_id="g", middleware=[telemetry.telemetry])

    @app.handler(T, batch=True)
    def apply(events: list[Event], tx: Any) -> None:
        tx.effects.extend(e.id for e in events)

    run(app, traced(0, "e1", trace_id="1" * 32), traced(1, "e2", trace_id="2" * 32))
    [span] = telemetry.finished(f"process {T}")
    [batch] = telemetry.finished("kinbox.batch")
    # auto: a batch handler is linked, never parented (its events come from many traces)
    assert parent_of(span) == span_id(batch)
    attributes = dict(span.attributes or {})
    assert attributes["messaging.batch.message_count"] == 2
    assert "messaging.message.id" not in attributes
    links = [
        (format(link.context.trace_id, "032x"), dict(link.attributes or {})) for link in span.links
    ]
    assert links == [
        ("1" * 32, {"messaging.message.id": "e1", "messaging.kafka.offset": 0}),
        ("2" * 32, {"messaging.message.id": "e2", "messaging.kafka.offset": 1}),
    ]


def test_metrics_time_each_call_claim_and_commit_and_count_what_was_consumed() -> None:
    telemetry = sdk()
    app = each_app(telemetry, fail="bad")
    run(app, traced(0, "ok"), traced(1, "bad"), traced(2, "ok"))
    by_error = {
        dict(p.attributes).get("error.type"): p.count
        for p in telemetry.points("messaging.process.duration")
    }
    assert by_error == {None: 3, "kinbox.core.errors.DeadLetter": 1}
    [consumed] = telemetry.points("messaging.client.consumed.messages")
    assert consumed.value == 3 and dict(consumed.attributes) == {
        "messaging.system": "kafka", "messaging.operation.name": "consume",
        "messaging.destination.name": T, "messaging.consumer.group.name": "g",
    }  # fmt: skip
    [size] = telemetry.points("kinbox.batch.size")
    assert size.count == 1 and size.sum == 3
    # three transactions (optimistic, abandoned; careful, rolled back for the
    # dead letter to go out; the redo), each claimed; one COMMIT
    assert sum(p.count for p in telemetry.points("kinbox.claim.duration")) == 3
    assert sum(p.count for p in telemetry.points("kinbox.commit.duration")) == 1
    [duplicates] = telemetry.points("kinbox.events.duplicate")
    assert duplicates.value == 1  # the second "ok"


def test_lag_is_a_gauge_per_assigned_partition_fed_by_the_board() -> None:
    telemetry = sdk()
    app = each_app(telemetry)
    board = LagBoard()
    board.update({(T, 0): 7, (T, 2): 0})
    run(app, traced(0, "e1"), lag=board)
    points = {
        (dict(p.attributes)["partition"], p.value) for p in telemetry.points("kinbox.consumer.lag")
    }
    # The worker stopped: it no longer reports (after_worker_stop forgot its board)
    assert points == set()
    telemetry.telemetry.before_worker_start(_worker(board))
    points = {
        (dict(p.attributes)["partition"], p.value) for p in telemetry.points("kinbox.consumer.lag")
    }
    assert points == {("0", 7), ("2", 0)}


def _worker(board: LagBoard) -> Any:
    from kinbox.middleware.base import WorkerInfo

    return WorkerInfo("g", (T,), None, board)


def test_without_an_sdk_nothing_is_made_and_the_handler_is_called_through() -> None:
    assert not tracing_on(NoOpTracerProvider()) and not metrics_on(NoOpMeterProvider())
    assert tracing_on(TracerProvider()) and metrics_on(MeterProvider())
    telemetry = Telemetry(tracer_provider=NoOpTracerProvider(), meter_provider=NoOpMeterProvider())
    calls: list[tuple[str, bool]] = []
    app = App(group_id="g", middleware=[telemetry])

    @app.handler(T)
    def apply(event: Event, tx: Any) -> None:
        calls.append((event.id, trace.get_current_span().get_span_context().is_valid))

    run(app, traced(0, "e1"))
    assert calls == [("e1", False)]


def test_a_reused_id_is_counted_apart_from_its_plain_duplicates() -> None:
    telemetry = sdk()
    app = each_app(telemetry)
    run(
        app,
        record(T, 0, 0, "a", value=b'{"n": 1}'),
        record(T, 0, 1, "a", value=b'{"n": 2}'),  # the id again, another payload
        record(T, 0, 2, "a", value=b'{"n": 1}'),  # the id again, the same payload
    )
    [reused] = telemetry.points("kinbox.events.reused_id")
    assert reused.value == 1 and dict(reused.attributes) == {"topic": T}
    [duplicates] = telemetry.points("kinbox.events.duplicate")
    assert duplicates.value == 2
