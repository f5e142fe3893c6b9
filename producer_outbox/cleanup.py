"""Delete sent outbox rows older than the retention, in bounded batches.

Never one unbounded ``DELETE``: each batch is its own short transaction, so
cleanup holds no long locks, keeps WAL bursts small and can stop between
batches. Pending and dead rows are never deleted.
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
