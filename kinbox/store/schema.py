"""Migration steps of the inbox component: the ``processed_events`` table.

Step 1 creates the table; step 2 adds ``reason`` (why a row is
``dead_lettered`` or ``skipped``); step 3 adds ``trace_id`` (the W3C trace id
of the record that claimed the row, for ``kinbox explain``) and a partial
index over the rows that are not ``applied`` (``kinbox status`` counts dead
letters from it); step 4 adds ``payload_hash`` (the digest of the claimed
record's value, :mod:`kinbox.core.reuse`) and the ``reused_event_ids`` table,
where a duplicate whose payload differs is recorded; step 5 adds the
``parked`` status and the ``parked_keys`` and ``parked_events`` tables of
key-ordered parking (:mod:`kinbox.core.parking`); step 6 rebuilds the
primary key to carry ``payload_hash`` beside its keys, so that a replay's
look-up reads the index alone. Its primary key
``(consumer, event_id)`` *is* the dedup guarantee: the claim ``INSERT ...
ON CONFLICT DO NOTHING`` of a second delivery conflicts with the first one's
row (or waits for the first one's transaction, if it is still open) and
drops out. Keying on the consumer group
as well as the id lets several groups share one database (docs/design.md invariant 4).
"""

from __future__ import annotations

from psycopg import sql

from kinbox.store.migrations import Component

STATUSES = ("applied", "dead_lettered", "skipped", "parked")
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
    # Why an event was dead-lettered or skipped (docs/design.md invariant 2: "recorded
    # as dead-lettered/skipped with its reason"); NULL for applied events.
    return [
        sql.SQL("ALTER TABLE {}.processed_events ADD COLUMN IF NOT EXISTS reason text").format(
            schema
        )
    ]


def _add_trace_id_and_verdict_index(schema: sql.Identifier) -> list[sql.Composed]:
    return [
        # Nullable and without a DEFAULT: adding it rewrites nothing, and a
        # record without a valid traceparent header leaves it NULL.
        sql.SQL("ALTER TABLE {}.processed_events ADD COLUMN IF NOT EXISTS trace_id text").format(
            schema
        ),
        # Dead letters and skips only: the claim inserts 'applied' rows, which
        # this index never holds, so the hot path does not pay for it; it lets
        # `kinbox status` count a group's dead letters without reading all of
        # its rows. Built inside the migration's transaction, it blocks writes
        # to processed_events while it scans the table once.
        sql.SQL(
            "CREATE INDEX IF NOT EXISTS processed_events_verdict_idx"
            " ON {}.processed_events (consumer, processed_at) WHERE status <> 'applied'"
        ).format(schema),
    ]


def _add_payload_hash_and_reused_ids(schema: sql.Identifier) -> list[sql.Composed]:
    return [
        # Nullable and without a DEFAULT, like trace_id: adding it rewrites
        # nothing. Rows claimed before it have none and never report a reuse.
        sql.SQL(
            "ALTER TABLE {}.processed_events ADD COLUMN IF NOT EXISTS payload_hash bigint"
        ).format(schema),
        # Written only when a duplicate's digest differs from its row's, so
        # the claim of a clean stream never touches it. One row per record:
        # a redelivery of the same record is not a new sighting.
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {}.reused_event_ids ("
            " consumer text NOT NULL,"
            " event_id text NOT NULL,"
            " topic text NOT NULL,"
            " partition integer NOT NULL,"
            ' "offset" bigint NOT NULL,'
            " payload_hash bigint NOT NULL,"
            " first_topic text NOT NULL,"
            " first_partition integer NOT NULL,"
            " first_offset bigint NOT NULL,"
            " first_payload_hash bigint NOT NULL,"
            " seen_at timestamptz NOT NULL DEFAULT now(),"
            ' PRIMARY KEY (consumer, event_id, topic, partition, "offset"))'
        ).format(schema),
    ]


def _add_parking(schema: sql.Identifier) -> list[sql.Composed]:
    return [
        # The check is replaced, not widened in place: PostgreSQL has no
        # ALTER CONSTRAINT for a CHECK. It validates the table once.
        sql.SQL(
            "ALTER TABLE {}.processed_events"
            " DROP CONSTRAINT IF EXISTS processed_events_status_check,"
            " ADD CONSTRAINT processed_events_status_check"
            " CHECK (status IN ('applied', 'dead_lettered', 'skipped', 'parked'))"
        ).format(schema),
        # One row per blocked key: the dead letter it waits behind, and
        # whether an operator released it. Only routes that park write here.
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {}.parked_keys ("
            " consumer text NOT NULL,"
            " topic text NOT NULL,"
            " key bytea NOT NULL,"
            " blocked_by text NOT NULL,"
            " released boolean NOT NULL DEFAULT false,"
            " since timestamptz NOT NULL DEFAULT now(),"
            " PRIMARY KEY (consumer, topic, key))"
        ).format(schema),
        # The record of each parked event, to re-publish it on release, in
        # the order it was parked (seq).
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {}.parked_events ("
            " consumer text NOT NULL,"
            " event_id text NOT NULL,"
            " topic text NOT NULL,"
            " key bytea NOT NULL,"
            " seq bigserial NOT NULL,"
            " partition integer NOT NULL,"
            ' "offset" bigint NOT NULL,'
            " value bytea,"
            " header_names text[] NOT NULL,"
            " header_values bytea[] NOT NULL,"
            " timestamp_ms bigint,"
            " blocked_by text NOT NULL,"
            " released boolean NOT NULL DEFAULT false,"
            " parked_at timestamptz NOT NULL DEFAULT now(),"
            " PRIMARY KEY (consumer, event_id))"
        ).format(schema),
        sql.SQL(
            "CREATE INDEX IF NOT EXISTS parked_events_key_idx"
            " ON {}.parked_events (consumer, topic, key, seq)"
        ).format(schema),
    ]


def _cover_payload_hash(schema: sql.Identifier) -> list[sql.Composed]:
    return [
        # The skim's look-up (kinbox.apply.skim) asks, per id, for the row's
        # digest: with the digest in the key's index, that is an index-only
        # probe, where it would otherwise read a heap page per id. The new
        # index is built first, while reads go on (writes wait for it); a
        # team with a large table builds it beforehand with CREATE UNIQUE
        # INDEX CONCURRENTLY under this name (docs/operations.md), and this
        # step then only swaps the constraint over to it.
        sql.SQL(
            "CREATE UNIQUE INDEX IF NOT EXISTS processed_events_covering_key"
            " ON {}.processed_events (consumer, event_id) INCLUDE (payload_hash)"
        ).format(schema),
        sql.SQL(
            "ALTER TABLE {}.processed_events DROP CONSTRAINT processed_events_pkey,"
            " ADD CONSTRAINT processed_events_pkey PRIMARY KEY"
            " USING INDEX processed_events_covering_key"
        ).format(schema),
    ]


INBOX = Component(
    "inbox",
    [
        _create_processed_events,
        _add_reason,
        _add_trace_id_and_verdict_index,
        _add_payload_hash_and_reused_ids,
        _add_parking,
        _cover_payload_hash,
    ],
)
"""The inbox component; ``kinbox migrate`` brings it to ``INBOX.version``."""
