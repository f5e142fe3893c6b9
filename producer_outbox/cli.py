"""``kinbox outbox``: relay, status, cleanup, debezium-config.

Settings come from flags, then ``KINBOX_*`` environment variables, then
defaults, as for the worker. Passwords never reach the output: URLs are
printed with the password masked, ``-X`` secrets are never printed.

Exit codes: 0 ok, 2 bad usage or configuration, 3 cannot connect (PostgreSQL,
or Kafka Connect for ``--register``), 4 schema missing or too old, 5 ``status``
crossed a warning threshold, 1 anything else.
"""

from __future__ import annotations

import json
import logging
import re
import signal
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any

import click
import psycopg

from kinbox.errors import ConfigurationError, ConnectorError, SchemaError
from kinbox.migrations import check
from kinbox.names import sql_identifier
from producer_outbox.cleanup import delete_older, delete_sent
from producer_outbox.connect_api import register
from producer_outbox.connect_plugin import build_smt_jar
from producer_outbox.debezium import (
    CDC_CONSTRAINT,
    DebeziumSettings,
    connector_config,
    refuse_bytes_payloads,
)
from producer_outbox.publisher import KafkaPublisher, producer_config
from producer_outbox.relay import Relay, RelayConfig
from producer_outbox.schema import OUTBOX
from producer_outbox.slots import DEFAULT_WARN_BYTES, parse_size, read_slots
from producer_outbox.status import read_status

RET_ERROR = 1
RET_CONFIG = 2
RET_CONNECT = 3
RET_SCHEMA = 4
RET_WARNING = 5
"""``status``: a threshold was crossed (a replication slot holds back too much WAL)."""

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


def _size_option(_ctx: click.Context, _param: click.Parameter, value: str | int) -> int:
    if isinstance(value, int):
        return value
    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@outbox.command()
@_database_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option(
    "--slot-warn-bytes",
    default=str(DEFAULT_WARN_BYTES),
    show_default=True,
    envvar="KINBOX_SLOT_WARN_BYTES",
    callback=_size_option,
    help="Warn (exit 5) when a replication slot holds back more WAL than this "
    "(512MB, 1GiB, ...) [env KINBOX_SLOT_WARN_BYTES].",
)
def status(database_url: str, schema: str, as_json: bool, slot_warn_bytes: int) -> None:
    """Show the backlog, the oldest unsent row's age, parked (dead) rows and replication slots.

    Under CDC the relay counters do not apply (nothing marks rows sent); the
    replication slots show how far the connector is behind.
    """
    with _connect(database_url, schema) as conn:
        state = read_status(conn, schema)
        slots = read_slots(conn)
    warnings = [w for w in (slot.warning(slot_warn_bytes) for slot in slots) if w]
    if as_json:
        report = {
            **state.as_dict(),
            "replication_slots": [slot.as_dict() for slot in slots],
            "warnings": warnings,
        }
        click.echo(json.dumps(report, indent=2))
        if warnings:
            raise SystemExit(RET_WARNING)
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
    click.echo(f"replication slots: {len(slots)}")
    for slot in slots:
        click.echo(
            f"  {slot.name} ({slot.plugin}, {'active' if slot.active else 'inactive'}, "
            f"wal_status={slot.wal_status}): retained {slot.retained_bytes} bytes, "
            f"unconfirmed {slot.unconfirmed_bytes} bytes"
        )
    for warning in warnings:
        click.echo(f"WARNING: {warning}", err=True)
    if warnings:
        raise SystemExit(RET_WARNING)


@outbox.command()
@_database_option
@click.option("--retention-days", type=float, default=7.0, show_default=True)
@click.option("--batch-size", type=int, default=1000, show_default=True)
@click.option(
    "--cdc",
    is_flag=True,
    help="The outbox is published by Debezium: delete rows by age alone (nothing marks "
    "them sent). Run it on a schedule; the relay's own cleanup never runs under CDC.",
)
def cleanup(
    database_url: str, schema: str, retention_days: float, batch_size: int, cdc: bool
) -> None:
    """Delete sent rows (--cdc: all rows) older than the retention, in bounded batches."""
    if retention_days < 0 or batch_size < 1:
        raise ConfigurationError(
            f"retention_days={retention_days!r}, batch_size={batch_size!r}: use >= 0 and >= 1"
        )
    retention = timedelta(days=retention_days)
    with _connect(database_url, schema) as conn:
        if cdc:
            deleted = delete_older(conn, schema, retention=retention, batch=batch_size)
        else:
            deleted = delete_sent(conn, schema, retention=retention, batch=batch_size)
    kind = "outbox rows" if cdc else "sent outbox rows"
    click.echo(f"deleted {deleted} {kind} older than {retention_days:g} days")


@outbox.command("debezium-config")
@_database_option
@click.option("--name", default="kinbox-outbox", show_default=True, help="Connector name.")
@click.option("--topic-prefix", default="kinbox", show_default=True)
@click.option("--slot-name", default="kinbox_outbox", show_default=True)
@click.option("--publication", default=None, help="Publication name [default: the slot's].")
@click.option(
    "--heartbeat-ms",
    type=int,
    default=10_000,
    show_default=True,
    help="Heartbeat interval; keeps the slot moving on a quiet outbox (0: off).",
)
@click.option(
    "--header-column",
    "header_columns",
    multiple=True,
    metavar="COLUMN[:HEADER]",
    help="Publish another outbox column as a header (repeat).",
)
@click.option(
    "--register",
    "connect_url",
    default=None,
    metavar="URL",
    help="Create or update the connector through this Kafka Connect REST API (kinbox dev "
    "--cdc prints it as KINBOX_CONNECT_URL) and wait until it runs; also makes the outbox "
    "refuse bytes payloads.",
)
@click.option(
    "--database-address",
    default=None,
    metavar="HOST[:PORT]",
    help="PostgreSQL's address as Kafka Connect reaches it, if not the URL's "
    "(Connect in a container: postgres:5432).",
)
@click.option("--timeout", type=float, default=60.0, show_default=True, help="Seconds.")
def debezium_config(
    database_url: str,
    schema: str,
    name: str,
    topic_prefix: str,
    slot_name: str,
    publication: str | None,
    heartbeat_ms: int,
    header_columns: tuple[str, ...],
    connect_url: str | None,
    database_address: str | None,
    timeout: float,
) -> None:
    """Print (or --register) the Debezium connector for this outbox (CDC instead of the relay).

    The Outbox Event Router publishes each inserted row like the relay would:
    topic from `topic`, key from `aggregateid`, the JSON payload as the value,
    the event id in the `id` and `event-id` headers, one header per entry of
    `headers`. The password is a Kafka Connect config-provider placeholder,
    never the real one. Bytes payloads are relay-only.
    """
    extra: dict[str, str] = {}
    for item in header_columns:
        column, _, header = item.partition(":")
        extra[column] = header or column
    settings = DebeziumSettings(
        name=name,
        topic_prefix=topic_prefix,
        slot_name=slot_name,
        publication=publication,
        heartbeat_ms=heartbeat_ms,
        header_columns=extra,
        database_address=database_address,
    )
    connector = connector_config(database_url, schema, settings)
    if connect_url is None:
        click.echo(json.dumps(connector, indent=2))
        return
    with _connect(database_url, schema) as conn:
        if refuse_bytes_payloads(conn, schema):
            click.echo(
                f"{schema}.outbox now refuses bytes payloads ({CDC_CONSTRAINT}): "
                "Debezium routes JSON payloads only",
                err=True,
            )
    try:
        created, state = register(connect_url, connector, timeout=timeout)
    except ConnectorError as exc:
        click.echo(str(exc), err=True)
        raise SystemExit(RET_CONNECT) from exc
    click.echo(
        f"connector {name!r} {'created' if created else 'updated'} at {connect_url}: "
        f"{state.connector}, tasks {', '.join(state.tasks)}; slot {slot_name!r}"
    )


@outbox.command("connect-plugin")
@click.option(
    "--connect-libs",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    required=True,
    help="The Connect worker's jar folder to compile against (libs/ of a Kafka "
    "distribution, /kafka/libs in Debezium's image).",
)
@click.option(
    "--output",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="A plugin.path directory; the jar goes into <output>/kinbox-connect-smt/.",
)
def connect_plugin(connect_libs: Path, output: Path) -> None:
    """Build kinbox's Kafka Connect transform (one header per `headers` entry) as a jar.

    The Debezium connector from `debezium-config` needs it on every Connect
    worker's plugin.path. Needs a JDK (javac, jar), 17 or newer.
    """
    try:
        jar = build_smt_jar(connect_libs, output / "kinbox-connect-smt" / "kinbox-connect-smt.jar")
    except ConnectorError as exc:
        click.echo(str(exc), err=True)
        raise SystemExit(RET_ERROR) from exc
    click.echo(f"{jar}: add {output} to plugin.path of every Connect worker")
