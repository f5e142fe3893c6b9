"""kinbox itself: per-event handler, batch handler, and the same with the inbox turned off.

The per-event and batch contenders run :func:`kinbox.ops.worker.run`, the very
code ``kinbox worker`` runs, with kinbox's default settings: what a user
deploys, with nothing tuned for the benchmark.

"Inbox off" shows what deduplication costs: the same :class:`~kinbox.consume.runner.Runner`
and batch handler over a store whose claim takes every event as fresh and
records nothing, so no ``processed_events`` row is written or read. It is
at-least-once: a duplicate is applied again, and the check counts it.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from types import FrameType
from typing import Any, TypeVar

from kinbox.app import App
from kinbox.bench import effects
from kinbox.bench.spec import ChildSpec
from kinbox.core.config import Settings
from kinbox.core.event import Event
from kinbox.core.inbox import InboxStore
from kinbox.core.steps import CheckReused, Claim, DeadLetterRow, Program, Step, Steps, rewrite


def app(spec: ChildSpec, *, batch: bool, awaits: bool = False) -> App:
    """A kinbox app writing one effect row per event (set-based when ``batch``).

    With ``awaits``, its handler is ``async def``, on an ``AsyncConnection``.

    The statements are rendered to text once, so a handler executes a plain
    SQL string as the docs' example does: the run's schema and table are only
    known here, and a ``psycopg.sql.Composed`` is composed again at every
    ``execute`` (for the per-event handler that was a sixth of the worker's
    CPU, spent on the benchmark's own naming, not on kinbox or the database).
    """
    application = App(group_id=spec.group, schema=spec.schema)
    if awaits:
        return _async_app(application, spec, batch=batch)
    if batch:
        insert = effects.insert_many(spec.schema, spec.table).as_bytes()

        def handle_batch(events: list[Event], tx: Any) -> None:
            rows = [_row(e) for e in events]
            tx.execute(insert, [list(c) for c in zip(*rows, strict=True)])

        application.handler(spec.topic, batch=True)(handle_batch)
    else:
        one = effects.insert_one(spec.schema, spec.table).as_bytes()

        def handle(event: Event, tx: Any) -> None:
            tx.execute(one, _row(event))

        application.handler(spec.topic)(handle)
    return application


def _async_app(application: App, spec: ChildSpec, *, batch: bool) -> App:
    """:func:`app`'s handlers, ``async def``: the same statements, awaited."""
    if batch:
        insert = effects.insert_many(spec.schema, spec.table).as_bytes()

        async def handle_batch(events: list[Event], tx: Any) -> None:
            rows = [_row(e) for e in events]
            await tx.execute(insert, [list(c) for c in zip(*rows, strict=True)])

        application.handler(spec.topic, batch=True)(handle_batch)
    else:
        one = effects.insert_one(spec.schema, spec.table).as_bytes()

        async def handle(event: Event, tx: Any) -> None:
            await tx.execute(one, _row(event))

        application.handler(spec.topic)(handle)
    return application


def _row(event: Event) -> tuple[Any, ...]:
    body = event.json()
    return (
        event.id,
        event.partition,
        event.offset,
        body["userId"],
        body["lessonId"],
        body["sentAt"],
    )


def settings(application: App, spec: ChildSpec) -> Settings:
    """Kinbox's defaults, plus where to connect (the environment is ignored: no tuning)."""
    flags = {
        "bootstrap_servers": spec.bootstrap_servers,
        "database_url": spec.database_url,
        "kafka_overrides": dict(spec.kafka),
    }
    return application.settings(flags, {}).validate()


def serve(application: App, spec: ChildSpec) -> None:
    """Run ``application`` as ``kinbox worker`` does, with kinbox's defaults (:func:`settings`)."""
    from kinbox.ops.worker import run

    run(application, settings(application, spec))


def run_each(spec: ChildSpec) -> None:
    """``@handler``: one handler call per fresh event."""
    serve(app(spec, batch=False), spec)


def run_batch(spec: ChildSpec) -> None:
    """``@handler(batch=True)``: one call per partition batch."""
    serve(app(spec, batch=True), spec)


def run_each_async(spec: ChildSpec) -> None:
    """``async def`` ``@handler``: one awaited call per fresh event."""
    serve(app(spec, batch=False, awaits=True), spec)


def run_batch_async(spec: ChildSpec) -> None:
    """``async def`` ``@handler(batch=True)``: one awaited call per partition batch."""
    serve(app(spec, batch=True, awaits=True), spec)


T = TypeVar("T")


def _no_claim(step: Step) -> Steps[Any]:
    """A step of an inbox transaction that claims everything and remembers nothing."""
    if isinstance(step, Claim):
        return list(step.events)
    if isinstance(step, DeadLetterRow):
        return None  # nothing is recorded: without an inbox there is nowhere to say so
    if isinstance(step, CheckReused):
        return []  # every event was fresh: no duplicate to compare
    return (yield step)


class InboxOff:
    """An :class:`~kinbox.store.postgres.InboxStore` around the real one, with the claim removed."""

    def __init__(self, inner: InboxStore) -> None:
        self._inner = inner

    def run(self, program: Program[T]) -> T:
        """``program`` in the real store, its claim taking every event as fresh."""
        return self._inner.run(lambda tx: rewrite(program(tx), _no_claim))

    def known(self, events: Sequence[Event]) -> set[str]:
        """None: without an inbox nothing is recorded."""
        return set()

    def close(self) -> None:
        """Close the real store."""
        self._inner.close()


def run_inbox_off(spec: ChildSpec) -> None:
    """The batch handler on kinbox's runner, without the inbox (at-least-once)."""
    from kinbox.consume.runner import Runner
    from kinbox.kafka import KafkaTransport, dead_letter_publisher
    from kinbox.store.postgres import PostgresInboxStore

    application = app(spec, batch=True)
    config = settings(application, spec)
    store = PostgresInboxStore(
        config.database_url, schema=config.schema, consumer=config.group_id,
        pool_size=config.pool_size,
    )  # fmt: skip
    store.open()
    runner = Runner(
        application, config, KafkaTransport(config), InboxOff(store),
        publisher=dead_letter_publisher(config),
    )  # fmt: skip

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        runner.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    runner.run()
