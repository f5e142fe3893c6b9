"""``enqueue_async`` on a real PostgreSQL and broker: the same row as ``enqueue``, from asyncio.

An asyncio service (FastAPI, an async kinbox handler) holds a psycopg
``AsyncConnection``; ``enqueue_async`` writes the outbox row in its
transaction. Both writers drive one sequence of steps, so these tests check
that the rows agree column by column, that the relay publishes them, and that
errors and the inbox cause come out the same.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql

from kinbox import App, Event
from kinbox.core.errors import ConfigurationError, StoreError
from kinbox.devstack.stack import Stack
from kinbox.testing import InboxTestClient
from producer_outbox import enqueue, enqueue_async
from tests.conftest import MakeTopic
from tests.support.database import Conn
from tests.support.outbox import consume, count, migrate_outbox, running_relay
from tests.support.waiting import wait_for

# What differs between two rows by design: their identity and when they were made.
_SAME = "topic, aggregatetype, aggregateid, type, payload, payload_bytes, headers, status"


def run_async(database_url: str, work: Callable[[psycopg.AsyncConnection[Any]], Any]) -> Any:
    """Run ``work`` on a fresh AsyncConnection inside one transaction, committed at the end."""

    async def main() -> Any:
        conn = await psycopg.AsyncConnection.connect(database_url)
        async with conn, conn.transaction():
            return await work(conn)

    return asyncio.run(main())


def row_of(db: Conn, schema: str, event_id: uuid.UUID) -> tuple[Any, ...]:
    query = sql.SQL("SELECT " + _SAME + " FROM {}.outbox WHERE id = %s").format(
        sql.Identifier(schema)
    )
    row = db.execute(query, (event_id,)).fetchone()
    assert row is not None, f"no outbox row {event_id}"
    return row


def test_an_async_enqueue_writes_the_row_enqueue_writes_and_the_relay_publishes_it(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> None:
    migrate_outbox(db, schema)
    topic = make_topic()
    options: dict[str, Any] = {
        "key": "u1",
        "headers": {"trace": "abc"},
        "event_type": "lesson.completed",
        "schema": schema,
    }
    payload = {"userId": "u1", "lessonId": 7}
    # Given the same event enqueued by each writer
    with db.transaction():
        sync_id = enqueue(db, topic, payload, **options)

    async def write(conn: psycopg.AsyncConnection[Any]) -> uuid.UUID:
        return await enqueue_async(conn, topic, payload, **options)

    async_id = run_async(stack.database_url, write)
    # Then the rows agree in everything but their identity
    assert row_of(db, schema, async_id) == row_of(db, schema, sync_id)
    # And the relay publishes the async one with its key and headers
    with running_relay(stack, schema):
        wait_for(lambda: count(db, schema, "status = 'sent'") == 2, what="2 rows sent")
    records = {r.event_id: r for r in consume(stack, topic, 2)}
    published = records[str(async_id)]
    assert published.key == "u1" and published.headers["trace"] == b"abc"
    assert published.headers["ce_type"] == b"lesson.completed"


def test_a_rolled_back_async_transaction_leaves_no_row(stack: Stack, schema: str, db: Conn) -> None:
    migrate_outbox(db, schema)

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(stack.database_url) as conn:
            await enqueue_async(conn, "lessons", {"n": 1}, schema=schema)
            await conn.rollback()

    asyncio.run(main())
    assert count(db, schema) == 0


def test_an_async_enqueue_fails_as_enqueue_does(stack: Stack, schema: str) -> None:
    # A bad key is refused before any statement; a missing outbox is a StoreError.
    async def bad_key(conn: psycopg.AsyncConnection[Any]) -> None:
        await enqueue_async(conn, "lessons", {}, key=b"bytes", schema=schema)  # type: ignore[arg-type]

    async def no_table(conn: psycopg.AsyncConnection[Any]) -> None:
        await enqueue_async(conn, "lessons", {}, schema=schema)

    with pytest.raises(ConfigurationError, match="must be str"):
        run_async(stack.database_url, bad_key)
    with pytest.raises(StoreError, match="cannot enqueue") as raised:
        run_async(stack.database_url, no_table)
    assert not raised.value.transient
    assert isinstance(raised.value.__cause__, psycopg.errors.UndefinedTable)


def test_an_async_handler_enqueues_with_its_inbox_event_as_the_cause(
    stack: Stack, schema: str
) -> None:
    # Given an async handler that publishes a follow-up event through the outbox
    app = App(group_id="chain")

    @app.handler("lessons")
    async def handle(event: Event, tx: psycopg.AsyncConnection[Any]) -> None:
        await enqueue_async(tx, "audit", {"seen": event.id}, key=event.id, schema=client.schema)

    client = InboxTestClient(app, stack.database_url, outbox=True)
    try:
        # When one event is delivered twice
        first = client.deliver("lessons", {"n": 1}, id="e1")
        again = client.redeliver(first)
        # Then one row was enqueued, in the inbox transaction, naming its cause
        assert (first.status, again.status) == ("applied", "duplicate")
        rows = client.execute(
            "SELECT topic, aggregateid, caused_by_consumer, caused_by_event_id FROM outbox"
        )
        assert rows == [("audit", "e1", "chain", "e1")]
    finally:
        client.close()
