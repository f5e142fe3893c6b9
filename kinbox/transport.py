"""The Kafka transport: the only module that talks to Kafka through confluent-kafka.

:class:`Transport` is the seam the runner depends on (a fake implements it in
the unit tests); :class:`KafkaTransport` is the real one. :class:`Publisher`
(real: :class:`KafkaPublisher`) sends dead letters and replays, and
:func:`read_topic` reads a topic from its start for ``kinbox dlq replay``.
``KafkaException`` is translated to :class:`~kinbox.errors.TransportError` here.

Offsets: ``enable.auto.commit=false`` and ``enable.auto.offset.store=false``.
kinbox commits synchronously, and only offsets whose events are committed in
PostgreSQL; nothing in librdkafka commits on its own (auto-commit would also
commit on revoke, including partitions whose batch was rolled back).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol, cast

from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from kinbox.config import Settings
from kinbox.envelope import Record
from kinbox.errors import TransportError

log = logging.getLogger(__name__)

Partition = tuple[str, int]
"""A (topic, partition) pair."""

# The group has moved on: this member's generation/epoch is stale, so the
# commit must be dropped, never retried (the partition may have a new owner).
REJECTED = frozenset(
    {
        KafkaError.ILLEGAL_GENERATION,
        KafkaError.UNKNOWN_MEMBER_ID,
        KafkaError.REBALANCE_IN_PROGRESS,
        KafkaError.FENCED_INSTANCE_ID,
        KafkaError.STALE_MEMBER_EPOCH,
        KafkaError.FENCED_MEMBER_EPOCH,
        KafkaError._ASSIGNMENT_LOST,
        KafkaError._STATE,
    }
)


class RebalanceListener(Protocol):
    """Told about assignment changes, from inside :meth:`Transport.poll`."""

    def on_assigned(self, partitions: list[Partition]) -> None:
        """Partitions were added to this member."""

    def on_revoked(self, partitions: list[Partition]) -> None:
        """Partitions are about to go: the last chance to commit their offsets."""

    def on_lost(self, partitions: list[Partition]) -> None:
        """Partitions were taken away already: commit nothing for them."""


class Transport(Protocol):
    """What the runner needs from Kafka."""

    def subscribe(self, topics: Sequence[str], listener: RebalanceListener) -> None:
        """Join the group for ``topics``; ``listener`` hears about rebalances."""

    def poll(self, max_messages: int, timeout: float) -> list[Record]:
        """Return up to ``max_messages`` records, waiting at most ``timeout`` seconds."""

    def commit(self, offsets: Mapping[Partition, int]) -> None:
        """Commit ``offsets`` (next offset to read) synchronously.

        Raises:
            TransportError: ``retriable`` is false when the broker rejected the
                commit because the group moved on.
        """

    def pause(self, partitions: Sequence[Partition]) -> None:
        """Stop fetching ``partitions`` (the member stays in the group)."""

    def resume(self, partitions: Sequence[Partition]) -> None:
        """Fetch ``partitions`` again."""

    def seek(self, partition: Partition, offset: int) -> None:
        """Read ``partition`` from ``offset`` next."""

    def close(self) -> None:
        """Leave the group (revoke callbacks run) and release the client."""


def consumer_config(settings: Settings) -> dict[str, Any]:
    """Return the librdkafka configuration for ``settings``; ``-X`` overrides win."""
    overrides = dict(settings.kafka_overrides)
    config: dict[str, Any] = {
        "bootstrap.servers": settings.bootstrap_servers,
        "group.id": settings.group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        # A new group must not skip events published before it first joined.
        "auto.offset.reset": "earliest",
        "max.poll.interval.ms": int(settings.max_poll_interval * 1000),
        "logger": logging.getLogger("kinbox.kafka"),
    }
    if overrides.get("group.protocol", "classic") == "classic":
        # Under KIP-848 (group.protocol=consumer) the broker owns these two
        # and librdkafka refuses them.
        config["session.timeout.ms"] = int(settings.session_timeout * 1000)
        # Cooperative: a rebalance moves only the partitions that change
        # owner, so the others keep flowing.
        config["partition.assignment.strategy"] = "cooperative-sticky"
    config.update(overrides)
    return config


class KafkaTransport:
    """:class:`Transport` on a confluent-kafka ``Consumer``."""

    def __init__(self, settings: Settings) -> None:
        try:
            self._consumer = Consumer(consumer_config(settings))
        except KafkaException as exc:
            raise _translate("creating the consumer", exc) from exc

    def subscribe(self, topics: Sequence[str], listener: RebalanceListener) -> None:
        """See :meth:`Transport.subscribe`.

        The binding calls ``assign``/``incremental_assign`` (or the unassign
        pair) itself after each callback, choosing by the rebalance protocol
        in force (eager, cooperative or KIP-848). Python has no
        ``rebalance_protocol()`` to choose with here, so kinbox leaves that call
        to the binding and only does its offset bookkeeping in the callbacks.
        """

        def assigned(_: Consumer, parts: list[TopicPartition]) -> None:
            listener.on_assigned(_pairs(parts))

        def revoked(_: Consumer, parts: list[TopicPartition]) -> None:
            listener.on_revoked(_pairs(parts))

        def lost(_: Consumer, parts: list[TopicPartition]) -> None:
            listener.on_lost(_pairs(parts))

        try:
            self._consumer.subscribe(
                list(topics), on_assign=assigned, on_revoke=revoked, on_lost=lost
            )
        except KafkaException as exc:
            raise _translate(f"subscribing to {list(topics)!r}", exc) from exc

    def poll(self, max_messages: int, timeout: float) -> list[Record]:
        """See :meth:`Transport.poll`; error events are logged, fatal ones raised."""
        try:
            messages = self._consumer.consume(max_messages, timeout)
        except KafkaException as exc:
            raise _translate("consuming", exc) from exc
        records = []
        for msg in messages:
            err = msg.error()
            if err is None:
                records.append(_record(msg))
            elif err.fatal():
                raise TransportError(f"fatal consumer error: {err.str()}", retriable=False)
            elif err.code() != KafkaError._PARTITION_EOF:
                log.warning("consumer error (librdkafka retries): %s", err.str())
        return records

    def commit(self, offsets: Mapping[Partition, int]) -> None:
        """See :meth:`Transport.commit`."""
        if not offsets:
            return
        parts = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
        try:
            result = self._consumer.commit(offsets=parts, asynchronous=False)
        except KafkaException as exc:
            if exc.args and exc.args[0].code() == KafkaError._NO_OFFSET:
                return
            raise _translate(f"committing {dict(offsets)}", exc) from exc
        for part in result:
            if part.error is not None:
                raise _translate(
                    f"committing {part.topic}[{part.partition}]@{part.offset}",
                    KafkaException(part.error),
                )

    def pause(self, partitions: Sequence[Partition]) -> None:
        """See :meth:`Transport.pause`."""
        self._call("pausing", self._consumer.pause, partitions)

    def resume(self, partitions: Sequence[Partition]) -> None:
        """See :meth:`Transport.resume`."""
        self._call("resuming", self._consumer.resume, partitions)

    def seek(self, partition: Partition, offset: int) -> None:
        """See :meth:`Transport.seek`."""
        try:
            self._consumer.seek(TopicPartition(partition[0], partition[1], offset))
        except KafkaException as exc:
            raise _translate(f"seeking {partition}@{offset}", exc) from exc

    def close(self) -> None:
        """See :meth:`Transport.close`."""
        try:
            self._consumer.close()
        except (KafkaException, RuntimeError) as exc:
            log.warning("closing the consumer failed: %s", exc)

    def _call(self, what: str, method: Any, partitions: Sequence[Partition]) -> None:
        try:
            method([TopicPartition(t, p) for t, p in partitions])
        except KafkaException as exc:
            raise _translate(f"{what} {list(partitions)}", exc) from exc


class Publisher(Protocol):
    """Produces records and says when the broker has acknowledged all of them."""

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes | None]],
    ) -> None:
        """Queue one record (asynchronous; :meth:`flush` waits for it).

        Raises:
            TransportError: the client refused it at once (too large, unknown topic...).
        """

    def flush(self) -> None:
        """Wait until every queued record is acknowledged.

        Raises:
            TransportError: a record failed or was not acknowledged in time;
                the caller must treat none of them as delivered.
        """

    def close(self) -> None:
        """Flush what is left (best effort) and release the client."""


def producer_config(settings: Settings) -> dict[str, Any]:
    """Producer configuration: idempotent, ``acks=all``; ``-X`` overrides win.

    Consumer-only ``-X`` keys are left out, so security settings shared by
    both clients apply to the producer too without warnings.
    """
    consumer_only = ("group.", "session.", "heartbeat.", "max.poll.", "auto.", "enable.auto")
    overrides = {
        k: v for k, v in settings.kafka_overrides.items() if not k.startswith(consumer_only)
    }
    return {
        "bootstrap.servers": settings.bootstrap_servers,
        "enable.idempotence": True,
        "acks": "all",
        # Bounds flush(): a dead letter not acknowledged by then fails the batch.
        "message.timeout.ms": 30000,
        "logger": logging.getLogger("kinbox.kafka"),
        **overrides,
    }


class KafkaPublisher:
    """:class:`Publisher` on a confluent-kafka ``Producer``."""

    def __init__(self, settings: Settings) -> None:
        self._config = producer_config(settings)
        self._timeout = int(self._config["message.timeout.ms"]) / 1000 + 5.0
        self._errors: list[str] = []
        try:
            self._producer = Producer(self._config)
        except KafkaException as exc:
            raise _translate("creating the producer", exc) from exc

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self._errors.append(f"{msg.topic()}: {err.str()} ({err.name()})")

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes | None]],
    ) -> None:
        """See :meth:`Publisher.send`."""
        while True:
            try:
                self._producer.produce(
                    topic, value=value, key=key, headers=list(headers), on_delivery=self._delivered
                )
                return
            except BufferError:
                self._producer.poll(0.1)  # local queue full: let delivery reports drain
            except KafkaException as exc:
                raise _translate(f"producing to {topic!r}", exc) from exc

    def flush(self) -> None:
        """See :meth:`Publisher.flush`."""
        left = self._producer.flush(self._timeout)
        errors, self._errors = self._errors, []
        if left:
            raise TransportError(f"{left} record(s) not acknowledged in time", retriable=True)
        if errors:
            raise TransportError(f"produce failed: {'; '.join(errors[:3])}", retriable=True)

    def close(self) -> None:
        """See :meth:`Publisher.close`."""
        self._producer.flush(5.0)


def read_topic(settings: Settings, topic: str, timeout: float = 10.0) -> Iterator[Record]:
    """Yield every record of ``topic`` from its start up to its end as of now.

    Reads with a group-less consumer (nothing is committed) partition by
    partition, in offset order within each.

    Raises:
        TransportError: the topic does not exist or cannot be read.
    """
    config = consumer_config(settings)
    # A plain assign()-ed reader: no group membership, so none of its settings.
    for key in list(config):
        if key.startswith(("group.", "partition.assignment", "session.", "max.poll.")):
            del config[key]
    config["group.id"] = f"kinbox-reader-{time.time_ns()}"
    try:
        consumer = Consumer(config)
    except KafkaException as exc:
        raise _translate("creating a reader", exc) from exc
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
                yield _record(msg)
    except KafkaException as exc:
        raise _translate(f"reading {topic!r}", exc) from exc
    finally:
        consumer.close()


def _pairs(parts: list[TopicPartition]) -> list[Partition]:
    return [(p.topic, p.partition) for p in parts]


def _record(msg: Message) -> Record:
    ts_type, ts = msg.timestamp()
    return Record(
        topic=cast(str, msg.topic()),
        partition=cast(int, msg.partition()),
        offset=cast(int, msg.offset()),
        key=msg.key(),
        value=msg.value(),
        headers=cast("list[tuple[str, bytes | None]]", msg.headers() or []),
        timestamp=None if ts_type == TIMESTAMP_NOT_AVAILABLE else ts,
    )


def _translate(what: str, exc: KafkaException) -> TransportError:
    err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
    if err is None:
        return TransportError(f"{what}: {exc}", retriable=False)
    retriable = err.code() not in REJECTED and not err.fatal()
    return TransportError(f"{what}: {err.str()} ({err.name()})", retriable=retriable)
