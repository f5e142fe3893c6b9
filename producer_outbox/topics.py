"""Failing topics: a topic Kafka refuses as a whole is an outage of the topic, not of its rows.

A topic that does not exist (with ``auto.create.topics.enable=false``) or that
the relay may not write (topic or cluster not authorized) fails every row sent
to it, and none of them is at fault. So such an error never touches the rows:
they stay ``pending`` with their ``attempts`` and ``last_error`` unchanged and
are never parked. Instead the topic gets one row in
``<schema>.outbox_failing_topics``:

- the relay records it when a batch meets the error (:func:`record_failure`);
- the claim skips the topic's rows until ``retry_at``, and holds back the
  later rows of their keys in other topics (per-key order);
- ``retry_at`` backs off exponentially per topic (the relay's
  ``backoff_base`` / ``backoff_max``), counted once per round of retries
  however many lanes or relays meet the error in that round;
- the first record of the topic that Kafka acknowledges deletes the row
  (:func:`clear_many`, one statement per batch): the topic works again.

Why a table rather than something derived from the rows' ``last_error``: the
failure is a fact about the topic. One row per failing topic is written only
when the state changes, is seen by every relay (a second relay does not
rediscover the outage with a batch of its own), survives relay restarts, and
is what ``kinbox outbox status`` — another process — reads to say which topics
fail and why. The rows themselves are not rewritten on every try.

Each statement here runs on its own (autocommit, after the batch's COMMIT)
and either touches one topic row or locks its rows in one order, so relays
reporting topics in different orders can never deadlock on this table.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

_RECORD = """
INSERT INTO {failing} AS t (topic, error, retry_at)
VALUES (%(topic)s, %(error)s, clock_timestamp() + %(base)s * interval '1 second')
ON CONFLICT (topic) DO UPDATE SET
    error = EXCLUDED.error,
    last_failed_at = clock_timestamp(),
    -- A new round only when the topic was due: the other lanes and relays
    -- that met the error in the same round do not push it further back.
    failures = t.failures + (t.retry_at <= clock_timestamp())::int,
    retry_at = CASE WHEN t.retry_at <= clock_timestamp()
        THEN clock_timestamp()
             + least(%(cap)s, %(base)s * 2 ^ least(t.failures, 30)) * interval '1 second'
        ELSE t.retry_at END
RETURNING failures, extract(epoch FROM retry_at - clock_timestamp())
"""

_READ = """
SELECT t.topic, t.error, t.failures,
       extract(epoch FROM now() - t.first_failed_at),
       greatest(0, extract(epoch FROM t.retry_at - now())),
       (SELECT count(*) FROM {outbox} o WHERE o.status = 'pending' AND o.topic = t.topic)
FROM {failing} t
ORDER BY t.first_failed_at, t.topic
"""


@dataclass(frozen=True)
class FailingTopic:
    """A topic Kafka refuses as a whole, as ``kinbox outbox status`` shows it."""

    topic: str
    error: str
    failures: int
    failing_seconds: float
    retry_in_seconds: float
    pending: int


def _table(schema: str) -> sql.Composed:
    return sql.SQL("{}.outbox_failing_topics").format(sql.Identifier(schema))


def record_failure(
    conn: psycopg.Connection[Any], schema: str, topic: str, error: str, *, base: float, cap: float
) -> tuple[int, float]:
    """Record that ``topic`` failed with ``error``; return ``(failures, seconds to retry)``."""
    row = conn.execute(
        sql.SQL(_RECORD).format(failing=_table(schema)),
        {"topic": topic, "error": error[:2000], "base": base, "cap": cap},
    ).fetchone()
    assert row is not None  # INSERT ... ON CONFLICT DO UPDATE always returns the row
    return int(row[0]), max(0.0, float(row[1]))


def clear_many(
    conn: psycopg.Connection[Any], schema: str, names: Collection[str]
) -> Callable[[], list[str]]:
    """Forget the failures of ``names`` (records of each were acknowledged), in one statement.

    Returns a function giving the topics that were failing; call it once the
    statement has run (it may be queued in a pipeline). A seq scan or an index
    scan both take the rows' locks in one order for every relay, so two relays
    clearing the same topics cannot deadlock.
    """
    if not names:
        return list
    statement = sql.SQL("DELETE FROM {} WHERE topic = ANY(%s) RETURNING topic").format(
        _table(schema)
    )
    cursor = conn.execute(statement, (sorted(names),))
    return lambda: sorted(row[0] for row in cursor.fetchall())


def failing(conn: psycopg.Connection[Any], schema: str) -> set[str]:
    """The topics recorded as failing (the relay reads this once per round of its lanes)."""
    statement = sql.SQL("SELECT topic FROM {}").format(_table(schema))
    return {row[0] for row in conn.execute(statement)}


def read_failing(conn: psycopg.Connection[Any], schema: str) -> list[FailingTopic]:
    """Every failing topic with its error, age, next retry and pending rows (status)."""
    statement = sql.SQL(_READ).format(
        failing=_table(schema), outbox=sql.SQL("{}.outbox").format(sql.Identifier(schema))
    )
    return [
        FailingTopic(str(t), str(e), int(n), float(age), float(retry), int(pending))
        for t, e, n, age, retry, pending in conn.execute(statement)
    ]
