"""The Kafka seam: the only package that talks to Kafka through confluent-kafka.

=================  ==========================================================
``consumer``       :class:`Transport` (what the runner needs) and
                   :class:`KafkaTransport`, the group member's consumer
``producer``       :class:`Publisher` and :class:`KafkaPublisher`: dead
                   letters and replays, acknowledged before they count
``reader``         :func:`read_topic`: a topic from its start, for replay
``errors``         ``KafkaException`` → :class:`~kinbox.errors.TransportError`
=================  ==========================================================
"""

from kinbox.kafka.consumer import KafkaTransport, Partition, RebalanceListener, Transport
from kinbox.kafka.producer import KafkaPublisher, Publisher
from kinbox.kafka.reader import read_topic

__all__ = [
    "KafkaPublisher",
    "KafkaTransport",
    "Partition",
    "Publisher",
    "RebalanceListener",
    "Transport",
    "read_topic",
]
