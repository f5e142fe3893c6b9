"""What operators decided in ``kinbox console``: who, when, what, and how it went.

A component of its own (``console``), migrated by ``kinbox migrate`` beside
the inbox and the outbox, so that a worker never needs it and the inbox's
version never moves for it. Two tables:

- ``operator_decisions``: one row per action (replay or discard a group of
  dead letters or one of them, requeue or discard a parked outbox row,
  release or discard a parked key): the operator, the time, the action, what
  it was aimed at, how many records it covered and its outcome.
- ``operator_decision_records``: the dead letters a decision covered, by
  their coordinates in the dead-letter topic. The console hides a dead
  letter once a decision on it is ``done``: it stays in Kafka, the decision
  says it was dealt with.

A decision is written *before* its action runs (``pending``) and finished
after it (``done`` or ``failed``), each in its own transaction: a console
that dies half-way leaves a ``pending`` row saying what may have happened,
never an action with no record of it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from kinbox.core.names import sql_identifier
from kinbox.core.record import Position
from kinbox.store.errors import translate
from kinbox.store.migrations import Component

OUTCOMES = ("pending", "done", "failed")
"""Values of ``operator_decisions.outcome``."""


def _create_decisions(schema: sql.Identifier) -> list[sql.Composed]:
    return [
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {}.operator_decisions ("
            " id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
            " decided_at timestamptz NOT NULL DEFAULT now(),"
            " operator text NOT NULL,"
            " action text NOT NULL,"
            " target text NOT NULL,"
            " subject text NOT NULL,"
            " records integer NOT NULL DEFAULT 0,"
            " outcome text NOT NULL DEFAULT 'pending'"
            " CONSTRAINT operator_decisions_outcome_check"
            " CHECK (outcome IN ('pending', 'done', 'failed')),"
            " detail text,"
            " finished_at timestamptz)"
        ).format(schema),
        # Keyed by the dead letter first: the console asks "which of these
        # records has a decision", for the records it has just read.
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {}.operator_decision_records ("
            " dlq_topic text NOT NULL,"
            " partition integer NOT NULL,"
            ' "offset" bigint NOT NULL,'
            " decision_id bigint NOT NULL REFERENCES {}.operator_decisions (id),"
            " event_id text,"
            " consumer text,"
            ' PRIMARY KEY (dlq_topic, partition, "offset", decision_id))'
        ).format(schema, schema),
    ]


CONSOLE = Component("console", [_create_decisions])
"""The console's component; ``kinbox migrate`` brings it to ``CONSOLE.version``."""


@dataclass(frozen=True)
class DecidedRecord:
    """A dead letter a decision covers."""

    topic: str
    partition: int
    offset: int
    event_id: str | None = None
    consumer: str | None = None


@dataclass(frozen=True)
class OperatorDecision:
    """One row of ``operator_decisions``."""

    id: int
    decided_at: datetime
    operator: str
    action: str
    target: str
    subject: str
    records: int
    outcome: str
    detail: str | None
    finished_at: datetime | None


@dataclass(frozen=True)
class Closed:
    """The latest finished decision on a dead letter: why the console no longer shows it open."""

    decision_id: int
    action: str
    operator: str
    decided_at: datetime


_COLUMNS = (
    "id, decided_at, operator, action, target, subject, records, outcome, detail, finished_at"
)

# The latest done decision of each record asked about: unnest() joins the
# coordinates read from Kafka to the primary key, so the cost follows what
# the console read, never what the table has gathered over the years.
_CLOSED = """
SELECT DISTINCT ON (r.dlq_topic, r.partition, r."offset")
       r.dlq_topic, r.partition, r."offset", d.id, d.action, d.operator, d.decided_at
FROM unnest(%s::text[], %s::int[], %s::bigint[]) AS q(topic, partition, "offset")
JOIN {records} r ON r.dlq_topic = q.topic AND r.partition = q.partition
                AND r."offset" = q."offset"
JOIN {decisions} d ON d.id = r.decision_id AND d.outcome = 'done'
ORDER BY r.dlq_topic, r.partition, r."offset", d.id DESC
"""


class DecisionLog:
    """``operator_decisions`` of one schema; a connection per call (decisions are rare).

    Args:
        conninfo: the database.
        schema: the schema of the kinbox tables.

    Raises:
        ConfigurationError: the schema name is not valid.
    """

    def __init__(self, conninfo: str, schema: str) -> None:
        self._conninfo = conninfo
        self.schema = sql_identifier(schema, setting="schema")
        name = sql.Identifier(self.schema)
        self._decisions = sql.SQL("{}.operator_decisions").format(name)
        self._records = sql.SQL("{}.operator_decision_records").format(name)

    def _connect(self) -> psycopg.Connection[tuple[Any, ...]]:
        try:
            return psycopg.connect(self._conninfo, connect_timeout=10)
        except psycopg.Error as exc:
            raise translate(exc) from exc

    def available(self) -> bool:
        """Whether the tables exist (``kinbox migrate`` has run with this kinbox).

        Raises:
            StoreError: the database cannot be reached.
        """
        try:
            with self._connect() as conn:
                row = conn.execute(
                    "SELECT to_regclass(%s) IS NOT NULL",
                    (f"{self.schema}.operator_decision_records",),
                ).fetchone()
        except psycopg.Error as exc:
            raise translate(exc) from exc
        return bool(row and row[0])

    def begin(
        self,
        operator: str,
        action: str,
        target: str,
        subject: str,
        records: Sequence[DecidedRecord] = (),
    ) -> int:
        """Record a decision as ``pending``, with the dead letters it covers; return its id.

        Raises:
            StoreError: it could not be recorded (then nothing is to be done).
        """
        try:
            with self._connect() as conn, conn.transaction():
                row = conn.execute(
                    sql.SQL(
                        "INSERT INTO {} (operator, action, target, subject, records)"
                        " VALUES (%s, %s, %s, %s, %s) RETURNING id"
                    ).format(self._decisions),
                    (operator, action, target, subject, len(records)),
                ).fetchone()
                assert row is not None  # INSERT ... RETURNING of one row
                decision = int(row[0])
                if records:
                    with conn.cursor() as cur:
                        cur.executemany(
                            sql.SQL(
                                'INSERT INTO {} (dlq_topic, partition, "offset", decision_id,'
                                " event_id, consumer) VALUES (%s, %s, %s, %s, %s, %s)"
                            ).format(self._records),
                            [
                                (r.topic, r.partition, r.offset, decision, r.event_id, r.consumer)
                                for r in records
                            ],
                        )
        except psycopg.Error as exc:
            raise translate(exc) from exc
        return decision

    def finish(
        self, decision: int, outcome: str, detail: str | None, records: int | None = None
    ) -> None:
        """Set the outcome (``done`` or ``failed``) and what came of it.

        Raises:
            StoreError: the database cannot be reached.
        """
        try:
            with self._connect() as conn:
                conn.execute(
                    sql.SQL(
                        "UPDATE {} SET outcome = %s, detail = %s, finished_at = now(),"
                        " records = coalesce(%s, records) WHERE id = %s"
                    ).format(self._decisions),
                    (outcome, detail, records, decision),
                )
        except psycopg.Error as exc:
            raise translate(exc) from exc

    def closed(self, coordinates: Iterable[Position]) -> dict[Position, Closed]:
        """The dead letters among ``coordinates`` that a finished decision dealt with.

        Raises:
            StoreError: the database cannot be reached.
        """
        asked = list(coordinates)
        if not asked:
            return {}
        topics, partitions, offsets = (list(column) for column in zip(*asked, strict=True))
        query = sql.SQL(_CLOSED).format(records=self._records, decisions=self._decisions)
        try:
            with self._connect() as conn:
                rows = conn.execute(query, (topics, partitions, offsets)).fetchall()
        except psycopg.Error as exc:
            raise translate(exc) from exc
        return {(t, p, o): Closed(d, action, who, at) for t, p, o, d, action, who, at in rows}

    def recent(self, limit: int = 100) -> list[OperatorDecision]:
        """The newest ``limit`` decisions, newest first.

        Raises:
            StoreError: the database cannot be reached.
        """
        return self._select("ORDER BY id DESC LIMIT %s", (limit,))

    def get(self, decision: int) -> OperatorDecision | None:
        """One decision by id, or ``None``.

        Raises:
            StoreError: the database cannot be reached.
        """
        return next(iter(self._select("WHERE id = %s", (decision,))), None)

    def _select(self, tail: str, params: tuple[Any, ...]) -> list[OperatorDecision]:
        query = sql.SQL("SELECT {} FROM {} ").format(sql.SQL(_COLUMNS), self._decisions)
        try:
            with self._connect() as conn:
                rows = conn.execute(query + sql.SQL(tail), params).fetchall()
        except psycopg.Error as exc:
            raise translate(exc) from exc
        return [OperatorDecision(*row) for row in rows]
