"""Records in and out of the real broker: the producer, a topic reader, committed offsets.

The fault suite and the integration tests write their events here (with
delivery reports, so they know each record's partition and offset), read
dead-letter topics back, read the group's committed offsets from the broker,
and change a topic's record size limit as an operator would.
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

# (re-exported by confluent_kafka.admin, but not in a way mypy --strict accepts)
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource


@dataclass(frozen=True)
class Produced:
    """What the producer wrote, from its delivery reports."""

    topic: str
    partitions: int
    records: dict[tuple[int, int], str]
    """(partition, offset) -> event id."""
    keys: int = 0
    """Above 0: event ``<prefix>-<n>``'s record has key ``k<n % keys>`` (:func:`key_of`)."""
    ends: dict[int, int] | None = None
    """The partitions' log end offsets, where they lie past the last record +1
    (a transaction's commit marker takes an offset); by default from ``records``."""

    @property
    def ids(self) -> set[str]:
        """Distinct event ids (duplicates share one)."""
        return set(self.records.values())

    def end_offsets(self) -> dict[int, int]:
        """Next offset after the last record (or the log's end), per partition written to."""
        if self.ends is not None:
            return dict(self.ends)
        ends: dict[int, int] = {}
        for partition, offset in self.records:
            ends[partition] = max(ends.get(partition, 0), offset + 1)
        return ends


Headers = list[tuple[str, bytes | None]]


def key_of(event_id: str, keys: int) -> str:
    """The record key of event ``<prefix>-<n>`` among ``keys`` keys: ``k<n % keys>``."""
    return f"k{int(event_id.rsplit('-', 1)[1]) % keys}"


def produce(
    bootstrap: str,
    topic: str,
    count: int,
    partitions: int,
    *,
    prefix: str,
    duplicates: int = 0,
    rng: random.Random | None = None,
    keys: int = 0,
) -> Produced:
    """Write ``count`` events ``<prefix>-<n>`` round-robin over ``partitions``.

    ``duplicates`` extra records repeat random earlier ids (the same ``event-id``
    header at a later offset, possibly on another partition): the inbox must
    suppress them. ``keys``: above 0, each record is keyed (:func:`key_of`).
    """
    rng = rng or random.Random(0)
    plan = [(f"{prefix}-{n}", n % partitions) for n in range(count)]
    for _ in range(duplicates):
        event_id, _partition = plan[rng.randrange(count)]
        plan.insert(rng.randrange(len(plan) + 1), (event_id, rng.randrange(partitions)))
    items: list[tuple[int, Headers, str | None]] = [
        (partition, [("event-id", event_id.encode())], event_id) for event_id, partition in plan
    ]
    if not keys:
        return produce_plan(bootstrap, topic, partitions, items)
    written = write_records(bootstrap, topic, items, keys)
    return Produced(topic, partitions, written, keys)


def produce_plan(
    bootstrap: str, topic: str, partitions: int, items: list[tuple[int, Headers, str | None]]
) -> Produced:
    """Write one record per ``(partition, headers, expected id)``, in order.

    The expected id is what kinbox should key the record on; ``None`` means the
    record has no valid id, so kinbox keys it on ``topic/partition/offset``
    (dead-lettered or derived), which is filled in from the delivery report.
    """
    return Produced(topic, partitions, write_records(bootstrap, topic, items))


def write_records(
    bootstrap: str, topic: str, items: Sequence[tuple[int, Headers, str | None]], keys: int = 0
) -> dict[tuple[int, int], str]:
    """Write ``items`` as :func:`produce_plan` does; return ``(partition, offset) -> id``.

    ``keys``: above 0, each record with an id is keyed (:func:`key_of`).

    The one producer of the tests that need each record's place: an idempotent
    producer, so a retried send never writes a record twice, with a delivery
    report per record; fails unless every record was acknowledged.
    """
    records: dict[tuple[int, int], str] = {}
    errors: list[str] = []

    def delivered(event_id: str | None, err: Any, msg: Any) -> None:
        # The id comes from the closure: a delivery report's headers are not
        # reliably readable from inside the callback.
        if err is not None:
            errors.append(str(err))
            return
        where = (msg.partition(), msg.offset())
        records[where] = event_id or f"{topic}/{where[0]}/{where[1]}"

    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5}
    )
    for partition, headers, event_id in items:
        producer.produce(
            topic,
            value=b'{"n": 1}',
            partition=partition,
            key=key_of(event_id, keys) if keys and event_id else None,
            headers=cast("list[tuple[str, str | bytes | None]]", headers),
            on_delivery=functools.partial(delivered, event_id),
        )
        producer.poll(0)
    left = producer.flush(60)
    assert left == 0 and not errors, f"produce failed: {left} undelivered, errors {errors[:3]}"
    return records


@dataclass(frozen=True)
class Read:
    """One record read back from a topic."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers

    def header(self, name: str) -> str | None:
        """The first ``name`` header as text (``None`` if absent)."""
        for key, value in self.headers:
            if key == name and value is not None:
                return value.decode("utf-8", "replace")
        return None


def read_topic(bootstrap: str, topic: str, timeout: float = 10.0) -> list[Read]:
    """Every record of ``topic`` up to its end as of now, by partition; ``[]`` if it does not exist.

    Group-less (``assign``), so nothing is committed and no topic is created.
    """
    return sorted(iter_topic(bootstrap, topic, timeout), key=lambda r: (r.partition, r.offset))


def iter_topic(bootstrap: str, topic: str, timeout: float = 10.0) -> Iterator[Read]:
    """:func:`read_topic` one record at a time, for a topic too long to hold in memory.

    Every partition is read at once, so records of different partitions
    come interleaved (each partition's in offset order).
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"fault-reader-{time.time_ns()}",
            "enable.auto.commit": False,
            "allow.auto.create.topics": False,
            "log_level": 3,
        }
    )
    try:
        meta = consumer.list_topics(timeout=timeout).topics.get(topic)
        if meta is None:
            return
        ends: dict[int, int] = {}
        starts = []
        for partition in sorted(meta.partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout)
            if high > low:
                ends[partition] = high
                starts.append(TopicPartition(topic, partition, low))
        consumer.assign(starts)
        while ends:
            msg = consumer.poll(timeout)
            assert msg is not None, f"{topic}{sorted(ends)}: nothing read in {timeout}s"
            if msg.error() is not None:
                raise AssertionError(f"reading {topic}[{msg.partition()}]: {msg.error()}")
            partition, offset = msg.partition() or 0, msg.offset() or 0
            if offset >= ends.get(partition, 0):
                continue  # written after this read began
            if offset + 1 >= ends[partition]:
                del ends[partition]
            headers = cast(Headers, msg.headers() or [])
            yield Read(partition, offset, msg.key(), msg.value(), headers)
    finally:
        consumer.close()


def dead_letter_id(letter: Read, id_headers: tuple[str, ...] = ("event-id", "ce_id", "id")) -> str:
    """The event id kinbox recorded as ``dead_lettered`` for the dead letter ``letter``.

    An invalid-id record is keyed on its original ``topic/partition/offset``
    (from the ``kinbox.dlq.*`` headers); any other on its id header.
    """
    if letter.header("kinbox.dlq.reason") == "invalid-id":
        origin = ("topic", "partition", "offset")
        return "/".join(letter.header(f"kinbox.dlq.{name}") or "?" for name in origin)
    for name in id_headers:
        found = letter.header(name)
        if found is not None:
            return found
    return "?"


def _retrying(action: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """Run ``action`` until it stops raising a retriable Kafka error (coordinator loading...)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return action()
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            retriable = err is not None and (err.retriable() or "coordinator" in err.str().lower())
            if not retriable or time.monotonic() > deadline:
                raise AssertionError(f"{what}: {exc}") from exc
            time.sleep(0.5)


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """Committed offsets of ``group`` read back from the broker (absent ones left out)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "log_level": 3})
    try:
        parts = _retrying(
            lambda: consumer.committed(
                [TopicPartition(topic, p) for p in range(partitions)], timeout=10
            ),
            f"reading committed offsets of {group!r}",
        )
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in parts if tp.offset >= 0}


def log_ends(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """Each partition's high watermark: the offset after the last committed record or marker."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "fault-ends", "log_level": 3})
    try:
        return {
            p: int(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1])
            for p in range(partitions)
        }
    finally:
        consumer.close()


def set_max_message_bytes(bootstrap: str, topic: str, limit: int) -> None:
    """Set ``topic``'s ``max.message.bytes``, as an operator would.

    The broker applies a topic's configuration asynchronously, so a lowered
    limit is waited for: until a probe over it is refused (a probe taken
    before that is deleted again, so the topic holds only what the test
    expects). A raised limit is not probed.
    """
    admin = AdminClient({"bootstrap.servers": bootstrap})
    entry = ConfigEntry(
        "max.message.bytes", str(limit), incremental_operation=AlterConfigOpType.SET
    )
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[entry])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)
    deadline = time.monotonic() + 30
    while limit < 64 * 1024 and not _refuses(admin, bootstrap, topic, b"p" * (limit + 1)):
        assert time.monotonic() < deadline, f"{topic}'s max.message.bytes={limit} never held"
        time.sleep(0.2)


def _refuses(admin: AdminClient, bootstrap: str, topic: str, value: bytes) -> bool:
    """Whether the broker refuses ``value`` on ``topic`` for its size (if not, delete it)."""
    producer = Producer({"bootstrap.servers": bootstrap, "log_level": 3})
    reports: list[tuple[KafkaError | None, Any]] = []
    producer.produce(topic, value, partition=0, on_delivery=lambda e, m: reports.append((e, m)))
    assert producer.flush(30) == 0, f"probe of {topic} not acknowledged"
    [(err, msg)] = reports
    if err is not None:
        assert err.code() == KafkaError.MSG_SIZE_TOO_LARGE, f"probing {topic}: {err}"
        return True
    taken = TopicPartition(topic, 0, msg.offset() + 1)
    for future in admin.delete_records([taken]).values():
        future.result(timeout=30)
    return False
