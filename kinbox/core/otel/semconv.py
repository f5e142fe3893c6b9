"""The names kinbox's spans and metrics use: OpenTelemetry's messaging conventions, then kinbox's.

One place for every attribute, span and instrument name, so the consumer's
telemetry (:mod:`kinbox.middleware.telemetry`) and the outbox relay's
(:mod:`producer_outbox.telemetry`) cannot drift apart. Plain strings (and two
functions that make attribute values): this module imports nothing,
OpenTelemetry included.

The ``messaging.*`` and ``error.type`` names follow the messaging semantic
conventions as they stand now (Kafka: ``messaging.kafka.offset``,
``messaging.consumer.group.name``, ``messaging.destination.partition.id``,
``messaging.operation.type`` / ``.name``), not the legacy names of v1.24 and
before (``messaging.kafka.message.offset``, ``messaging.kafka.consumer.group``,
``messaging.operation``). Names of kinbox's own start with ``kinbox.``.
"""

from __future__ import annotations

# -- attributes (messaging semantic conventions) --

MESSAGING_SYSTEM = "messaging.system"
KAFKA = "kafka"
"""The value of :data:`MESSAGING_SYSTEM`."""
OPERATION_TYPE = "messaging.operation.type"
OPERATION_NAME = "messaging.operation.name"
PROCESS = "process"
"""Operation type and name of a handler call: a CONSUMER span, ``process <topic>``."""
SEND = "send"
"""Operation type and name of the relay publishing a row: a PRODUCER span, ``send <topic>``."""
DESTINATION = "messaging.destination.name"
PARTITION = "messaging.destination.partition.id"
CONSUMER_GROUP = "messaging.consumer.group.name"
OFFSET = "messaging.kafka.offset"
MESSAGE_KEY = "messaging.kafka.message.key"
MESSAGE_ID = "messaging.message.id"
BATCH_COUNT = "messaging.batch.message_count"
ERROR_TYPE = "error.type"

# -- attributes (kinbox's own) --

DUPLICATE = "kinbox.duplicate"
"""True on the ``kinbox.duplicate`` span event of a delivery the inbox suppressed."""
ATTEMPT = "kinbox.attempt"
"""The event's try, as the failure policy counts it (1 = first)."""
FIRST_OFFSET = "kinbox.batch.first_offset"
LAST_OFFSET = "kinbox.batch.last_offset"
APPLIED = "kinbox.batch.applied"
DUPLICATES = "kinbox.batch.duplicates"
DEAD_LETTERED = "kinbox.batch.dead_lettered"
REASON = "kinbox.dead_letter.reason"
DEAD_LETTER_TOPIC = "kinbox.dead_letter.topic"
CLAIMED = "kinbox.claim.events"
FRESH = "kinbox.claim.fresh"
OUTBOX_ID = "kinbox.outbox.id"

# -- span and span-event names --

BATCH_SPAN = "kinbox.batch"
"""INTERNAL span around one partition batch (claims, handlers, dead letters, COMMITs)."""
CLAIM_SPAN = "kinbox.claim"
COMMIT_SPAN = "kinbox.commit"
DUPLICATE_EVENT = "kinbox.duplicate"
DEAD_LETTER_EVENT = "kinbox.dead_letter"

# -- metric labels of kinbox's own instruments (short: they become Prometheus labels) --

TOPIC = "topic"
PARTITION_LABEL = "partition"
GROUP = "group"
KIND = "kind"
SOURCE_TOPIC = "source_topic"

# -- instruments: (name, unit, description) --

Instrument = tuple[str, str, str]

PROCESS_DURATION: Instrument = (
    "messaging.process.duration", "s", "Duration of a handler call (per event or per batch)",
)  # fmt: skip
CONSUMED_MESSAGES: Instrument = (
    "messaging.client.consumed.messages", "{message}", "Records the consumer handed to kinbox",
)  # fmt: skip
SENT_MESSAGES: Instrument = (
    "messaging.client.sent.messages", "{message}",
    "Records the outbox relay tried to send; error.type set on the failed ones",
)  # fmt: skip
OPERATION_DURATION: Instrument = (
    "messaging.client.operation.duration", "s",
    "Duration of the relay publishing one claimed batch (every delivery report in)",
)  # fmt: skip

RECEIVED: Instrument = ("kinbox.events.received", "{event}", "Records consumed")
APPLIED_EVENTS: Instrument = ("kinbox.events.applied", "{event}", "Handlers committed")
DUPLICATE_EVENTS: Instrument = (
    "kinbox.events.duplicate", "{event}", "Deliveries the inbox suppressed (already processed)",
)  # fmt: skip
REUSED_IDS: Instrument = (
    "kinbox.events.reused_id", "{event}",
    "Duplicates whose payload differs from the one their id was first processed with (not applied)",
)  # fmt: skip
DEAD_LETTERED_EVENTS: Instrument = (
    "kinbox.events.dead_lettered", "{event}", "Records sent to a dead-letter topic and recorded so",
)  # fmt: skip
BATCHES_FAILED: Instrument = (
    "kinbox.batches.failed", "{batch}",
    "Partition batches that stopped at a failure, by kind (handler, store, dead-letter, envelope)",
)  # fmt: skip
UNDELIVERABLE: Instrument = (
    "kinbox.dead_letters.undeliverable", "{try}",
    "Tries whose dead letter the broker did not take; the partition waits at it",
)  # fmt: skip
BATCH_SIZE: Instrument = ("kinbox.batch.size", "{record}", "Records in one partition batch")
CLAIM_DURATION: Instrument = (
    "kinbox.claim.duration", "s", "Duration of one claim of a batch's event ids (one INSERT)",
)  # fmt: skip
COMMIT_DURATION: Instrument = (
    "kinbox.commit.duration", "s", "Duration of one COMMIT of a batch's inbox transaction",
)  # fmt: skip
CONSUMER_LAG: Instrument = (
    "kinbox.consumer.lag", "{record}",
    "Records of an assigned partition behind the group's committed offset (end offset - committed)",
)  # fmt: skip

OUTBOX_PENDING: Instrument = ("kinbox.outbox.pending", "{row}", "Outbox rows not yet published")
OUTBOX_RETRYING: Instrument = (
    "kinbox.outbox.retrying", "{row}", "Pending outbox rows whose last try failed",
)  # fmt: skip
OUTBOX_PARKED: Instrument = (
    "kinbox.outbox.parked", "{row}", "Parked outbox rows (status dead); each blocks its key",
)  # fmt: skip
OUTBOX_OLDEST: Instrument = (
    "kinbox.outbox.oldest_pending.age", "s", "Age of the oldest outbox row not yet published",
)  # fmt: skip
OUTBOX_FAILING_TOPIC: Instrument = (
    "kinbox.outbox.topic.failing", "s",
    "Seconds a topic Kafka refuses as a whole has been failing (one point per failing topic)",
)  # fmt: skip
PUBLISH_FAILURES: Instrument = (
    "kinbox.outbox.publish.failures", "{row}",
    "Outbox rows whose publish failed, by topic and kind (row, outage, topic)",
)  # fmt: skip

DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Bucket boundaries advised for the duration histograms, in seconds."""
SIZE_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)
"""Bucket boundaries advised for :data:`BATCH_SIZE`."""


# -- attribute values --


def error_type(error: BaseException) -> str:
    """``error.type`` for ``error``: its class's canonical name (``module.Class``)."""
    cls = type(error)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def key_text(key: bytes | None) -> str | None:
    """The key as text when it has one canonical text form (UTF-8), as the conventions ask."""
    if key is None:
        return None
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        return None
