"""kinbox's producer configuration: idempotent, ``acks=all``, the ``-X`` overrides applied.

The dead-letter producer uses it as it is; the admin clients that check
dead-letter topics and read topic settings start from it too.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kinbox.core.config import Settings


def producer_config(settings: Settings) -> dict[str, Any]:
    """Producer configuration: idempotent, ``acks=all``; ``-X`` overrides win.

    Consumer-only ``-X`` keys are left out, so security settings shared by
    both clients apply to the producer too without warnings.
    """
    consumer_only = ("group.", "session.", "heartbeat.", "max.poll.", "auto.", "enable.auto")
    overrides = {
        k: v for k, v in settings.kafka_overrides.items() if not k.startswith(consumer_only)
    }
    return {
        "bootstrap.servers": settings.bootstrap_servers,
        "enable.idempotence": True,
        "acks": "all",
        # Bounds a send: a dead letter not acknowledged by then fails the batch.
        "message.timeout.ms": 30000,
        "logger": logging.getLogger("kinbox.kafka"),
        **overrides,
    }
