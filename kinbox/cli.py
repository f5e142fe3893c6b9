"""The ``kinbox`` command."""

import click

from kinbox.devstack.command import dev


@click.group()
def main() -> None:
    """kinbox: exactly-once database effects for Kafka consumers on PostgreSQL."""


main.add_command(dev)
