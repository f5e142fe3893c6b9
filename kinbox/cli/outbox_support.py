"""What every ``kinbox outbox`` command shares: exit codes, options, connecting, errors.

Settings come from flags, then ``KINBOX_*`` environment variables, then
defaults, as for the worker. Passwords never reach the output: URLs are
printed with the password masked, ``-X`` secrets are never printed.

Exit codes: 0 ok, 2 bad usage or configuration, 3 cannot connect (PostgreSQL,
or Kafka, or Kafka Connect for ``--register``), 4 schema missing or too old,
5 ``status`` crossed a warning threshold or ``cleanup`` refused to delete rows
whose records their topic still keeps, 1 anything else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from kinbox.core.config import redact_url
from kinbox.core.errors import ConfigurationError, SchemaError, StoreError
from producer_outbox import database

F = TypeVar("F", bound=Callable[..., Any])

RET_ERROR = 1
RET_CONFIG = 2
RET_CONNECT = 3
RET_SCHEMA = 4
RET_WARNING = 5
"""``status``: a threshold was crossed (a replication slot holds back too much WAL);
``cleanup``: refused below the topics' retention."""


def database_option(function: Any) -> Any:
    """Add ``--database-url`` and ``--schema`` (with their ``KINBOX_*`` variables)."""
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


def kafka_options(purpose: str) -> Callable[[F], F]:
    """``--bootstrap-servers`` (with ``KINBOX_BOOTSTRAP_SERVERS``) and ``-X``, for ``purpose``."""

    def decorate(function: F) -> F:
        function = click.option(
            "-X", "overrides", multiple=True, help="librdkafka property key=value (repeat)."
        )(function)
        return click.option(
            "--bootstrap-servers",
            envvar="KINBOX_BOOTSTRAP_SERVERS",
            default="localhost:9092",
            show_default=True,
            help=f"Kafka bootstrap servers, {purpose} [env KINBOX_BOOTSTRAP_SERVERS].",
        )(function)

    return decorate


def size_option(_ctx: click.Context, _param: click.Parameter, value: str | int) -> int:
    """Click callback: ``512MB``, ``1GiB``, ``1073741824`` … as bytes."""
    from producer_outbox.slots import parse_size

    if isinstance(value, int):
        return value
    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def parse_overrides(values: tuple[str, ...]) -> dict[str, str]:
    """Parse repeated ``-X key=value`` options into a dict."""
    overrides: dict[str, str] = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise click.BadParameter(f"{name!r} is not key=value", param_hint="-X")
        overrides[name.strip()] = value
    return overrides


def connect(database_url: str, schema: str) -> database.Connection:
    """Connect (autocommit) and check the outbox tables are migrated; exit 3 or 4 if not."""
    try:
        return database.connect(database_url, schema)
    except SchemaError as exc:
        click.echo(str(exc), err=True)
        raise SystemExit(RET_SCHEMA) from exc
    except StoreError as exc:
        click.echo(f"cannot connect to PostgreSQL at {redact_url(database_url)}: {exc}", err=True)
        raise SystemExit(RET_CONNECT) from exc


class ConfigGroup(click.Group):
    """Turns :class:`ConfigurationError` into a one-line message and exit code 2."""

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; a configuration error ends it with exit code 2."""
        try:
            return super().invoke(ctx)
        except ConfigurationError as exc:
            click.echo(f"configuration error: {exc}", err=True)
            raise SystemExit(RET_CONFIG) from exc
