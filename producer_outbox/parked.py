"""Parked rows: a row parked as dead blocks its key until it is requeued.

A row is parked (``status = 'dead'``) on its ``max_attempts``-th failure of
its own (outages never count, see :mod:`.batch`). Per-key order must never
break silently, so a parked row holds back every later row of its key (the
claim's probe in :mod:`.claim`): the key is *blocked*, and
``kinbox outbox status`` lists it with the number of rows waiting behind it.
Rows of other keys never wait; rows without a key have no order and block
nothing.

``kinbox outbox requeue`` (:func:`requeue`) puts parked rows back:
``pending``, ``attempts`` 0, due now, ``last_error`` cleared, and wakes the
relays. A requeued row is the earliest unfinished row of its key, so it goes
out first, then the rows held behind it. Requeue after fixing the cause
(raise the topic's ``max.message.bytes``, grant the ACL, ...); a row that keeps
failing is parked again after ``max_attempts`` more tries. To give up on a row
instead, delete it (:func:`discard`, as ``kinbox console`` does, or ``DELETE
FROM <schema>.outbox WHERE id = …``): its key's later rows then go on without
it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from producer_outbox.schema import notify_channel

_PARKED = """
SELECT id::text, topic, aggregateid, attempts, last_error FROM {outbox}
WHERE status = 'dead' AND {which}
ORDER BY txid, seq
FOR UPDATE
"""

_REQUEUE = """
UPDATE {outbox}
SET status = 'pending', attempts = 0, last_error = NULL, next_attempt_at = now()
WHERE id = ANY(%s::uuid[])
"""

# Only a parked row: a pending or sent one is never given up from here.
_DISCARD = """
DELETE FROM {outbox} WHERE status = 'dead' AND id = %s
RETURNING id::text, topic, aggregateid, attempts, last_error
"""

# Rows of these keys that wait behind each key's earliest parked row.
_HELD = """
SELECT count(*)
FROM (SELECT DISTINCT ON (aggregateid) aggregateid, txid, seq FROM {outbox}
      WHERE status = 'dead' AND aggregateid = ANY(%s)
      ORDER BY aggregateid, txid, seq) f
JOIN {outbox} p ON p.status = 'pending' AND p.aggregateid = f.aggregateid
               AND (p.txid, p.seq) > (f.txid, f.seq)
"""

_BLOCKED = """
WITH first_parked AS (
    SELECT DISTINCT ON (aggregateid) aggregateid, id, topic, txid, seq, last_error
    FROM {outbox}
    WHERE status = 'dead' AND aggregateid IS NOT NULL
    ORDER BY aggregateid, txid, seq)
SELECT f.aggregateid, f.id::text, f.topic, f.last_error,
       (SELECT count(*) FROM {outbox} d
        WHERE d.status = 'dead' AND d.aggregateid = f.aggregateid),
       (SELECT count(*) FROM {outbox} p
        WHERE p.status = 'pending' AND p.aggregateid = f.aggregateid
          AND (p.txid, p.seq) > (f.txid, f.seq))
FROM first_parked f
ORDER BY f.txid, f.seq
LIMIT %s
"""


@dataclass(frozen=True)
class ParkedRow:
    """A row parked as dead after too many failed publishes."""

    id: str
    topic: str
    key: str | None
    attempts: int
    last_error: str | None


@dataclass(frozen=True)
class BlockedKey:
    """A key whose earliest unfinished row is parked: its later rows wait."""

    key: str
    parked_id: str
    topic: str
    last_error: str | None
    parked: int
    held: int


@dataclass(frozen=True)
class Requeued:
    """What :func:`requeue` did (or would do, on a dry run)."""

    rows: list[ParkedRow] = field(default_factory=list)
    held: int = 0
    """Rows of the requeued rows' keys that wait behind them and follow them out."""
    dry_run: bool = False

    @property
    def keys(self) -> int:
        """How many distinct keys the rows have (rows without a key not counted)."""
        return len({row.key for row in self.rows if row.key is not None})


def _outbox(schema: str) -> sql.Composed:
    return sql.SQL("{}.outbox").format(sql.Identifier(schema))


def _which(row_id: uuid.UUID | None, key: str | None) -> tuple[sql.SQL, tuple[Any, ...]]:
    if row_id is not None:
        return sql.SQL("id = %s"), (row_id,)
    if key is not None:
        return sql.SQL("aggregateid = %s"), (key,)
    return sql.SQL("true"), ()


def _held(conn: psycopg.Connection[Any], schema: str, keys: list[str]) -> int:
    if not keys:
        return 0
    row = conn.execute(sql.SQL(_HELD).format(outbox=_outbox(schema)), (keys,)).fetchone()
    return int(row[0]) if row else 0


def requeue(
    conn: psycopg.Connection[Any],
    schema: str,
    *,
    row_id: uuid.UUID | None = None,
    key: str | None = None,
    dry_run: bool = False,
) -> Requeued:
    """Put parked rows back to pending: the row ``row_id``, every parked row of ``key``, or all.

    Runs in one transaction that also wakes the relays (``NOTIFY``). With
    ``dry_run`` nothing changes; the result says what would be requeued.
    """
    which, params = _which(row_id, key)
    outbox = _outbox(schema)
    with conn.transaction():
        # Locked, so a concurrent requeue of the same rows waits and then finds them pending.
        rows = [
            ParkedRow(*values)
            for values in conn.execute(sql.SQL(_PARKED).format(outbox=outbox, which=which), params)
        ]
        # Counted before the update: once requeued, nothing is parked to count behind.
        held = _held(conn, schema, sorted({r.key for r in rows if r.key is not None}))
        if rows and not dry_run:
            conn.execute(sql.SQL(_REQUEUE).format(outbox=outbox), ([r.id for r in rows],))
            conn.execute("SELECT pg_notify(%s, '')", (notify_channel(schema),))
    return Requeued(rows, held, dry_run)


def discard(conn: psycopg.Connection[Any], schema: str, row_id: uuid.UUID) -> ParkedRow | None:
    """Delete the parked row ``row_id``, giving its event up; ``None`` if no such row is parked.

    The later rows of its key then go out without it: the same transaction
    wakes the relays (``NOTIFY``).
    """
    with conn.transaction():
        found = conn.execute(sql.SQL(_DISCARD).format(outbox=_outbox(schema)), (row_id,)).fetchone()
        if found is not None:
            conn.execute("SELECT pg_notify(%s, '')", (notify_channel(schema),))
    return None if found is None else ParkedRow(*found)


def blocked_keys(
    conn: psycopg.Connection[Any], schema: str, *, limit: int = 20
) -> tuple[int, list[BlockedKey]]:
    """Return how many keys are blocked by a parked row, and the first ``limit`` of them."""
    outbox = _outbox(schema)
    total = conn.execute(
        sql.SQL(
            "SELECT count(DISTINCT aggregateid) FROM {} WHERE status = 'dead'"
            " AND aggregateid IS NOT NULL"
        ).format(outbox)
    ).fetchone()
    keys = [
        BlockedKey(*values)
        for values in conn.execute(sql.SQL(_BLOCKED).format(outbox=outbox), (limit,))
    ]
    return (int(total[0]) if total else 0), keys
