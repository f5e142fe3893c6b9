"""Helpers for the failure-handling integration tests (real broker, real PostgreSQL)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from psycopg import sql

from kinbox.app import App
from kinbox.consume.runner import Runner
from kinbox.core.config import Settings
from kinbox.core.event import Event
from kinbox.core.record import Record
from kinbox.kafka import read_topic
from tests.integration import inbox_support
from tests.support.database import Conn


@contextmanager
def running(app: App, config: Settings) -> Iterator[Runner]:
    """A real group member with a real dead-letter publisher, in a thread."""
    with inbox_support.running(app, config, dead_letters=True) as runner:
        yield runner


def effect_app(
    topic: str, schema: str, group: str, before: Callable[[Event], None] | None = None, **route: Any
) -> App:
    """One handler inserting an effect row per event; ``before(event)`` may raise or sleep."""
    app = App(group_id=group, schema=schema)
    insert = sql.SQL(
        'INSERT INTO {}.effects (consumer, event_id, topic, partition, "offset", pid)'
        " VALUES (%s, %s, %s, %s, %s, 0)"
    ).format(sql.Identifier(schema))

    @app.handler(topic, **route)
    def apply(event: Event, tx: Any) -> None:
        if before is not None:
            before(event)
        tx.execute(insert, (group, event.id, event.topic, event.partition, event.offset))

    return app


def poison_app(topic: str, schema: str, group: str, poison: str = "poison", **route: Any) -> App:
    """:func:`effect_app` whose handler can never apply the event ``poison``."""

    def before(event: Event) -> None:
        if event.id == poison:
            raise ValueError("cannot be applied")

    return effect_app(topic, schema, group, before, **route)


def statuses(db: Conn, schema: str, group: str) -> dict[str, tuple[str, str | None]]:
    """``processed_events`` of ``group``: id -> (status, reason)."""
    rows = db.execute(
        sql.SQL(
            "SELECT event_id, status, reason FROM {}.processed_events WHERE consumer = %s"
        ).format(sql.Identifier(schema)),
        (group,),
    ).fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def dead_letters(config: Settings, topic: str) -> list[Record]:
    """Every record on the dead-letter ``topic``."""
    return list(read_topic(config, topic, timeout=5))


def header(record: Record, name: str) -> str | None:
    for key, value in record.headers:
        if key == name and value is not None:
            return value.decode()
    return None
