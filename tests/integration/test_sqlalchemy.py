"""A SQLAlchemy Session in the inbox transaction, against the real broker and PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from sqlalchemy import event, func, select
from sqlalchemy.orm import Session

from kinbox.app import App
from kinbox.core.errors import TransactionControlError
from kinbox.core.event import Event
from kinbox.devstack.stack import Stack
from kinbox.params.wrap import prepare
from kinbox.store.orm import engine_for
from kinbox.store.postgres import PostgresInboxStore
from tests.conftest import MakeTopic
from tests.integration.failure_support import dead_letters, header, running, statuses
from tests.integration.inbox_support import committed, settings
from tests.integration.orm_support import Note, note_rows, on_path, run_three_notes
from tests.integration.orm_support import notes as notes  # a fixture of the tests here
from tests.integration.typed_support import produce_values
from tests.support.database import Conn
from tests.support.waiting import wait_for


def app_on(make_topic: MakeTopic, schema: str) -> tuple[App, str, str]:
    """A one-partition topic and a group on ``schema``: ``(app, topic, group)``."""
    group = f"g-{uuid.uuid4().hex[:8]}"
    return App(group_id=group, schema=schema), make_topic(partitions=1), group


def test_orm_effects_commit_with_the_claim_and_a_duplicate_is_suppressed(
    stack: Stack, make_topic: MakeTopic, notes: str, db: Conn
) -> None:
    # Given a handler that writes through the ORM, and an event delivered twice
    app, topic, group = app_on(make_topic, notes)

    @app.handler(topic)
    def apply(payload: dict[str, str], session: Session, event: Event) -> None:
        session.add(Note(event_id=event.id, text=payload["text"]))

    # When a worker consumes them, then each event's ORM row committed once, with its claim
    run_three_notes(stack, app, topic, group, notes, db)


def test_a_failed_try_commits_nothing_even_after_session_commit(
    stack: Stack, make_topic: MakeTopic, notes: str, db: Conn
) -> None:
    # Given a handler that adds a row, commits its session, then fails on its first try
    app, topic, group = app_on(make_topic, notes)
    tries: list[str] = []

    @app.handler(topic, max_attempts=3)
    def apply(payload: bytes, session: Session, event: Event) -> None:
        tries.append(event.id)
        session.add(Note(event_id=event.id, text=f"try {len(tries)}"))
        session.commit()  # harmless: only the session's savepoint
        if len(tries) == 1:
            raise RuntimeError("crash after the session committed")

    config = settings(stack.bootstrap_servers, on_path(stack.database_url, notes), group, notes)
    produce_values(stack.bootstrap_servers, topic, [("e1", b"x")])

    # When a worker consumes it
    with running(app, config):
        wait_for(lambda: committed(stack.bootstrap_servers, group, topic, 1) == {0: 1})

    # Then only the second try's row exists: the first went with its rollback
    assert tries == ["e1", "e1"]
    assert note_rows(db, notes) == [("e1", "try 2")]


def test_a_poison_event_mid_batch_is_redone_carefully_with_the_session(
    stack: Stack, make_topic: MakeTopic, notes: str, db: Conn
) -> None:
    # Given an ORM handler that fails for one event of a batch, for good (one try)
    app, topic, group = app_on(make_topic, notes)

    @app.handler(topic, max_attempts=1)
    def apply(payload: str, session: Session, event: Event) -> None:
        session.add(Note(event_id=event.id, text=payload))
        session.flush()
        if payload == "poison":
            raise ValueError("cannot apply poison")

    config = settings(stack.bootstrap_servers, on_path(stack.database_url, notes), group, notes)
    records = [("e1", b"a"), ("e2", b"b"), ("p", b"poison"), ("e3", b"c"), ("e4", b"d")]
    produce_values(stack.bootstrap_servers, topic, records)

    # When a worker consumes them (one batch: optimistic pass, then the careful redo)
    with running(app, config):
        wait_for(lambda: committed(stack.bootstrap_servers, group, topic, 1) == {0: 5})

    # Then the others are applied once each, the poison's row is gone, and it is dead-lettered
    assert note_rows(db, notes) == [("e1", "a"), ("e2", "b"), ("e3", "c"), ("e4", "d")]
    assert statuses(db, notes, group)["p"][0] == "dead_lettered"
    [letter] = dead_letters(config, f"{topic}.dlq")
    assert header(letter, "kinbox.dlq.reason") == "handler-error"


# --- the session and the transaction, in one inbox transaction without Kafka ---------------


@pytest.fixture
def store(stack: Stack, notes: str) -> Iterator[PostgresInboxStore]:
    inbox = PostgresInboxStore(on_path(stack.database_url, notes), schema=notes, consumer="g")
    inbox.open()
    yield inbox
    inbox.close()


def one_event(value: bytes = b"x") -> Event:
    return Event(id=f"e-{uuid.uuid4().hex[:8]}", topic="t", partition=0, offset=0, key=None,
                 value=value)  # fmt: skip


def count_elsewhere(database_url: str, schema: str) -> int:
    """Rows of ``notes`` a separate connection sees: only what has committed."""
    with psycopg.connect(database_url) as other:
        query = sql.SQL("SELECT count(*) FROM {}.notes").format(sql.Identifier(schema))
        row = other.execute(query).fetchone()
    assert row is not None
    return int(row[0])


def test_session_commit_sends_no_commit_and_nothing_escapes_the_transaction(
    stack: Stack, notes: str, store: PostgresInboxStore
) -> None:
    # Given a handler that commits its session and then looks from another connection
    seen: list[int] = []
    statements: list[str] = []

    def handler(payload: bytes, session: Session, tx: Any) -> None:
        session.add(Note(event_id="a", text="a"))
        session.commit()
        seen.append(count_elsewhere(stack.database_url, notes))
        session.add(Note(event_id="b", text="b"))

    call = prepare(handler, batch=False, where="test").bound(store, None).call

    # When it runs in an inbox transaction that then rolls back (a crash before COMMIT)
    with pytest.raises(RuntimeError, match="crash"), store.transaction() as tx:
        event.listen(engine_for(tx.connection), "before_cursor_execute", _record(statements))
        call(one_event(), tx.connection)
        assert count_elsewhere(stack.database_url, notes) == 0
        raise RuntimeError("crash between the handler and the commit")

    # Then nothing was ever visible outside, nothing committed, and SQLAlchemy sent
    # savepoints only, never a COMMIT or ROLLBACK of its own
    assert seen == [0]
    assert count_elsewhere(stack.database_url, notes) == 0
    words = {s.split()[0] for s in statements}
    assert words <= {"SAVEPOINT", "RELEASE", "INSERT", "SELECT"}, statements


def test_session_rollback_undoes_the_session_s_work_only(
    stack: Stack, notes: str, store: PostgresInboxStore, db: Conn
) -> None:
    def handler(payload: bytes, session: Session, tx: psycopg.Connection[Any]) -> None:
        session.add(Note(event_id="undone", text="undone"))
        session.flush()
        session.rollback()
        session.add(Note(event_id="kept", text="kept"))
        assert session.scalar(select(func.count()).select_from(Note)) == 1

    call = prepare(handler, batch=False, where="test").bound(store, None).call
    with store.transaction() as tx:
        call(one_event(), tx.connection)
    assert note_rows(db, notes) == [("kept", "kept")]


def test_a_handler_cannot_end_the_inbox_transaction(
    stack: Stack, notes: str, store: PostgresInboxStore
) -> None:
    def commits(payload: bytes, session: Session) -> None:
        session.add(Note(event_id="c", text="c"))
        session.connection().commit()

    def rolls_back(payload: bytes, session: Session) -> None:
        session.connection().rollback()

    for handler, verb in ((commits, "commit"), (rolls_back, "roll back")):
        call = prepare(handler, batch=False, where="test").bound(store, None).call
        with (
            pytest.raises(TransactionControlError, match=f"cannot {verb} the inbox transaction"),
            store.transaction() as tx,
        ):
            call(one_event(), tx.connection)
    assert count_elsewhere(stack.database_url, notes) == 0


def test_the_engine_follows_kinbox_s_connection(stack: Stack) -> None:
    # An engine per psycopg connection, forgotten once kinbox's pool closed it
    with psycopg.connect(stack.database_url) as first:
        engine = engine_for(first)
        assert engine_for(first) is engine
    with psycopg.connect(stack.database_url) as second:
        assert engine_for(second) is not engine


def _record(statements: list[str]) -> Any:
    def listener(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    return listener
