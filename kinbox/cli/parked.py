"""``kinbox dlq parked``, ``release`` and ``discard``: the keys a dead letter holds back."""

from __future__ import annotations

from typing import Any

import click

from kinbox.cli.support import connection_options, guard, load_settings
from kinbox.ops.parked_keys import key_text, parse_key

_WHICH = [
    click.option("--group", required=True, help="The consumer group that parked it."),
    click.option("--topic", required=True, help="The topic of the key's events."),
    click.option("--key", "key_", required=True, help="The record key (hex:... for bytes)."),
]


def _which(function: Any) -> Any:
    for option in reversed(_WHICH):
        function = option(function)
    return function


@click.command()
@click.option("--group", help="Only this consumer group's keys.")
@click.option("--limit", type=click.IntRange(1), default=1000, show_default=True)
@click.option(
    "--idle", is_flag=True, help="Also keys a dead letter blocks with nothing parked yet."
)
@connection_options
def parked(
    group: str | None,
    limit: int,
    idle: bool,
    bootstrap_servers: str | None,
    database_url: str | None,
    schema: str | None,
    kafka: tuple[str, ...],
) -> None:
    """List the keys parked behind a dead letter (handlers with park_keys=True), oldest first."""
    from kinbox.ops.parked_keys import parked_keys

    settings = load_settings(bootstrap_servers, database_url, schema, kafka)
    rows = guard(lambda: parked_keys(settings, group, limit, idle=idle))
    for row in rows:
        state = "released, on its way back" if row.released else "blocked"
        click.echo(
            f"{row.group} {row.topic} key={key_text(row.key)} waiting={row.waiting} "
            f"behind={row.blocked_by} since={row.since.isoformat(timespec='seconds')} ({state})"
        )
    click.echo(f"{len(rows)} parked key(s)")


@click.command()
@_which
@connection_options
def release(
    group: str,
    topic: str,
    key_: str,
    bootstrap_servers: str | None,
    database_url: str | None,
    schema: str | None,
    kafka: tuple[str, ...],
) -> None:
    """Let a parked key's events go on: re-publish them in order, leaving its dead letter.

    To apply the dead letter first, replay it instead (kinbox dlq replay):
    that releases the keys it blocks after it.
    """
    from kinbox.kafka import dead_letter_publisher
    from kinbox.ops.parked_keys import release as release_key
    from kinbox.ops.parked_keys import with_publisher

    settings = load_settings(bootstrap_servers, database_url, schema, kafka)
    key = guard(lambda: parse_key(key_))
    count = guard(
        lambda: with_publisher(
            settings, dead_letter_publisher, lambda p: release_key(settings, group, topic, key, p)
        )
    )
    click.echo(f"released {count} parked event(s) of key {key_text(key)}")


@click.command()
@_which
@connection_options
def discard(
    group: str,
    topic: str,
    key_: str,
    bootstrap_servers: str | None,
    database_url: str | None,
    schema: str | None,
    kafka: tuple[str, ...],
) -> None:
    """Give a parked key's events up (recorded as skipped, never applied) and free the key."""
    from kinbox.ops.parked_keys import discard as discard_key

    settings = load_settings(bootstrap_servers, database_url, schema, kafka)
    key = guard(lambda: parse_key(key_))
    count = guard(lambda: discard_key(settings, group, topic, key))
    click.echo(f"discarded {count} parked event(s) of key {key_text(key)}; the key is free")
