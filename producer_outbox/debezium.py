"""The Debezium connector that publishes the outbox table instead of the relay (CDC).

Debezium reads the table's inserts from PostgreSQL's WAL through a logical
replication slot (``pgoutput``, no extension) and its Outbox Event Router
turns each one into the record the relay would have sent:

==================  ==========================================================
Kafka record        from the row
==================  ==========================================================
topic               ``topic``, verbatim
key                 ``aggregateid`` (the partition key; NULL → no key)
value               ``payload``: its JSON text as is, no schema envelope
header ``id``       ``id`` (the router's own header)
header ``event-id`` ``id`` again: kinbox's default id header
header ``ce_type``  ``type`` (when set)
``traceparent``,    the trace context ``enqueue`` stored (when set), so the
``tracestate``      consumer continues the business transaction's trace
other headers       one per entry of ``headers`` (kinbox's ``ExpandJsonHeader``
                    transform, see ``producer_outbox/java``)
==================  ==========================================================

Deletes (cleanup) publish nothing and no tombstones. A heartbeat writes a
logical decoding message every ``heartbeat_ms``, so the slot's position moves
even when the outbox is quiet and the rest of the server is busy.

Bytes payloads (``payload_bytes``) are relay-only: the router routes one
payload column, and a JSON one cannot carry arbitrary bytes. Registering the
connector adds a check constraint (:data:`CDC_CONSTRAINT`) that refuses such
rows, and :func:`producer_outbox.enqueue` turns its violation into a
:class:`~kinbox.core.errors.PayloadError`, so a bytes event fails in the business
transaction instead of vanishing downstream.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from kinbox.core.errors import ConfigurationError
from kinbox.core.names import sql_identifier
from producer_outbox.trace_context import COLUMNS as TRACE_COLUMNS

CONNECTOR_CLASS = "io.debezium.connector.postgresql.PostgresConnector"
EVENT_ROUTER = "io.debezium.transforms.outbox.EventRouter"
HEADERS_TRANSFORM = "dev.kinbox.connect.ExpandJsonHeader"

PASSWORD_PLACEHOLDER = "${env:KINBOX_DEBEZIUM_DATABASE_PASSWORD}"
"""What the config says instead of a password: Connect's ``EnvVarConfigProvider`` fills it in."""

HEADERS_CARRIER = "kinbox.headers"
"""The header the router puts the ``headers`` column in, for ``ExpandJsonHeader`` to expand."""

HEADER_COLUMNS: Mapping[str, str] = {"type": "ce_type", **TRACE_COLUMNS}
"""Outbox columns published as one header each (column → header name), beside the id.

A NULL in one adds no header. More with ``header_columns`` (:func:`connector_config`).
Each must have no ``DEFAULT``: see :func:`check_header_columns`.
"""

CDC_CONSTRAINT = "outbox_cdc_json_only"
"""Check constraint that refuses bytes payloads once the outbox is published by CDC."""

HEARTBEAT_PREFIX = "kinbox-heartbeat"
"""Prefix of the heartbeat's logical decoding messages (filtered out, never published)."""

_SLOT = re.compile(r"^[a-z0-9_]{1,63}$")


@dataclass(frozen=True)
class DebeziumSettings:
    """What varies between deployments of the connector; everything else is fixed.

    Args:
        name: the connector's name in Kafka Connect.
        topic_prefix: Debezium's ``topic.prefix`` (names its heartbeat topic).
        slot_name: the replication slot (lower case letters, digits, ``_``).
        publication: the publication, limited to the outbox table; Debezium
            creates it (``filtered``) when missing.
        heartbeat_ms: how often the heartbeat runs (0: never).
        header_columns: extra ``column → header`` pairs (see :data:`HEADER_COLUMNS`).
        database_address: ``host[:port]`` of PostgreSQL as Connect reaches it,
            when that differs from the URL's (Connect in a container, say).
    """

    name: str = "kinbox-outbox"
    topic_prefix: str = "kinbox"
    slot_name: str = "kinbox_outbox"
    publication: str | None = None
    heartbeat_ms: int = 10_000
    header_columns: Mapping[str, str] = field(default_factory=dict)
    database_address: str | None = None

    def validate(self) -> DebeziumSettings:
        """Return ``self`` if every value is usable; raise :class:`ConfigurationError` if not."""
        if not _SLOT.match(self.slot_name):
            raise ConfigurationError(
                f"slot_name={self.slot_name!r}: PostgreSQL slot names are 1-63 characters "
                "of lower case letters, digits and _"
            )
        if self.publication is not None:
            sql_identifier(self.publication, setting="publication")
        if not self.name or "/" in self.name:
            raise ConfigurationError(f"name={self.name!r}: a non-empty name without '/'")
        if not re.match(r"^[A-Za-z0-9_.-]+$", self.topic_prefix):
            raise ConfigurationError(
                f"topic_prefix={self.topic_prefix!r}: letters, digits, '.', '_' and '-' only"
            )
        if self.heartbeat_ms < 0:
            raise ConfigurationError(f"heartbeat_ms={self.heartbeat_ms!r}: use 0 or more")
        for column, header in self.header_columns.items():
            sql_identifier(column, setting="header column")
            if not header or "," in header or ":" in header:
                raise ConfigurationError(
                    f"header name {header!r} for column {column!r}: non-empty, without ',' or ':'"
                )
        return self


def connector_config(
    database_url: str, schema: str, settings: DebeziumSettings | None = None
) -> dict[str, Any]:
    """Build the connector JSON (``{"name", "config"}``) for ``<schema>.outbox``.

    The password never appears: a URL with one gets
    :data:`PASSWORD_PLACEHOLDER` instead (the worker needs
    ``config.providers=env``), a URL without one gets no password at all.

    Raises:
        ConfigurationError: a bad schema, setting or URL.
    """
    settings = (settings or DebeziumSettings()).validate()
    sql_identifier(schema, setting="schema")
    try:
        parts = conninfo_to_dict(database_url)
    except psycopg.ProgrammingError as exc:
        raise ConfigurationError(f"database_url is not a valid conninfo: {exc}") from None
    host, port = str(parts.get("host", "localhost")), str(parts.get("port", "5432"))
    if settings.database_address:
        host, _, given_port = settings.database_address.partition(":")
        port = given_port or "5432"
    table = f"{schema}.outbox"
    headers = {"id": "event-id", **HEADER_COLUMNS, **settings.header_columns}
    placement = [f"{column}:header:{header}" for column, header in headers.items()]
    placement.append(f"headers:header:{HEADERS_CARRIER}")
    config: dict[str, str] = {
        "connector.class": CONNECTOR_CLASS,
        "tasks.max": "1",  # one slot is read by one task; more would not help
        "plugin.name": "pgoutput",
        "database.hostname": host,
        "database.port": port,
        "database.user": str(parts.get("user", "postgres")),
        "database.dbname": str(parts.get("dbname", "postgres")),
        "topic.prefix": settings.topic_prefix,
        "slot.name": settings.slot_name,
        "publication.name": settings.publication or settings.slot_name,
        # Debezium creates the publication FOR TABLE <outbox> only, so the
        # server decodes nothing else for this slot.
        "publication.autocreate.mode": "filtered",
        "table.include.list": re.escape(table),
        # Rows written before the slot existed were the relay's to publish;
        # an outbox is a stream of new events, not a table to copy.
        "snapshot.mode": "no_data",
        "tombstones.on.delete": "false",
        # With nothing queued, Debezium waits this long before looking again
        # (default 500 ms), which sets commit-to-consumer latency on a quiet
        # outbox: measured p50 393 ms at 500, 54 ms at 50, 17 ms at 10. An idle
        # wake-up every 10 ms costs nothing worth saving; under load the queue
        # is never empty and this never applies.
        "poll.interval.ms": "10",
        # Debezium's own context headers (__debezium.context.*) are not events' headers.
        "extended.headers.enabled": "false",
        "key.converter": "org.apache.kafka.connect.storage.StringConverter",
        # The payload column arrives as jsonb's JSON text; StringConverter
        # writes that text as the value, byte for byte what the relay sends.
        # The router's table.expand.json.payload is left off on purpose: it
        # infers a Connect schema from each payload, and fails the task on a
        # top-level array or scalar and turns a payload with a mixed-type
        # array into a JSON *string* (tests/integration/test_cdc.py).
        "value.converter": "org.apache.kafka.connect.storage.StringConverter",
        "transforms": "outbox,headers",
        "transforms.outbox.type": EVENT_ROUTER,
        "transforms.outbox.predicate": "outboxTable",
        "transforms.outbox.table.field.event.id": "id",
        "transforms.outbox.table.field.event.key": "aggregateid",
        "transforms.outbox.table.field.event.payload": "payload",
        "transforms.outbox.table.expand.json.payload": "false",
        "transforms.outbox.table.fields.additional.placement": ",".join(placement),
        "transforms.outbox.route.by.field": "topic",
        "transforms.outbox.route.topic.replacement": "${routedByValue}",
        "transforms.outbox.route.tombstone.on.empty.payload": "false",
        # The relay's status updates, should one run too, are not events.
        "transforms.outbox.table.op.invalid.behavior": "warn",
        "transforms.headers.type": HEADERS_TRANSFORM,
        "transforms.headers.header": HEADERS_CARRIER,
        "transforms.headers.drop.null": ",".join(
            header for column, header in headers.items() if column != "id"
        ),
        "predicates": "outboxTable",
        "predicates.outboxTable.type": (
            "org.apache.kafka.connect.transforms.predicates.TopicNameMatches"
        ),
        "predicates.outboxTable.pattern": re.escape(f"{settings.topic_prefix}.{table}"),
    }
    if parts.get("password"):
        config["database.password"] = PASSWORD_PLACEHOLDER
    if settings.heartbeat_ms:
        config.update(
            {
                "heartbeat.interval.ms": str(settings.heartbeat_ms),
                # A non-transactional logical decoding message: WAL that this
                # slot decodes even when the outbox is quiet, so the connector
                # has a position to confirm and the slot frees WAL that other
                # tables' writes fill. No table needed, nothing published.
                "heartbeat.action.query": (
                    f"SELECT pg_logical_emit_message(false, '{HEARTBEAT_PREFIX}', '')"
                ),
                "message.prefix.exclude.list": HEARTBEAT_PREFIX,
            }
        )
    return {"name": settings.name, "config": config}


def check_header_columns(
    conn: psycopg.Connection[Any], schema: str, columns: Mapping[str, str]
) -> None:
    """Refuse header columns the outbox lacks, or that have a ``DEFAULT``.

    A column with a default is published wrongly: Debezium puts the default
    into the column's Connect schema, and Kafka Connect's ``Struct.get``
    returns that default for a NULL (KAFKA-8713), so a row whose column is
    NULL gets a header with the default's value (``''`` for an expression
    Debezium cannot evaluate) instead of none. Fill such a column in the
    INSERT (or a trigger) and drop its default.

    Raises:
        ConfigurationError: naming the column and what is wrong with it.
    """
    found = {
        str(name): bool(has_default)
        for name, has_default in conn.execute(
            "SELECT attname, atthasdef FROM pg_attribute"
            " WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped",
            (f"{sql_identifier(schema, setting='schema')}.outbox",),
        )
    }
    for column, header in columns.items():
        if column not in found:
            raise ConfigurationError(
                f"header column {column!r} (header {header!r}): {schema}.outbox has no such column"
            )
        if found[column]:
            raise ConfigurationError(
                f"header column {column!r} of {schema}.outbox has a DEFAULT: Debezium would "
                f"publish a NULL in it as the default in header {header!r}, not as no header; "
                "drop the default and fill the column in the INSERT or a trigger"
            )


def refuse_bytes_payloads(conn: psycopg.Connection[Any], schema: str) -> bool:
    """Add :data:`CDC_CONSTRAINT` to ``<schema>.outbox`` unless present; return whether added.

    ``NOT VALID``: rows already there (the relay's) are not checked, only new
    ones, so adding it takes no long lock and never fails on old bytes rows.
    """
    schema_id = sql.Identifier(sql_identifier(schema, setting="schema"))
    with conn.transaction():
        found = conn.execute(
            "SELECT 1 FROM pg_constraint WHERE conname = %s AND conrelid = to_regclass(%s)",
            (CDC_CONSTRAINT, f"{schema}.outbox"),
        ).fetchone()
        if found:
            return False
        conn.execute(
            sql.SQL(
                "ALTER TABLE {}.outbox ADD CONSTRAINT {} CHECK (payload_bytes IS NULL) NOT VALID"
            ).format(schema_id, sql.Identifier(CDC_CONSTRAINT))
        )
    return True
