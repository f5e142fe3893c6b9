"""``kinbox outbox``: relay, status, requeue, cleanup, debezium-config, connect-plugin.

The group lives here; each command lives in the module of its concern
(:mod:`.cli_relay`, :mod:`.cli_rows`, :mod:`.cli_debezium`), and what they
share — options, exit codes, connecting — in :mod:`.cli_support`.
"""

from __future__ import annotations

import click

from producer_outbox.cli_debezium import connect_plugin, debezium_config
from producer_outbox.cli_relay import relay
from producer_outbox.cli_rows import cleanup, requeue, status
from producer_outbox.cli_support import RET_WARNING, ConfigGroup, redact

__all__ = ["RET_WARNING", "outbox", "redact"]


@click.group(cls=ConfigGroup)
def outbox() -> None:
    """Transactional outbox: publish rows written by enqueue() to Kafka."""


for _command in (relay, status, requeue, cleanup, debezium_config, connect_plugin):
    outbox.add_command(_command)
