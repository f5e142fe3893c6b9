"""The ``<schema>.outbox`` table, as migration steps of the ``outbox`` component.

Column names follow the Debezium Outbox Event Router's defaults, so moving from
the relay to CDC is a connector configuration (``kinbox outbox debezium-config``):

=================  =========================================================
``id``             uuid, the event id (router ``table.field.event.id``) and PK
``aggregatetype``  the topic again (router ``route.by.field`` default column)
``aggregateid``    the partition key, NULL for none (``table.field.event.key``)
``type``           optional event type (``ce_type`` header)
``payload``        jsonb payload (``table.field.event.payload``); NULL for bytes
``payload_bytes``  bytea payload when the caller enqueued ``bytes``
=================  =========================================================

plus the relay's own columns: ``txid`` (the writing transaction's id) and
``seq`` (bigserial, enqueue order), which together are the publishing order
``(txid, seq)`` (see :mod:`producer_outbox.claim`), ``topic``, ``headers``
(jsonb object of text values), ``status`` (``pending`` / ``sent`` / ``dead``),
``attempts`` (tries the broker answered for the row itself: its own failures
and the final success; outages and waits behind other rows do not count),
``last_error``, ``next_attempt_at``, ``created_at``, ``sent_at``.

Step 2 publishes in ``(txid, seq)`` order instead of ``seq`` order: it swaps
the claim's indexes for ones in that order and adds ``outbox_failing_topics``,
one row per topic the broker refuses as a whole (missing, not authorized;
see :mod:`producer_outbox.topics`). Its ``CREATE INDEX`` runs inside the
migration's transaction and blocks writes to the outbox while it builds,
which takes a moment on a table that holds mostly pending and parked rows
(sent rows are outside both partial indexes).

Step 3 adds ``caused_by_consumer`` and ``caused_by_event_id``: when a kinbox
handler enqueues inside its inbox transaction, the consumer group and the
event it was handling (:mod:`kinbox.core.cause`), so ``kinbox explain`` can say
what an event's transaction enqueued. Both are NULL for rows written outside
a handler. Like every outbox column a CDC connector may publish as a header,
they have no ``DEFAULT`` (Debezium would publish a NULL as the default's
value, KAFKA-8713).

Step 4 adds ``traceparent`` and ``tracestate``: the W3C trace context that
was current when the row was enqueued (:mod:`producer_outbox.trace_context`),
NULL when there was none. The relay continues that trace and puts both on
the record as headers; Debezium's router does the same from the columns.
They have no ``DEFAULT`` on purpose: Debezium records a column's default in
the Connect schema, and Kafka Connect then reads a NULL as that default
(KAFKA-8713), so an untraced row would be published with a bogus header.

Step 5 adds ``outbox_troubled_idx``: the rows that can hold their key back
by their own state — parked, or pending after a failed try (``last_error``
set) — in ``(aggregateid, txid, seq)`` order. The claim's per-key probe reads
it instead of every unsent row of the key, so its cost no longer grows with
the key's backlog (see :mod:`producer_outbox.claim`). The index holds only
those few rows; a healthy outbox keeps it empty.

Step 6 makes every writer wake the relay: ``outbox_notify``, an ``AFTER
INSERT … FOR EACH STATEMENT`` trigger, sends the relay's notification
(:func:`notify_channel`) in the writer's transaction, whatever wrote the
rows — :func:`~producer_outbox.writer.enqueue`, plain SQL, an ORM, another
language, ``COPY``. Once per statement, not per row, and PostgreSQL folds
equal notifications of one transaction into one, so a transaction that
writes many rows still wakes the relay once, at its COMMIT; a rollback
sends nothing. A statement that inserts no row wakes the relay for
nothing, which costs it one empty claim.

Bytes payloads live in their own ``bytea`` column so they round-trip exactly
(no base64 convention a consumer must know); a CDC connector only routes
``payload``, so bytes rows are relay-only.
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from kinbox.store.migrations import Component


def _create_table(schema: sql.Identifier) -> Sequence[sql.Composed | sql.SQL]:
    return [
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {}.outbox ("
            " id uuid PRIMARY KEY,"
            " seq bigserial NOT NULL UNIQUE,"
            " txid xid8 NOT NULL DEFAULT pg_current_xact_id(),"
            " topic text NOT NULL,"
            " aggregatetype text NOT NULL,"
            " aggregateid text,"
            " type text,"
            " payload jsonb,"
            " payload_bytes bytea,"
            " headers jsonb NOT NULL DEFAULT '{{}}'::jsonb,"
            " status text NOT NULL DEFAULT 'pending'"
            "  CHECK (status IN ('pending', 'sent', 'dead')),"
            " attempts integer NOT NULL DEFAULT 0,"
            " last_error text,"
            " next_attempt_at timestamptz NOT NULL DEFAULT now(),"
            " created_at timestamptz NOT NULL DEFAULT now(),"
            " sent_at timestamptz,"
            " CHECK (payload IS NULL OR payload_bytes IS NULL))"
        ).format(schema),
        # The relay reads unsent rows in seq order; this index holds only those,
        # so it stays small however many sent rows wait for cleanup.
        sql.SQL(
            "CREATE INDEX IF NOT EXISTS outbox_pending_idx ON {}.outbox (seq)"
            " WHERE status = 'pending'"
        ).format(schema),
        # The claim's "earlier unsent row of the same key?" probe.
        sql.SQL(
            "CREATE INDEX IF NOT EXISTS outbox_pending_key_idx ON {}.outbox (aggregateid, seq)"
            " WHERE status = 'pending'"
        ).format(schema),
        # Cleanup deletes the oldest sent rows in bounded batches.
        sql.SQL(
            "CREATE INDEX IF NOT EXISTS outbox_sent_idx ON {}.outbox (sent_at)"
            " WHERE status = 'sent'"
        ).format(schema),
        # Parked rows, for `kinbox outbox status`.
        sql.SQL(
            "CREATE INDEX IF NOT EXISTS outbox_dead_idx ON {}.outbox (seq) WHERE status = 'dead'"
        ).format(schema),
    ]


def _publish_order_and_failing_topics(schema: sql.Identifier) -> Sequence[sql.Composed | sql.SQL]:
    return [
        # The claim reads pending rows in (txid, seq) order (replaces the seq index).
        sql.SQL(
            "CREATE INDEX IF NOT EXISTS outbox_claim_idx ON {}.outbox (txid, seq)"
            " WHERE status = 'pending'"
        ).format(schema),
        # The claim's "earlier unfinished row of the same key?" probe, in the same
        # order; parked rows are in it because they hold their key back.
        sql.SQL(
            "CREATE INDEX IF NOT EXISTS outbox_key_order_idx ON {}.outbox (aggregateid, txid, seq)"
            " WHERE status <> 'sent'"
        ).format(schema),
        sql.SQL("DROP INDEX IF EXISTS {}.outbox_pending_idx").format(schema),
        sql.SQL("DROP INDEX IF EXISTS {}.outbox_pending_key_idx").format(schema),
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {}.outbox_failing_topics ("
            " topic text PRIMARY KEY,"
            " error text NOT NULL,"
            " failures integer NOT NULL DEFAULT 1,"
            " first_failed_at timestamptz NOT NULL DEFAULT now(),"
            " last_failed_at timestamptz NOT NULL DEFAULT now(),"
            " retry_at timestamptz NOT NULL)"
        ).format(schema),
    ]


def _add_cause(schema: sql.Identifier) -> Sequence[sql.Composed | sql.SQL]:
    return [
        # Nullable, no DEFAULT (see the module docstring): adding them rewrites nothing.
        sql.SQL(
            "ALTER TABLE {}.outbox ADD COLUMN IF NOT EXISTS caused_by_consumer text,"
            " ADD COLUMN IF NOT EXISTS caused_by_event_id text"
        ).format(schema),
        # `kinbox explain` looks rows up by the event that caused them. Partial:
        # rows enqueued outside a handler (most, in a pure producer) are not in it.
        sql.SQL(
            "CREATE INDEX IF NOT EXISTS outbox_caused_by_idx"
            " ON {}.outbox (caused_by_event_id, caused_by_consumer)"
            " WHERE caused_by_event_id IS NOT NULL"
        ).format(schema),
    ]


def _add_trace_context(schema: sql.Identifier) -> Sequence[sql.Composed | sql.SQL]:
    return [
        # Nullable, no DEFAULT (see the module docstring): adding them rewrites nothing.
        sql.SQL(
            "ALTER TABLE {}.outbox ADD COLUMN IF NOT EXISTS traceparent text,"
            " ADD COLUMN IF NOT EXISTS tracestate text"
        ).format(schema),
    ]


def _troubled_rows(schema: sql.Identifier) -> Sequence[sql.Composed | sql.SQL]:
    return [
        # The claim's "earlier row of the same key that holds it back?" probe.
        # Its predicate must stay exactly the probe's (producer_outbox.claim),
        # so the planner can prove the index applies.
        sql.SQL(
            "CREATE INDEX IF NOT EXISTS outbox_troubled_idx ON {}.outbox (aggregateid, txid, seq)"
            " WHERE status = 'dead' OR (status = 'pending' AND last_error IS NOT NULL)"
        ).format(schema),
    ]


def _notify_every_writer(schema: sql.Identifier) -> Sequence[sql.Composed | sql.SQL]:
    return [
        # The channel is notify_channel(<the table's schema>), spelled in SQL:
        # schema names are ASCII identifiers, so left() cuts where [:56] does.
        sql.SQL(
            "CREATE OR REPLACE FUNCTION {}.outbox_notify() RETURNS trigger LANGUAGE plpgsql AS"
            " $$BEGIN PERFORM pg_notify(left(TG_TABLE_SCHEMA, 56) || '_outbox', '');"
            " RETURN NULL; END$$"
        ).format(schema),
        sql.SQL("DROP TRIGGER IF EXISTS outbox_notify ON {}.outbox").format(schema),
        sql.SQL(
            "CREATE TRIGGER outbox_notify AFTER INSERT ON {}.outbox"
            " FOR EACH STATEMENT EXECUTE FUNCTION {}.outbox_notify()"
        ).format(schema, schema),
    ]


OUTBOX = Component(
    "outbox",
    [
        _create_table,
        _publish_order_and_failing_topics,
        _add_cause,
        _add_trace_context,
        _troubled_rows,
        _notify_every_writer,
    ],
)
"""The outbox component: ``kinbox migrate`` applies it next to the inbox's."""


def notify_channel(schema_name: str) -> str:
    """Return the LISTEN/NOTIFY channel of the outbox in ``schema_name`` (already validated).

    Channel names share the 63-byte identifier limit; a truncated name shared by
    two long schema names only causes a spurious wake-up, never a missed one.
    The ``outbox_notify`` trigger (step 6) computes the same name in SQL.
    """
    return f"{schema_name[:56]}_outbox"
