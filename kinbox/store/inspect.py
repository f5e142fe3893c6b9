"""Reading ``processed_events`` for an operator: ``kinbox status`` and ``kinbox explain``.

Every query here is cheap on a table of ten million rows, because each walks
an index over only what it returns:

- the consumer groups: a *loose index scan* of the primary key
  ``(consumer, event_id)`` — one descent per group, where ``SELECT DISTINCT
  consumer`` reads the whole table (PostgreSQL 15 has no skip scan);
- one event across groups: ``consumer = ANY(groups) AND event_id = $1``, one
  primary-key probe per group, where ``WHERE event_id = $1`` alone reads the
  whole table (no index leads with the id, and none is added for a command
  an operator runs now and then);
- the activity of a window: a range of the ``processed_at`` index;
- dead letters and skips: the partial index of the rows that are not
  ``applied`` (inbox migration step 3), which the claim never writes to;
- the reuses of one id (``reused_event_ids``, inbox migration step 4): a
  probe of its primary key per group, as for the id's own rows;
- the verdicts of given events (the console's dead letters): one
  primary-key probe per ``(consumer, event id)`` asked about;
- the table's size: the planner's row estimate and ``pg_total_relation_size``,
  never ``count(*)``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql

from kinbox.core.names import sql_identifier
from kinbox.store import migrations
from kinbox.store.errors import translate
from kinbox.store.schema import INBOX

# Each step takes the smallest consumer above the last one through the
# primary key, so the cost is one index descent per group, whatever the rows.
_CONSUMERS = """
WITH RECURSIVE found(consumer) AS (
    (SELECT consumer FROM {table} ORDER BY consumer LIMIT 1)
    UNION ALL
    SELECT (SELECT t.consumer FROM {table} t WHERE t.consumer > found.consumer
            ORDER BY t.consumer LIMIT 1)
    FROM found WHERE found.consumer IS NOT NULL
)
SELECT consumer FROM found WHERE consumer IS NOT NULL
"""

_ACTIVITY = """
SELECT consumer, status, count(*), max(processed_at) FROM {table}
WHERE consumer = ANY(%s) AND processed_at > now() - %s
GROUP BY consumer, status
"""

# The predicate matches the partial index's, so only its rows are read.
_VERDICTS = """
SELECT consumer, status, count(*), max(processed_at) FROM {table}
WHERE status <> 'applied' AND consumer = ANY(%s)
GROUP BY consumer, status
"""

_TABLE = """
SELECT c.reltuples::bigint, pg_total_relation_size(c.oid),
       (SELECT extract(epoch FROM now() - min(processed_at)) FROM {table})
FROM pg_class c WHERE c.oid = %s::regclass
"""

_LOOKUP = """
SELECT consumer, status, reason, topic, partition, "offset", processed_at, trace_id
FROM {table} WHERE consumer = ANY(%s) AND event_id = %s
ORDER BY processed_at, consumer
"""

_REUSED = """
SELECT consumer, topic, partition, "offset", first_topic, first_partition, first_offset, seen_at
FROM {reused} WHERE consumer = ANY(%s) AND event_id = %s
ORDER BY seen_at, consumer
"""


# unnest() pairs the groups with the ids, so each pair is one primary-key probe.
_STATUSES = """
SELECT p.consumer, p.event_id, p.status, p.processed_at
FROM unnest(%s::text[], %s::text[]) AS q(consumer, event_id)
JOIN {table} p ON p.consumer = q.consumer AND p.event_id = q.event_id
"""


@dataclass(frozen=True)
class Counted:
    """How many rows of one group have one status (in a window, or in all)."""

    rows: int
    last_at: datetime | None


@dataclass(frozen=True)
class TableStats:
    """``processed_events`` as a whole: estimated rows, bytes on disk, age of the oldest row.

    ``rows_estimate`` is the planner's (kept by autovacuum/ANALYZE), ``None``
    before the table was first analysed.
    """

    rows_estimate: int | None
    total_bytes: int
    oldest_seconds: float | None


@dataclass(frozen=True)
class Processed:
    """One group's row of one event."""

    consumer: str
    status: str
    reason: str | None
    topic: str
    partition: int
    offset: int
    processed_at: datetime
    trace_id: str | None


@dataclass(frozen=True)
class Reused:
    """A delivery of an event id, in one group, whose payload differed from the id's row's.

    It was not applied; ``first_*`` is where the id's row was claimed.
    """

    consumer: str
    topic: str
    partition: int
    offset: int
    first_topic: str
    first_partition: int
    first_offset: int
    seen_at: datetime


class InboxReader:
    """A read-only view of one schema's ``processed_events``; a context manager.

    Raises:
        StoreError: the database cannot be reached.
        SchemaError: the inbox tables are missing or older than this kinbox.
    """

    def __init__(self, conninfo: str, schema: str) -> None:
        self.schema = sql_identifier(schema, setting="schema")
        self._table = sql.Identifier(self.schema, "processed_events")
        self._reused = sql.Identifier(self.schema, "reused_event_ids")
        try:
            self._conn: psycopg.Connection[tuple[Any, ...]] = psycopg.connect(
                conninfo, autocommit=True, connect_timeout=10
            )
            migrations.check(self._conn, self.schema, INBOX)
        except psycopg.Error as exc:
            raise translate(exc) from exc

    @property
    def connection(self) -> psycopg.Connection[tuple[Any, ...]]:
        """The connection, for the outbox's readers of the same database."""
        return self._conn

    def __enter__(self) -> InboxReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self._conn.close()

    def _rows(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        try:
            text = sql.SQL(query).format(table=self._table, reused=self._reused)
            return self._conn.execute(text, params).fetchall()
        except psycopg.Error as exc:
            raise translate(exc) from exc

    def consumers(self) -> list[str]:
        """Every consumer group with a row here, sorted."""
        return [row[0] for row in self._rows(_CONSUMERS)]

    def activity(self, groups: list[str], window: timedelta) -> dict[str, dict[str, Counted]]:
        """Per group and status: rows processed within the last ``window``."""
        return self._counted(_ACTIVITY, (groups, window))

    def verdicts(self, groups: list[str]) -> dict[str, dict[str, Counted]]:
        """Per group: all its rows that are not ``applied``, per status."""
        return self._counted(_VERDICTS, (groups,))

    def _counted(self, query: str, params: tuple[Any, ...]) -> dict[str, dict[str, Counted]]:
        out: dict[str, dict[str, Counted]] = {}
        for consumer, status, rows, last_at in self._rows(query, params):
            out.setdefault(consumer, {})[status] = Counted(int(rows), last_at)
        return out

    def table(self) -> TableStats:
        """Estimated rows, total bytes (indexes and TOAST included), oldest row's age."""
        rows = self._rows(_TABLE, (f"{self.schema}.processed_events",))
        estimate, size, oldest = rows[0]
        return TableStats(
            None if estimate < 0 else int(estimate),
            int(size),
            None if oldest is None else float(oldest),
        )

    def statuses(
        self, pairs: Iterable[tuple[str, str]]
    ) -> dict[tuple[str, str], tuple[str, datetime]]:
        """The row of each ``(consumer, event id)`` that has one: its status and when."""
        asked = sorted(set(pairs))
        if not asked:
            return {}
        consumers, ids = ([a for a, _ in asked], [b for _, b in asked])
        rows = self._rows(_STATUSES, (consumers, ids))
        return {(c, e): (status, at) for c, e, status, at in rows}

    def lookup(self, groups: list[str], event_id: str) -> list[Processed]:
        """The rows of ``event_id`` in each of ``groups`` that has one, oldest first."""
        return [Processed(*row) for row in self._rows(_LOOKUP, (groups, event_id))]

    def reused(self, groups: list[str], event_id: str) -> list[Reused]:
        """The deliveries of ``event_id`` in ``groups`` that reused it with another payload."""
        return [Reused(*row) for row in self._rows(_REUSED, (groups, event_id))]
