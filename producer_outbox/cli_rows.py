"""``kinbox outbox status``, ``requeue`` and ``cleanup``: look at and act on the rows."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import click

from kinbox.errors import ConfigurationError
from producer_outbox.cleanup import delete_sent
from producer_outbox.cli_support import connect, database_option
from producer_outbox.parked import requeue as requeue_rows
from producer_outbox.status import OutboxStatus, read_status


@click.command()
@database_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status(database_url: str, schema: str, as_json: bool) -> None:
    """Show the backlog, parked rows, the keys they block and the topics Kafka refuses."""
    with connect(database_url, schema) as conn:
        state = read_status(conn, schema)
    if as_json:
        click.echo(json.dumps(state.as_dict(), indent=2))
        return
    click.echo(_describe(state))


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
def cleanup(database_url: str, schema: str, retention_days: float, batch_size: int) -> None:
    """Delete sent rows older than the retention, in bounded batches."""
    if retention_days < 0 or batch_size < 1:
        raise ConfigurationError(
            f"retention_days={retention_days!r}, batch_size={batch_size!r}: use >= 0 and >= 1"
        )
    with connect(database_url, schema) as conn:
        deleted = delete_sent(
            conn, schema, retention=timedelta(days=retention_days), batch=batch_size
        )
    click.echo(f"deleted {deleted} sent outbox rows older than {retention_days:g} days")
