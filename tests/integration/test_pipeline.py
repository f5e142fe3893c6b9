"""Per-event handlers under psycopg's pipeline mode, against the real server (no broker needed).

The optimistic pass sends every handler's statements without waiting for
each result, so PostgreSQL's answer to a failed statement may come back while
a later event's handler runs, or only at the end. These tests prove that the
failure is still blamed on the event whose statement failed, and on nothing
else: a failure under the pipeline rolls the batch back and redoes it without
the pipeline, where each statement's error is raised in its own handler.
"""

from __future__ import annotations

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

IDS = ["e0", "e1", "bad", "e3", "e4", "e5"]
"""``bad`` (offset 2) writes an amount its table's CHECK refuses; the others are fine."""


class Pipelines:
    """A handler per event writing two statements, noting whether each call ran pipelined."""

    def __init__(self, stack: Stack, schema: str, db: Conn) -> None:
        prepare_schema(stack.database_url, schema)
        table = sql.Identifier(schema)
        db.execute(
            sql.SQL("CREATE TABLE {}.amounts (event_id text, amount int CHECK (amount < 100))")
            .format(table)
        )  # fmt: skip
        db.execute(sql.SQL("CREATE TABLE {}.counter (n int)").format(table))
        db.execute(sql.SQL("INSERT INTO {}.counter VALUES (0)").format(table))
        self.calls: list[tuple[str, bool]] = []
        self.publisher = FakePublisher()
        self._store = PostgresInboxStore(stack.database_url, schema=schema, consumer="g")
        self._store.open()
        self._effect = sql.SQL(
            'INSERT INTO {}.effects (consumer, event_id, topic, partition, "offset", pid)'
            " VALUES ('g', %s, %s, %s, %s, 0)"
        ).format(table)
        self._amount = sql.SQL("INSERT INTO {}.amounts VALUES (%s, %s)").format(table)
        self._count = sql.SQL("UPDATE {}.counter SET n = n + 1").format(table)
        self._read = sql.SQL("SELECT count(*) FROM {}.effects").format(table)
        self._copy = sql.SQL(
            'COPY {}.effects (consumer, event_id, topic, partition, "offset", pid) FROM STDIN'
        ).format(table)
        self._find = sql.SQL("SELECT event_id FROM {}.effects WHERE event_id = %s").format(table)

    def close(self) -> None:
        self._store.close()

    def processor(self, handler: Any, max_attempts: int = 3) -> BatchProcessor:
        app = App(group_id="g", middleware=[])
        app.handler("t", max_attempts=max_attempts)(handler)
        return BatchProcessor(
            app.routes, self._store, ["event-id"], publisher=self.publisher, consumer="g"
        )

    def note(self, event: Event, tx: Any) -> None:
        self.calls.append((event.id, tx.pgconn.pipeline_status != psycopg.pq.PipelineStatus.OFF))

    def two_statements(self, event: Event, tx: Any) -> None:
        """The effect row, then an amount (refused for ``bad``), then a counter update."""
        self.note(event, tx)
        tx.execute(self._effect, (event.id, event.topic, event.partition, event.offset))
        tx.execute(self._amount, (event.id, 500 if event.id == "bad" else 1))
        tx.execute(self._count)

    def reading(self, event: Event, tx: Any) -> None:
        """Reads how many effects this transaction wrote so far, and writes its own after them."""
        self.note(event, tx)
        (before,) = tx.execute(self._read).fetchone()
        tx.execute(self._effect, (event.id, event.topic, event.partition, before))

    def copying(self, event: Event, tx: Any) -> None:
        """Writes its effect with COPY, reads it back with stream() and a server-side cursor."""
        self.note(event, tx)
        with tx.cursor().copy(self._copy) as copy:
            copy.write_row(("g", event.id, event.topic, event.partition, event.offset, 0))
        streamed = list(tx.cursor().stream(self._find, (event.id,)))
        with tx.cursor(name="effects") as named:
            named.execute(self._find, (event.id,))
            assert named.fetchall() == streamed == [(event.id,)]


def batch(first: int = 0) -> list[Any]:
    return [record("t", 0, o, IDS[o]) for o in range(first, len(IDS))]


def statuses(db: Conn, schema: str) -> dict[str, str]:
    query = sql.SQL("SELECT event_id, status FROM {}.processed_events").format(
        sql.Identifier(schema)
    )
    return dict(db.execute(query).fetchall())


def counter(db: Conn, schema: str) -> int:
    row = db.execute(sql.SQL("SELECT n FROM {}.counter").format(sql.Identifier(schema))).fetchone()
    assert row is not None
    return int(row[0])


def run(pipelines: Pipelines, handler: Any, first: int, attempt: int) -> BatchResult:
    return pipelines.processor(handler).process(batch(first), attempt)


def test_a_refused_statement_under_the_pipeline_counts_a_try_for_its_own_event_only(
    stack: Stack, schema: str, db: Conn
) -> None:
    p = Pipelines(stack, schema, db)
    try:
        # Given a batch whose third event's statement is refused (a CHECK), with
        # later events executing statements too, on the events' first try
        result = run(p, p.two_statements, 0, 1)
        # Then the failure is the third event's, on its first try, and nothing else's:
        # the two before it are applied, it and those after it are not (not even claimed)
        failure = result.failure
        assert failure is not None and failure.kind == "handler" and failure.event is not None
        assert (failure.event.id, failure.offset, failure.attempt) == ("bad", 2, 1)
        assert "CheckViolation" in type(failure.error).__name__ + str(failure.error)
        assert (result.next_offset, result.applied, result.dead_lettered) == (2, 2, 0)
        assert [row[1] for row in effects(db, schema)] == ["e0", "e1"]
        assert statuses(db, schema) == {"e0": "applied", "e1": "applied"}
        assert counter(db, schema) == 2 and p.publisher.acked == []
        # The first pass ran pipelined; the failing try that counted did not
        assert p.calls[0] == ("e0", True)
        assert ("bad", False) in p.calls
        # When the partition comes back to it on its last try (the batch starts there)
        p.calls.clear()
        last = run(p, p.two_statements, 2, 3)
        # Then that event alone is dead-lettered, and every later one applied once
        assert (last.next_offset, last.applied, last.dead_lettered) == (6, 3, 1)
        assert last.failure is None
        assert [row[1] for row in effects(db, schema)] == ["e0", "e1", "e3", "e4", "e5"]
        assert statuses(db, schema) == {
            "e0": "applied", "e1": "applied", "bad": "dead_lettered",
            "e3": "applied", "e4": "applied", "e5": "applied",
        }  # fmt: skip
        assert counter(db, schema) == 5
        [letter] = p.publisher.acked
        headers = p.publisher.headers(0)
        assert (letter.value, headers["kinbox.dlq.offset"]) == (b"{}", "2")
        assert headers["kinbox.dlq.attempts"] == "3"
        assert "amount" in headers["kinbox.dlq.error.message"]
    finally:
        p.close()


def test_a_handlers_own_exception_under_the_pipeline_is_judged_without_a_redo(
    stack: Stack, schema: str, db: Conn
) -> None:
    p = Pipelines(stack, schema, db)

    def refuses_bad(event: Event, tx: Any) -> None:
        if event.id == "bad":
            p.note(event, tx)
            raise DeadLetter("no such customer")
        p.two_statements(event, tx)

    try:
        # Given a handler that gives up one event itself (no database error)
        result = run(p, refuses_bad, 0, 1)
        # Then only that event is dead-lettered; its handler ran once, pipelined,
        # and the careful pass that followed did not call it again
        assert (result.next_offset, result.applied, result.dead_lettered) == (6, 5, 1)
        assert [c for c in p.calls if c[0] == "bad"] == [("bad", True)]
        assert statuses(db, schema)["bad"] == "dead_lettered"
        assert [row[1] for row in effects(db, schema)] == ["e0", "e1", "e3", "e4", "e5"]
        assert counter(db, schema) == 5
    finally:
        p.close()


def test_a_handler_reading_results_under_the_pipeline_sees_the_batch_so_far(
    stack: Stack, schema: str, db: Conn
) -> None:
    p = Pipelines(stack, schema, db)
    try:
        # Given a handler that reads (fetchone) before it writes, in a clean batch
        result = run(p, p.reading, 0, 1)
        # Then every read waited for its result, which holds the earlier events'
        # writes of the same transaction; each handler ran once, pipelined
        assert (result.next_offset, result.applied, result.failure) == (6, 6, None)
        assert [(row[1], row[3]) for row in effects(db, schema)] == [
            (event_id, n) for n, event_id in enumerate(IDS)
        ]
        assert p.calls == [(event_id, True) for event_id in IDS]
    finally:
        p.close()


def test_a_handler_using_copy_stream_or_a_server_cursor_is_applied_as_without_the_pipeline(
    stack: Stack, schema: str, db: Conn
) -> None:
    p = Pipelines(stack, schema, db)
    try:
        # Given a handler writing with COPY and reading with stream() and a
        # named cursor, all of which psycopg refuses in pipeline mode
        result = run(p, p.copying, 0, 1)
        # Then every event is applied once, on its first try: the pipelined
        # pass was redone without the pipeline, and no event was blamed
        assert (result.next_offset, result.applied, result.failure) == (6, 6, None)
        assert [row[1] for row in effects(db, schema)] == IDS
        assert p.calls[0] == ("e0", True)
        assert p.calls[1:] == [(event_id, False) for event_id in IDS]
    finally:
        p.close()
