"""The per-event paths (optimistic, careful) against the real server (no broker needed)."""

from __future__ import annotations

import contextlib
from typing import Any

import psycopg
from psycopg import sql

from kinbox.app import App
from kinbox.apply.batch import BatchProcessor
from kinbox.core.errors import DeadLetter
from kinbox.core.event import Event
from kinbox.core.outcome import BatchResult
from kinbox.devstack.stack import Stack
from kinbox.store.postgres import PostgresInboxStore
from kinbox.testing import FakePublisher, record
from tests.integration.inbox_support import effects
from tests.support.database import Conn, prepare_schema


def process(stack: Stack, schema: str, ids: list[str]) -> tuple[BatchResult, FakePublisher]:
    """Run one batch of ``ids`` on its last try through a handler that inserts each id.

    Except ``poison``, which asks to be dead-lettered, and ``swallow``, which
    catches a database error and returns as if all was well.
    """
    prepare_schema(stack.database_url, schema)
    insert = sql.SQL(
        'INSERT INTO {}.effects (consumer, event_id, topic, partition, "offset", pid)'
        " VALUES ('g', %s, %s, %s, %s, 0)"
    ).format(sql.Identifier(schema))
    app = App(group_id="g", middleware=[])

    @app.handler("t", max_attempts=1)
    def apply(event: Event, tx: Any) -> None:
        if event.id == "poison":
            raise DeadLetter("poison")
        if event.id == "swallow":
            with contextlib.suppress(psycopg.errors.DivisionByZero):
                tx.execute("SELECT 1/0")  # aborts the transaction, whatever the handler thinks
            return
        tx.execute(insert, (event.id, event.topic, event.partition, event.offset))

    store = PostgresInboxStore(stack.database_url, schema=schema, consumer="g")
    store.open()
    publisher = FakePublisher()
    processor = BatchProcessor(app.routes, store, ["event-id"], publisher=publisher, consumer="g")
    try:
        return processor.process([record("t", 0, o, i) for o, i in enumerate(ids)]), publisher
    finally:
        store.close()


def test_a_handler_that_swallows_a_database_error_is_blamed_for_it(
    stack: Stack, schema: str, db: Conn
) -> None:
    # Given a handler that catches a database error and returns as if all was well,
    # when it runs in the middle of a batch, on its last try
    result, publisher = process(stack, schema, ["a", "swallow", "b"])
    # Then that event, not the next one, is dead-lettered, and the others are applied once
    assert (result.next_offset, result.applied, result.dead_lettered) == (3, 2, 1)
    assert [row[1] for row in effects(db, schema)] == ["a", "b"]
    headers = publisher.headers(0)
    assert headers["kinbox.dlq.offset"] == "1"
    assert headers["kinbox.dlq.error.type"] == "StoreError"
    assert "aborted" in headers["kinbox.dlq.error.message"]


def test_a_handler_that_swallows_a_database_error_under_a_savepoint_is_blamed_alone(
    stack: Stack, schema: str, db: Conn
) -> None:
    # Given a batch that goes the careful way (a dead letter in it), with the
    # swallowing handler in it and a healthy event after it
    result, publisher = process(stack, schema, ["a", "poison", "b", "swallow", "c"])
    # Then only the two culprits are dead-lettered: the savepoint rolled back the
    # aborted work, so the event after the swallowing one was not blamed for it
    assert (result.next_offset, result.applied, result.dead_lettered) == (5, 3, 2)
    assert [row[1] for row in effects(db, schema)] == ["a", "b", "c"]
    assert [publisher.headers(i)["kinbox.dlq.offset"] for i in range(2)] == ["1", "3"]
    assert "left the transaction aborted" in publisher.headers(1)["kinbox.dlq.error.message"]
