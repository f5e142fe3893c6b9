"""The outbox rows around one event, for ``kinbox explain``.

Two links, both by event id:

- **upstream**: an event published by the relay carries its outbox row's id
  as its event id, so the row that *became* the event is found by primary key
  (when the outbox is in the database explain reads);
- **downstream**: the rows a kinbox handler enqueued while handling the
  event carry it as ``caused_by_event_id`` (with its group in
  ``caused_by_consumer``; see :mod:`kinbox.core.cause`), found through the partial
  index ``outbox_caused_by_idx``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

_COLUMNS = (
    "id::text, topic, aggregateid, status, attempts, created_at, sent_at,"
    " caused_by_consumer, caused_by_event_id"
)


@dataclass(frozen=True)
class OutboxEntry:
    """One outbox row, as explain shows it."""

    id: str
    topic: str
    key: str | None
    status: str
    attempts: int
    created_at: datetime
    sent_at: datetime | None
    caused_by_consumer: str | None
    caused_by_event_id: str | None


def source(conn: psycopg.Connection[Any], schema: str, event_id: str) -> OutboxEntry | None:
    """The outbox row published as ``event_id``, if it is (still) in ``schema``'s outbox."""
    try:
        row_id = uuid.UUID(event_id)
    except ValueError:
        return None  # the relay's ids are UUIDs: this event came from elsewhere
    query = sql.SQL("SELECT " + _COLUMNS + " FROM {} WHERE id = %s").format(
        sql.Identifier(schema, "outbox")
    )
    row = conn.execute(query, (row_id,)).fetchone()
    return None if row is None else OutboxEntry(*row)


def caused_by(
    conn: psycopg.Connection[Any], schema: str, groups: list[str], event_id: str
) -> list[OutboxEntry]:
    """The rows enqueued while one of ``groups`` handled ``event_id``, in publishing order."""
    query = sql.SQL(
        "SELECT " + _COLUMNS + " FROM {} WHERE caused_by_event_id = %s"
        " AND caused_by_consumer = ANY(%s) ORDER BY txid, seq"
    ).format(sql.Identifier(schema, "outbox"))
    return [OutboxEntry(*row) for row in conn.execute(query, (event_id, groups))]
