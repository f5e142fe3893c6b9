"""Parked keys for an operator: list them, release them, discard their events.

The worker's side of key-ordered parking is in the inbox transaction
(:mod:`kinbox.apply.parking`); this is the operator's, on an autocommit
connection. Each change runs in a transaction of its own that locks the
key's ``parked_keys`` row first, as the worker's transaction does, so the
two never interleave: a worker parking an event of the key waits for a
release, and a release for the worker.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from kinbox.core.record import Record
from kinbox.store.errors import translate

_KEYS = """
SELECT * FROM (
    SELECT k.consumer, k.topic, k.key, k.blocked_by, k.released, k.since,
           (SELECT count(*) FROM {events} e
            WHERE e.consumer = k.consumer AND e.topic = k.topic AND e.key = k.key) AS waiting
    FROM {keys} k
    WHERE (%(consumer)s::text IS NULL OR k.consumer = %(consumer)s)
) AS found
WHERE waiting > 0 OR %(all)s
ORDER BY since, consumer, topic, key
LIMIT %(limit)s
"""

_LOCK = "SELECT blocked_by FROM {keys} WHERE consumer = %s AND topic = %s AND key = %s FOR UPDATE"

_RELEASE_KEY = "UPDATE {keys} SET released = true WHERE consumer = %s AND topic = %s AND key = %s"

_RELEASE_EVENTS = """
UPDATE {events} SET released = true WHERE consumer = %s AND topic = %s AND key = %s
RETURNING seq, event_id, partition, "offset", key, value, header_names, header_values,
          timestamp_ms
"""

_DISCARD_STATUS = """
UPDATE {table} p SET status = 'skipped', reason = %s
FROM {events} e
WHERE e.consumer = %s AND e.topic = %s AND e.key = %s
  AND p.consumer = e.consumer AND p.event_id = e.event_id
"""

_DISCARD_EVENTS = "DELETE FROM {events} WHERE consumer = %s AND topic = %s AND key = %s"

_DISCARD_KEY = "DELETE FROM {keys} WHERE consumer = %s AND topic = %s AND key = %s"

_BLOCKED_BY = """
SELECT topic, key, blocked_by FROM {keys}
WHERE consumer = %s AND blocked_by = ANY(%s::text[])
"""


@dataclass(frozen=True)
class ParkedKeyRow:
    """One blocked key, as ``kinbox dlq parked`` lists it.

    Attributes:
        group: the consumer group.
        topic: the topic of its events.
        key: the record key.
        blocked_by: the event id of the dead letter the key waits behind.
        released: an operator released it; its events are on their way back.
        since: when it was blocked.
        waiting: its parked events.
    """

    group: str
    topic: str
    key: bytes
    blocked_by: str
    released: bool
    since: dt.datetime
    waiting: int


@dataclass(frozen=True)
class Released:
    """A parked event handed back by a release: its record, to re-publish."""

    event_id: str
    record: Record


class Parking:
    """The parked keys of one schema, on ``conn`` (autocommit)."""

    def __init__(self, conn: psycopg.Connection[Any], schema: str) -> None:
        self._conn = conn
        self._names = {
            "keys": sql.Identifier(schema, "parked_keys"),
            "events": sql.Identifier(schema, "parked_events"),
            "table": sql.Identifier(schema, "processed_events"),
        }

    def keys(
        self, group: str | None = None, limit: int = 1000, *, idle: bool = False
    ) -> list[ParkedKeyRow]:
        """The keys with parked events (of ``group``, or all), oldest first.

        ``idle``: also the keys a dead letter blocks with nothing parked yet.
        """
        rows = self._run(_KEYS, {"consumer": group, "limit": limit, "all": idle})
        return [ParkedKeyRow(*row) for row in rows]

    def blocked_by(self, group: str, event_ids: Sequence[str]) -> list[tuple[str, bytes]]:
        """The ``(topic, key)`` of each key that one of ``event_ids`` blocks."""
        rows = self._run(_BLOCKED_BY, (group, list(event_ids)))
        return [(topic, bytes(key)) for topic, key, _ in rows]

    def release(self, group: str, topic: str, key: bytes) -> list[Released] | None:
        """Mark the key released and hand back its parked events, in the order they were parked.

        ``None`` if the key is not blocked. The events stay parked until they
        come back: re-publish them (:func:`kinbox.kafka.release.republish`).
        """
        with self._transaction() as cur:
            if cur.execute(self._sql(_LOCK), (group, topic, key)).fetchone() is None:
                return None
            cur.execute(self._sql(_RELEASE_KEY), (group, topic, key))
            rows = cur.execute(self._sql(_RELEASE_EVENTS), (group, topic, key)).fetchall()
        return [_released(topic, row) for row in sorted(rows)]

    def discard(self, group: str, topic: str, key: bytes) -> int | None:
        """Give the key's parked events up (``skipped``, saying why) and free it.

        Returns how many, or ``None`` if the key is not blocked.
        """
        with self._transaction() as cur:
            row = cur.execute(self._sql(_LOCK), (group, topic, key)).fetchone()
            if row is None:
                return None
            reason = f"discarded by an operator: parked behind {row[0]}"
            cur.execute(self._sql(_DISCARD_STATUS), (reason, group, topic, key))
            count = cur.execute(self._sql(_DISCARD_EVENTS), (group, topic, key)).rowcount
            cur.execute(self._sql(_DISCARD_KEY), (group, topic, key))
        return count

    def _sql(self, text: str) -> sql.Composed:
        return sql.SQL(text).format(**self._names)

    def _run(self, text: str, params: Any) -> list[tuple[Any, ...]]:
        try:
            return self._conn.execute(self._sql(text), params).fetchall()
        except psycopg.Error as exc:
            raise translate(exc) from exc

    @contextmanager
    def _transaction(self) -> Iterator[psycopg.Cursor[Any]]:
        """A transaction on the autocommit connection, its errors translated."""
        try:
            with self._conn.transaction():
                yield self._conn.cursor()
        except psycopg.Error as exc:
            raise translate(exc) from exc


def _released(topic: str, row: tuple[Any, ...]) -> Released:
    _, event_id, partition, offset, key, value, names, values, timestamp = row
    headers = [(n, None if v is None else bytes(v)) for n, v in zip(names, values, strict=True)]
    value = None if value is None else bytes(value)
    return Released(
        event_id, Record(topic, partition, offset, bytes(key), value, headers, timestamp)
    )
