"""What every ``kinbox`` subcommand shares: exit codes, ``-X`` parsing, error reporting.

Exit codes tell a supervisor what went wrong without parsing logs:
2 configuration, 3 import, 4 connection, 5 schema not migrated, 6 stopped on
a record without a valid event id (``missing_id=fail``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import click

from kinbox.errors import (
    ConfigurationError,
    EnvelopeError,
    KinboxError,
    SchemaError,
    StoreError,
    TransportError,
)

EXIT_CONFIG = 2
EXIT_IMPORT = 3
EXIT_CONNECT = 4
EXIT_SCHEMA = 5
EXIT_BAD_INPUT = 6


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


def guard(action: Any) -> Any:
    """Run ``action``; turn kinbox's errors into a message and an exit code."""
    try:
        return action()
    except ImportError as exc:
        die(f"cannot import the app: {exc}", EXIT_IMPORT)
    except ConfigurationError as exc:
        die(f"configuration error: {exc}", EXIT_CONFIG)
    except SchemaError as exc:
        die(str(exc), EXIT_SCHEMA)
    except (StoreError, TransportError) as exc:
        die(f"cannot connect: {exc}", EXIT_CONNECT)
    except EnvelopeError as exc:
        die(str(exc), EXIT_BAD_INPUT)
    except KinboxError as exc:
        die(str(exc), 1)


def die(message: str, code: int) -> NoReturn:
    """Print ``kinbox: message`` to stderr and exit with ``code``."""
    click.echo(f"kinbox: {message}", err=True)
    sys.exit(code)
