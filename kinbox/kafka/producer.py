"""The producing side of the Kafka seam: :class:`Publisher` and :class:`KafkaPublisher`.

kinbox produces only dead letters and ``kinbox dlq replay`` records, and treats
a record as sent only once :meth:`Publisher.flush` has seen the broker
acknowledge it (idempotent producer, ``acks=all``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from kinbox.core.config import Settings
from kinbox.core.errors import TransportError
from kinbox.kafka.errors import ClientLog, broken, create_client, describe, is_fatal, translate
from kinbox.kafka.producer_config import producer_config

log = logging.getLogger(__name__)


class _Reports:
    """Delivery reports of one producer instance (a replaced one reports into its own)."""

    def __init__(self) -> None:
        self.failed: list[tuple[KafkaError, Message]] = []

    def delivered(self, err: KafkaError | None, msg: Message) -> None:
        # Only store it: after a fatal error the binding may run this with that
        # exception pending, when any call on `err` or `msg` fails.
        if err is not None:
            self.failed.append((err, msg))

    def fatal(self) -> str | None:
        """The first report that says the producer is fatally broken (code ``_FATAL``)."""
        return next((describe(err) for err, _ in self.failed if is_fatal(err)), None)

    def errors(self) -> list[str]:
        return [f"{msg.topic()}: {describe(err)}" for err, msg in self.failed]


class KafkaPublisher:
    """:class:`Publisher` on a confluent-kafka ``Producer``, replaced when it fails fatally.

    A fatal error (see :mod:`kinbox.kafka.errors`: an idempotent producer
    that can no longer keep its guarantee) makes every later call of that
    producer fail. So the publisher drops it and creates a new one, and the
    :meth:`send` or :meth:`flush` in hand raises a *retriable*
    :class:`TransportError`: nothing queued since the last flush counts as
    delivered, the batch rolls back and is tried again on the new producer.

    Args:
        settings: brokers and ``-X`` overrides.
        factory: creates the producer from its configuration (a seam for tests).
        max_record_bytes: the largest record to be sent (the dead-letter
            topics' limit); raises the client's own ``message.max.bytes``
            (default 1,000,000, below a topic's default of 1,048,588) so the
            client never refuses what the topic would take. ``-X`` wins.

    Raises:
        ConfigurationError: librdkafka refused the configuration (``-X``).
    """

    def __init__(
        self,
        settings: Settings,
        factory: Callable[[dict[str, Any]], Producer] = Producer,
        *,
        max_record_bytes: int | None = None,
    ) -> None:
        self._config = producer_config(settings)
        if max_record_bytes is not None and "message.max.bytes" not in settings.kafka_overrides:
            # librdkafka's bounds for the setting.
            self._config["message.max.bytes"] = min(max(max_record_bytes, 1000), 1_000_000_000)
        self._factory = factory
        self._producer = self._create()
        # After the client accepted the configuration, so the value is a number.
        self._timeout = int(self._config["message.timeout.ms"]) / 1000 + 5.0
        self._reports = _Reports()
        self.replaced = 0
        """How many times a fatally failed producer was replaced."""

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes | None]],
    ) -> None:
        """See :meth:`Publisher.send`."""
        what = f"producing to {topic!r}"
        while True:
            try:
                self._producer.produce(
                    topic,
                    value=value,
                    key=key,
                    headers=list(headers),
                    on_delivery=self._reports.delivered,
                )
                return
            except BufferError:
                # Local queue full: let delivery reports drain.
                self._guarded(what, lambda: self._producer.poll(0.1))
            except (KafkaException, SystemError) as exc:
                raise self._failure(what, exc) from exc

    def flush(self) -> None:
        """See :meth:`Publisher.flush`."""
        left = self._guarded("flushing", lambda: self._producer.flush(self._timeout))
        if left or self._reports.failed:
            # A refusal can make the producer fatal (enable.gapless.guarantee):
            # serve its error event now, so the replacement happens with this
            # batch rather than at the next one's send.
            self._guarded("flushing", lambda: self._producer.poll(0))
        reports, self._reports = self._reports, _Reports()
        fatal = reports.fatal()
        if fatal is not None:
            raise self._replace("flushing", fatal)
        if left:
            raise TransportError(f"{left} record(s) not acknowledged in time", retriable=True)
        if reports.failed:
            failed = "; ".join(reports.errors()[:3])
            raise TransportError(f"produce failed: {failed}", retriable=True)

    def close(self) -> None:
        """See :meth:`Publisher.close`."""
        try:
            self._producer.flush(5.0)
        except (KafkaException, SystemError) as exc:
            log.warning("closing the dead-letter producer: %s", exc)

    def _create(self) -> Producer:
        # A log per producer: the fatal reason it remembers is this one's.
        self._log = ClientLog(logging.getLogger("kinbox.kafka"))
        config = {**self._config, "logger": self._log}
        return create_client(self._factory, config, "the dead-letter producer")

    def _guarded(self, what: str, call: Callable[[], int]) -> int:
        try:
            return call()
        except (KafkaException, SystemError) as exc:
            raise self._failure(what, exc) from exc

    def _failure(self, what: str, exc: KafkaException | SystemError) -> TransportError:
        """The error to raise for ``exc``; a fatal one replaces the producer first."""
        reason = broken(exc, self._log)
        if reason is not None:
            return self._replace(what, reason)
        assert isinstance(exc, KafkaException)  # a SystemError is always `broken`
        return translate(what, exc)

    def _replace(self, what: str, reason: str) -> TransportError:
        """Drop the fatally failed producer for a new one; say why the batch failed."""
        log.error(
            "the dead-letter producer failed fatally (%s); replacing it. Records it had not "
            "acknowledged count as not sent: their batch rolls back and is tried again",
            reason,
        )
        old, self._producer = self._producer, self._create()
        self._reports = _Reports()
        self.replaced += 1
        try:
            # Nothing of the old one may still go out behind the batch's retry.
            old.purge(in_queue=True, in_flight=True, blocking=False)
        except (KafkaException, SystemError) as exc:
            log.debug("purging the failed producer: %s", exc)
        return TransportError(
            f"{what}: the producer failed fatally ({reason}); a new one takes over",
            retriable=True,
        )
