"""The relay's SQL: claim the next rows of the relay's lanes, then mark each row's fate.

No transaction stays open while Kafka works. :func:`claim` is a read-only
transaction: it locks nothing and never gets a transaction id, so the
``pg_snapshot_xmin`` every claim filters on (see ``_CLAIM``) never waits for a
relay that waits for a broker. :func:`mark` is a short write transaction once
the rows' delivery reports are in. What keeps two processes from publishing
the same row at once is the lane's owner (a session-level advisory lock held
across these transactions, :mod:`.lanes`) and, within the owning lane group,
the rows in flight, whose keys the next claims leave out (:mod:`.flight`) —
not row locks. (The source article's poller took ``FOR UPDATE SKIP LOCKED``
outside a transaction, so its locks vanished at once and two pollers sent the
same rows; a relay that kept them through the publish would hold up every
other claim for as long as a broker keeps it waiting.)

The claim takes the lanes' rows in ``(txid, seq)`` order (why that order, and
why it is final, is said at ``_CLAIM``), skipping rows that must wait: of a
paused topic (:mod:`.topics`), or behind an earlier row of their key that is
parked (:mod:`.parked`) or backing off, or of a key with rows in flight.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
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
#
# One statement claims every lane the relay owns ({lanes}: a lane filter, or
# nothing when it owns them all), so a wake-up costs one claim, not one per lane.
# {busy}: the keys (and keyless rows) the lane group has in flight. A key's
# rows in flight are all the rows of it that a claim could return before the
# rest (the claim is in order), so leaving the whole key out keeps its order;
# its next rows come in a claim after the ones in flight are marked.
#
# A pending row is either *due* or it *holds its key back*, never neither: due
# when it never failed (last_error NULL: fresh, or requeued) or its backoff is
# over; holding back when it failed and backs off. (A fresh row is due however
# its next_attempt_at compares with this transaction's now(): a writer that
# began after this transaction did could otherwise give its row a default
# next_attempt_at "in the future", neither due nor, by last_error, troubled.)
# So each earlier unsent row of o's key either comes in this batch ahead of o
# (same key, same lane, final, due: the ORDER BY puts it first) or makes the
# probe below hold o back: parked (blocked until requeued), backing off, or in a
# paused topic. The probe reads outbox_troubled_idx, whose rows are exactly
# those that can hold a key back by their own state: its cost is the key's
# troubled rows, not the key's backlog (probing every unsent row of the key made
# a claim quadratic in a key's backlog: 480,000 buffer hits to claim 100 of
# 50,000 pending rows of 200 keys). Paused topics are rare: that probe runs only
# while one is paused (the first NOT EXISTS is an InitPlan, evaluated once, and
# the OR stops at it).
_CLAIM = """
SELECT o.id::text, o.seq, o.topic, o.aggregateid, o.type, NULL::text,
       coalesce(o.payload_bytes, convert_to(coalesce(o.payload::text, 'null'), 'UTF8')),
       nullif(o.headers, '{{}}'::jsonb), o.attempts, o.traceparent, o.tracestate, {lane}
FROM {outbox} o
WHERE o.status = 'pending'
  AND o.txid < pg_snapshot_xmin(pg_current_snapshot())
  {lanes}
  {busy}
  AND (o.last_error IS NULL OR o.next_attempt_at <= now())
  -- A topic the broker refuses as a whole waits for its retry time (.topics).
  AND NOT EXISTS (
      SELECT 1 FROM {failing} f WHERE f.topic = o.topic AND f.retry_at > now())
  AND NOT EXISTS (
      SELECT 1 FROM {outbox} e
      WHERE e.aggregateid = o.aggregateid
        AND (e.status = 'dead' OR (e.status = 'pending' AND e.last_error IS NOT NULL))
        AND (e.txid, e.seq) < (o.txid, o.seq)
        AND (e.status = 'dead' OR e.next_attempt_at > now()))
  AND (NOT EXISTS (SELECT 1 FROM {failing} WHERE retry_at > now())
       OR NOT EXISTS (
           SELECT 1 FROM {outbox} e
           WHERE e.aggregateid = o.aggregateid
             AND e.status <> 'sent'
             AND (e.txid, e.seq) < (o.txid, o.seq)
             AND EXISTS (
                 SELECT 1 FROM {failing} f WHERE f.topic = e.topic AND f.retry_at > now())))
ORDER BY o.txid, o.seq
LIMIT %(limit)s
"""

# The planner cannot estimate the lane filter (a hash modulo a constant) nor
# how few rows the probes drop: it may prefer a bitmap scan of every pending row
# plus a sort to the index scan in (txid, seq) order that stops after `limit`
# rows, and the sort's cost grows with the backlog. Measured on 50,000 pending
# rows: 330 ms against ~20 ms for 2,000 rows. The same misestimate puts the
# plan's cost (~600,000 on a 100,000-row backlog) above jit_above_cost and the
# inlining and optimisation thresholds: PostgreSQL then compiled the claim for
# ~930 ms to run it for ~17 ms (EXPLAIN ANALYZE, 50,000 of 100,000 rows sent),
# every batch. A claim reads at most `limit` rows and their probes: never worth
# compiling. The marks update a batch's rows by id, `id = ANY(<1,000 ids>)`:
# until psycopg prepares the statement and PostgreSQL settles on a generic plan
# (ten executions on a connection), each is planned for its ids, and a
# sequential scan of the whole outbox with the ids hashed costs less than
# 1,000 probes of the primary key by the planner's count: 30-48 ms a batch on a
# 100,000-row outbox against 15-24 ms by the key, and on an outbox that keeps a
# week of sent rows, a scan of all of them for each of a relay's first batches.
# SET LOCAL ends with the claim's, or the marks', transaction.
_PLAN = (
    "SET LOCAL enable_bitmapscan = off",
    "SET LOCAL enable_sort = off",
    "SET LOCAL enable_seqscan = off",
    "SET LOCAL jit = off",
)

# The marks guard on the row's status: a row can be published by two relays
# when its lane changed hands while it was in flight (the first owner's
# connection died, and its lock with it). Marking it sent again would count a
# second attempt; a failure reported after another relay sent it, or for a
# row no longer pending, must leave it as it is.
_MARK_SENT = """
UPDATE {outbox}
SET status = 'sent', sent_at = clock_timestamp(), attempts = attempts + 1, last_error = NULL
WHERE id = ANY(%s::uuid[]) AND status <> 'sent'
"""

_MARK_FAILED = """
UPDATE {outbox} o
SET attempts = o.attempts + f.counts::int,
    last_error = f.error,
    next_attempt_at = clock_timestamp() + f.delay * interval '1 second',
    status = CASE WHEN f.park THEN 'dead' ELSE 'pending' END
FROM unnest(%s::uuid[], %s::text[], %s::float8[], %s::bool[], %s::bool[])
     AS f(id, error, delay, park, counts)
WHERE o.id = f.id AND o.status = 'pending'
"""


@dataclass(frozen=True)
class FailedRow:
    """A row whose publish failed: retry after ``delay`` seconds, or ``park`` it as dead.

    ``counts``: the row's own failure, one more of its ``attempts``; an
    outage's failure records ``error`` but leaves ``attempts`` alone.
    """

    id: str
    """The row's id, as the claim returned it (its text form)."""
    error: str
    delay: float
    park: bool
    counts: bool = True


def _uuids(ids: Sequence[str]) -> str:
    """A ``uuid[]`` literal of ``ids``, each the text form PostgreSQL gave a uuid."""
    return "{" + ",".join(ids) + "}"


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
    owned: Collection[int],
    lanes: int,
    limit: int,
    busy_keys: Collection[str] = (),
    busy_ids: Collection[str] = (),
) -> list[OutboxRow]:
    """Return up to ``limit`` publishable rows of the ``owned`` lanes, in order; lock nothing.

    The order is ``(txid, seq)`` across the lanes (per key, the publishing
    order). Rows of ``busy_keys`` and the keyless rows ``busy_ids`` (the lane
    group's rows in flight) are left out. Each row carries its lane. One round
    trip: a read-only transaction (it never gets a transaction id) with the
    planner settings and the claim, in one pipeline.
    """
    lane_filter = (
        sql.SQL("")
        if set(owned) >= set(range(lanes))
        else sql.SQL("AND {} = ANY(%(owned)s::int[])").format(lane_sql(lanes))
    )
    busy = []
    if busy_keys:
        busy.append(sql.SQL("AND (o.aggregateid IS NULL OR o.aggregateid <> ALL(%(keys)s))"))
    if busy_ids:
        busy.append(sql.SQL("AND o.id <> ALL(%(ids)s::uuid[])"))
    query = sql.SQL(_CLAIM).format(
        outbox=_outbox(schema),
        failing=_failing(schema),
        lanes=lane_filter,
        lane=lane_sql(lanes),
        busy=sql.SQL(" ").join(busy),
    )
    params = {
        "owned": sorted(owned),
        "limit": limit,
        "keys": list(busy_keys),
        "ids": _uuids(list(busy_ids)),
    }
    with conn.pipeline(), conn.transaction():
        conn.execute("SET TRANSACTION READ ONLY")
        for setting in _PLAN:
            conn.execute(setting)
        # Binary results: the value comes as the bytes to publish, no decoding.
        cursor = conn.cursor(binary=True)
        cursor.execute(query, params)
    return [row_from_db(values) for values in cursor.fetchall()]


def mark(
    conn: psycopg.Connection[tuple[Any, ...]],
    schema: str,
    sent: Sequence[str],
    failed: Sequence[FailedRow],
) -> None:
    """Record the rows' outcome: ``sent`` rows done, ``failed`` rows retried later or parked.

    One short write transaction (with the claim's planner settings). The ids
    are the claim's, in their text form: one ``uuid[]`` literal each, built
    with a join (the text of a uuid holds nothing to quote), where a list of
    ``uuid.UUID`` took a Python dumper call per row. A row another relay
    marked meanwhile is left as it is (see ``_MARK_SENT``).
    """
    if not sent and not failed:
        return
    with conn.transaction():
        for setting in _PLAN:
            conn.execute(setting)
        _mark(conn, schema, sent, failed)


def _mark(
    conn: psycopg.Connection[tuple[Any, ...]],
    schema: str,
    sent: Sequence[str],
    failed: Sequence[FailedRow],
) -> None:
    if sent:
        conn.execute(sql.SQL(_MARK_SENT).format(outbox=_outbox(schema)), (_uuids(sent),))
    if failed:
        conn.execute(
            sql.SQL(_MARK_FAILED).format(outbox=_outbox(schema)),
            (
                _uuids([f.id for f in failed]),
                [f.error[:2000] for f in failed],
                [f.delay for f in failed],
                [f.park for f in failed],
                [f.counts for f in failed],
            ),
        )
