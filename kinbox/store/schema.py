"""Migration steps of the inbox component: the ``processed_events`` table.

Step 1 creates the table; step 2 adds ``reason`` (why a row is
``dead_lettered`` or ``skipped``). Its primary key ``(consumer, event_id)`` *is* the
dedup guarantee: the claim ``INSERT ... ON CONFLICT DO NOTHING`` of a second
delivery conflicts with the first one's row (or waits for the first one's
transaction, if it is still open) and drops out. Keying on the consumer group
as well as the id lets several groups share one database (DESIGN invariant 4).
"""

from __future__ import annotations

from psycopg import sql

from kinbox.store.migrations import Component

STATUSES = ("applied", "dead_lettered", "skipped")
"""Values of ``processed_events.status``."""


def _create_processed_events(schema: sql.Identifier) -> list[sql.Composed]:
    return [
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {}.processed_events ("
            " consumer text NOT NULL,"
            " event_id text NOT NULL,"
            " status text NOT NULL DEFAULT 'applied'"
            " CONSTRAINT processed_events_status_check"
            " CHECK (status IN ('applied', 'dead_lettered', 'skipped')),"
            " topic text NOT NULL,"
            " partition integer NOT NULL,"
            ' "offset" bigint NOT NULL,'
            " processed_at timestamptz NOT NULL DEFAULT now(),"
            " PRIMARY KEY (consumer, event_id))"
        ).format(schema),
        # Retention deletes the oldest rows in bounded batches; without this
        # index each batch would scan the whole table.
        sql.SQL(
            "CREATE INDEX IF NOT EXISTS processed_events_processed_at_idx"
            " ON {}.processed_events (processed_at)"
        ).format(schema),
    ]


def _add_reason(schema: sql.Identifier) -> list[sql.Composed]:
    # Why an event was dead-lettered or skipped (DESIGN invariant 2: "recorded
    # as dead-lettered/skipped with its reason"); NULL for applied events.
    return [
        sql.SQL("ALTER TABLE {}.processed_events ADD COLUMN IF NOT EXISTS reason text").format(
            schema
        )
    ]


INBOX = Component("inbox", [_create_processed_events, _add_reason])
"""The inbox component; ``kinbox migrate`` brings it to ``INBOX.version``."""
