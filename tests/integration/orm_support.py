"""The ORM side of the SQLAlchemy tests (sync and async): a model, its table, reading it back."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from kinbox.app import App
from kinbox.devstack.stack import Stack
from tests.integration.failure_support import running, statuses
from tests.integration.inbox_support import committed, settings
from tests.integration.typed_support import produce_values
from tests.support.database import Conn, prepare_schema
from tests.support.waiting import wait_for


class Base(DeclarativeBase):
    pass


class Note(Base):
    """An ORM model, as a team's repository would have it (in the test's schema: on_path)."""

    __tablename__ = "notes"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    event_id: Mapped[str] = mapped_column(String)
    text: Mapped[str] = mapped_column(String(20))


@pytest.fixture
def notes(stack: Stack, schema: str) -> Iterator[str]:
    """The test's schema, migrated, with the ORM's ``notes`` table in it."""
    prepare_schema(stack.database_url, schema)
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE TABLE {}.notes (id bigserial PRIMARY KEY, event_id text, text varchar(20))"
            ).format(sql.Identifier(schema))
        )
    yield schema


def note_rows(db: Conn, schema: str) -> list[tuple[str, str]]:
    query = sql.SQL("SELECT event_id, text FROM {}.notes ORDER BY id").format(
        sql.Identifier(schema)
    )
    return [(r[0], r[1]) for r in db.execute(query).fetchall()]


def on_path(database_url: str, schema: str) -> str:
    """``database_url`` with the test's schema first on the search path (for ``notes``)."""
    return f"{database_url}?options=-csearch_path%3D{schema}"


def run_three_notes(stack: Stack, app: App, topic: str, group: str, notes: str, db: Conn) -> None:
    """Deliver e1, e2 and e1 again to ``app`` through a real worker; each note is there once."""
    config = settings(stack.bootstrap_servers, on_path(stack.database_url, notes), group, notes)
    records = [("e1", b'{"text": "one"}'), ("e2", b'{"text": "two"}'), ("e1", b'{"text": "1"}')]
    produce_values(stack.bootstrap_servers, topic, records)
    with running(app, config):
        wait_for(lambda: committed(stack.bootstrap_servers, group, topic, 1) == {0: 3})
    # Each event's ORM row committed once, with its claim; the duplicate suppressed
    assert note_rows(db, notes) == [("e1", "one"), ("e2", "two")]
    assert statuses(db, notes, group) == {"e1": ("applied", None), "e2": ("applied", None)}
