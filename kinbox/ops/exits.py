"""The exit statuses of ``kinbox`` commands, and which error ends a worker with which.

A supervisor (systemd, Kubernetes, ``kinbox worker --processes N``) tells
what went wrong from the status alone, without parsing logs:

===  ==========================================================================
0    stopped as asked, every batch in hand finished
1    another kinbox error
2    configuration (librdkafka refusing a ``-X`` property included)
3    the app cannot be imported
4    cannot connect (PostgreSQL, Kafka)
5    the kinbox tables are missing or too old (``kinbox migrate``)
6    stopped on a record without a valid event id (``missing_id=fail``)
7    the Kafka consumer failed fatally, or a call into it never returned
8    ``status`` crossed a threshold, ``inbox cleanup`` refused
9    a handler (or a middleware hook) raised ``SystemExit`` or ``KeyboardInterrupt``
10   the worker crashed: a batch raised what no event's failure explains (a
     middleware's ``before_batch``, a bug), or a thread it needs died
130  a second signal, or a signal's graceful stop outlasted ``shutdown_timeout``
===  ==========================================================================

A leaf: the CLI and the worker process both import it, and it imports only
the error tree (and click, to say why a command ends: :func:`guard`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NoReturn, TypeVar

import click

from kinbox.core.errors import (
    ConfigurationError,
    EnvelopeError,
    ExitRequested,
    FatalTransportError,
    KinboxError,
    SchemaError,
    StoreError,
    TransportError,
    WorkerExit,
)

EXIT_OK = 0
EXIT_CONFIG = 2
EXIT_IMPORT = 3
EXIT_CONNECT = 4
EXIT_SCHEMA = 5
EXIT_BAD_INPUT = 6
EXIT_FATAL = 7
EXIT_THRESHOLD = 8
EXIT_HANDLER_EXIT = 9
EXIT_CRASH = 10
EXIT_INTERRUPTED = 130

_STATUSES: tuple[tuple[type[BaseException], int], ...] = (
    # The most specific first: SchemaError is a StoreError, FatalTransportError
    # a TransportError, ExitRequested a WorkerExit.
    (ImportError, EXIT_IMPORT),
    (ConfigurationError, EXIT_CONFIG),
    (SchemaError, EXIT_SCHEMA),
    (FatalTransportError, EXIT_FATAL),
    (StoreError, EXIT_CONNECT),
    (TransportError, EXIT_CONNECT),
    (EnvelopeError, EXIT_BAD_INPUT),
    (ExitRequested, EXIT_HANDLER_EXIT),
    (WorkerExit, EXIT_CRASH),
    (KinboxError, 1),
)


def status_of(error: BaseException) -> int | None:
    """The exit status of a command that stopped on ``error``; ``None``: kinbox has none."""
    for kind, status in _STATUSES:
        if isinstance(error, kind):
            return status
    return None


def worker_status(error: BaseException) -> int:
    """The exit status of a worker that stopped on ``error``: :data:`EXIT_CRASH` for the unknown.

    A worker that stops on an exception kinbox has no status for (a
    middleware hook's, a bug) has crashed; only kinbox's own errors say more.
    """
    status = status_of(error)
    return EXIT_CRASH if status is None else status


T = TypeVar("T")


def guard(action: Callable[[], T]) -> T:
    """Run ``action``; turn kinbox's errors into a message and an exit code."""
    try:
        return action()
    except (ImportError, KinboxError) as exc:
        status = status_of(exc)
        assert status is not None  # every KinboxError has one
        die(f"{_SAYS.get(status, '')}{exc}", status)


_SAYS = {
    EXIT_IMPORT: "cannot import the app: ",
    EXIT_CONFIG: "configuration error: ",
    EXIT_FATAL: "the Kafka client failed fatally: ",
    EXIT_CONNECT: "cannot connect: ",
}
"""What :func:`guard` says before an error's own message, by exit status."""


def die(message: str, code: int) -> NoReturn:
    """Print ``kinbox: message`` to stderr and exit with ``code``."""
    click.echo(f"kinbox: {message}", err=True)
    sys.exit(code)
