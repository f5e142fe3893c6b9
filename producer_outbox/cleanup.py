"""Delete sent outbox rows older than the retention, in bounded batches.

Never one unbounded ``DELETE``: each batch is its own short transaction, so
cleanup holds no long locks, keeps WAL bursts small and can stop between
batches. Pending and dead rows are never deleted.

Under CDC (Debezium) nothing marks a row sent: the connector reads the insert
from the WAL, and the row itself is never looked at again. So CDC cleanup
(:func:`delete_older`) goes by age alone. That is safe whether or not the
connector has caught up: deleting a row does not take its insert out of the
WAL the slot retains, and the router publishes nothing for a delete.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql

DEFAULT_RETENTION = timedelta(days=7)

# The subselect bounds the batch (PostgreSQL's DELETE has no LIMIT); SKIP
# LOCKED lets two relays clean at once without waiting on each other.
_DELETE_BATCH = """
DELETE FROM {outbox} WHERE id IN (
    SELECT id FROM {outbox}
    WHERE status = 'sent' AND sent_at < now() - %(retention)s
    ORDER BY sent_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED)
"""


def delete_sent(
    conn: psycopg.Connection[Any],
    schema: str,
    *,
    retention: timedelta = DEFAULT_RETENTION,
    batch: int = 1000,
    should_stop: Callable[[], bool] = lambda: False,
) -> int:
    """Delete sent rows older than ``retention``, ``batch`` rows per transaction.

    Returns:
        The number of rows deleted.
    """
    statement = sql.SQL(_DELETE_BATCH).format(
        outbox=sql.SQL("{}.outbox").format(sql.Identifier(schema))
    )
    total = 0
    while not should_stop():
        with conn.transaction():
            deleted = conn.execute(statement, {"retention": retention, "batch": batch}).rowcount
        total += deleted
        if deleted < batch:
            break
    return total


# Oldest first along the seq index; created_at is the writing transaction's
# start, close enough to seq order that the scan stops after about `batch` rows.
_DELETE_OLDER_BATCH = """
DELETE FROM {outbox} WHERE id IN (
    SELECT id FROM {outbox}
    WHERE created_at < now() - %(retention)s
    ORDER BY seq
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED)
"""


def delete_older(
    conn: psycopg.Connection[Any],
    schema: str,
    *,
    retention: timedelta = DEFAULT_RETENTION,
    batch: int = 1000,
    should_stop: Callable[[], bool] = lambda: False,
) -> int:
    """Delete rows created more than ``retention`` ago whatever their status (CDC mode).

    Returns:
        The number of rows deleted.
    """
    statement = sql.SQL(_DELETE_OLDER_BATCH).format(
        outbox=sql.SQL("{}.outbox").format(sql.Identifier(schema))
    )
    total = 0
    while not should_stop():
        with conn.transaction():
            deleted = conn.execute(statement, {"retention": retention, "batch": batch}).rowcount
        total += deleted
        if deleted < batch:
            break
    return total
