"""The Kafka seam: the only package that talks to Kafka through confluent-kafka.

=================  ==========================================================
``consumer``       :class:`KafkaTransport`, the group member's consumer
                   (the :class:`~kinbox.core.transport.Transport` seam)
``publisher``      :class:`KafkaPublisher`, the one producer: dead letters,
                   replays and the outbox relay (the
                   :class:`~kinbox.core.publisher.Publisher` seam);
                   ``producer_config``, ``deliveries`` (what a report
                   says), ``topic_checks`` (a topic asked about first)
``reader``         :func:`read_topic`: a topic from its start, for replay
``admin``          :func:`~kinbox.kafka.admin.check_dead_letter_topics`:
                   dead-letter topics exist and take writes, before the start
``inspect``        groups, offsets, record timestamps, topic retention: what
                   ``kinbox status`` and the retention guards ask the broker
``errors``         fatal errors, refused configuration, ``KafkaException`` →
                   :class:`~kinbox.core.errors.TransportError`
=================  ==========================================================

The names below load on first use (PEP 562), so ``producer_outbox`` can use
:mod:`kinbox.kafka.errors` without loading the consumer's modules.
"""

from typing import TYPE_CHECKING

from kinbox.core.lazy import exports as _exports

if TYPE_CHECKING:
    from kinbox.kafka.consumer import KafkaTransport
    from kinbox.kafka.publisher import KafkaPublisher, dead_letter_publisher
    from kinbox.kafka.reader import read_topic

__all__ = [
    "KafkaPublisher",
    "KafkaTransport",
    "dead_letter_publisher",
    "read_topic",
]

_SOURCES = {
    "KafkaPublisher": "kinbox.kafka.publisher",
    "KafkaTransport": "kinbox.kafka.consumer",
    "dead_letter_publisher": "kinbox.kafka.publisher",
    "read_topic": "kinbox.kafka.reader",
}

__getattr__, __dir__ = _exports(__name__, _SOURCES)
