"""Which inbox event a handler works for, as enqueue sees it (kinbox.core.cause)."""

from __future__ import annotations

from typing import Any

import pytest

from kinbox.app import App
from kinbox.apply.batch import BatchProcessor
from kinbox.core import cause
from kinbox.core.event import Event
from kinbox.testing import FakeStore, record

pytestmark = pytest.mark.unit


def run(app: App, ids: list[str]) -> None:
    processor = BatchProcessor(app.routes, FakeStore(), ("event-id",), consumer="billing")
    result = processor.process([record("orders", 0, n, i) for n, i in enumerate(ids)])
    assert result.failure is None


def test_a_per_event_handler_works_for_its_event_and_the_cause_ends_with_the_call() -> None:
    seen: list[cause.Cause | None] = []
    app = App(group_id="billing")

    @app.handler("orders")
    def on_order(event: Event, tx: Any) -> None:
        seen.append(cause.current())

    run(app, ["a", "b"])
    assert seen == [cause.Cause("billing", "a"), cause.Cause("billing", "b")]
    assert cause.current() is None


def test_a_batch_handler_names_one_event_only_when_it_says_which() -> None:
    seen: list[cause.Cause | None] = []
    app = App(group_id="billing")

    @app.handler("orders", batch=True)
    def on_orders(events: list[Event], tx: Any) -> None:
        seen.append(cause.current())
        for event in events:
            with cause.caused_by(event):
                seen.append(cause.current())
        seen.append(cause.current())

    run(app, ["a", "b"])
    assert seen == [
        cause.Cause("billing", None),
        cause.Cause("billing", "a"),
        cause.Cause("billing", "b"),
        cause.Cause("billing", None),
    ]


def test_caused_by_outside_a_handler_sets_nothing() -> None:
    event = Event(id="x", topic="t", partition=0, offset=0, key=None, value=b"")
    with cause.caused_by(event):
        assert cause.current() is None
