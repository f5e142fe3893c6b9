"""Reading topics outside any consumer group: ``kinbox dlq replay`` and the console.

Every reader here is a group-less, ``assign()``-ed consumer: it joins no
group and commits nothing, so reading a dead-letter topic never moves any
group's position. Three shapes of read: a whole topic (:func:`read_topic`),
the newest records of a topic (:func:`read_tail`, bounded however long the
topic is) and one record by its coordinates (:func:`read_at`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from kinbox.core.config import Settings
from kinbox.core.errors import TransportError
from kinbox.core.record import Record
from kinbox.kafka.consumer import consumer_config, to_record
from kinbox.kafka.errors import create_client, translate


def read_topic(settings: Settings, topic: str, timeout: float = 10.0) -> Iterator[Record]:
    """Yield every record of ``topic`` from its start up to its end as of now.

    Reads partition by partition, in offset order within each.

    Raises:
        ConfigurationError: librdkafka refused the configuration (``-X``).
        TransportError: the topic does not exist or cannot be read.
    """
    return _read(settings, topic, timeout, lambda _p, low, high: (low, high))


def read_tail(settings: Settings, topic: str, limit: int, timeout: float = 10.0) -> list[Record]:
    """The newest ``limit`` records of ``topic``, newest first (by timestamp, then offset).

    Reads at most ``limit`` records of each partition (the last ones), so
    the cost is bounded by ``limit`` times the partition count, whatever the
    topic holds.

    Raises:
        ConfigurationError: librdkafka refused the configuration (``-X``).
        TransportError: the topic does not exist or cannot be read.
    """
    found = list(
        _read(settings, topic, timeout, lambda _p, low, high: (max(low, high - limit), high))
    )
    found.sort(key=lambda r: (r.timestamp or 0, r.offset), reverse=True)
    return found[:limit]


def read_at(
    settings: Settings, topic: str, partition: int, offset: int, timeout: float = 10.0
) -> Record | None:
    """The record of ``topic`` at ``partition``/``offset``; ``None`` when none is kept there.

    Raises:
        ConfigurationError: librdkafka refused the configuration (``-X``).
        TransportError: the topic does not exist or cannot be read.
    """

    def just(p: int, low: int, high: int) -> tuple[int, int] | None:
        return (offset, offset + 1) if p == partition and low <= offset < high else None

    return next((r for r in _read(settings, topic, timeout, just) if r.offset == offset), None)


Ranges = Callable[[int, int, int], tuple[int, int] | None]
"""``(partition, first offset, end offset) -> (start, end)`` to read of it, or ``None``."""


def _reader(settings: Settings) -> Consumer:
    config: Mapping[str, Any] = consumer_config(settings)
    # A plain assign()-ed reader: no group membership, so none of its settings.
    plain = {
        key: value
        for key, value in config.items()
        if not key.startswith(("group.", "partition.assignment", "session.", "max.poll."))
    }
    plain["group.id"] = f"kinbox-reader-{time.time_ns()}"
    return create_client(Consumer, plain, "the topic reader")


def _read(settings: Settings, topic: str, timeout: float, ranges: Ranges) -> Iterator[Record]:
    consumer = _reader(settings)
    try:
        meta = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if meta is None or meta.error is not None:
            raise TransportError(
                f"cannot read topic {topic!r}: {meta and meta.error}", retriable=False
            )
        for partition in sorted(meta.partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout)
            span = ranges(partition, low, high)
            if span is None or span[1] <= span[0]:
                continue
            yield from _partition(consumer, topic, partition, span, timeout)
    except KafkaException as exc:
        raise translate(f"reading {topic!r}", exc) from exc
    finally:
        consumer.close()


def _partition(
    consumer: Consumer, topic: str, partition: int, span: tuple[int, int], timeout: float
) -> Iterator[Record]:
    """The records of one partition from ``span[0]`` up to (not including) ``span[1]``."""
    start, end = span
    consumer.assign([TopicPartition(topic, partition, start)])
    position = start
    while position < end:
        msg = consumer.poll(timeout)
        if msg is None:
            raise TransportError(
                f"{topic}[{partition}]: nothing read in {timeout}s", retriable=True
            )
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                break
            raise TransportError(f"reading {topic}[{partition}]: {err.str()}", retriable=True)
        position = cast(int, msg.offset()) + 1
        yield to_record(msg)
