"""``kinbox console``: serve the web console (the ``console`` extra).

This module loads only click: the web stack (Starlette, uvicorn, Jinja2) is
imported when the command runs, so ``kinbox worker`` and every other
command never load it, and a kinbox installed without the extra still lists
the command and says what to install.
"""

from __future__ import annotations

from typing import Any

import click

from kinbox.cli.support import (
    EXIT_CONNECT,
    EXIT_IMPORT,
    EXIT_SCHEMA,
    connection_options,
    die,
    guard,
    load_settings,
)


@click.command(name="console")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on (plain HTTP: keep it on loopback or behind a TLS proxy).",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8470,
    show_default=True,
    help="TCP port (0: any free one).",
)
@click.option(
    "--token",
    envvar="KINBOX_CONSOLE_TOKEN",
    help="Access token, 16+ characters [KINBOX_CONSOLE_TOKEN]; default: a new one, "
    "printed once in the URL to open.",
)
@click.option(
    "--allow-actions",
    is_flag=True,
    help="Allow replay, discard, requeue and release (default: read-only).",
)
@click.option(
    "--operator",
    envvar="KINBOX_CONSOLE_OPERATOR",
    default="operator",
    show_default=True,
    help="Name decisions are recorded under when the person "
    "gave none at login (programs: X-Operator header) [KINBOX_CONSOLE_OPERATOR].",
)
@click.option(
    "--scan-limit",
    type=click.IntRange(1, 100_000),
    default=500,
    show_default=True,
    help="Newest records read from each dead-letter topic.",
)
@click.option(
    "--sample-interval",
    type=click.FloatRange(1, 3600),
    default=10.0,
    show_default=True,
    help="Seconds between two samples of the overview and charts.",
)
@click.option(
    "--trace-url",
    envvar="KINBOX_CONSOLE_TRACE_URL",
    metavar="URL",
    help="Tracing UI link with {trace_id}, e.g. http://jaeger:16686/trace/{trace_id} "
    "[KINBOX_CONSOLE_TRACE_URL].",
)
@click.option(
    "--dlq-topic",
    "dlq_topics",
    multiple=True,
    metavar="TOPIC",
    help="A dead-letter topic not named <topic>.dlq (repeatable).",
)
@connection_options
def console(
    host: str, port: int, token: str | None, allow_actions: bool, operator: str,
    scan_limit: int, sample_interval: float, trace_url: str | None,
    dlq_topics: tuple[str, ...], **connection: Any,
) -> None:  # fmt: skip
    """Serve a web console: groups, lag, dead letters by cause, the outbox, an event's story.

    Read-only unless --allow-actions: then dead letters can be replayed (as
    `kinbox dlq replay` does) or discarded, parked outbox rows requeued or
    discarded; each decision is recorded in PostgreSQL (run `kinbox migrate`
    first). Every page needs the access token.
    """
    try:
        from kinbox.console.serve import serve
        from kinbox.console.settings import ConsoleSettings, new_token
    except ImportError as exc:
        die(f"the console needs its extra: pip install 'kinbox[console]' ({exc})", EXIT_IMPORT)
    from kinbox.store.decisions import DecisionLog
    from kinbox.store.inspect import InboxReader

    settings = load_settings(**connection)
    generated = not token
    chosen = ConsoleSettings(
        settings, token or new_token(), host=host, port=port, allow_actions=allow_actions,
        operator=operator, scan_limit=scan_limit, sample_every=sample_interval,
        trace_url=trace_url, dlq_topics=dlq_topics,
    )  # fmt: skip
    guard(chosen.validate)

    def check() -> bool:
        with InboxReader(settings.database_url, settings.schema):
            pass  # reachable, and the inbox tables are there
        return DecisionLog(settings.database_url, settings.schema).available()

    if not guard(check) and allow_actions:
        die(
            f"--allow-actions records each decision in {settings.schema}.operator_decisions, "
            f"which is missing: run `kinbox migrate --schema {settings.schema}`",
            EXIT_SCHEMA,
        )
    try:
        serve(chosen, token_generated=generated)
    except OSError as exc:
        die(f"cannot listen on {host}:{port}: {exc}", EXIT_CONNECT)
