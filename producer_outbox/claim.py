"""The relay's SQL: claim a lane's next batch, then mark each row sent or failed.

All three statements run in ONE transaction per batch (see :mod:`.relay`): the
row locks taken by ``claim`` hold until the batch is published and marked, so
no other process can publish the same rows meanwhile — unlike the source
article's poller, whose ``FOR UPDATE SKIP LOCKED`` ran outside a transaction
and released its locks at once.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from producer_outbox.records import OutboxRow, row_from_db

# A row's lane: a stable hash of its partition key (of its id when it has no
# key, spreading unordered rows), so all rows of one key share one lane.
LANE_EXPRESSION = "(hashtext(coalesce({t}.aggregateid, {t}.id::text)) & 2147483647) %% {lanes}"

_CLAIM = """
WITH snap AS (SELECT pg_snapshot_xmin(pg_current_snapshot()) AS xmin)
SELECT o.id, o.seq, o.topic, o.aggregateid, o.type, o.payload::text, o.payload_bytes,
       o.headers, o.attempts
FROM {outbox} o, snap
WHERE o.status = 'pending'
  AND {lane} = %(lane)s
  AND o.next_attempt_at <= now()
  -- Sequence-gap race: seq values are taken at INSERT but become visible at
  -- COMMIT, so a row with a lower seq can appear after a higher one was read.
  -- Only rows written by transactions older than every transaction still
  -- running (txid below this snapshot's xmin) are taken; any row committed
  -- later belongs to a transaction not yet finished now, so it cannot slip in
  -- below a seq already published. (watermill-sql does the same; the cost: a
  -- long-running write transaction anywhere delays the relay until it ends.)
  AND o.txid < snap.xmin
  -- Per-key order: a row waits while an earlier unsent row of its key cannot
  -- go yet (backing off after a failure, or not yet past the xmin filter).
  AND NOT EXISTS (
      SELECT 1 FROM {outbox} e
      WHERE e.status = 'pending'
        AND e.aggregateid = o.aggregateid
        AND e.seq < o.seq
        AND (e.next_attempt_at > now() OR e.txid >= snap.xmin))
ORDER BY o.seq
LIMIT %(limit)s
FOR UPDATE OF o SKIP LOCKED
"""

_MARK_SENT = """
UPDATE {outbox}
SET status = 'sent', sent_at = clock_timestamp(), attempts = attempts + 1, last_error = NULL
WHERE id = ANY(%s)
"""

_MARK_FAILED = """
UPDATE {outbox} o
SET attempts = o.attempts + 1,
    last_error = f.error,
    next_attempt_at = clock_timestamp() + f.delay * interval '1 second',
    status = CASE WHEN f.park THEN 'dead' ELSE 'pending' END
FROM unnest(%s::uuid[], %s::text[], %s::float8[], %s::bool[]) AS f(id, error, delay, park)
WHERE o.id = f.id
"""


@dataclass(frozen=True)
class Failure:
    """A row whose publish failed: retry after ``delay`` seconds, or ``park`` it as dead."""

    id: uuid.UUID
    error: str
    delay: float
    park: bool


def _outbox(schema: str) -> sql.Composed:
    return sql.SQL("{}.outbox").format(sql.Identifier(schema))


def lane_sql(lanes: int, table: str = "o") -> sql.SQL:
    """Return the SQL expression of a row's lane among ``lanes`` (``lanes`` is a validated int)."""
    return sql.SQL(LANE_EXPRESSION.format(t=table, lanes=int(lanes)))


def claim(
    conn: psycopg.Connection[tuple[Any, ...]],
    schema: str,
    *,
    lane: int,
    lanes: int,
    limit: int,
) -> list[OutboxRow]:
    """Lock and return up to ``limit`` publishable rows of ``lane`` in seq order.

    Must run inside a transaction that stays open until :func:`mark` has run.
    """
    query = sql.SQL(_CLAIM).format(outbox=_outbox(schema), lane=lane_sql(lanes))
    rows = conn.execute(query, {"lane": lane, "limit": limit}).fetchall()
    return [row_from_db(tuple(values)) for values in rows]


def mark(
    conn: psycopg.Connection[tuple[Any, ...]],
    schema: str,
    sent: Sequence[uuid.UUID],
    failed: Sequence[Failure],
) -> None:
    """Record the batch's outcome: ``sent`` rows done, ``failed`` rows retried later or parked."""
    if sent:
        conn.execute(sql.SQL(_MARK_SENT).format(outbox=_outbox(schema)), (list(sent),))
    if failed:
        conn.execute(
            sql.SQL(_MARK_FAILED).format(outbox=_outbox(schema)),
            (
                [f.id for f in failed],
                [f.error[:2000] for f in failed],
                [f.delay for f in failed],
                [f.park for f in failed],
            ),
        )
