"""Retention of ``processed_events``: delete old rows in bounded batches (``kinbox inbox cleanup``).

A row is what suppresses a redelivery of its event, so the retention must
exceed the longest time a record can still be delivered again: the topic's
retention, the worst consumer lag, and any ``kinbox dlq replay`` of old dead
letters. A redelivery that finds its row gone is applied again.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import psycopg
from psycopg import sql

from kinbox.names import sql_identifier
from kinbox.store.errors import translate

# The subselect bounds each batch (DELETE has no LIMIT) and walks the
# processed_at index; every batch is its own short transaction, so cleanup
# never holds long locks and can stop between batches.
_DELETE_PROCESSED = (
    "DELETE FROM {table} WHERE ctid IN ("
    " SELECT ctid FROM {table} WHERE processed_at < now() - %s"
    " ORDER BY processed_at LIMIT %s)"
)


def delete_processed(
    conninfo: str,
    schema: str,
    *,
    older_than: timedelta,
    batch: int = 1000,
    should_stop: Callable[[], bool] = lambda: False,
) -> int:
    """Delete ``processed_events`` rows older than ``older_than``, ``batch`` rows at a time.

    ``older_than`` must exceed the longest time a record can still be
    redelivered (topic retention, consumer lag, replays): a redelivery that
    finds its row gone is applied again.

    Returns:
        The number of rows deleted.

    Raises:
        StoreError: the database failed or could not be reached.
    """
    table = sql.SQL("{}.processed_events").format(
        sql.Identifier(sql_identifier(schema, setting="schema"))
    )
    statement = sql.SQL(_DELETE_PROCESSED).format(table=table)
    total = 0
    try:
        with psycopg.connect(conninfo, connect_timeout=10, autocommit=True) as conn:
            while not should_stop():
                with conn.transaction():
                    deleted = conn.execute(statement, (older_than, batch)).rowcount
                total += deleted
                if deleted < batch:
                    break
    except psycopg.Error as exc:
        raise translate(exc) from exc
    return total
