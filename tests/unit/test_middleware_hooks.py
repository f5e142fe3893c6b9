"""Middleware hooks that hold something open: worker start/stop, after_batch, around_event."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kinbox.app import App
from kinbox.apply.kinds import EachEvent, WholeBatch
from kinbox.consume.runner import Runner
from kinbox.core.config import Settings
from kinbox.core.errors import FatalTransportError
from kinbox.core.event import Event
from kinbox.core.outcome import BatchResult, Failure
from kinbox.core.policy import Decision
from kinbox.core.record import Record
from kinbox.middleware.base import Middleware, WorkerInfo
from kinbox.middleware.telemetry import Telemetry
from kinbox.testing import FakePublisher, FakeStore, FakeTransport, InlineExecutor, record

pytestmark = pytest.mark.unit

T = "orders"
CONFIG = Settings(database_url="postgresql:///x", group_id="g").validate()


class Layer(Middleware):
    """Records every hook, and raises from the ones it is told to."""

    def __init__(self, name: str, calls: list[str], raise_in: str = "") -> None:
        self.name, self.calls, self.raise_in = name, calls, raise_in

    def _note(self, what: str) -> None:
        self.calls.append(f"{self.name}.{what}")
        if what.split()[0] == self.raise_in:
            raise RuntimeError(f"{self.name} broke in {what}")

    def before_worker_start(self, worker: WorkerInfo) -> None:
        self._note(f"start {worker.group_id} {','.join(worker.topics)}")

    def after_worker_stop(self, worker: WorkerInfo, error: BaseException | None) -> None:
        self._note(f"stop {type(error).__name__ if error else None}")

    def before_batch(self, topic: str, partition: int, records: Sequence[Record]) -> None:
        self._note(f"before {len(records)}")

    def around_event(self, event: Event, call_next: Callable[[Event], object]) -> object:
        self._note(f"enter {event.id}")
        try:
            return call_next(event)
        finally:
            self.calls.append(f"{self.name}.exit {event.id}")

    def around_events(
        self, events: Sequence[Event], call_next: Callable[[Sequence[Event]], object]
    ) -> object:
        self._note(f"enter-batch {len(events)}")
        return call_next(events)

    def after_batch(
        self,
        topic: str,
        partition: int,
        records: Sequence[Record],
        result: BatchResult,
        error: BaseException | None,
    ) -> None:
        self.calls.append(f"{self.name}.after {result.next_offset} {type(error).__name__}")


class StopAfter:
    """A transport that asks the runner to stop after ``turns`` polls."""

    def __init__(self, inner: FakeTransport, runner: list[Runner], turns: int = 1) -> None:
        self.inner, self.runner, self.turns = inner, runner, turns

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def poll(self, max_messages: int, timeout: float) -> list[Record]:
        self.turns -= 1
        if self.turns <= 0:
            self.runner[0].stop()
        return self.inner.poll(max_messages, timeout)


def running(app: App, *records: Record, turns: int = 1) -> tuple[Runner, FakeTransport, FakeStore]:
    transport, store = FakeTransport(), FakeStore()
    for r in records:
        transport.append(r)
    holder: list[Runner] = []
    runner = Runner(app, CONFIG, StopAfter(transport, holder, turns), store, FakePublisher())  # type: ignore[arg-type]
    holder.append(runner)
    return runner, transport, store


def per_event_app(*layers: Middleware, fail: BaseException | None = None) -> App:
    app = App(group_id="g", middleware=list(layers))

    @app.handler(T)
    def apply(event: Event, tx: Any) -> None:
        if fail is not None and event.id == "bad":
            raise fail
        tx.effects.append(event.id)

    return app


def test_worker_hooks_wrap_the_whole_run_in_order() -> None:
    calls: list[str] = []
    app = per_event_app(Layer("a", calls), Layer("b", calls))
    runner, transport, store = running(app, record(T, 0, 0, "x"))
    runner.run()
    assert calls[:2] == [f"a.start g {T}", f"b.start g {T}"]
    assert calls[-2:] == ["b.stop None", "a.stop None"]
    assert store.effects == ["x"] and transport.committed == {(T, 0): 1} and transport.closed


def test_a_failing_worker_start_stops_only_the_layers_that_started() -> None:
    calls: list[str] = []
    app = per_event_app(Layer("a", calls), Layer("b", calls, raise_in="start"), Layer("c", calls))
    runner, transport, store = running(app, record(T, 0, 0, "x"))
    with pytest.raises(RuntimeError, match="b broke in start"):
        runner.run()
    assert calls == [f"a.start g {T}", f"b.start g {T}", "a.stop RuntimeError"]
    assert store.effects == [] and transport.listener is None and transport.closed and store.closed


def test_after_worker_stop_hears_the_error_the_worker_stopped_on() -> None:
    calls: list[str] = []
    app = per_event_app(Layer("a", calls))
    runner, transport, _ = running(app, record(T, 0, 0, "x"), turns=5)
    transport.commit_errors.append(FatalTransportError("fenced"))
    with pytest.raises(FatalTransportError):
        runner.run()
    assert calls[-1] == "a.stop FatalTransportError"


def test_after_batch_runs_with_the_error_when_a_before_batch_hook_raises() -> None:
    # Given three layers, the middle one broken in before_batch
    calls: list[str] = []
    app = per_event_app(Layer("a", calls), Layer("b", calls, raise_in="before"), Layer("c", calls))
    runner, transport, store = running(app, record(T, 0, 0, "x"))
    # When the batch runs, the worker stops on the error...
    with pytest.raises(RuntimeError, match="b broke in before"):
        runner.run()
    # ...and only the layer whose before_batch completed hears after_batch, with it
    batch = [c for c in calls if ".before" in c or ".after" in c]
    assert batch == ["a.before 1", "b.before 1", "a.after None RuntimeError"]
    assert store.effects == [] and transport.committed == {}


def test_after_batch_runs_with_the_error_when_the_batch_itself_raises() -> None:
    calls: list[str] = []
    app = per_event_app(Layer("a", calls))
    runner, transport, store = running(app, record(T, 0, 0, "x"))

    def broken() -> Any:
        raise RuntimeError("a bug in a store")

    store.transaction = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="a bug in a store"):
        runner.run()
    assert "a.after None RuntimeError" in calls and transport.committed == {}


def test_around_event_wraps_each_call_first_registered_outermost() -> None:
    calls: list[str] = []
    app = per_event_app(Layer("a", calls), Layer("b", calls))
    runner, _, store = running(app, record(T, 0, 0, "x"), record(T, 0, 1, "y"))
    runner.run()
    wrapped = [c for c in calls if ".enter" in c or ".exit" in c]
    assert wrapped == [
        "a.enter x", "b.enter x", "b.exit x", "a.exit x",
        "a.enter y", "b.enter y", "b.exit y", "a.exit y",
    ]  # fmt: skip
    assert store.effects == ["x", "y"]


class Recording:
    """A failure policy that keeps what it was asked about."""

    def __init__(self) -> None:
        self.failures: list[Failure] = []

    def decide(self, failure: Failure) -> Decision:
        self.failures.append(failure)
        return Decision("retry", 60.0)


def test_a_handlers_exception_reaches_the_failure_policy_unchanged_through_the_wrappers() -> None:
    boom = ValueError("bad currency")
    calls: list[str] = []
    app = per_event_app(Layer("a", calls), Layer("b", calls), fail=boom)
    transport, store = FakeTransport(), FakeStore()
    for r in (record(T, 0, 0, "x"), record(T, 0, 1, "bad")):
        transport.append(r)
    policy = Recording()
    runner = Runner(
        app, CONFIG, transport, store, policy=policy, publisher=FakePublisher(),
        executor=InlineExecutor(),
    )  # fmt: skip
    transport.subscribe([T], runner)
    runner.turn()
    [failure] = policy.failures
    assert failure.error is boom and failure.offset == 1
    assert "a.exit bad" in calls and "b.exit bad" in calls  # both wrappers saw it leave
    assert store.effects == ["x"] and transport.committed == {(T, 0): 1}


def test_a_batch_handler_is_wrapped_by_around_events() -> None:
    calls: list[str] = []
    app = App(group_id="g", middleware=[Layer("a", calls)])

    @app.handler(T, batch=True)
    def apply(events: list[Event], tx: Any) -> None:
        tx.effects.extend(e.id for e in events)

    runner, _, store = running(app, record(T, 0, 0, "x"), record(T, 0, 1, "y"))
    runner.run()
    assert "a.enter-batch 2" in calls and not any(".enter " in c for c in calls)
    assert store.effects == ["x", "y"]


def test_the_handler_kind_is_chosen_when_the_handler_is_registered() -> None:
    app = App(group_id="g")

    @app.handler("one")
    def each(event: Event, tx: Any) -> None: ...

    @app.handler("many", batch=True)
    def whole(events: list[Event], tx: Any) -> None: ...

    assert isinstance(app.routes["one"].kind, EachEvent) and not app.routes["one"].batch
    assert isinstance(app.routes["many"].kind, WholeBatch) and app.routes["many"].batch


def test_telemetry_takes_its_own_tracer_and_meter_providers() -> None:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    app = per_event_app(Telemetry(tracer_provider=tracer_provider, meter_provider=meter_provider))
    runner, _, store = running(app, record(T, 0, 0, "x"), record(T, 0, 1, "x"))
    runner.run()
    [span] = [s for s in spans.get_finished_spans() if s.name == "kinbox.batch"]
    assert span.attributes is not None
    assert span.attributes["messaging.destination.name"] == T
    data = reader.get_metrics_data()
    assert data is not None
    sums: dict[str, float] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                points: Any = m.data.data_points
                # Histograms (process.duration, batch.size, ...) count their points.
                sums[m.name] = sum(p.value if hasattr(p, "value") else p.count for p in points)
    assert sums["kinbox.events.applied"] == 1 and sums["kinbox.events.duplicate"] == 1
    assert store.effects == ["x"]


def test_telemetry_ends_the_span_with_an_error_when_the_batch_raises() -> None:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    app = per_event_app(Telemetry(tracer_provider=provider))
    runner, _, store = running(app, record(T, 0, 0, "x"))

    def broken() -> Any:
        raise RuntimeError("a bug in a store")

    store.transaction = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        runner.run()
    [span] = [s for s in spans.get_finished_spans() if s.name == "kinbox.batch"]
    assert span.status.status_code.name == "ERROR" and span.events[0].name == "exception"
