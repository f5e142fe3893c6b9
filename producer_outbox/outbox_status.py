"""What ``kinbox outbox status`` shows: backlog, parked rows, blocked keys, failing topics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from producer_outbox.parked import BlockedKey, ParkedRow, blocked_keys
from producer_outbox.topics import FailingTopic, read_failing

_COUNTS = """
SELECT count(*) FILTER (WHERE status = 'pending'),
       count(*) FILTER (WHERE status = 'pending' AND last_error IS NOT NULL),
       count(*) FILTER (WHERE status = 'dead'),
       count(*) FILTER (WHERE status = 'sent'),
       coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE status = 'pending')), 0)
FROM {outbox}
"""

# The counts of read_status without the sent rows: only the unfinished rows are
# read (the outbox_key_order_idx partial index holds exactly those), so the
# relay can ask every few seconds however many sent rows wait for cleanup.
_BACKLOG = """
SELECT count(*) FILTER (WHERE status = 'pending'),
       count(*) FILTER (WHERE status = 'pending' AND last_error IS NOT NULL),
       count(*) FILTER (WHERE status = 'dead'),
       coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE status = 'pending')), 0)
FROM {outbox}
WHERE status <> 'sent'
"""

_DEAD = """
SELECT id::text, topic, aggregateid, attempts, last_error FROM {outbox}
WHERE status = 'dead' ORDER BY seq LIMIT %s
"""

__all__ = [
    "Backlog",
    "BlockedKey",
    "FailingTopic",
    "OutboxStatus",
    "ParkedRow",
    "read_backlog",
    "read_status",
]


@dataclass(frozen=True)
class Backlog:
    """What is left to publish: the relay's gauges (see :func:`read_backlog`)."""

    pending: int
    retrying: int
    dead: int
    oldest_pending_seconds: float


@dataclass(frozen=True)
class OutboxStatus:
    """A snapshot of one schema's outbox.

    ``retrying``: pending rows whose last try failed (their own failure or an
    outage). ``blocked``: keys whose earliest unfinished row is parked; the
    first of them are in ``blocked_keys``. ``failing_topics``: topics Kafka
    refuses as a whole, whose rows wait without counting attempts.
    """

    pending: int
    retrying: int
    dead: int
    sent: int
    oldest_pending_seconds: float
    parked: list[ParkedRow] = field(default_factory=list)
    blocked: int = 0
    blocked_keys: list[BlockedKey] = field(default_factory=list)
    failing_topics: list[FailingTopic] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (``status --json``)."""
        return {
            "pending": self.pending,
            "retrying": self.retrying,
            "dead": self.dead,
            "sent": self.sent,
            "oldest_pending_seconds": round(self.oldest_pending_seconds, 3),
            "parked": [vars(row) for row in self.parked],
            "blocked": self.blocked,
            "blocked_keys": [vars(key) for key in self.blocked_keys],
            "failing_topics": [
                {
                    **vars(topic),
                    "failing_seconds": round(topic.failing_seconds, 3),
                    "retry_in_seconds": round(topic.retry_in_seconds, 3),
                }
                for topic in self.failing_topics
            ],
        }


def read_status(
    conn: psycopg.Connection[Any], schema: str, *, parked_limit: int = 20
) -> OutboxStatus:
    """Read the counters, failing topics, first ``parked_limit`` parked rows and blocked keys."""
    outbox = sql.SQL("{}.outbox").format(sql.Identifier(schema))
    row = conn.execute(sql.SQL(_COUNTS).format(outbox=outbox)).fetchone()
    assert row is not None  # an aggregate always returns one row
    parked = [
        ParkedRow(*values)
        for values in conn.execute(sql.SQL(_DEAD).format(outbox=outbox), (parked_limit,))
    ]
    blocked, keys = blocked_keys(conn, schema, limit=parked_limit)
    return OutboxStatus(
        pending=int(row[0]),
        retrying=int(row[1]),
        dead=int(row[2]),
        sent=int(row[3]),
        oldest_pending_seconds=float(row[4]),
        parked=parked,
        blocked=blocked,
        blocked_keys=keys,
        failing_topics=read_failing(conn, schema),
    )


def read_backlog(conn: psycopg.Connection[Any], schema: str) -> Backlog:
    """Read the unfinished rows' counts and the oldest pending row's age (cheap: no sent rows)."""
    outbox = sql.SQL("{}.outbox").format(sql.Identifier(schema))
    row = conn.execute(sql.SQL(_BACKLOG).format(outbox=outbox)).fetchone()
    assert row is not None  # an aggregate always returns one row
    return Backlog(int(row[0]), int(row[1]), int(row[2]), float(row[3]))
