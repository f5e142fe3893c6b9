"""The relay's SQL: claim a lane's next batch, then mark each row sent or failed.

All three statements run in ONE transaction per batch (see :mod:`.relay`): the
row locks taken by ``claim`` hold until the batch is published and marked, so
no other process can publish the same rows meanwhile — unlike the source
article's poller, whose ``FOR UPDATE SKIP LOCKED`` ran outside a transaction
and released its locks at once.

The claim takes a lane's rows in ``(txid, seq)`` order (why that order, and
why it is final, is said at ``_CLAIM``), skipping rows that must wait: of a
paused topic (:mod:`.topics`), or behind an earlier row of their key that is
parked (:mod:`.parked`) or backing off.
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

# Publishing order: (txid, seq), the writing transaction's id, then the enqueue
# order within it. Only rows of transactions older than every transaction
# still running (txid below this snapshot's xmin) are taken. Such rows are
# final: every transaction that gets an id from now on gets a higher one, so no
# row can ever appear below one already published, and every relay, at any
# time, sees the same order. (In seq order it could: seq is taken at INSERT and
# becomes visible at COMMIT, so a lower seq of the same key could still be
# uncommitted.) The cost: a long-running write transaction anywhere delays the
# relay until it ends, as in watermill-sql, which filters on xmin the same way.
_CLAIM = """
SELECT o.id, o.seq, o.topic, o.aggregateid, o.type, o.payload::text, o.payload_bytes,
       o.headers, o.attempts, o.traceparent, o.tracestate
FROM {outbox} o
WHERE o.status = 'pending'
  AND o.txid < pg_snapshot_xmin(pg_current_snapshot())
  AND {lane} = %(lane)s
  AND o.next_attempt_at <= now()
  -- A topic the broker refuses as a whole waits for its retry time (.topics).
  AND NOT EXISTS (
      SELECT 1 FROM {failing} f WHERE f.topic = o.topic AND f.retry_at > now())
  -- Per-key order: a row waits while an earlier row of its key is unfinished
  -- and cannot go in this batch: parked (the key is blocked until it is
  -- requeued), backing off after a failure, or in a paused topic. Earlier
  -- rows that can go are in this batch, ahead of it: same key, same lane, and
  -- all final, since (txid, seq) below a final row's is below the xmin too.
  AND NOT EXISTS (
      SELECT 1 FROM {outbox} e
      WHERE e.aggregateid = o.aggregateid
        AND e.status <> 'sent'
        AND (e.txid, e.seq) < (o.txid, o.seq)
        AND (e.status = 'dead'
             OR e.next_attempt_at > now()
             OR EXISTS (
                 SELECT 1 FROM {failing} f WHERE f.topic = e.topic AND f.retry_at > now())))
ORDER BY o.txid, o.seq
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
SET attempts = o.attempts + f.counts::int,
    last_error = f.error,
    next_attempt_at = clock_timestamp() + f.delay * interval '1 second',
    status = CASE WHEN f.park THEN 'dead' ELSE 'pending' END
FROM unnest(%s::uuid[], %s::text[], %s::float8[], %s::bool[], %s::bool[])
     AS f(id, error, delay, park, counts)
WHERE o.id = f.id
"""


@dataclass(frozen=True)
class Failure:
    """A row whose publish failed: retry after ``delay`` seconds, or ``park`` it as dead.

    ``counts``: the row's own failure, one more of its ``attempts``; an
    outage's failure records ``error`` but leaves ``attempts`` alone.
    """

    id: uuid.UUID
    error: str
    delay: float
    park: bool
    counts: bool = True


def _outbox(schema: str) -> sql.Composed:
    return sql.SQL("{}.outbox").format(sql.Identifier(schema))


def _failing(schema: str) -> sql.Composed:
    return sql.SQL("{}.outbox_failing_topics").format(sql.Identifier(schema))


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
    """Lock and return up to ``limit`` publishable rows of ``lane`` in ``(txid, seq)`` order.

    Must run inside a transaction that stays open until :func:`mark` has run.
    """
    query = sql.SQL(_CLAIM).format(
        outbox=_outbox(schema), failing=_failing(schema), lane=lane_sql(lanes)
    )
    # The planner cannot estimate the lane filter (a hash modulo a parameter):
    # it assumes 0.5% of rows match, not 1/lanes, and then prefers a bitmap scan
    # of every pending row plus a sort to the index scan in (txid, seq) order
    # that stops after `limit` rows of the lane. Measured on 20,000 pending
    # rows, 16 lanes: ~1 ms against 6-11 ms per claim. SET LOCAL ends with the
    # batch's transaction.
    conn.execute("SET LOCAL enable_bitmapscan = off")
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
                [f.counts for f in failed],
            ),
        )
