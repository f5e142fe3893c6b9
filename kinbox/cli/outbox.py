"""``kinbox outbox``: relay, status, requeue, cleanup, debezium-config, connect-plugin.

The group lives here; each command lives in the module of its concern
(:mod:`kinbox.cli.outbox_relay`, :mod:`kinbox.cli.outbox_rows`,
:mod:`kinbox.cli.outbox_debezium`), and what they share — options, exit
codes, connecting — in :mod:`kinbox.cli.outbox_support`. The outbox itself
is the library :mod:`producer_outbox`; the relay runs as a process of
:mod:`kinbox.ops.relay_process`.
"""

from __future__ import annotations

import click

from kinbox.cli.outbox_debezium import connect_plugin, debezium_config
from kinbox.cli.outbox_relay import relay
from kinbox.cli.outbox_rows import cleanup, requeue, status
from kinbox.cli.outbox_support import RET_WARNING, ConfigGroup

__all__ = ["RET_WARNING", "outbox"]


@click.group(cls=ConfigGroup)
def outbox() -> None:
    """Transactional outbox: publish rows written by enqueue() to Kafka."""


for _command in (relay, status, requeue, cleanup, debezium_config, connect_plugin):
    outbox.add_command(_command)
