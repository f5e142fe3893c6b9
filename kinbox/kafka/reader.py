"""Reading a whole topic once, outside any consumer group (``kinbox dlq replay``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import cast

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from kinbox.config import Settings
from kinbox.consume.envelope import Record
from kinbox.errors import TransportError
from kinbox.kafka.consumer import consumer_config, to_record
from kinbox.kafka.errors import create_client, translate


def read_topic(settings: Settings, topic: str, timeout: float = 10.0) -> Iterator[Record]:
    """Yield every record of ``topic`` from its start up to its end as of now.

    Reads with a group-less consumer (nothing is committed) partition by
    partition, in offset order within each.

    Raises:
        ConfigurationError: librdkafka refused the configuration (``-X``).
        TransportError: the topic does not exist or cannot be read.
    """
    config = consumer_config(settings)
    # A plain assign()-ed reader: no group membership, so none of its settings.
    for key in list(config):
        if key.startswith(("group.", "partition.assignment", "session.", "max.poll.")):
            del config[key]
    config["group.id"] = f"kinbox-reader-{time.time_ns()}"
    consumer = create_client(Consumer, config, "the topic reader")
    try:
        meta = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if meta is None or meta.error is not None:
            raise TransportError(
                f"cannot read topic {topic!r}: {meta and meta.error}", retriable=False
            )
        for partition in sorted(meta.partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout)
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, partition, low)])
            position = low
            while position < high:
                msg = consumer.poll(timeout)
                if msg is None:
                    raise TransportError(
                        f"{topic}[{partition}]: nothing read in {timeout}s", retriable=True
                    )
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        break
                    raise TransportError(
                        f"reading {topic}[{partition}]: {err.str()}", retriable=True
                    )
                position = cast(int, msg.offset()) + 1
                yield to_record(msg)
    except KafkaException as exc:
        raise translate(f"reading {topic!r}", exc) from exc
    finally:
        consumer.close()
