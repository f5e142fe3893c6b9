"""What the broker knows about groups and topics, for ``kinbox status`` and the retention guards.

Read-only: a group's members and their assignments, its committed offsets,
each partition's first and end offsets, the timestamp of the record at a
given offset (the oldest unprocessed one, the oldest one still kept), and a
topic's retention. Nothing here joins a group or commits: records are read
by a group-less, ``assign()``-ed consumer, as :mod:`kinbox.kafka.reader` does.

Every ``KafkaException`` becomes a :class:`~kinbox.core.errors.TransportError`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # public, not re-exported in the stubs
    AdminClient,
    ConfigResource,
    OffsetSpec,
)

from kinbox.core.errors import TransportError
from kinbox.core.transport import Partition
from kinbox.kafka.errors import create_client, translate

_PRODUCER_ONLY = ("enable.idempotence", "acks", "message.timeout.ms", "linger.ms", "compression.")
_CONSUMER_ONLY = ("group.", "session.", "heartbeat.", "max.poll.", "auto.", "enable.auto")


@dataclass(frozen=True)
class Member:
    """One member of a consumer group and the partitions assigned to it."""

    member_id: str
    client_id: str
    host: str
    instance_id: str | None
    partitions: tuple[Partition, ...]


@dataclass(frozen=True)
class Group:
    """A consumer group as the coordinator describes it."""

    group_id: str
    state: str
    members: tuple[Member, ...]


@dataclass(frozen=True)
class Retention:
    """How long a topic keeps its records.

    ``ms`` is ``retention.ms``; ``None`` when the topic keeps records forever:
    ``retention.ms=-1``, or ``cleanup.policy=compact`` without ``delete``
    (compaction keeps the latest record of each key however old it is).
    """

    topic: str
    ms: int | None
    cleanup_policy: str


def admin_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A producer's or consumer's librdkafka configuration, as a plain client's.

    Security settings (``-X security.protocol=...``) carry over; what only a
    producer or a member of a group would take is left out.
    """
    return {
        key: value
        for key, value in config.items()
        if not key.startswith(_PRODUCER_ONLY) and not key.startswith(_CONSUMER_ONLY)
    }


class Inspector:
    """Asks the cluster about groups, offsets and topics (an admin client holds no membership).

    Args:
        config: a librdkafka configuration (``bootstrap.servers``, security
            settings); producer and group settings in it are ignored.
        timeout: how long to wait for each answer, in seconds.

    Raises:
        ConfigurationError: librdkafka refused the configuration.
    """

    def __init__(self, config: Mapping[str, Any], timeout: float = 15.0) -> None:
        self._config = admin_config(config)
        self._timeout = timeout
        self._admin = create_client(AdminClient, self._config, "the admin client")

    def group(self, group_id: str) -> Group:
        """Describe ``group_id``: its state and members with their assignments.

        A group the coordinator does not know is ``Dead`` with no members.
        """
        futures = self._admin.describe_consumer_groups([group_id], request_timeout=self._timeout)
        try:
            described = futures[group_id].result(timeout=self._timeout)
        except KafkaException as exc:
            err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            if err is not None and err.code() == KafkaError.GROUP_ID_NOT_FOUND:
                return Group(group_id, "Dead", ())
            raise translate(f"describing group {group_id!r}", exc) from exc
        members = tuple(
            Member(
                member_id=m.member_id,
                client_id=m.client_id,
                host=m.host,
                instance_id=m.group_instance_id,
                partitions=tuple(
                    sorted((tp.topic, tp.partition) for tp in m.assignment.topic_partitions)
                ),
            )
            for m in described.members
        )
        state = getattr(described.state, "name", str(described.state))
        return Group(group_id, _state_name(state), members)

    def committed(self, group_id: str) -> dict[Partition, int]:
        """The offsets ``group_id`` has committed (next offset to read), by partition."""
        request = [ConsumerGroupTopicPartitions(group_id)]
        futures = self._admin.list_consumer_group_offsets(request, request_timeout=self._timeout)
        try:
            answer = futures[group_id].result(timeout=self._timeout)
        except KafkaException as exc:
            raise translate(f"reading the offsets of group {group_id!r}", exc) from exc
        return {
            (tp.topic, tp.partition): tp.offset
            for tp in answer.topic_partitions or []
            if tp.error is None and tp.offset >= 0
        }

    def topic_names(self) -> list[str]:
        """Every topic of the cluster but its internal ones (``__consumer_offsets``...), sorted."""
        try:
            meta = self._admin.list_topics(timeout=self._timeout)
        except KafkaException as exc:
            raise translate("listing topics", exc) from exc
        return sorted(name for name in meta.topics if not name.startswith("__"))

    def partitions(self, topics: Iterable[str]) -> list[Partition]:
        """Every partition of those of ``topics`` that exist."""
        wanted = set(topics)
        if not wanted:
            return []
        try:
            meta = self._admin.list_topics(timeout=self._timeout)
        except KafkaException as exc:
            raise translate("listing topics", exc) from exc
        return sorted(
            (name, partition)
            for name, topic in meta.topics.items()
            if name in wanted and topic.error is None
            for partition in topic.partitions
        )

    def watermarks(self, partitions: Iterable[Partition]) -> dict[Partition, tuple[int, int]]:
        """``(first offset, end offset)`` of each partition, as a read_committed consumer sees it.

        The end offset is the last stable offset: under a transactional
        producer, records of an open transaction are not counted yet.
        """
        wanted = sorted(set(partitions))
        if not wanted:
            return {}
        first = self._offsets(wanted, OffsetSpec.earliest())  # type: ignore[no-untyped-call]
        end = self._offsets(wanted, OffsetSpec.latest())  # type: ignore[no-untyped-call]
        return {tp: (first[tp], end[tp]) for tp in wanted if tp in first and tp in end}

    def _offsets(self, partitions: list[Partition], spec: Any) -> dict[Partition, int]:
        request = {TopicPartition(t, p): spec for t, p in partitions}
        try:
            futures = self._admin.list_offsets(
                request,
                isolation_level=IsolationLevel.READ_COMMITTED,
                request_timeout=self._timeout,
            )
            return {
                (tp.topic, tp.partition): int(future.result(timeout=self._timeout).offset)
                for tp, future in futures.items()
            }
        except KafkaException as exc:
            raise translate(f"listing offsets of {partitions}", exc) from exc

    def timestamps(
        self, offsets: Mapping[Partition, int], ends: Mapping[Partition, int]
    ) -> dict[Partition, int]:
        """The timestamp (ms) of the first record at or after each offset, below its end offset.

        A partition with nothing there (offset at its end), or whose record
        has no timestamp, is left out. Reads at most one record per partition.
        """
        wanted = {tp: o for tp, o in offsets.items() if o < ends.get(tp, 0)}
        if not wanted:
            return {}
        from confluent_kafka import Consumer

        config = {
            **self._config,
            # Group-less: assign() only, nothing is ever committed under this id.
            "group.id": f"kinbox-inspect-{time.time_ns()}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
        consumer = create_client(Consumer, config, "the offset reader")
        found: dict[Partition, int] = {}
        try:
            consumer.assign([TopicPartition(t, p, o) for (t, p), o in wanted.items()])
            pending = set(wanted)
            deadline = time.monotonic() + self._timeout
            while pending and time.monotonic() < deadline:
                msg = consumer.poll(min(1.0, max(0.1, deadline - time.monotonic())))
                if msg is None:
                    continue
                tp = (cast(str, msg.topic()), cast(int, msg.partition()))
                err = msg.error()
                if err is not None and err.code() != KafkaError._PARTITION_EOF:
                    raise TransportError(f"reading {tp}: {err.str()}", retriable=True)
                if tp not in pending:
                    continue
                pending.discard(tp)
                if err is None:
                    kind, stamp = msg.timestamp()
                    if kind != TIMESTAMP_NOT_AVAILABLE and stamp >= 0:
                        found[tp] = stamp
                consumer.pause([TopicPartition(*tp)])  # seen: no more of it is needed
            if pending:
                raise TransportError(
                    f"no record read from {sorted(pending)} in {self._timeout}s", retriable=True
                )
        except KafkaException as exc:
            raise translate("reading record timestamps", exc) from exc
        finally:
            consumer.close()
        return found

    def retention(self, topics: Iterable[str]) -> dict[str, Retention]:
        """``retention.ms`` and ``cleanup.policy`` of each of ``topics`` that exists."""
        names = sorted(set(topics))
        resources = [ConfigResource(ConfigResource.Type.TOPIC, name) for name in names]
        if not resources:
            return {}
        found = {}
        for resource, future in self._admin.describe_configs(
            resources, request_timeout=self._timeout
        ).items():
            try:
                entries = future.result(timeout=self._timeout)
            except KafkaException as exc:
                err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                if err is not None and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                    continue
                raise translate(f"reading the configuration of {resource.name!r}", exc) from exc
            policy = _value(entries, "cleanup.policy") or "delete"
            raw = _value(entries, "retention.ms")
            ms = int(raw) if raw is not None else None
            forever = ms is None or ms < 0 or "delete" not in policy
            found[resource.name] = Retention(resource.name, None if forever else ms, policy)
        return found


def _value(entries: Mapping[str, Any], name: str) -> str | None:
    entry = entries.get(name)
    return None if entry is None or entry.value is None else str(entry.value)


def _state_name(state: str) -> str:
    """``STABLE`` -> ``Stable``: the state as Kafka's own tools print it."""
    return state.title().replace("_", "")
