"""The relay's Kafka producer: its configuration, and the publisher made with it.

The relay publishes through :class:`~kinbox.kafka.publisher.KafkaPublisher`
(the :class:`~kinbox.core.publisher.Publisher` seam), an idempotent producer
that reports the delivery of every record and asks about a topic before
its first record. What the relay changes of librdkafka's defaults is here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kinbox.core.errors import ConfigurationError
from kinbox.kafka.publisher import KafkaPublisher

#: librdkafka defaults the relay changes; ``-X`` overrides all but idempotence.
PRODUCER_DEFAULTS: dict[str, str] = {
    "enable.idempotence": "true",
    "acks": "all",
    # The relay flushes right after producing a batch (a flush sends at once,
    # whatever linger.ms says) and waits for every delivery report: lingering
    # only holds back the first request while the rest of the batch is being
    # produced. 1 ms lets the records produced meanwhile share it.
    "linger.ms": "1",
    # Every request is on the path to a batch's COMMIT; Nagle's algorithm
    # could hold a small one back until the previous one is acknowledged.
    "socket.nagle.disable": "true",
    # Every record gets a delivery report within this time, so a batch's
    # transaction is never held longer than this (plus a margin).
    "message.timeout.ms": "30000",
    # A missing topic is reported as UNKNOWN_TOPIC_OR_PART only after this
    # delay (librdkafka's default, 30 s, equals the message timeout above, so
    # the first try would end as a plain timeout); shorter, the relay learns
    # early that the topic, not the broker, is failing.
    "topic.metadata.propagation.max.ms": "10000",
}


def producer_config(bootstrap_servers: str, overrides: Mapping[str, str]) -> dict[str, str]:
    """Build the producer configuration: relay defaults, then ``-X`` overrides.

    Raises:
        ConfigurationError: an override turns idempotence off.
    """
    if overrides.get("enable.idempotence", "true").lower() != "true":
        raise ConfigurationError(
            f"-X enable.idempotence={overrides['enable.idempotence']!r} is not allowed: "
            "the relay needs the idempotent producer to keep per-key order"
        )
    return {"bootstrap.servers": bootstrap_servers, **PRODUCER_DEFAULTS, **overrides}


def relay_publisher(config: Mapping[str, str], **seams: Any) -> KafkaPublisher:
    """The relay's publisher on ``config`` (:func:`producer_config`); ``seams`` are for tests.

    It asks about each topic before its first record, and its librdkafka
    lines go to the ``producer_outbox.kafka`` logger.

    Raises:
        ConfigurationError: librdkafka refused the configuration (``-X``).
    """
    return KafkaPublisher(
        config, **seams, name="the outbox relay's producer", logger="producer_outbox.kafka"
    )
