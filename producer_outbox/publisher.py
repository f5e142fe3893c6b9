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
    # A missing topic is reported as UNKNOWN_TOPIC_OR_PART only after this
    # delay (librdkafka's default, 30 s, equals the message timeout above, so
    # the first try would end as a plain timeout); shorter, the relay learns
    # early that the topic, not the broker, is failing.
    "topic.metadata.propagation.max.ms": "10000",
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

# Errors that mean "this topic cannot be written at all" (missing with
# auto-create off, not authorized): an outage of the topic, never a failure of
# the row; the relay pauses the topic (see producer_outbox.topics).
_TOPIC_CODES = frozenset(
    {
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    }
)


@dataclass(frozen=True)
class Outcome:
    """The fate of one record: ``error is None`` means acknowledged by the broker.

    ``outage``: Kafka, not the record, failed (never counts as a try of the
    row). ``topic_failure``: the whole topic is refused (missing, not
    authorized). ``held``: not sent, because an earlier record of its key
    failed. Both of the latter are outages too.
    """

    error: str | None = None
    outage: bool = False
    topic_failure: bool = False
    held: bool = False

    @property
    def ok(self) -> bool:
        """Whether the broker acknowledged the record."""
        return self.error is None


ACKED = Outcome()
HELD = Outcome("not sent: an earlier record of its key failed", outage=True, held=True)


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
    text = f"{error.name()}: {error.str()}"
    if error.code() in _TOPIC_CODES:
        return Outcome(error=text, outage=True, topic_failure=True)
    outage = error.code() in _OUTAGE_CODES or error.retriable()
    return Outcome(error=text, outage=outage)


class KafkaPublisher:
    """A :class:`Publisher` over one idempotent ``confluent_kafka.Producer``.

    A fatal producer error (idempotence state lost) fails the batch and
    replaces the producer before the next one.
    """

    def __init__(self, config: Mapping[str, str]) -> None:
        self._config = dict(config)
        timeout_ms = int(self._config.get("message.timeout.ms", "300000"))
        self._flush_timeout = timeout_ms / 1000 + 5.0
        self._metadata_timeout = min(10.0, timeout_ms / 1000)
        self._producer = Producer(self._config)
        self._writable: set[str] = set()  # topics the broker confirmed (see _refused_topics)

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

        # A key's order spans topics (the outbox orders rows by key, whatever their topic).
        failed_keys: set[bytes] = set()
        refused_topics = self._refused_topics(records)
        for index, record in enumerate(records):
            if record.key is not None and record.key in failed_keys:
                # An earlier record of this key was refused at once (e.g. too large):
                # sending this one would overtake it. It waits, untouched (HELD).
                outcomes[index] = HELD
                continue
            if record.topic in refused_topics:
                outcomes[index] = refused_topics[record.topic]
            else:
                self._produce(index, record, report(index), outcomes)
            refused = outcomes[index]  # set already only when produce() refused it
            if record.key is not None and refused is not None and not refused.ok:
                failed_keys.add(record.key)
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
        # A topic refused now is asked about again before its next records go.
        self._writable -= {
            r.topic for r, o in zip(records, outcomes, strict=True) if o and o.topic_failure
        }
        return [
            o if o is not None else Outcome("no delivery report in time", outage=True)
            for o in outcomes
        ]

    def _refused_topics(self, records: Sequence[Record]) -> dict[str, Outcome]:
        """Ask the broker about topics not yet confirmed; return those it refuses as a whole.

        librdkafka reports a missing topic only in the delivery report, after
        ``topic.metadata.propagation.max.ms``, by which time later records of
        the same keys in other topics may be acknowledged. Asked first, a
        missing or forbidden topic fails its records before any is produced,
        so the later records of their keys are held.
        """
        refused: dict[str, Outcome] = {}
        for topic in sorted({r.topic for r in records} - self._writable):
            try:
                metadata = self._producer.list_topics(topic, timeout=self._metadata_timeout)
            except KafkaException:
                continue  # broker unreachable: producing reports the outage
            found = metadata.topics.get(topic)
            error = found.error if found is not None else None
            if found is not None and error is None:
                self._writable.add(topic)
            elif error is not None and error.code() in _TOPIC_CODES:
                refused[topic] = _outcome(error)
        return refused

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
