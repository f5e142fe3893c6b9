"""``kinbox dev``: a throwaway Kafka broker and PostgreSQL server until Ctrl-C."""

from __future__ import annotations

import signal
import threading
from contextlib import AbstractContextManager
from types import FrameType

import click

from kinbox.core.errors import ServiceError
from kinbox.devstack.stack import Stack, local_stack

READY_LINE = "kinbox dev: ready"
"""Printed once both services accept connections (tests and scripts wait for it)."""


def dev_stack(
    *, fsync: bool = False, cdc: bool = False, schema_registry: bool = False, brokers: int = 1
) -> AbstractContextManager[Stack]:
    """What ``kinbox dev`` runs: services of its own, never external ones.

    The fault suite's three-broker scenarios start their cluster through
    this too (``brokers=3``), so they run exactly what ``kinbox dev
    --brokers 3`` gives a user.
    """
    return local_stack(
        fsync=fsync, use_external=False, cdc=cdc, schema_registry=schema_registry, brokers=brokers
    )


@click.command("dev")
@click.option(
    "--fsync/--no-fsync",
    default=False,
    show_default=True,
    help="Durable PostgreSQL commits (slower; what a benchmark should measure).",
)
@click.option(
    "--cdc",
    is_flag=True,
    help="Also run Kafka Connect (distributed) with Debezium's PostgreSQL connector "
    "and print its REST address (register with `kinbox outbox debezium-config --register`).",
)
@click.option(
    "--schema-registry",
    is_flag=True,
    help="Also run a schema registry with Confluent's API (Apicurio Registry, Java 21+) "
    "and print its address, for value_deserializer=AvroDeserializer(...) and the like.",
)
@click.option(
    "--brokers",
    type=click.IntRange(1, 9),
    default=1,
    show_default=True,
    help="Kafka nodes (KRaft, broker + controller each). More than one is a replicated "
    "cluster: 3 gives replication factor 3 and min.insync.replicas=2, as in production.",
)
def dev(fsync: bool, cdc: bool, schema_registry: bool, brokers: int) -> None:
    """Run a throwaway local Kafka broker and PostgreSQL server until Ctrl-C.

    The first start downloads the broker's jars from Maven Central (cached
    under ~/.cache/kinbox), with --cdc those of Kafka Connect and Debezium, and
    with --schema-registry Apicurio Registry's distribution.
    Everything else lives in temporary directories that are removed on exit.
    """
    stopping = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    names = [f"a {brokers}-node Kafka cluster" if brokers > 1 else "Kafka", "PostgreSQL"]
    names += ["Kafka Connect"] * cdc + ["a schema registry"] * schema_registry
    services = ", ".join(names[:-1]) + f" and {names[-1]}"
    click.echo(f"kinbox dev: starting {services} ...", err=True)
    try:
        with dev_stack(
            fsync=fsync, cdc=cdc, schema_registry=schema_registry, brokers=brokers
        ) as stack:
            click.echo(stack.describe(), err=True)
            click.echo(f"export KINBOX_BOOTSTRAP_SERVERS={stack.bootstrap_servers}")
            click.echo(f"export KINBOX_DATABASE_URL={stack.database_url}")
            if stack.connect_url:
                click.echo(f"export KINBOX_CONNECT_URL={stack.connect_url}")
            if stack.schema_registry_url:
                click.echo(f"export KINBOX_SCHEMA_REGISTRY_URL={stack.schema_registry_url}")
            click.echo(f"{READY_LINE} (Ctrl-C stops all and removes their data)", err=True)
            while not stopping.wait(1.0):
                pass
            click.echo("kinbox dev: stopping ...", err=True)
    except ServiceError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo("kinbox dev: stopped", err=True)
