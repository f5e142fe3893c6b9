"""Operator commands: ``kinbox dlq replay``, and the ``kinbox inbox`` group (its ``cleanup``)."""

from __future__ import annotations

import os
from typing import Any

import click

from kinbox.apply import deadletter
from kinbox.cli.support import guard, parse_kafka_overrides
from kinbox.core.config import Settings
from kinbox.core.names import topic_name
from kinbox.core.publisher import Publisher


@click.group()
def dlq() -> None:
    """Dead-letter topics."""


@dlq.command()
@click.option("--topic", required=True, help="The dead-letter topic to read, e.g. orders.dlq.")
@click.option(
    "--filter-reason", metavar="SUBSTR", help="Only records whose kinbox.dlq.reason contains it."
)
@click.option("--dry-run", is_flag=True, help="List what would be replayed; publish nothing.")
@click.option("--limit", type=click.IntRange(1), help="Replay at most this many records.")
@click.option("--bootstrap-servers", help="Kafka brokers [KINBOX_BOOTSTRAP_SERVERS].")
@click.option(
    "--database-url", help="PostgreSQL URL, to release parked keys [KINBOX_DATABASE_URL]."
)
@click.option("--schema", help="Schema of the kinbox tables [KINBOX_SCHEMA].")
@click.option("-X", "kafka", multiple=True, metavar="KEY=VALUE", help="librdkafka property.")
def replay(
    topic: str,
    filter_reason: str | None,
    dry_run: bool,
    limit: int | None,
    bootstrap_servers: str | None,
    database_url: str | None,
    schema: str | None,
    kafka: tuple[str, ...],
) -> None:
    """Re-publish dead letters to their original topic, so their handler runs again.

    Each record goes back with its original key, value and headers (so its
    event id is the same) plus a kinbox.replay header. A consumer group that
    dead-lettered the event applies it once; a group that applied it already
    ignores it, and replaying the same dead letter again applies nothing more.
    Fix the handler (or the data) and deploy it before replaying. With a
    database (--database-url or KINBOX_DATABASE_URL), the keys a replayed
    dead letter holds parked (handlers with park_keys=True) are released
    right after it: their events follow it, in order.
    """
    from kinbox.kafka import dead_letter_publisher, read_topic

    flags: dict[str, Any] = {
        "bootstrap_servers": bootstrap_servers,
        "database_url": database_url,
        "schema": schema,
        "kafka_overrides": parse_kafka_overrides(kafka) or None,
    }
    settings: Settings = guard(lambda: Settings.load(flags, os.environ))
    guard(lambda: topic_name(topic, setting="--topic"))

    def run() -> tuple[deadletter.ReplayReport, int]:
        publisher = None if dry_run else dead_letter_publisher(settings)
        try:
            report = deadletter.replay(
                read_topic(settings, topic), publisher, filter_reason=filter_reason, limit=limit,
                id_headers=settings.id_headers,
            )  # fmt: skip
            if publisher is None or not settings.database_url:
                return report, 0
            return report, _release_behind(settings, report, publisher)
        finally:
            if publisher is not None:
                publisher.close()

    report, released = guard(run)
    for line in report.lines or []:
        click.echo(("would replay " if dry_run else "replayed ") + line)
    verb = "would replay" if dry_run else "replayed"
    click.echo(f"{verb} {report.replayed} of {report.read} read; {report.skipped} skipped")
    if released:
        click.echo(f"released {released} parked event(s) behind them")


def _release_behind(
    settings: Settings, report: deadletter.ReplayReport, publisher: Publisher
) -> int:
    """Release the parked keys the replayed dead letters blocked; return events released."""
    from kinbox.ops.parked_keys import release_blocked_by

    by_group: dict[str, list[str]] = {}
    for group, event_id in report.events:
        by_group.setdefault(group, []).append(event_id)
    return sum(
        release_blocked_by(settings, group, ids, publisher) for group, ids in by_group.items()
    )


from kinbox.cli.parked import discard, parked, release  # noqa: E402  (after the group they join)

dlq.add_command(parked)
dlq.add_command(release)
dlq.add_command(discard)


@click.group()
def inbox() -> None:
    """The inbox table, processed_events."""


from kinbox.cli.inbox_cleanup import cleanup  # noqa: E402  (after the group it joins)

inbox.add_command(cleanup)
