"""Delivery reports read: what a confluent-kafka report or refusal says about one message.

:func:`outcome` classifies an error as the relay needs it (an outage of
Kafka, a topic refused as a whole, or the message's own failure);
:class:`PendingSend` keeps the reports of one send until they become outcomes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import confluent_kafka
from confluent_kafka import KafkaError

from kinbox.core.publisher import ACKED, Outcome, OutgoingRecord, Sending
from kinbox.kafka.errors import describe, is_fatal

Callback = Callable[[KafkaError | None, confluent_kafka.Message], None]

# Errors that mean "Kafka is unreachable right now", not "this record is bad":
# they are recorded on the row but never park it.
OUTAGE_CODES = frozenset(
    {
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._PURGE_QUEUE,
        # Purged in flight: only ever by the publisher itself, from a producer that went fatal.
        KafkaError._PURGE_INFLIGHT,
    }
)

# Errors that mean "this topic cannot be written at all" (missing with
# auto-create off, not authorized): an outage of the topic, never a failure of
# the row; the relay pauses the topic (see producer_outbox.topics).
TOPIC_CODES = frozenset(
    {
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    }
)

_CASUALTIES = frozenset({KafkaError._FATAL, KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT})
"""Report codes of messages that failed only because their producer went fatal."""

LATE = Outcome("no delivery report in time", outage=True)

PENDING = object()
"""No delivery report yet."""


def outcome(error: KafkaError) -> Outcome:
    """The outcome of a message that ``error`` refused."""
    text = f"{error.name()}: {error.str()}"
    if error.code() in TOPIC_CODES:
        return Outcome(error=text, outage=True, topic_failure=True)
    # A fatally broken producer says nothing about the record: never park it for that.
    outage = error.code() in OUTAGE_CODES or error.retriable() or is_fatal(error)
    return Outcome(error=text, outage=outage)


def reported(report: object, missing: Outcome, fatal: bool) -> Outcome:
    """The outcome a delivery report says; ``missing`` when there was none to say more."""
    if report is PENDING:
        return missing
    if report is None:
        return ACKED
    assert isinstance(report, KafkaError)
    if fatal and report.code() in _CASUALTIES:
        return missing  # it names the fatal error, which is the real reason
    return outcome(report)


class Fatal:
    """Why the producer became unusable while serving one call, if it did."""

    reason: str | None = None

    def saw(self, error: KafkaError) -> None:
        """Note ``error``, which says the producer is fatally broken."""
        self.because(describe(error))

    def because(self, reason: str) -> None:
        """Note ``reason``, unless an earlier one was noted."""
        if self.reason is None:
            self.reason = reason


class PendingSend:
    """The messages of one send that still wait for delivery reports, and their sending."""

    def __init__(self, messages: Sequence[OutgoingRecord], deadline: float) -> None:
        self.messages = messages
        self.sending = Sending(len(messages))
        self.deadline = deadline
        """When every report should have come (``message.timeout.ms`` and a margin)."""
        self.reports: list[object] = [PENDING] * len(messages)
        self.arrived: list[int] = []
        """Indexes whose report came and is not yet an outcome."""

    def report(self, index: int) -> Callback:
        """The delivery callback of message ``index``."""

        def on_delivery(error: KafkaError | None, _message: confluent_kafka.Message) -> None:
            # Only store it: after a fatal error the binding may run this
            # with that exception pending, when any call on `error` fails.
            self.reports[index] = error
            self.arrived.append(index)

        return on_delivery

    def waiting(self) -> bool:
        """Whether a message has neither an outcome nor a report."""
        return any(
            known is None and report is PENDING
            for known, report in zip(self.sending.outcomes, self.reports, strict=True)
        )
