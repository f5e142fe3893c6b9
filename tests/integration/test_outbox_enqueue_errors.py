"""``enqueue``'s errors on a real PostgreSQL: ``transient`` says whether trying again may succeed.

A web request that enqueues an event and fails must know whether to run its
transaction again. ``enqueue`` judges a failed INSERT as kinbox judges its
own statements (:func:`kinbox.store.errors.blame`): a lock or statement
timeout, a lost connection and a deadlock are worth another try; a duplicate
event id is not. Each test runs the real failure, then the retry the error
asks for, and counts the rows: nothing is lost and nothing is written twice.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import psycopg
import pytest

from kinbox.core.errors import ConflictError, StoreError
from kinbox.devstack.stack import Stack
from producer_outbox import enqueue
from tests.support.database import Conn
from tests.support.outbox import count, migrate_outbox


def _connect(stack: Stack) -> psycopg.Connection[Any]:
    return psycopg.connect(stack.database_url)


def test_a_lock_timeout_is_transient_and_the_retry_writes_one_row(
    stack: Stack, schema: str, db: Conn
) -> None:
    # Given a transaction holding an event id it has not committed yet
    migrate_outbox(db, schema)
    event_id = uuid.uuid4()
    with _connect(stack) as holder, _connect(stack) as writer:
        enqueue(holder, "lessons", {"by": "holder"}, event_id=event_id, schema=schema)
        # When another writer enqueues the same id with a lock timeout
        writer.execute("SET lock_timeout = '200ms'")
        with pytest.raises(StoreError, match="cannot enqueue event") as raised:
            enqueue(writer, "lessons", {"by": "writer"}, event_id=event_id, schema=schema)
        # Then it is told to try again, and once the holder rolled back its retry lands
        assert raised.value.transient
        assert isinstance(raised.value.__cause__, psycopg.errors.LockNotAvailable)
        writer.rollback()
        holder.rollback()
        enqueue(writer, "lessons", {"by": "writer"}, event_id=event_id, schema=schema)
        writer.commit()
    assert count(db, schema) == 1


def test_a_deadlock_between_two_writers_is_a_conflict_and_a_duplicate_is_not_transient(
    stack: Stack, schema: str, db: Conn
) -> None:
    # Given two writers that each enqueued one of two ids, uncommitted
    migrate_outbox(db, schema)
    first, second = uuid.uuid4(), uuid.uuid4()
    with _connect(stack) as a, _connect(stack) as b:
        enqueue(a, "lessons", {"n": 1}, event_id=first, schema=schema)
        enqueue(b, "lessons", {"n": 2}, event_id=second, schema=schema)
        # When each then enqueues the other's id: each waits for the other
        outcomes: dict[str, BaseException | None] = {}

        def write(name: str, conn: psycopg.Connection[Any], event_id: uuid.UUID) -> None:
            try:
                enqueue(conn, "lessons", {"n": 3}, event_id=event_id, schema=schema)
                outcomes[name] = None
            except StoreError as exc:
                outcomes[name] = exc
                conn.rollback()  # as a caller would: the victim's transaction is gone

        waiting = threading.Thread(target=write, args=("a", a, second))
        waiting.start()
        write("b", b, first)
        waiting.join(timeout=30)
        assert not waiting.is_alive()
        # Then PostgreSQL aborts one of them: a ConflictError, worth another try
        errors = [e for e in outcomes.values() if e is not None]
        assert len(errors) == 1, outcomes
        (conflict,) = errors
        assert isinstance(conflict, ConflictError) and conflict.transient
        assert isinstance(conflict.__cause__, psycopg.errors.DeadlockDetected)
        winner, loser = (a, b) if outcomes["a"] is None else (b, a)
        winner.commit()
        # And the victim's retry finds both ids enqueued: not worth another try
        with pytest.raises(StoreError) as duplicate:
            enqueue(loser, "lessons", {"n": 1}, event_id=first, schema=schema)
        assert not duplicate.value.transient
        assert isinstance(duplicate.value.__cause__, psycopg.errors.UniqueViolation)
    assert count(db, schema) == 2


def test_a_terminated_connection_is_transient_and_a_new_one_writes_the_row(
    stack: Stack, schema: str, db: Conn
) -> None:
    # Given a writer whose server process an operator terminated
    migrate_outbox(db, schema)
    event_id = uuid.uuid4()
    with _connect(stack) as writer:
        db.execute("SELECT pg_terminate_backend(%s)", (writer.info.backend_pid,))
        # When it enqueues
        with pytest.raises(StoreError) as raised:
            enqueue(writer, "lessons", {"n": 1}, event_id=event_id, schema=schema)
        # Then it is told to try again, and the retry on a new connection lands once
        assert raised.value.transient
    with _connect(stack) as again:
        enqueue(again, "lessons", {"n": 1}, event_id=event_id, schema=schema)
        again.commit()
    assert count(db, schema) == 1
