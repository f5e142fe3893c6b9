"""``kinbox inbox cleanup``: delete old ``processed_events`` rows, never inside the dedup window.

The window is read from the broker for every group whose rows would go
(:mod:`kinbox.ops.dedup_window`): the topics' retention, the oldest record not
consumed yet, the oldest dead letter still on a dead-letter topic. Asked to
delete inside it, the command refuses (exit 8) and says which guard and why;
``--force`` deletes anyway and says what that risks.
"""

from __future__ import annotations

from typing import Any

import click

from kinbox.cli.support import (
    EXIT_THRESHOLD,
    connection_options,
    guard,
    load_settings,
    parse_duration,
)
from kinbox.core.errors import TransportError
from kinbox.ops.dedup_window import Guard, floor, guards
from kinbox.ops.status_report import ago

RISK = (
    "a redelivery of an event whose row is gone — a group reset to the earliest offset, "
    "a lagging group catching up on a producer's retry, a dead-letter replay — is applied "
    "a second time"
)


@click.command()
@click.option(
    "--older-than", required=True, metavar="DURATION",
    help="Delete rows processed longer ago than this (14d, 36h, ...); refused inside the "
    "dedup window unless --force.",
)  # fmt: skip
@click.option(
    "--group", "groups", multiple=True,
    help="Only this group's rows (repeatable); default: every group in processed_events.",
)  # fmt: skip
@click.option(
    "--topic", "topics", multiple=True,
    help="A topic the groups consume that Kafka may not know of for them (repeatable).",
)  # fmt: skip
@click.option(
    "--dlq-topic", "dlq_topics", multiple=True,
    help="A dead-letter topic besides <topic>.dlq (repeatable).",
)  # fmt: skip
@click.option("--force", is_flag=True, help="Delete inside the dedup window (says what it risks).")
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@click.option("--batch-size", type=click.IntRange(1, 100_000), default=1000, show_default=True)
@connection_options
def cleanup(
    older_than: str,
    groups: tuple[str, ...],
    topics: tuple[str, ...],
    dlq_topics: tuple[str, ...],
    force: bool,
    dry_run: bool,
    batch_size: int,
    **connection: Any,
) -> None:
    """Delete processed_events rows older than --older-than, in bounded batches.

    A row is the inbox's memory of an event: once it is gone, a redelivery is
    applied again. So the rows of each group are kept at least as long as its
    topics' retention on the broker, the oldest record it has not consumed
    yet, and the oldest dead letter on its dead-letter topics; asked for less,
    this refuses (exit 8) unless --force.
    """
    from kinbox.kafka.inspect import Inspector
    from kinbox.kafka.producer_config import producer_config
    from kinbox.store.inspect import InboxReader
    from kinbox.store.pruning import count_processed, delete_processed

    settings = load_settings(**connection)
    age = parse_duration(older_than)

    def read_groups() -> list[str]:
        with InboxReader(settings.database_url, settings.schema) as reader:
            return sorted(set(groups)) if groups else reader.consumers()

    names: list[str] = guard(read_groups)

    def read_guards() -> list[Guard]:
        inspector = Inspector(producer_config(settings))
        return guards(inspector, names, topics=topics, dead_letter_topics=dlq_topics)

    try:
        found: list[Guard] = guard(read_guards) if not force else read_guards()
    except TransportError as exc:  # only with --force: the broker could not be asked
        click.echo(f"WARNING: cannot read the dedup window from Kafka ({exc}); forced", err=True)
        found = []
    for item in found:
        keep = "forever" if item.keep_seconds is None else ago(item.keep_seconds)
        click.echo(f"keep {item.group} {item.kind} {item.subject}: {keep} ({item.why})")
    breaking = [g for g in found if g.forbids(age.total_seconds())]
    if breaking:
        worst = floor(breaking)
        assert worst is not None
        window = "forever" if worst.keep_seconds is None else ago(worst.keep_seconds)
        what = (
            f"--older-than {older_than} is inside the dedup window: group {worst.group!r} "
            f"needs its rows kept {window} ({worst.kind} {worst.subject}: {worst.why})"
        )
        if not force:
            click.echo(f"refusing: {what}; {RISK}. Choose a longer --older-than, or --force.",
                       err=True)  # fmt: skip
            raise SystemExit(EXIT_THRESHOLD)
        click.echo(f"FORCED: {what}; {RISK}.", err=True)
    selected = list(groups) or None
    if dry_run:
        counts: dict[str, int] = guard(
            lambda: count_processed(
                settings.database_url, settings.schema, older_than=age, groups=selected
            )
        )
        per_group = ", ".join(f"{g} {n}" for g, n in sorted(counts.items()))
        click.echo(
            f"would delete {sum(counts.values())} processed_events row(s) older than "
            f"{older_than}" + (f" ({per_group})" if per_group else "")
        )
        return
    deleted = guard(
        lambda: delete_processed(
            settings.database_url,
            settings.schema,
            older_than=age,
            batch=batch_size,
            groups=selected,
        )
    )
    click.echo(f"deleted {deleted} processed_events row(s) older than {older_than}")
