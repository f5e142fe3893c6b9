"""The events a scenario feeds every contender, and producing them.

A workload is a sequence of *deliveries*: each names one event (its id, key
and payload fields), and a producer duplicate is the same event sent again
with the same id and key — so it lands in the same partition, as a
producer's retry would. Half of the duplicates follow their original within
a few records (inside one poll batch), half thousands of records later
(another batch), so both of kinbox's paths are exercised: the in-batch
first-occurrence filter and the claim against committed rows.

Every payload carries ``sentAt``, the producer's wall clock when the record
was handed to the client: the latency scenario measures from it. On a topic
whose timestamps are the broker's (``message.timestamp.type=LogAppendTime``)
the acknowledgements also tell when the broker appended each record, which
splits that latency into the producer's leg and the consumer's.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, KafkaError, Message, Producer, TopicPartition
from confluent_kafka import Consumer as _Consumer

from kinbox.bench.spec import Target
from kinbox.core.errors import KinboxError
from producer_outbox.ids import from_stamp, stamp_of

ID_HEADER = "event-id"
NEAR = 20
"""A near duplicate follows its original within this many records."""
FAR = 3_000
"""A far duplicate comes at least this many records after its original."""


@dataclass(frozen=True)
class Workload:
    """The deliveries of one topic: event indexes in order, with the ids they carry."""

    ids: Sequence[str]
    """Event id by event index."""
    order: Sequence[int]
    """Event index of each delivery, in produce order (a repeat is a producer duplicate)."""
    pad: int = 0
    """Bytes of padding in each payload (the memory scenario's 1 KB records)."""

    @property
    def distinct(self) -> int:
        """Distinct events delivered: what exactly-once must apply."""
        return len(set(self.order))

    @property
    def deliveries(self) -> int:
        """Records in the topic, duplicates included."""
        return len(self.order)

    def head(self, count: int) -> Workload:
        """The same deliveries for only the first ``count`` events (slow contenders' topic)."""
        return Workload(self.ids[:count], [i for i in self.order if i < count], self.pad)


def build(
    events: int,
    duplicates: float = 0.0,
    *,
    seed: int = 0,
    pad: int = 0,
    ordered: bool = False,
) -> Workload:
    """``events`` unique events, plus ``duplicates`` x that many producer duplicates.

    Ids are random (version 4) UUIDs, or with ``ordered`` time-ordered ones
    (version 7, as ``producer_outbox`` makes them): stamped from now on, one
    1/4096 ms apart in event order, so they sort after every id made before.
    """
    rng = random.Random(seed)
    if ordered:
        start = stamp_of(time.time_ns())
        ids = [str(from_stamp(start + i, rng.getrandbits(62))) for i in range(events)]
    else:
        ids = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(events)]
    positions: list[tuple[float, int]] = [(float(i), i) for i in range(events)]
    chosen = rng.sample(range(events), round(events * duplicates))
    for n, index in enumerate(chosen):
        if n % 2 == 0:
            at = index + rng.uniform(0.5, NEAR)
        else:
            # Past the end means "among the last records": still another batch.
            at = min(index + FAR + rng.uniform(0, events), events + rng.uniform(0, NEAR))
        positions.append((at, index))
    positions.sort()
    return Workload(ids, [index for _, index in positions], pad)


def payload(index: int, pad: int) -> dict[str, Any]:
    """The business fields of event ``index``; ``sentAt`` is added when it is produced."""
    body: dict[str, Any] = {"userId": f"u{index % 1000}", "lessonId": f"l{index}"}
    if pad:
        body["pad"] = "x" * pad
    return body


class _Acks:
    def __init__(self, appended: dict[tuple[int, int], float] | None = None) -> None:
        self.errors: list[str] = []
        self._appended = appended

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.errors.append(err.str())
            return
        if self._appended is not None:
            kind, ms = msg.timestamp()
            if kind == TIMESTAMP_LOG_APPEND_TIME:
                partition, offset = msg.partition(), msg.offset()
                assert partition is not None and offset is not None  # acknowledged
                self._appended[(partition, offset)] = ms / 1000


def produce(
    target: Target,
    topic: str,
    work: Workload,
    *,
    rate: float | None = None,
    linger_ms: int = 20,
    appended: dict[tuple[int, int], float] | None = None,
    keys: int = 97,
) -> dict[int, int]:
    """Produce ``work`` to ``topic``; return the end offset of each partition.

    Args:
        target: the cluster.
        topic: an existing topic.
        work: what to send.
        rate: deliveries per second, paced (the latency scenario); ``None``
            produces as fast as the client takes them.
        linger_ms: the producer's batching delay (0 for latency: the
            benchmark measures the consumer, not the producer's batching).
        appended: filled with ``(partition, offset) → seconds since the
            epoch`` the broker appended each record at, on the broker's
            clock, when ``topic``'s timestamps are the broker's
            (``LogAppendTime``); left empty otherwise.
        keys: distinct record keys: event ``i`` is keyed ``k<i % keys>``.

    Raises:
        KinboxError: a record was not acknowledged.
    """
    config: dict[str, Any] = {
        **target.client_config(),
        "linger.ms": linger_ms,
        "enable.idempotence": True,
        "acks": "all",
        # The broker going away at the end of a local run is not news.
        "log.connection.close": False,
    }
    producer = Producer(config)
    acks = _Acks(appended)
    start = time.time()
    for n, index in enumerate(work.order):
        if rate:
            delay = start + n / rate - time.time()
            if delay > 0:
                time.sleep(delay)
        body = payload(index, work.pad)
        body["sentAt"] = time.time()
        value = json.dumps(body).encode()
        while True:
            try:
                producer.produce(
                    topic, value, key=f"k{index % keys}".encode(),
                    headers=[(ID_HEADER, work.ids[index].encode())], on_delivery=acks,
                )  # fmt: skip
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    left = producer.flush(120)
    if left or acks.errors:
        raise KinboxError(
            f"producing to {topic!r}: {left} record(s) unacknowledged, errors: {acks.errors[:3]}"
        )
    return end_offsets(target, topic)


def end_offsets(target: Target, topic: str) -> dict[int, int]:
    """The high watermark of every partition of ``topic``."""
    consumer = _Consumer({**target.client_config(), "group.id": f"{target.prefix}.watermarks"})
    try:
        meta = consumer.list_topics(topic, timeout=30).topics[topic]
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in sorted(meta.partitions)
        }
    finally:
        consumer.close()


def total(offsets: Mapping[int, int]) -> int:
    """Records below ``offsets``, summed over partitions."""
    return sum(offsets.values())
