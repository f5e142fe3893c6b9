"""``kinbox outbox debezium-config`` and ``connect-plugin``: the outbox through Debezium (CDC)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from kinbox.cli.outbox_support import RET_CONNECT, RET_ERROR, connect, database_option
from kinbox.core.errors import ConnectorError
from producer_outbox.connect_api import register
from producer_outbox.connect_plugin import build_smt_jar
from producer_outbox.debezium import (
    CDC_CONSTRAINT,
    HEADER_COLUMNS,
    DebeziumSettings,
    check_header_columns,
    connector_config,
    refuse_bytes_payloads,
)


@click.command("debezium-config")
@database_option
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
    help="Publish another outbox column as a header (repeat). The column must have no "
    "DEFAULT: Debezium would publish a NULL in it as the default (--register refuses it).",
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
    the event id in the `id` and `event-id` headers, the stored trace context in
    `traceparent` / `tracestate`, one header per entry of `headers`. The password
    is a Kafka Connect config-provider placeholder, never the real one. Bytes
    payloads are relay-only.
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
    with connect(database_url, schema) as conn:
        # The default ones too: the router fails its task on a column the table lacks.
        check_header_columns(conn, schema, {**HEADER_COLUMNS, **extra})
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


@click.command("connect-plugin")
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
