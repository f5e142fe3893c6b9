"""``kinbox dev``: a throwaway Kafka broker and PostgreSQL server until Ctrl-C."""

from __future__ import annotations

import signal
import threading
from types import FrameType

import click

from kinbox.devstack.stack import local_stack
from kinbox.errors import ServiceError

READY_LINE = "kinbox dev: ready"
"""Printed once both services accept connections (tests and scripts wait for it)."""


@click.command("dev")
@click.option(
    "--fsync/--no-fsync",
    default=False,
    show_default=True,
    help="Durable PostgreSQL commits (slower; what a benchmark should measure).",
)
def dev(fsync: bool) -> None:
    """Run a throwaway local Kafka broker and PostgreSQL server until Ctrl-C.

    The first start downloads the broker's jars from Maven Central (cached
    under ~/.cache/kinbox). Everything else lives in temporary directories
    that are removed on exit.
    """
    stopping = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    click.echo("kinbox dev: starting Kafka and PostgreSQL ...", err=True)
    try:
        with local_stack(fsync=fsync, use_external=False) as stack:
            click.echo(stack.describe(), err=True)
            click.echo(f"export KINBOX_BOOTSTRAP_SERVERS={stack.bootstrap_servers}")
            click.echo(f"export KINBOX_DATABASE_URL={stack.database_url}")
            click.echo(f"{READY_LINE} (Ctrl-C stops both and removes their data)", err=True)
            while not stopping.wait(1.0):
                pass
            click.echo("kinbox dev: stopping ...", err=True)
    except ServiceError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo("kinbox dev: stopped", err=True)
