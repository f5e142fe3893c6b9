"""Topics of their own for each test: created on the real broker, named ``<prefix>-<random>``."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence

from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic


def topic_name(prefix: str = "t") -> str:
    """A fresh topic name, so tests never read each other's records."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def create_topic(
    bootstrap: str,
    name: str | None = None,
    partitions: int = 3,
    *,
    prefix: str = "t",
    config: Mapping[str, str] | None = None,
    replication_factor: int = 1,
    replicas: Sequence[Sequence[int]] | None = None,
) -> str:
    """Create ``name`` (or a fresh :func:`topic_name`); return it.

    Args:
        config: topic-level settings (``max.message.bytes``...).
        replication_factor: 1 by default; -1 takes the broker's default
            (3 on ``kinbox dev --brokers 3``).
        replicas: instead of ``partitions`` and ``replication_factor``, each
            partition's replicas by broker id, the preferred leader first.

    Raises:
        confluent_kafka.KafkaException: the broker refused it or did not answer in 30 s.
    """
    topic = name or topic_name(prefix)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    if replicas is not None:
        # The binding wants a partition count with an assignment, and no factor.
        new = NewTopic(
            topic,
            num_partitions=len(replicas),
            replica_assignment=[list(r) for r in replicas],
            config=dict(config or {}),
        )
    else:
        new = NewTopic(
            topic,
            num_partitions=partitions,
            replication_factor=replication_factor,
            config=dict(config or {}),
        )
    admin.create_topics([new])[topic].result(timeout=30)
    return topic
