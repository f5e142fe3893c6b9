"""The one module that touches confluent-kafka: publish a batch, report each record's fate.

:class:`Publisher` is the seam: the relay is unit-tested with a fake and
integration-tested with :class:`KafkaPublisher`, an idempotent producer
(``enable.idempotence=true``: no duplicates or reordering from the client's own
retries) that waits for the delivery report of every record.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from kinbox.errors import ConfigurationError
from producer_outbox.records import Record

_Callback = Callable[[KafkaError | None, Message], None]

log = logging.getLogger(__name__)

#: librdkafka defaults the relay changes; ``-X`` overrides all but idempotence.
PRODUCER_DEFAULTS: dict[str, str] = {
    "enable.idempotence": "true",
    "acks": "all",
    "linger.ms": "5",
    # Every record gets a delivery report within this time, so a batch's
    # transaction is never held longer than this (plus a margin).
    "message.timeout.ms": "30000",
}

# Errors that mean "Kafka is unreachable right now", not "this record is bad":
# they are recorded on the row but never park it.
_OUTAGE_CODES = frozenset(
    {
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._PURGE_QUEUE,
    }
)


@dataclass(frozen=True)
class Outcome:
    """The fate of one record: ``error is None`` means acknowledged by the broker."""

    error: str | None = None
    outage: bool = False

    @property
    def ok(self) -> bool:
        """Whether the broker acknowledged the record."""
        return self.error is None


ACKED = Outcome()


class Publisher(Protocol):
    """Publishes a batch and returns one :class:`Outcome` per record, in order."""

    def publish(self, records: Sequence[Record]) -> list[Outcome]:
        """Send ``records``; return only once every one has a final outcome."""
        ...

    def close(self) -> None:
        """Release the client."""
        ...


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


def _outcome(error: KafkaError) -> Outcome:
    outage = error.code() in _OUTAGE_CODES or error.retriable()
    return Outcome(error=f"{error.name()}: {error.str()}", outage=outage)


class KafkaPublisher:
    """A :class:`Publisher` over one idempotent ``confluent_kafka.Producer``.

    A fatal producer error (idempotence state lost) fails the batch and
    replaces the producer before the next one.
    """

    def __init__(self, config: Mapping[str, str]) -> None:
        self._config = dict(config)
        timeout_ms = int(self._config.get("message.timeout.ms", "300000"))
        self._flush_timeout = timeout_ms / 1000 + 5.0
        self._producer = Producer(self._config)

    def publish(self, records: Sequence[Record]) -> list[Outcome]:
        """Produce every record, flush, and return each delivery report's outcome."""
        outcomes: list[Outcome | None] = [None] * len(records)
        fatal = False

        def report(index: int) -> _Callback:
            def on_delivery(error: KafkaError | None, _message: Message) -> None:
                nonlocal fatal
                if error is None:
                    outcomes[index] = ACKED
                else:
                    fatal = fatal or error.fatal()
                    outcomes[index] = _outcome(error)

            return on_delivery

        failed_keys: set[tuple[str, bytes]] = set()
        for index, record in enumerate(records):
            if record.key is not None and (record.topic, record.key) in failed_keys:
                # An earlier record of this key was refused at once (e.g. too large):
                # sending this one would overtake it. It waits; outage=True so the
                # wait does not count towards parking it.
                outcomes[index] = Outcome("an earlier record of its key failed", outage=True)
                continue
            self._produce(index, record, report(index), outcomes)
            refused = outcomes[index]  # set already only when produce() refused it
            if record.key is not None and refused is not None and not refused.ok:
                failed_keys.add((record.topic, record.key))
        deadline = time.monotonic() + self._flush_timeout
        while any(o is None for o in outcomes) and time.monotonic() < deadline:
            self._producer.flush(min(1.0, max(0.0, deadline - time.monotonic())))
        if any(o is None for o in outcomes):
            # Should not happen (message.timeout.ms bounds every record); drop what
            # is still queued so it cannot go out after a retry of the same row.
            self._producer.purge(in_queue=True, in_flight=False)
            self._producer.poll(0)
        if fatal:
            log.error("fatal Kafka producer error; creating a new producer")
            self._producer = Producer(self._config)
        return [
            o if o is not None else Outcome("no delivery report in time", outage=True)
            for o in outcomes
        ]

    def _produce(
        self, index: int, record: Record, callback: _Callback, outcomes: list[Outcome | None]
    ) -> None:
        while True:
            try:
                self._producer.produce(
                    record.topic,
                    value=record.value,
                    key=record.key,
                    headers=list(record.headers),
                    on_delivery=callback,
                )
                return
            except BufferError:
                self._producer.poll(0.1)  # local queue full: let reports drain
            except KafkaException as exc:
                outcomes[index] = _outcome(exc.args[0])
                return

    def close(self) -> None:
        """Flush what is left and drop the producer."""
        self._producer.flush(self._flush_timeout)
