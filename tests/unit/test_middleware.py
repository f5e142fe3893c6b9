"""Middleware: hook order, the swallow-and-log rule, registration on the App."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any

import pytest

from kinbox.app import App
from kinbox.consume.runner import Runner
from kinbox.core.config import Settings
from kinbox.core.errors import ConfigurationError, DeadLetter
from kinbox.core.event import Event
from kinbox.core.letter import Letter
from kinbox.core.outcome import BatchResult
from kinbox.core.record import Record
from kinbox.middleware.base import Middleware
from kinbox.middleware.telemetry import Telemetry
from kinbox.testing import FakePublisher, FakeStore, FakeTransport, InlineExecutor, record
from tests.support import metrics

pytestmark = pytest.mark.unit

T = "orders"


class Recorder(Middleware):
    def __init__(self, name: str, calls: list[str], fail_after: bool = False) -> None:
        self.name = name
        self.calls = calls
        self.fail_after = fail_after

    def before_batch(self, topic: str, partition: int, records: Sequence[Record]) -> None:
        self.calls.append(f"{self.name}.before {topic}[{partition}] {len(records)}")

    def after_dead_letter(self, letter: Letter) -> None:
        self.calls.append(f"{self.name}.dead {letter.record.offset} {letter.reason}")
        if self.fail_after:
            raise RuntimeError("broken dead-letter hook")

    def after_batch(
        self,
        topic: str,
        partition: int,
        records: Sequence[Record],
        result: BatchResult,
        error: BaseException | None,
    ) -> None:
        self.calls.append(f"{self.name}.after {result.applied} {result.next_offset}")
        if self.fail_after:
            raise RuntimeError("broken after hook")


def run_app(app: App, *records: Record, turns: int = 1) -> tuple[FakeTransport, FakeStore]:
    transport, store = FakeTransport(), FakeStore()
    for r in records:
        transport.append(r)
    config = Settings(database_url="postgresql:///x", group_id="g").validate()
    runner = Runner(
        app, config, transport, store, publisher=FakePublisher(), executor=InlineExecutor()
    )
    transport.subscribe([T], runner)
    for _ in range(turns):
        runner.turn()
    return transport, store


def handled_app(**kw: Any) -> App:
    app = App(group_id="g", **kw)

    @app.handler(T)
    def apply(event: Event, tx: Any) -> None:
        if event.id == "poison":
            raise DeadLetter("unknown currency")
        tx.effects.append(event.id)

    return app


def test_before_hooks_run_in_order_after_hooks_in_reverse() -> None:
    calls: list[str] = []
    app = handled_app(middleware=[Recorder("a", calls), Recorder("b", calls)])
    run_app(app, record(T, 0, 0, "x"), record(T, 0, 1, "poison"), record(T, 0, 2, "y"))
    assert calls == [
        f"a.before {T}[0] 3",
        f"b.before {T}[0] 3",
        "b.dead 1 dead-letter-requested: unknown currency",
        "a.dead 1 dead-letter-requested: unknown currency",
        "b.after 2 3",
        "a.after 2 3",
    ]


def test_a_failing_after_hook_is_logged_and_never_raised(caplog: pytest.LogCaptureFixture) -> None:
    # Given an inner middleware whose after_* hooks raise
    calls: list[str] = []
    app = handled_app(middleware=[Recorder("outer", calls), Recorder("inner", calls, True)])
    # When a batch with a dead letter runs
    transport, store = run_app(app, record(T, 0, 0, "x"), record(T, 0, 1, "poison"))
    # Then the other hooks still ran, the offset moved, and the failures were logged
    assert calls[-2:] == ["inner.after 1 2", "outer.after 1 2"]
    assert "outer.dead 1 dead-letter-requested: unknown currency" in calls
    assert store.effects == ["x"] and transport.committed == {(T, 0): 2}
    failed = [r for r in caplog.records if r.name == "kinbox.middleware.base"]
    assert [r.levelno for r in failed] == [logging.ERROR, logging.ERROR]
    assert "after_dead_letter" in failed[0].getMessage()
    assert "after_batch" in failed[1].getMessage()


def test_a_failing_before_hook_stops_the_batch_before_any_database_work() -> None:
    class Broken(Middleware):
        def before_batch(self, topic: str, partition: int, records: Sequence[Record]) -> None:
            raise RuntimeError("tracer misconfigured")

    app = handled_app(middleware=[Broken()])
    with pytest.raises(RuntimeError, match="tracer misconfigured"):
        run_app(app, record(T, 0, 0, "x"))


def test_dead_letters_of_a_rolled_back_transaction_are_not_reported() -> None:
    # Given a dead letter the broker does not acknowledge: the batch rolls back
    calls: list[str] = []
    app = handled_app(middleware=[Recorder("m", calls)])
    transport, store = FakeTransport(), FakeStore()
    transport.append(record(T, 0, 0, "poison"))
    publisher = FakePublisher()
    publisher.fail_flushes = 1
    config = Settings(database_url="postgresql:///x", group_id="g").validate()
    runner = Runner(app, config, transport, store, publisher=publisher, executor=InlineExecutor())
    transport.subscribe([T], runner)
    runner.turn()
    assert calls == [f"m.before {T}[0] 1", "m.after 0 None"]


def test_app_middleware_defaults_replacement_and_append() -> None:
    [default] = App().middleware
    assert isinstance(default, Telemetry)
    mine = Recorder("m", [])
    assert App(middleware=[mine]).middleware == (mine,)
    app = App(middleware=[])
    app.add_middleware(mine)
    assert app.middleware == (mine,)
    with pytest.raises(ConfigurationError, match="not a kinbox Middleware"):
        app.add_middleware(object())  # type: ignore[arg-type]


def test_telemetry_middleware_runs_through_a_batch_without_an_sdk() -> None:
    app = handled_app()  # Telemetry by default
    transport, store = run_app(app, record(T, 0, 0, "x"), record(T, 0, 1, "poison"))
    assert store.effects == ["x"] and transport.committed == {(T, 0): 2}


def test_telemetry_counts_each_undelivered_dead_letter_with_its_topic() -> None:
    # Given an application with the OpenTelemetry SDK, and a dead letter the
    # broker does not acknowledge twice
    metrics.install()
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    app = App(group_id="g")

    @app.handler(topic)
    def apply(event: Event, tx: Any) -> None:
        if event.id == "poison":
            raise DeadLetter("unknown currency")
        tx.effects.append(event.id)

    transport, store = FakeTransport(), FakeStore()
    for offset, event_id in enumerate(["a", "poison"]):
        transport.append(record(topic, 0, offset, event_id))
    publisher = FakePublisher()
    publisher.fail_flushes = 2
    now = [0.0]
    config = Settings(database_url="postgresql:///x", group_id="g").validate()
    runner = Runner(
        app, config, transport, store, publisher=publisher, clock=lambda: now[0],
        executor=InlineExecutor(),
    )  # fmt: skip
    transport.subscribe([topic], runner)
    # When the worker tries three times (each retry after its backoff)
    for _ in range(3):
        runner.turn()
        now[0] += 120.0
    # Then each undelivered try was counted, under the dead-letter topic, and
    # as a failed batch of kind dead-letter; the third try delivered it
    undeliverable = "kinbox.dead_letters.undeliverable"
    assert metrics.counted(undeliverable, topic=f"{topic}.dlq", source_topic=topic) == 2
    assert metrics.counted("kinbox.batches.failed", topic=topic, kind="dead-letter") == 2
    assert metrics.counted("kinbox.events.dead_lettered", topic=topic) == 1
    assert store.status == {"a": "applied", "poison": "dead_lettered"}
    assert transport.committed == {(topic, 0): 2}
