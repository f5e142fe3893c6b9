"""Conflicts against the real server: redone at once without counting a try, but never forever.

PostgreSQL aborts a transaction to resolve a deadlock (``40P01``) or a
serialization failure (``40001``). The batch is redone at once, up to
:data:`~kinbox.apply.narrow.CONFLICT_RETRIES` times in a row, without
counting a try of any event; one more conflict counts as a try of the event
whose handler met it, so an event that conflicts every time is dead-lettered
after ``max_attempts`` like any failing event, and its partition moves on.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from psycopg import sql

from kinbox.app import App
from kinbox.apply.batch import BatchProcessor
from kinbox.apply.narrow import CONFLICT_RETRIES
from kinbox.core.event import Event
from kinbox.devstack.stack import Stack
from kinbox.store.postgres import PostgresInboxStore
from kinbox.testing import FakePublisher, record
from tests.integration.inbox_support import effects
from tests.support.database import Conn, prepare_schema

# A serialization failure raised by the server itself, as a SERIALIZABLE
# transaction meets one: the same SQLSTATE, the same abort.
SERIALIZATION_FAILURE = (
    "DO $$ BEGIN RAISE EXCEPTION 'could not serialize access due to concurrent update'"
    " USING ERRCODE = 'serialization_failure'; END $$"
)


class Conflicts:
    """A store on the test's schema, handlers that write an effect, and the calls they got."""

    def __init__(self, stack: Stack, schema: str, db: Conn) -> None:
        prepare_schema(stack.database_url, schema)
        table = sql.Identifier(schema)
        db.execute(sql.SQL("CREATE TABLE {}.accounts (id int PRIMARY KEY, n int)").format(table))
        db.execute(sql.SQL("INSERT INTO {}.accounts VALUES (1, 0), (2, 0)").format(table))
        self.store = PostgresInboxStore(
            stack.database_url, schema=schema, consumer="g", pool_size=2
        )
        self.store.open()
        self.publisher = FakePublisher()
        self.calls: Counter[str] = Counter()
        self._effect = sql.SQL(
            'INSERT INTO {}.effects (consumer, event_id, topic, partition, "offset", pid)'
            " VALUES ('g', %s, %s, %s, %s, 0)"
        ).format(table)
        self._bump = sql.SQL("UPDATE {}.accounts SET n = n + 1 WHERE id = %s").format(table)

    def processor(self, handler: Any, max_attempts: int = 3, batch: bool = False) -> BatchProcessor:
        app = App(group_id="g", middleware=[])
        for topic in ("t", "u"):
            app.handler(topic, max_attempts=max_attempts, batch=batch)(handler)
        return BatchProcessor(
            app.routes, self.store, ["event-id"], publisher=self.publisher, consumer="g"
        )

    def effect(self, event: Event, tx: Any) -> None:
        self.calls[event.id] += 1
        tx.execute(self._effect, (event.id, event.topic, event.partition, event.offset))

    def bump(self, tx: Any, account: int) -> None:
        tx.execute(self._bump, (account,))


@pytest.fixture
def conflicts(stack: Stack, schema: str, db: Conn) -> Iterator[Conflicts]:
    c = Conflicts(stack, schema, db)
    yield c
    c.store.close()


def test_a_conflict_every_time_counts_as_a_try_after_the_bound_and_is_dead_lettered(
    conflicts: Conflicts, db: Conn, schema: str
) -> None:
    # Given a handler whose statement for "bad" always fails as a serialization failure
    def handler(event: Event, tx: Any) -> None:
        conflicts.effect(event, tx)
        if event.id == "bad":
            tx.execute(SERIALIZATION_FAILURE)

    processor = conflicts.processor(handler, max_attempts=2)
    batch = [record("t", 0, o, i) for o, i in enumerate(["a", "bad", "c"])]
    # When its batch is applied on the events' first try
    first = processor.process(batch, 1)
    # Then it was redone at once CONFLICT_RETRIES times, and the next conflict
    # counted as the bad event's first try: the event before it committed
    failure = first.failure
    assert failure is not None and failure.kind == "handler" and failure.event is not None
    assert (failure.event.id, failure.attempt) == ("bad", 1)
    assert "SerializationFailure" in str(failure.error) or "serializ" in str(failure.error)
    assert (first.next_offset, first.applied) == (1, 1)
    plain = CONFLICT_RETRIES + 1  # the redone passes, and the one that counted
    assert conflicts.calls["bad"] == 1 + plain  # the pipelined pass, then the plain ones
    # When the partition comes back to it on its last try
    conflicts.calls.clear()
    last = processor.process(batch[1:], 2)
    # Then the same bound ends in a verdict: dead-lettered, and the partition moves on
    assert (last.next_offset, last.applied, last.dead_lettered, last.failure) == (3, 1, 1, None)
    assert conflicts.calls["bad"] == 1 + plain
    assert [row[1] for row in effects(db, schema)] == ["a", "c"]
    [letter] = conflicts.publisher.acked
    assert conflicts.publisher.headers(0)["kinbox.dlq.reason"] == "handler-error"
    assert letter.value == b"{}"


def test_a_conflict_that_passes_is_redone_without_counting_a_try(
    conflicts: Conflicts, db: Conn, schema: str
) -> None:
    # Given a handler whose statement for "flaky" fails as a conflict twice, then not
    left = [2]

    def handler(event: Event, tx: Any) -> None:
        conflicts.effect(event, tx)
        if event.id == "flaky" and left[0]:
            left[0] -= 1
            tx.execute(SERIALIZATION_FAILURE)

    processor = conflicts.processor(handler, max_attempts=1)
    batch = [record("t", 0, o, i) for o, i in enumerate(["a", "flaky", "c"])]
    # When its batch is applied on its only try (max_attempts=1)
    result = processor.process(batch, 1)
    # Then every event is applied once: the conflicts were no tries
    assert (result.next_offset, result.applied, result.failure) == (3, 3, None)
    assert [row[1] for row in effects(db, schema)] == ["a", "flaky", "c"]
    assert conflicts.publisher.acked == []


def test_two_batches_that_deadlock_both_apply_without_counting_a_try(
    conflicts: Conflicts, db: Conn, schema: str
) -> None:
    # Given two partitions' batches whose (batch) handlers lock the same two
    # rows in opposite orders, each waiting for the other to hold its first row
    both = threading.Barrier(2, timeout=20)

    def handler(events: list[Event], tx: Any) -> None:
        for event in events:
            conflicts.effect(event, tx)
            first, second = (1, 2) if event.topic == "t" else (2, 1)
            conflicts.bump(tx, first)
            if conflicts.calls[event.id] == 1:
                both.wait()  # on the first call only: the redo runs freely
            conflicts.bump(tx, second)

    processor = conflicts.processor(handler, max_attempts=1, batch=True)
    batches = [[record(topic, 0, 0, f"{topic}-0")] for topic in ("t", "u")]
    # When they run side by side (each on its own connection), so PostgreSQL
    # breaks the deadlock by aborting one of them
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda b: processor.process(b, 1), batches))
    # Then both apply on their only try: the aborted one was redone, no try counted
    assert [(r.next_offset, r.applied, r.failure) for r in results] == [(1, 1, None)] * 2
    assert sorted(row[1] for row in effects(db, schema)) == ["t-0", "u-0"]
    assert sorted(conflicts.calls.values()) == [1, 2]
    counts = db.execute(
        sql.SQL("SELECT n FROM {}.accounts ORDER BY id").format(sql.Identifier(schema))
    ).fetchall()
    assert counts == [(2,), (2,)]
    assert conflicts.publisher.acked == []
