"""``kinbox outbox debezium-config``: the outbox table through Debezium's Outbox Event Router."""

from __future__ import annotations

import json
from typing import Any

import click
import psycopg
from psycopg.conninfo import conninfo_to_dict

from kinbox.errors import ConfigurationError
from kinbox.names import sql_identifier
from producer_outbox.cli_support import database_option


@click.command("debezium-config")
@database_option
@click.option("--name", default="kinbox-outbox", show_default=True, help="Connector name.")
@click.option("--topic-prefix", default="kinbox", show_default=True)
@click.option("--slot-name", default="kinbox_outbox", show_default=True)
def debezium_config(
    database_url: str, schema: str, name: str, topic_prefix: str, slot_name: str
) -> None:
    """Print a Debezium PostgreSQL connector config (Outbox Event Router) for this table.

    The password is a Kafka Connect config-provider placeholder, never the real one.
    """
    click.echo(json.dumps(debezium_connector(database_url, schema, name, topic_prefix, slot_name)))


def debezium_connector(
    database_url: str, schema: str, name: str, topic_prefix: str, slot_name: str
) -> dict[str, Any]:
    """Build the Debezium connector JSON (``{"name", "config"}``) matching the outbox table.

    Routing: topic from the ``topic`` column verbatim; key from ``aggregateid``;
    value from ``payload`` (jsonb, expanded to JSON); headers ``id`` (the
    router's own), ``event-id`` and ``ce_type``. Bytes payloads and the
    ``headers`` column are relay-only. Under CDC nothing marks rows sent:
    delete them on your own schedule (or keep the relay's cleanup off).
    """
    sql_identifier(schema, setting="schema")
    try:
        parts = conninfo_to_dict(database_url)
    except psycopg.ProgrammingError as exc:
        raise ConfigurationError(f"database_url is not a valid conninfo: {exc}") from None
    config = {
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "plugin.name": "pgoutput",
        "database.hostname": str(parts.get("host", "localhost")),
        "database.port": str(parts.get("port", "5432")),
        "database.user": str(parts.get("user", "postgres")),
        "database.password": "${env:KINBOX_DEBEZIUM_DATABASE_PASSWORD}",
        "database.dbname": str(parts.get("dbname", "postgres")),
        "topic.prefix": topic_prefix,
        "slot.name": slot_name,
        "publication.autocreate.mode": "filtered",
        "table.include.list": f"{schema}.outbox",
        "tombstones.on.delete": "false",
        "key.converter": "org.apache.kafka.connect.storage.StringConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter.schemas.enable": "false",
        "transforms": "outbox",
        "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
        "transforms.outbox.table.field.event.id": "id",
        "transforms.outbox.table.field.event.key": "aggregateid",
        "transforms.outbox.table.field.event.payload": "payload",
        "transforms.outbox.table.expand.json.payload": "true",
        "transforms.outbox.table.fields.additional.placement": (
            "id:header:event-id,type:header:ce_type"
        ),
        "transforms.outbox.route.by.field": "topic",
        "transforms.outbox.route.topic.replacement": "${routedByValue}",
        "transforms.outbox.table.op.invalid.behavior": "warn",
    }
    return {"name": name, "config": config}
