"""The producing side of the Kafka seam, free of any driver: dead letters and replays.

:class:`Publisher` is what the batch processor (and ``kinbox dlq replay``)
depends on. This module imports no Kafka client:
:class:`~kinbox.kafka.producer.KafkaPublisher` is the real implementation, on
confluent-kafka, and :mod:`kinbox.testing` has a fake. The consuming side is
:mod:`kinbox.core.transport`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


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
