"""producer_outbox: a transactional outbox writer and relay for PostgreSQL and Kafka.

Write with :func:`enqueue` inside your business transaction; run
``kinbox outbox relay`` to publish. Never imports kinbox's consumer code.
"""

from kinbox.errors import PayloadError
from producer_outbox.cleanup import delete_sent
from producer_outbox.config import RelayConfig
from producer_outbox.publisher import KafkaPublisher, Outcome, Publisher
from producer_outbox.records import OutboxRow, Record
from producer_outbox.relay import Relay
from producer_outbox.schema import OUTBOX
from producer_outbox.status import OutboxStatus, read_status
from producer_outbox.writer import enqueue

__all__ = [
    "OUTBOX",
    "KafkaPublisher",
    "OutboxRow",
    "OutboxStatus",
    "Outcome",
    "PayloadError",
    "Publisher",
    "Record",
    "Relay",
    "RelayConfig",
    "delete_sent",
    "enqueue",
    "read_status",
]
