"""The producing side of the Kafka seam: :class:`Publisher` and :class:`KafkaPublisher`.

kinbox produces only dead letters and ``kinbox dlq replay`` records, and treats
a record as sent only once :meth:`Publisher.flush` has seen the broker
acknowledge it (idempotent producer, ``acks=all``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from kinbox.config import Settings
from kinbox.errors import TransportError
from kinbox.kafka.errors import translate


class Publisher(Protocol):
    """Produces records and says when the broker has acknowledged all of them."""

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes | None]],
    ) -> None:
        """Queue one record (asynchronous; :meth:`flush` waits for it).

        Raises:
            TransportError: the client refused it at once (too large, unknown topic...).
        """

    def flush(self) -> None:
        """Wait until every queued record is acknowledged.

        Raises:
            TransportError: a record failed or was not acknowledged in time;
                the caller must treat none of them as delivered.
        """

    def close(self) -> None:
        """Flush what is left (best effort) and release the client."""


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
        # Bounds flush(): a dead letter not acknowledged by then fails the batch.
        "message.timeout.ms": 30000,
        "logger": logging.getLogger("kinbox.kafka"),
        **overrides,
    }


class KafkaPublisher:
    """:class:`Publisher` on a confluent-kafka ``Producer``.

    Args:
        settings: bootstrap servers and ``-X`` overrides.
        max_record_bytes: the largest record to be sent (the dead-letter
            topics' limit); raises the client's own ``message.max.bytes``
            (default 1,000,000, below a topic's default of 1,048,588) so the
            client never refuses what the topic would take. ``-X`` wins.
    """

    def __init__(self, settings: Settings, max_record_bytes: int | None = None) -> None:
        self._config = producer_config(settings)
        if max_record_bytes is not None and "message.max.bytes" not in settings.kafka_overrides:
            # librdkafka's bounds for the setting.
            self._config["message.max.bytes"] = min(max(max_record_bytes, 1000), 1_000_000_000)
        self._timeout = int(self._config["message.timeout.ms"]) / 1000 + 5.0
        self._errors: list[str] = []
        try:
            self._producer = Producer(self._config)
        except KafkaException as exc:
            raise translate("creating the producer", exc) from exc

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self._errors.append(f"{msg.topic()}: {err.str()} ({err.name()})")

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes | None]],
    ) -> None:
        """See :meth:`Publisher.send`."""
        while True:
            try:
                self._producer.produce(
                    topic, value=value, key=key, headers=list(headers), on_delivery=self._delivered
                )
                return
            except BufferError:
                self._producer.poll(0.1)  # local queue full: let delivery reports drain
            except KafkaException as exc:
                raise translate(f"producing to {topic!r}", exc) from exc

    def flush(self) -> None:
        """See :meth:`Publisher.flush`."""
        left = self._producer.flush(self._timeout)
        errors, self._errors = self._errors, []
        if left:
            raise TransportError(f"{left} record(s) not acknowledged in time", retriable=True)
        if errors:
            raise TransportError(f"produce failed: {'; '.join(errors[:3])}", retriable=True)

    def close(self) -> None:
        """See :meth:`Publisher.close`."""
        self._producer.flush(5.0)
