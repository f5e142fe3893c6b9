"""``kinbox outbox``: relay, status, cleanup, debezium-config.

Settings come from flags, then ``KINBOX_*`` environment variables, then
defaults, as for the worker. Passwords never reach the output: URLs are
printed with the password masked, ``-X`` secrets are never printed.

Exit codes: 0 ok, 2 bad usage or configuration, 3 cannot connect, 4 schema
missing or too old, 1 anything else.
"""

from __future__ import annotations

import json
import logging
import re
import signal
from datetime import timedelta
from types import FrameType
from typing import Any

import click
import psycopg
from psycopg.conninfo import conninfo_to_dict

from kinbox.errors import ConfigurationError, SchemaError
from kinbox.migrations import check
from kinbox.names import sql_identifier
from producer_outbox.cleanup import delete_sent
from producer_outbox.publisher import KafkaPublisher, producer_config
from producer_outbox.relay import Relay, RelayConfig
from producer_outbox.schema import OUTBOX
from producer_outbox.status import read_status

RET_ERROR = 1
RET_CONFIG = 2
RET_CONNECT = 3
RET_SCHEMA = 4

_URL_PASSWORD = re.compile(r"(://[^:/@]*:)[^@]*(@)")
_KV_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]*)", re.IGNORECASE)

log = logging.getLogger("producer_outbox")


def redact(url: str) -> str:
    """Mask the password of a PostgreSQL URL or ``key=value`` conninfo."""
    return _KV_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\1***\2", url))


def _database_option(function: Any) -> Any:
    function = click.option(
        "--schema",
        envvar="KINBOX_SCHEMA",
        default="kinbox",
        show_default=True,
        help="PostgreSQL schema of the kinbox tables [env KINBOX_SCHEMA].",
    )(function)
    return click.option(
        "--database-url",
        envvar="KINBOX_DATABASE_URL",
        required=True,
        help="PostgreSQL URL or conninfo [env KINBOX_DATABASE_URL].",
    )(function)


def _parse_overrides(values: tuple[str, ...]) -> dict[str, str]:
    overrides: dict[str, str] = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise click.BadParameter(f"{name!r} is not key=value", param_hint="-X")
        overrides[name.strip()] = value
    return overrides


def _connect(database_url: str, schema: str) -> psycopg.Connection[Any]:
    sql_identifier(schema, setting="schema")
    try:
        conn = psycopg.connect(database_url, autocommit=True)
    except psycopg.Error as exc:
        click.echo(f"cannot connect to PostgreSQL at {redact(database_url)}: {exc}", err=True)
        raise SystemExit(RET_CONNECT) from exc
    try:
        check(conn, schema, OUTBOX)
    except SchemaError as exc:
        conn.close()
        click.echo(str(exc), err=True)
        raise SystemExit(RET_SCHEMA) from exc
    return conn


class _ConfigGroup(click.Group):
    """Turns :class:`ConfigurationError` into a one-line message and exit code 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ConfigurationError as exc:
            click.echo(f"configuration error: {exc}", err=True)
            raise SystemExit(RET_CONFIG) from exc


@click.group(cls=_ConfigGroup)
def outbox() -> None:
    """Transactional outbox: publish rows written by enqueue() to Kafka."""


@outbox.command()
@_database_option
@click.option(
    "--bootstrap-servers",
    envvar="KINBOX_BOOTSTRAP_SERVERS",
    default="localhost:9092",
    show_default=True,
    help="Kafka bootstrap servers [env KINBOX_BOOTSTRAP_SERVERS].",
)
@click.option("-X", "overrides", multiple=True, help="librdkafka property key=value (repeat).")
@click.option("--lanes", type=int, default=16, show_default=True, help="Same on every relay.")
@click.option("--batch-size", type=int, default=100, show_default=True)
@click.option("--poll-interval", type=float, default=1.0, show_default=True, help="Seconds.")
@click.option("--max-attempts", type=int, default=10, show_default=True)
@click.option("--retention-days", type=float, default=7.0, show_default=True)
@click.option("--cleanup-interval", type=float, default=3600.0, show_default=True)
@click.option("--source", default=None, help="CloudEvents ce_source (default /<topic>).")
@click.option("--log-level", default="INFO", show_default=True)
def relay(
    database_url: str,
    schema: str,
    bootstrap_servers: str,
    overrides: tuple[str, ...],
    lanes: int,
    batch_size: int,
    poll_interval: float,
    max_attempts: int,
    retention_days: float,
    cleanup_interval: float,
    source: str | None,
    log_level: str,
) -> None:
    """Publish committed outbox rows to Kafka until SIGTERM/SIGINT."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = RelayConfig(
        database_url=database_url,
        schema=schema,
        lanes=lanes,
        batch_size=batch_size,
        poll_interval=poll_interval,
        max_attempts=max_attempts,
        retention=timedelta(days=retention_days),
        cleanup_interval=cleanup_interval,
        source=source,
    ).validate()
    kafka_config = producer_config(bootstrap_servers, _parse_overrides(overrides))
    _connect(database_url, schema).close()  # fail fast: reachable and migrated
    publisher = KafkaPublisher(kafka_config)
    runner = Relay(config, publisher)

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: finishing the current batch, then stopping", signum)
        runner.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info(
        "outbox relay: kafka=%s database=%s schema=%s",
        bootstrap_servers,
        redact(database_url),
        schema,
    )
    try:
        runner.run()
    finally:
        publisher.close()


@outbox.command()
@_database_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status(database_url: str, schema: str, as_json: bool) -> None:
    """Show the backlog, the oldest unsent row's age and parked (dead) rows."""
    with _connect(database_url, schema) as conn:
        state = read_status(conn, schema)
    if as_json:
        click.echo(json.dumps(state.as_dict(), indent=2))
        return
    click.echo(
        f"pending: {state.pending} (retrying: {state.retrying})\n"
        f"oldest unsent: {state.oldest_pending_seconds:.1f}s\n"
        f"sent (kept for cleanup): {state.sent}\n"
        f"dead (parked): {state.dead}"
    )
    for row in state.parked:
        click.echo(
            f"  dead {row.id} topic={row.topic} key={row.key!r} "
            f"attempts={row.attempts} error={row.last_error}"
        )


@outbox.command()
@_database_option
@click.option("--retention-days", type=float, default=7.0, show_default=True)
@click.option("--batch-size", type=int, default=1000, show_default=True)
def cleanup(database_url: str, schema: str, retention_days: float, batch_size: int) -> None:
    """Delete sent rows older than the retention, in bounded batches."""
    if retention_days < 0 or batch_size < 1:
        raise ConfigurationError(
            f"retention_days={retention_days!r}, batch_size={batch_size!r}: use >= 0 and >= 1"
        )
    with _connect(database_url, schema) as conn:
        deleted = delete_sent(
            conn, schema, retention=timedelta(days=retention_days), batch=batch_size
        )
    click.echo(f"deleted {deleted} sent outbox rows older than {retention_days:g} days")


@outbox.command("debezium-config")
@_database_option
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
