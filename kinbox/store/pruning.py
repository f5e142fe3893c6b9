"""Retention of ``processed_events``: delete old rows in bounded batches (``kinbox inbox cleanup``).

A row is what suppresses a redelivery of its event, so the retention must
exceed the longest time a record can still be delivered again: the topic's
retention, the worst consumer lag, and any ``kinbox dlq replay`` of old dead
letters. A redelivery that finds its row gone is applied again.
:mod:`kinbox.ops.dedup_window` reads those horizons from the broker; this module
only deletes (and counts, for a dry run).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta

import psycopg
from psycopg import sql

from kinbox.core.names import sql_identifier
from kinbox.store.errors import translate

# The subselect bounds each batch (DELETE has no LIMIT) and walks the
# processed_at index; every batch is its own short transaction, so cleanup
# never holds long locks and can stop between batches. The consumer filter
# is NULL (every group) or the groups given.
_OLDER = (
    "processed_at < now() - %(age)s"
    " AND (%(groups)s::text[] IS NULL OR consumer = ANY(%(groups)s::text[]))"
)
_DELETE_PROCESSED = (
    "DELETE FROM {table} WHERE ctid IN ("
    " SELECT ctid FROM {table} WHERE " + _OLDER + " ORDER BY processed_at LIMIT %(batch)s)"
)
_COUNT_PROCESSED = "SELECT consumer, count(*) FROM {table} WHERE " + _OLDER + " GROUP BY consumer"
# The sightings of reused ids (kinbox explain) age with the rows they were
# compared against: once those are gone, nothing explains them any more.
_DELETE_REUSED = (
    "DELETE FROM {table} WHERE seen_at < now() - %(age)s"
    " AND (%(groups)s::text[] IS NULL OR consumer = ANY(%(groups)s::text[]))"
)


def _table(schema: str, name: str = "processed_events") -> sql.Composed:
    return sql.SQL("{}.{}").format(
        sql.Identifier(sql_identifier(schema, setting="schema")), sql.Identifier(name)
    )


def delete_processed(
    conninfo: str,
    schema: str,
    *,
    older_than: timedelta,
    batch: int = 1000,
    groups: Sequence[str] | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> int:
    """Delete ``processed_events`` rows older than ``older_than``, ``batch`` rows at a time.

    ``older_than`` must exceed the longest time a record can still be
    redelivered (topic retention, consumer lag, replays): a redelivery that
    finds its row gone is applied again. ``groups`` limits it to those
    consumer groups' rows. The ``reused_event_ids`` sightings as old go too
    (not counted in the result).

    Returns:
        The number of rows deleted.

    Raises:
        StoreError: the database failed or could not be reached.
    """
    statement = sql.SQL(_DELETE_PROCESSED).format(table=_table(schema))
    params = {"age": older_than, "batch": batch, "groups": None if groups is None else list(groups)}
    total = 0
    try:
        with psycopg.connect(conninfo, connect_timeout=10, autocommit=True) as conn:
            while not should_stop():
                with conn.transaction():
                    deleted = conn.execute(statement, params).rowcount
                total += deleted
                if deleted < batch:
                    break
            if not should_stop():
                reused = sql.SQL(_DELETE_REUSED).format(table=_table(schema, "reused_event_ids"))
                conn.execute(reused, params)
    except psycopg.Error as exc:
        raise translate(exc) from exc
    return total


def count_processed(
    conninfo: str, schema: str, *, older_than: timedelta, groups: Sequence[str] | None = None
) -> dict[str, int]:
    """How many rows :func:`delete_processed` would delete now, per consumer group (dry run).

    Raises:
        StoreError: the database failed or could not be reached.
    """
    statement = sql.SQL(_COUNT_PROCESSED).format(table=_table(schema))
    params = {"age": older_than, "groups": None if groups is None else list(groups)}
    try:
        with psycopg.connect(conninfo, connect_timeout=10, autocommit=True) as conn:
            return {str(g): int(n) for g, n in conn.execute(statement, params).fetchall()}
    except psycopg.Error as exc:
        raise translate(exc) from exc
