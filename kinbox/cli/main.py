"""The ``kinbox`` group: ``worker``, ``migrate``; ``outbox``, ``status``, ``console``... mount here.

Exit codes tell a supervisor what went wrong without parsing logs:
2 configuration, 3 import, 4 connection, 5 schema not migrated, 6 stopped on a
record without a valid event id (``missing_id=fail``), 7 the Kafka consumer
failed fatally, 8 ``status`` crossed a threshold or ``inbox cleanup`` refused to
delete inside the dedup window, 9 a handler raised ``SystemExit``, 10 the worker
crashed, 130 a second signal or a shutdown timeout (see :mod:`kinbox.ops.exits`);
``--processes N`` is run by :mod:`kinbox.ops.supervisor`.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import click

from kinbox.cli.support import (
    EXIT_BAD_INPUT,
    EXIT_CONFIG,
    EXIT_CONNECT,
    EXIT_CRASH,
    EXIT_FATAL,
    EXIT_HANDLER_EXIT,
    EXIT_IMPORT,
    EXIT_INTERRUPTED,
    EXIT_SCHEMA,
    EXIT_THRESHOLD,
)
from kinbox.cli.support import die as _die
from kinbox.cli.support import guard as _guard
from kinbox.cli.support import parse_kafka_overrides as _kafka_overrides
from kinbox.core.config import Settings
from kinbox.ops.logs import configure as configure_logging
from kinbox.store.decisions import CONSOLE
from kinbox.store.migrations import Component, render
from kinbox.store.schema import INBOX

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_CONFIG",
    "EXIT_CONNECT",
    "EXIT_CRASH",
    "EXIT_FATAL",
    "EXIT_HANDLER_EXIT",
    "EXIT_IMPORT",
    "EXIT_INTERRUPTED",
    "EXIT_SCHEMA",
    "EXIT_THRESHOLD",
    "main",
]

log = logging.getLogger("kinbox.cli")


@click.group()
@click.option(
    "--log-level",
    default="INFO",
    envvar="KINBOX_LOG_LEVEL",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
)
@click.option(
    "--log-format",
    default="text",
    envvar="KINBOX_LOG_FORMAT",
    show_default=True,
    type=click.Choice(["text", "json"]),
    help="json: one object a line, with topic/partition/offset/event_id where there is one.",
)
@click.pass_context
def main(ctx: click.Context, log_level: str, log_format: str) -> None:
    """Exactly-once database effects for Kafka consumers on PostgreSQL."""
    ctx.obj = {"log_level": log_level.upper(), "log_format": log_format}
    configure_logging(log_level.upper(), log_format)


@main.command()
@click.argument("target", metavar="MODULE[:APP]")
@click.option(
    "--processes",
    type=click.IntRange(1, 256),
    default=1,
    show_default=True,
    help="Group members to run, one process each; with -X group.instance.id=ID, member i is ID-i.",
)
@click.option("--bootstrap-servers", help="Kafka brokers [KINBOX_BOOTSTRAP_SERVERS].")
@click.option("--database-url", help="PostgreSQL URL [KINBOX_DATABASE_URL].")
@click.option("--group-id", help="Consumer group, also the dedup scope [KINBOX_GROUP_ID].")
@click.option("--schema", help="Schema of the kinbox tables [KINBOX_SCHEMA].")
@click.option(
    "--id-header",
    "id_headers",
    multiple=True,
    help="Event id header, in order of preference (repeatable).",
)
@click.option("--batch-max-messages", type=int, help="Most records per poll.")
@click.option("--batch-max-wait", type=float, help="Longest wait for a poll, seconds.")
@click.option("--shutdown-timeout", type=float, help="Longest graceful shutdown, seconds.")
@click.option(
    "--max-attempts",
    type=click.IntRange(1, 1000),
    help="Handler tries before an event is dead-lettered (default 5) [KINBOX_MAX_ATTEMPTS].",
)
@click.option(
    "--breaker-failures",
    type=click.IntRange(0, 100_000),
    help="Events whose handler failed in a row, across partitions, after which the worker "
    "pauses every partition (default 10; 0: never) [KINBOX_BREAKER_FAILURES].",
)
@click.option(
    "--breaker-pause",
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds the worker stays paused before it tries one event again (default 30) "
    "[KINBOX_BREAKER_PAUSE].",
)
@click.option(
    "--missing-id",
    type=click.Choice(["dead-letter", "derive", "fail"]),
    help="Record without a valid event id: dead-letter it (default), derive its id from "
    "topic/partition/offset (suppresses consumer redelivery only, not producer "
    "duplicates), or fail (stop the worker) [KINBOX_MISSING_ID].",
)
@click.option(
    "--health-port",
    type=click.IntRange(0, 65535),
    help="Serve /livez and /readyz on this port (0: off, the default; with --processes N, "
    "member i uses port + i) [KINBOX_HEALTH_PORT].",
)
@click.option(
    "--live-timeout",
    type=float,
    help="Seconds without a poll before /livez fails (default: max.poll.interval.ms) "
    "[KINBOX_LIVE_TIMEOUT].",
)
@click.option(
    "--trace-context",
    type=click.Choice(["auto", "parent", "link"]),
    help="How a handler's span relates to the producer's trace: parent (continue it), link "
    "(stay in the worker's trace, link it), auto (default: parent for per-event handlers, "
    "link for batch handlers) [KINBOX_TRACE_CONTEXT].",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    help="Serve Prometheus metrics at :PORT/metrics (needs kinbox[otel]; member i of "
    "--processes N uses PORT+i) [KINBOX_METRICS_PORT].",
)
@click.option(
    "-X",
    "kafka",
    multiple=True,
    metavar="KEY=VALUE",
    help="librdkafka property, e.g. -X security.protocol=SASL_SSL (repeatable).",
)
@click.pass_context
def worker(ctx: click.Context, /, target: str, processes: int, kafka: tuple[str, ...],
           id_headers: tuple[str, ...], **options: Any) -> None:  # fmt: skip
    """Run the handlers of MODULE (default app) or MODULE:APP as consumer group member(s)."""
    flags: dict[str, Any] = dict(options)
    flags["id_headers"] = id_headers or None
    flags["kafka_overrides"] = _kafka_overrides(kafka) or None
    from kinbox.ops.worker import resolve_target

    # Resolve once here so a bad target or setting fails before any fork.
    app, settings = _guard(lambda: resolve_target(target, flags))
    if processes == 1:
        _guard(lambda: _run(app, settings))
        return
    from kinbox.ops.supervisor import supervise

    sys.exit(supervise(target, flags, processes, ctx.obj["log_level"], ctx.obj["log_format"]))


def _run(app: Any, settings: Settings) -> None:
    from kinbox.ops.worker import run

    run(app, settings)


def components() -> list[Component]:
    """The schema components to migrate: inbox, console (decisions), outbox (when installed)."""
    found = [INBOX, CONSOLE]
    try:
        from producer_outbox.schema import OUTBOX  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        pass
    else:
        found.append(OUTBOX)
    return found


@main.command()
@click.option("--database-url", help="PostgreSQL URL [KINBOX_DATABASE_URL].")
@click.option("--schema", help="Schema of the kinbox tables [KINBOX_SCHEMA].")
@click.option(
    "--sql", "print_sql", is_flag=True, help="Print the DDL and exit, without connecting."
)
def migrate(database_url: str | None, schema: str | None, print_sql: bool) -> None:
    """Create or upgrade the kinbox tables (idempotent, safe to run concurrently)."""
    from kinbox.store.postgres import apply_migrations

    settings = _guard(
        lambda: Settings.load({"database_url": database_url, "schema": schema}, os.environ)
    )
    if print_sql:
        click.echo(_guard(lambda: render(settings.schema, components())), nl=False)
        return
    if not settings.database_url:
        _die("set --database-url or KINBOX_DATABASE_URL", EXIT_CONFIG)
    done = _guard(lambda: apply_migrations(settings.database_url, settings.schema, components()))
    for name, (before, after) in done.items():
        state = "up to date" if before == after else f"migrated {before} -> {after}"
        click.echo(f"{settings.schema}.{name}: version {after} ({state})")


# Imported last: they mount on the group above. The tools' commands (dev,
# bench) are mounted by the roof, kinbox.entry.
from kinbox.cli.console import console  # noqa: E402
from kinbox.cli.explain import explain_command  # noqa: E402
from kinbox.cli.ops import dlq, inbox  # noqa: E402
from kinbox.cli.outbox import outbox  # noqa: E402
from kinbox.cli.status import status  # noqa: E402

main.add_command(console)
main.add_command(dlq)
main.add_command(explain_command)
main.add_command(inbox)
main.add_command(outbox)
main.add_command(status)
