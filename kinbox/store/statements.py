"""The inbox's SQL: every statement kinbox runs on ``processed_events``, named.

Built with ``psycopg.sql`` from a validated schema name, and rendered to
bytes once per store (:class:`InboxStatements`), so psycopg converts each
only once. The sync and the async store run exactly these.
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import sql

# One statement decides which events are fresh. The primary key
# (consumer, event_id) makes a second delivery conflict with the first one's
# row, or wait for the first one's transaction and then conflict, so two
# members that briefly own the same partition during a rebalance still apply
# the event once. Never SELECT-then-INSERT: that races.
#
# One partition's events at a time: topic and partition are plain
# parameters, the ids, offsets, trace ids and payload digests four array
# literals (see kinbox.store.arrays).
#
# In the ids' order, not the batch's: each row's key is locked as it is
# inserted, and two batches side by side may share ids (a producer's
# duplicate in another partition). Taken in offset order, one could hold x
# and wait for y while the other holds y and waits for x, a deadlock
# PostgreSQL breaks only after deadlock_timeout by aborting one of them. In
# one order, the later batch waits for the earlier one and nothing more.
_INSERT = (
    "INSERT INTO {}.processed_events"
    ' (consumer, event_id, status, topic, partition, "offset", trace_id, payload_hash)'
    " SELECT %s, c.event_id, 'applied', %s, %s, c.off, c.trace_id, c.hash"
    " FROM unnest(%s::text[], %s::bigint[], %s::text[], %s::bigint[])"
    " AS c(event_id, off, trace_id, hash)"
    " ORDER BY c.event_id"
    " ON CONFLICT (consumer, event_id) "
)
# The plain claim also finds, in the same statement, which duplicates reuse
# an id with another payload (kinbox.core.reuse): it inserts every id, and
# looks up only those the insert dropped (one primary-key probe each: the
# LATERAL ... LIMIT 1 keeps the plan a nested loop, as the skim's look-up),
# recording in reused_event_ids the ones whose digest differs. A fresh event
# thus costs what a bare ON CONFLICT DO NOTHING costs, and no second
# statement is sent. The look-up reads the statement's snapshot: a row
# another transaction inserted meanwhile (the insert waited for it, then
# dropped the id) is not there to compare. Rows: each claimed id with NULLs,
# then each sighting recorded.
#
# A claim of one event takes it as plain values, not arrays: PostgreSQL
# plans a prepared statement once (a generic plan) only when that plan is
# estimated no dearer than one made for the values at hand, and a generic
# plan reckons with ten elements per array where the values have one; so
# with arrays of one it would plan the statement anew at every execution.
_CLAIM_EVENTS = (
    "WITH c AS (SELECT * FROM unnest(%(ids)s::text[], %(offsets)s::bigint[], %(traces)s::text[],"
    " %(hashes)s::bigint[]) AS c(event_id, off, trace_id, hash)),"
)
_CLAIM_EVENT = (
    "WITH c AS (SELECT %(ids)s::text AS event_id, %(offsets)s::bigint AS off,"
    " %(traces)s::text AS trace_id, %(hashes)s::bigint AS hash),"
)
_CLAIM_REST = (
    " claimed AS (INSERT INTO {0}.processed_events"
    ' (consumer, event_id, status, topic, partition, "offset", trace_id, payload_hash)'
    " SELECT %(consumer)s, c.event_id, 'applied', %(topic)s, %(partition)s, c.off, c.trace_id,"
    " c.hash FROM c ORDER BY c.event_id"
    " ON CONFLICT (consumer, event_id) DO NOTHING RETURNING event_id),"
    " dropped AS MATERIALIZED (SELECT c.event_id, c.off, c.hash FROM c"
    " WHERE c.event_id NOT IN (SELECT event_id FROM claimed)),"
    " seen AS (INSERT INTO {0}.reused_event_ids"
    ' (consumer, event_id, topic, partition, "offset", payload_hash,'
    " first_topic, first_partition, first_offset, first_payload_hash)"
    " SELECT %(consumer)s, d.event_id, %(topic)s, %(partition)s, d.off, d.hash, p.topic,"
    ' p.partition, p."offset", p.payload_hash FROM dropped d CROSS JOIN LATERAL'
    ' (SELECT q.topic, q.partition, q."offset", q.payload_hash FROM {0}.processed_events q'
    " WHERE q.consumer = %(consumer)s AND q.event_id = d.event_id LIMIT 1) AS p"
    " WHERE p.payload_hash <> d.hash ORDER BY d.event_id, d.off"
    ' ON CONFLICT DO NOTHING RETURNING event_id, "offset", first_topic, first_partition,'
    " first_offset)"
    " SELECT event_id, NULL::bigint, NULL::text, NULL::integer, NULL::bigint FROM claimed"
    ' UNION ALL SELECT event_id, "offset", first_topic, first_partition, first_offset FROM seen'
)
_CLAIM = _CLAIM_EVENTS + _CLAIM_REST
_CLAIM_ONE = _CLAIM_EVENT + _CLAIM_REST
# The same claim for replayed records, except that a dead-lettered row (or a
# parked one, re-published on its key's release) may be taken over: the row
# lock the UPDATE takes serialises two deliveries of the replay exactly like
# the INSERT does, and an applied row never matches the WHERE, so a replay
# applies at most once.
_RECLAIM = (
    _INSERT + "DO UPDATE SET status = 'applied', topic = EXCLUDED.topic,"
    ' partition = EXCLUDED.partition, "offset" = EXCLUDED."offset",'
    " processed_at = now(), reason = NULL, trace_id = EXCLUDED.trace_id,"
    " payload_hash = EXCLUDED.payload_hash"
    " WHERE processed_events.status IN ('dead_lettered', 'parked')"
    " RETURNING event_id"
)
# The skim's look-up (kinbox.apply.skim): one probe of the primary key per
# id. The LIMIT keeps the subquery from being flattened into a join, so every
# plan is this nested loop: a join's plan chooses by the consumer's estimated
# row count, and on stale statistics (a freshly emptied table that grew
# since) it read the consumer's whole index for every batch. An id is known
# when its row holds the record's digest, or none (claimed before digests
# were kept). The primary key carries the digest (schema step 6), so each
# probe reads the index alone, as one without the comparison would. The
# digests come packed, eight bytes each in the ids' order
# (kinbox.core.reuse.packed_digests).
_KNOWN = (
    "SELECT c.event_id FROM unnest(%(ids)s::text[]) WITH ORDINALITY AS c(event_id, n)"
    " CROSS JOIN LATERAL (SELECT q.payload_hash FROM {}.processed_events q"
    " WHERE q.consumer = %(consumer)s AND q.event_id = c.event_id LIMIT 1) AS p"
    " WHERE p.payload_hash IS NULL"
    " OR int8send(p.payload_hash) = substring(%(hashes)s::bytea FROM c.n::integer * 8 - 7 FOR 8)"
)
# Reused ids: runs only when a claim dropped duplicates, after it, in its
# transaction, over those duplicates alone (one partition's). Each row is
# there: the claim just met it (or waited for the transaction that wrote it),
# or inserted it for an earlier record of the batch; one primary-key probe
# each. A row without a digest never differs (NULL <> x is not true). The
# sighting's key is the record's position, so a redelivered record is
# recorded, and returned, once.
_REUSED = (
    "INSERT INTO {0}.reused_event_ids"
    ' (consumer, event_id, topic, partition, "offset", payload_hash,'
    " first_topic, first_partition, first_offset, first_payload_hash)"
    ' SELECT p.consumer, p.event_id, %s, %s, c.off, c.hash, p.topic, p.partition, p."offset",'
    " p.payload_hash"
    " FROM unnest(%s::text[], %s::bigint[], %s::bigint[]) AS c(event_id, off, hash)"
    " JOIN {0}.processed_events p ON p.consumer = %s AND p.event_id = c.event_id"
    " WHERE p.payload_hash <> c.hash"
    " ORDER BY c.event_id, c.off"
    " ON CONFLICT DO NOTHING"
    ' RETURNING topic, partition, "offset", first_topic, first_partition, first_offset'
)
# Runs only on a row this transaction just claimed, so it always finds it.
_DEAD_LETTER = (
    "UPDATE {}.processed_events SET status = 'dead_lettered', reason = %s"
    " WHERE consumer = %s AND event_id = %s"
)

# Key-ordered parking (kinbox.core.parking), run only by routes that park.
# The blocked keys among a batch's, their rows locked: a release or a discard
# (kinbox.store.parking) takes the same locks, so neither sees half of the other.
_BLOCKED = (
    "SELECT key, blocked_by, released FROM {}.parked_keys"
    " WHERE consumer = %s AND topic = %s AND key = ANY(%s::bytea[])"
    " ORDER BY key FOR UPDATE"
)
_RELEASED = (
    "SELECT key, event_id, released FROM {}.parked_events"
    " WHERE consumer = %s AND topic = %s AND key = ANY(%s::bytea[])"
)
# One statement per parked event: parking follows a dead letter, so it is
# rare, and a record's headers fit no array of the whole batch. A released
# event that a new dead letter of its key holds is parked again.
_PARK = (
    'INSERT INTO {}.parked_events (consumer, topic, event_id, key, partition, "offset",'
    " value, header_names, header_values, timestamp_ms, blocked_by)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s::text[], %s::bytea[], %s, %s)"
    " ON CONFLICT (consumer, event_id) DO UPDATE SET released = false,"
    " blocked_by = EXCLUDED.blocked_by"
    " RETURNING event_id"
)
_PARKED = (
    "UPDATE {}.processed_events SET status = 'parked', reason = %s"
    " WHERE consumer = %s AND event_id = %s RETURNING event_id"
)
_BLOCK = (
    "INSERT INTO {}.parked_keys (consumer, topic, key, blocked_by) VALUES (%s, %s, %s, %s)"
    " ON CONFLICT (consumer, topic, key) DO UPDATE SET blocked_by = EXCLUDED.blocked_by,"
    " released = false RETURNING key"
)
_UNPARK = (
    "DELETE FROM {}.parked_events WHERE consumer = %s AND event_id = ANY(%s::text[])"
    " RETURNING event_id"
)
_FREE = (
    "DELETE FROM {0}.parked_keys k"
    " WHERE k.consumer = %s AND k.topic = %s AND k.key = ANY(%s::bytea[])"
    " AND NOT EXISTS (SELECT FROM {0}.parked_events e"
    " WHERE e.consumer = k.consumer AND e.topic = k.topic AND e.key = k.key)"
    " RETURNING key"
)

CHECK_DEFERRED = b"SET CONSTRAINTS ALL IMMEDIATE"
"""Checks every deferrable constraint (and constraint trigger) queued so far, as COMMIT would.

Retroactive, and it keeps later statements immediate."""


@dataclass(frozen=True)
class InboxStatements:
    """The statements of one schema's inbox, rendered to bytes.

    Parameters: ``claim`` takes them by name (consumer, topic, partition,
    ids, offsets, traces, hashes: the last four array literals; for
    ``claim_one`` one value each); in order,
    ``reclaim`` takes the consumer, topic, partition and those four arrays;
    ``reused`` the topic, partition, three array literals (ids, offsets,
    digests) and the consumer; ``known`` by name the consumer, topic,
    partition, and array literals of ids and offsets; ``dead_letter`` the
    reason, the consumer and the id.
    """

    claim: bytes
    """Records fresh ids as ``applied``, and reused ids among the others; returns both."""
    claim_one: bytes
    """:attr:`claim` of one event: its id, offset, trace id and digest as plain values."""
    reclaim: bytes
    """:attr:`claim` for replayed records: a ``dead_lettered`` row is taken over too."""
    reused: bytes
    """Records the duplicates whose digest differs from their row's; returns those recorded."""
    known: bytes
    """Which of the ids this consumer has recorded, each with its row's digest where the row
    was claimed at another position (read-only)."""
    dead_letter: bytes
    """Sets a claimed row to ``dead_lettered`` with its reason."""
    blocked: bytes
    """The blocked keys among some of a topic's (consumer, topic, keys), locked."""
    released: bytes
    """The parked events of those keys, released or not (consumer, topic, keys)."""
    park: bytes
    """Keeps one parked event's record (consumer, topic, id, key, partition, offset,
    value, header names, header values, timestamp, blocked by)."""
    parked: bytes
    """Sets a claimed row to ``parked`` (reason, consumer, id)."""
    block: bytes
    """Blocks a key behind a dead letter (consumer, topic, key, its event id)."""
    unpark: bytes
    """Drops parked records (consumer, ids)."""
    free: bytes
    """Frees keys with nothing parked any more (consumer, topic, keys)."""

    @classmethod
    def of(cls, schema: str) -> InboxStatements:
        """The statements of the inbox in ``schema`` (an already validated identifier)."""
        table = sql.Identifier(schema)

        def render(text: str) -> bytes:
            return sql.SQL(text).format(table).as_bytes()

        return cls(
            render(_CLAIM), render(_CLAIM_ONE), render(_RECLAIM), render(_REUSED),
            render(_KNOWN), render(_DEAD_LETTER), render(_BLOCKED), render(_RELEASED),
            render(_PARK), render(_PARKED), render(_BLOCK), render(_UNPARK), render(_FREE),
        )  # fmt: skip
