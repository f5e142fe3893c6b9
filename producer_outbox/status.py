"""What ``kinbox outbox status`` shows: backlog, oldest unsent age, parked rows, relays."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

_COUNTS = """
SELECT count(*) FILTER (WHERE status = 'pending'),
       count(*) FILTER (WHERE status = 'pending' AND attempts > 0),
       count(*) FILTER (WHERE status = 'dead'),
       count(*) FILTER (WHERE status = 'sent'),
       coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE status = 'pending')), 0)
FROM {outbox}
"""

_DEAD = """
SELECT id::text, topic, aggregateid, attempts, last_error FROM {outbox}
WHERE status = 'dead' ORDER BY seq LIMIT %s
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
class OutboxStatus:
    """A snapshot of one schema's outbox."""

    pending: int
    retrying: int
    dead: int
    sent: int
    oldest_pending_seconds: float
    parked: list[ParkedRow] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (``status --json``)."""
        return {
            "pending": self.pending,
            "retrying": self.retrying,
            "dead": self.dead,
            "sent": self.sent,
            "oldest_pending_seconds": round(self.oldest_pending_seconds, 3),
            "parked": [vars(row) for row in self.parked],
        }


def read_status(
    conn: psycopg.Connection[Any], schema: str, *, parked_limit: int = 20
) -> OutboxStatus:
    """Read the outbox counters and the first ``parked_limit`` parked rows."""
    outbox = sql.SQL("{}.outbox").format(sql.Identifier(schema))
    row = conn.execute(sql.SQL(_COUNTS).format(outbox=outbox)).fetchone()
    assert row is not None  # an aggregate always returns one row
    parked = [
        ParkedRow(*values)
        for values in conn.execute(sql.SQL(_DEAD).format(outbox=outbox), (parked_limit,))
    ]
    return OutboxStatus(
        pending=int(row[0]),
        retrying=int(row[1]),
        dead=int(row[2]),
        sent=int(row[3]),
        oldest_pending_seconds=float(row[4]),
        parked=parked,
    )
