"""What every ``kinbox`` subcommand shares: exit codes, ``-X`` parsing, error reporting.

Exit codes tell a supervisor what went wrong without parsing logs; the table
is :mod:`kinbox.ops.exits` (2 configuration, 3 import, 4 connection, 5 schema
not migrated, 6 ``missing_id=fail``, 7 a fatally failed Kafka consumer, 8 a
threshold crossed, 9 a handler's ``sys.exit()``, 10 a crashed worker, 130 a
second signal or a shutdown timeout).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import click

from kinbox.ops.exits import EXIT_BAD_INPUT as EXIT_BAD_INPUT
from kinbox.ops.exits import EXIT_CONFIG as EXIT_CONFIG
from kinbox.ops.exits import EXIT_CONNECT as EXIT_CONNECT
from kinbox.ops.exits import EXIT_CRASH as EXIT_CRASH
from kinbox.ops.exits import EXIT_FATAL as EXIT_FATAL
from kinbox.ops.exits import EXIT_HANDLER_EXIT as EXIT_HANDLER_EXIT
from kinbox.ops.exits import EXIT_IMPORT as EXIT_IMPORT
from kinbox.ops.exits import EXIT_INTERRUPTED as EXIT_INTERRUPTED
from kinbox.ops.exits import EXIT_SCHEMA as EXIT_SCHEMA
from kinbox.ops.exits import EXIT_THRESHOLD as EXIT_THRESHOLD
from kinbox.ops.exits import die as die
from kinbox.ops.exits import guard as guard

if TYPE_CHECKING:
    from kinbox.core.config import Settings

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_duration(text: str) -> timedelta:
    """Parse ``14d``, ``36h``, ``90m`` or ``30s``.

    Raises:
        click.BadParameter: any other form.
    """
    found = _DURATION.fullmatch(text.strip())
    if not found:
        raise click.BadParameter(f"{text!r}: use a number and s, m, h or d, e.g. 14d")
    number, unit = found.groups()
    return timedelta(**{_UNITS[unit]: float(number)})


def connection_options(function: Any) -> Any:
    """``--bootstrap-servers``, ``--database-url``, ``--schema`` and ``-X``, as the worker has."""
    for option in reversed(
        [
            click.option("--bootstrap-servers", help="Kafka brokers [KINBOX_BOOTSTRAP_SERVERS]."),
            click.option("--database-url", help="PostgreSQL URL [KINBOX_DATABASE_URL]."),
            click.option("--schema", help="Schema of the kinbox tables [KINBOX_SCHEMA]."),
            click.option(
                "-X", "kafka", multiple=True, metavar="KEY=VALUE", help="librdkafka property."
            ),
        ]
    ):
        function = option(function)
    return function


def load_settings(
    bootstrap_servers: str | None,
    database_url: str | None,
    schema: str | None,
    kafka: Sequence[str],
) -> Settings:
    """The options of :func:`connection_options` > ``KINBOX_*`` env > defaults; needs a database."""
    from kinbox.core.config import Settings

    flags = {
        "bootstrap_servers": bootstrap_servers,
        "database_url": database_url,
        "schema": schema,
        "kafka_overrides": parse_kafka_overrides(kafka) or None,
    }
    settings: Settings = guard(lambda: Settings.load(flags, os.environ))
    if not settings.database_url:
        die("set --database-url or KINBOX_DATABASE_URL", EXIT_CONFIG)
    return settings


def parse_kafka_overrides(values: Sequence[str]) -> dict[str, str]:
    """Parse repeated ``-X key=value`` options into a dict."""
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(
                f"{item.split('=')[0]!r}...: use -X key=value", param_hint="-X"
            )
        out[key.strip()] = value
    return out
