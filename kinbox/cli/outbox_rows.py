"""``kinbox outbox status``, ``requeue`` and ``cleanup``: look at and act on the rows."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import click

from kinbox.cli.outbox_support import (
    RET_CONNECT,
    RET_WARNING,
    connect,
    database_option,
    kafka_options,
    parse_overrides,
    size_option,
)
from kinbox.core.errors import ConfigurationError, TransportError
from producer_outbox.cleanup import delete_older, delete_sent
from producer_outbox.outbox_status import OutboxStatus, read_status
from producer_outbox.parked import requeue as requeue_rows
from producer_outbox.producer import producer_config
from producer_outbox.sent_retention import Floor, broker_retention, floor
from producer_outbox.slots import DEFAULT_WARN_BYTES, read_slots


@click.command()
@database_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option(
    "--slot-warn-bytes",
    default=str(DEFAULT_WARN_BYTES),
    show_default=True,
    envvar="KINBOX_SLOT_WARN_BYTES",
    callback=size_option,
    help="Warn (exit 5) when a replication slot holds back more WAL than this "
    "(512MB, 1GiB, ...) [env KINBOX_SLOT_WARN_BYTES].",
)
def status(database_url: str, schema: str, as_json: bool, slot_warn_bytes: int) -> None:
    """Show the backlog, parked rows, the keys they block, failing topics and replication slots.

    Under CDC the relay counters do not apply (nothing marks rows sent); the
    replication slots show how far the connector is behind.
    """
    with connect(database_url, schema) as conn:
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
    else:
        click.echo(_describe(state))
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


def _describe(state: OutboxStatus) -> str:
    lines = [
        f"pending: {state.pending} (retrying: {state.retrying})",
        f"oldest unsent: {state.oldest_pending_seconds:.1f}s",
        f"sent (kept for cleanup): {state.sent}",
        f"dead (parked): {state.dead}",
    ]
    lines += [
        f"  dead {row.id} topic={row.topic} key={row.key!r} "
        f"attempts={row.attempts} error={row.last_error}"
        for row in state.parked
    ]
    lines.append(f"blocked keys (a parked row holds back their later rows): {state.blocked}")
    lines += [
        f"  key={key.key!r} held={key.held} behind {key.parked_id} topic={key.topic} "
        f"error={key.last_error}"
        for key in state.blocked_keys
    ]
    lines.append(f"failing topics (rows wait, never parked): {len(state.failing_topics)}")
    lines += [
        f"  topic={topic.topic} pending={topic.pending} failing for "
        f"{topic.failing_seconds:.0f}s ({topic.failures} rounds), next try in "
        f"{topic.retry_in_seconds:.0f}s: {topic.error}"
        for topic in state.failing_topics
    ]
    return "\n".join(lines)


@click.command()
@database_option
@click.option("--id", "row_id", type=click.UUID, default=None, help="One parked row, by id.")
@click.option("--key", default=None, help="Every parked row of this key.")
@click.option("--all", "every", is_flag=True, help="Every parked row.")
@click.option("--dry-run", is_flag=True, help="Print what would be requeued; change nothing.")
def requeue(
    database_url: str,
    schema: str,
    row_id: uuid.UUID | None,
    key: str | None,
    every: bool,
    dry_run: bool,
) -> None:
    """Put parked (dead) rows back to pending, after fixing what made them fail.

    A requeued row goes out before the later rows of its key, which waited
    behind it; it is parked again if it fails another --max-attempts times.
    """
    if (row_id is not None) + (key is not None) + every != 1:
        raise click.UsageError("give exactly one of --id, --key or --all")
    with connect(database_url, schema) as conn:
        done = requeue_rows(conn, schema, row_id=row_id, key=key, dry_run=dry_run)
    for row in done.rows:
        click.echo(
            f"  {row.id} topic={row.topic} key={row.key!r} attempts={row.attempts} "
            f"error={row.last_error}"
        )
    verb, follow = ("would requeue", "would follow") if dry_run else ("requeued", "follow")
    click.echo(
        f"{verb} {len(done.rows)} parked rows of {done.keys} keys; "
        f"{done.held} rows held behind them {follow} them out"
    )


@click.command()
@database_option
@click.option("--retention-days", type=float, default=7.0, show_default=True)
@click.option("--batch-size", type=int, default=1000, show_default=True)
@click.option(
    "--cdc",
    is_flag=True,
    help="The outbox is published by Debezium: delete rows by age alone (nothing marks "
    "them sent). Run it on a schedule; the relay's own cleanup never runs under CDC.",
)
@kafka_options("asked for the topics' retention")
@click.option(
    "--force",
    is_flag=True,
    help="Delete rows younger than their topic's retention on the broker (their events "
    "can then no longer be explained by their outbox row).",
)
def cleanup(
    database_url: str,
    schema: str,
    retention_days: float,
    batch_size: int,
    cdc: bool,
    bootstrap_servers: str,
    overrides: tuple[str, ...],
    force: bool,
) -> None:
    """Delete sent rows (--cdc: all rows) older than the retention, in bounded batches.

    Never rows whose records their topic still keeps on the broker (the
    longest retention.ms among the topics of the rows due; topics kept
    forever set no floor): refused with exit 5 unless --force.
    """
    if retention_days < 0 or batch_size < 1:
        raise ConfigurationError(
            f"retention_days={retention_days!r}, batch_size={batch_size!r}: use >= 0 and >= 1"
        )
    retention = timedelta(days=retention_days)
    read = broker_retention(producer_config(bootstrap_servers, parse_overrides(overrides)))
    with connect(database_url, schema) as conn:
        try:
            kept = floor(conn, schema, retention, read, cdc=cdc)
        except TransportError as exc:
            if not force:
                click.echo(f"cannot read the topics' retention from Kafka: {exc}", err=True)
                raise SystemExit(RET_CONNECT) from exc
            kept = Floor(retention)
        if kept.keep > retention or kept.forever:
            click.echo(kept.explain(retention), err=kept.keep > retention)
        if kept.keep > retention and not force:
            click.echo(
                f"refusing: use --retention-days {kept.keep.total_seconds() / 86400:g} or "
                "more, or --force",
                err=True,
            )
            raise SystemExit(RET_WARNING)
        if cdc:
            deleted = delete_older(conn, schema, retention=retention, batch=batch_size)
        else:
            deleted = delete_sent(conn, schema, retention=retention, batch=batch_size)
    kind = "outbox rows" if cdc else "sent outbox rows"
    click.echo(f"deleted {deleted} {kind} older than {retention_days:g} days")
