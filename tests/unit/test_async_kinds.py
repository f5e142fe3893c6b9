"""Async handlers' kinds over the fake store: the same passes and verdicts as sync ones."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Sequence
from typing import Any

import pytest

from kinbox.app import App
from kinbox.apply.batch import BatchProcessor
from kinbox.apply.kinds import AwaitedEachEvent, AwaitedWholeBatch, EachEvent, WholeBatch
from kinbox.core.errors import ConfigurationError, DeadLetter
from kinbox.core.event import Event
from kinbox.middleware.base import Middleware
from kinbox.params.signature import awaits
from kinbox.testing import FakePublisher, FakeStore, record
from tests.unit.test_failures import Harness, T


def async_app(fail: Any = None, **route: Any) -> App:
    app = App(group_id="g")

    @app.handler(T, **route)
    async def apply(event: Event, tx: Any) -> None:
        await asyncio.sleep(0)  # really suspends: the call runs on a loop
        if fail is not None:
            fail(event)
        tx.effects.append(event.id)

    return app


def test_async_def_is_recognised_and_gets_an_awaited_kind() -> None:
    app = App()

    @app.handler("a")
    async def one(event: Event, tx: Any) -> None: ...

    @app.handler("b", batch=True)
    async def many(events: list[Event], tx: Any) -> None: ...

    @app.handler("c")
    def plain(event: Event, tx: Any) -> None: ...

    class Callable_:
        async def __call__(self, event: Event, tx: Any) -> None: ...

    kinds: dict[str, type] = {topic: type(route.kind) for topic, route in app.routes.items()}
    assert kinds == {"a": AwaitedEachEvent, "b": AwaitedWholeBatch, "c": EachEvent}
    assert awaits(Callable_()) and not awaits(plain)
    assert isinstance(app.routes["b"].kind, WholeBatch) and app.routes["b"].batch


def test_async_events_are_applied_once_and_duplicates_suppressed() -> None:
    h = Harness(async_app())
    h.add(record(T, 0, 0, "a"), record(T, 0, 1, "b"), record(T, 0, 2, "a"))
    h.run()
    assert h.store.effects == ["a", "b"]
    assert h.committed == 3


def test_an_async_poison_event_is_dead_lettered_and_the_rest_applied() -> None:
    def fail(event: Event) -> None:
        if event.id == "bad":
            raise DeadLetter("no")

    h = Harness(async_app(fail))
    h.add(record(T, 0, 0, "a"), record(T, 0, 1, "bad"), record(T, 0, 2, "c"))
    h.run()
    assert h.store.effects == ["a", "c"]
    assert h.store.status["bad"] == "dead_lettered"
    assert [m.topic for m in h.publisher.acked] == [f"{T}.dlq"]
    assert h.committed == 3


def test_an_async_failure_is_retried_and_counts_its_tries() -> None:
    seen: list[int] = []

    def fail(event: Event) -> None:
        seen.append(event.attempt)
        raise RuntimeError("boom")

    h = Harness(async_app(fail, max_attempts=3))
    h.add(record(T, 0, 0, "a"))
    h.run(turns=6)
    assert seen[:3] == [1, 2, 3]
    assert h.store.status["a"] == "dead_lettered"


def test_an_async_batch_handler_gets_the_fresh_events() -> None:
    app = App(group_id="g")
    calls: list[list[str]] = []

    @app.handler(T, batch=True)
    async def apply(events: list[Event], tx: Any) -> None:
        await asyncio.sleep(0)
        calls.append([e.id for e in events])
        tx.effects.extend(e.id for e in events)

    h = Harness(app)
    h.add(record(T, 0, 0, "a"), record(T, 0, 1, "a"), record(T, 0, 2, "b"))
    h.run()
    assert calls == [["a", "b"]]
    assert h.store.effects == ["a", "b"]


def test_middleware_context_reaches_the_coroutine() -> None:
    # Telemetry's span and kinbox's cause are context variables set around
    # the call on the batch thread: the coroutine must see them.
    current = contextvars.ContextVar("current", default="none")
    seen: list[str] = []

    class Around(Middleware):
        def around_event(self, event: Event, call: Any) -> object:
            token = current.set(event.id)
            try:
                return call(event)
            finally:
                current.reset(token)

    app = App(group_id="g", middleware=[Around()])

    @app.handler(T)
    async def apply(event: Event, tx: Any) -> None:
        seen.append(current.get())

    h = Harness(app)
    h.add(record(T, 0, 0, "x"))
    h.run()
    assert seen == ["x"]


def test_a_store_that_cannot_run_async_handlers_is_refused_at_start() -> None:
    class SyncOnly:
        def __init__(self) -> None:
            self._store = FakeStore()

        def run(self, program: Any) -> Any:
            return self._store.run(program)

        def known(self, events: Sequence[Event]) -> set[str]:
            return self._store.known(events)

        def close(self) -> None: ...

    with pytest.raises(ConfigurationError, match="async handler"):
        BatchProcessor(async_app().routes, SyncOnly(), ["event-id"], publisher=FakePublisher())


def test_mixed_app_runs_each_route_in_its_own_store() -> None:
    picked: list[str] = []

    class Two(FakeStore):
        def __init__(self) -> None:
            super().__init__()
            self.async_side = FakeStore()

        def for_async(self) -> FakeStore:
            picked.append("async")
            return self.async_side

    app = async_app()

    @app.handler("sync-topic")
    def plain(event: Event, tx: Any) -> None:
        tx.effects.append(event.id)

    store = Two()
    processor = BatchProcessor(app.routes, store, ["event-id"], publisher=FakePublisher())
    processor.process([record(T, 0, 0, "a")])
    processor.process([record("sync-topic", 0, 0, "s")])
    assert picked == ["async"]
    assert store.async_side.effects == ["a"] and store.effects == ["s"]


def test_a_cancelled_coroutine_is_a_failed_try_never_the_end_of_the_worker() -> None:
    def fail(event: Event) -> None:
        raise asyncio.CancelledError("a cancel scope gone wrong")

    h = Harness(async_app(fail, max_attempts=2))
    h.add(record(T, 0, 0, "a"), record(T, 0, 1, "b"))
    h.run(turns=4)
    assert h.store.status == {"a": "dead_lettered", "b": "dead_lettered"}
    assert h.committed == 2
