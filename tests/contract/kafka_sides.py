"""The two transports and the two publishers under one contract: drive them, look inside.

A :class:`TransportSide` makes topics, writes records into them as a producer
would, creates the transport (the group member) and reads the group's
committed offsets back — from the broker for the real one, from the fake's
state for the fake. A :class:`PublisherSide` reads back what reached a topic
and makes a message the broker will not take.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Sequence
from typing import Protocol

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from kinbox.core.config import Settings
from kinbox.core.publisher import OutgoingRecord, Publisher
from kinbox.core.record import Record
from kinbox.core.transport import Transport
from kinbox.kafka.consumer import KafkaTransport
from kinbox.kafka.publisher import dead_letter_publisher
from kinbox.testing import FakePublisher, FakeTransport
from producer_outbox.producer import producer_config, relay_publisher
from tests.support.records import committed, read_topic
from tests.support.topics import create_topic
from tests.support.waiting import wait_for

Headers = Sequence[tuple[str, bytes | None]]
Sent = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]
"""A record as it reads back: key, value, headers."""


class TransportSide(Protocol):
    """One transport implementation, driven and inspected by the contract tests."""

    name: str

    def topic(self, partitions: int) -> str:
        """Create a topic with ``partitions`` partitions."""

    def produce(self, topic: str, partition: int, values: Sequence[bytes]) -> None:
        """Append a record per value (key ``k-<value>``, an ``event-id`` header)."""

    def transport(self) -> Transport:
        """The group member (one per test)."""

    def committed(self, topic: str, partitions: int) -> dict[int, int]:
        """The group's committed offsets by partition (absent ones left out)."""


class FakeTransportSide:
    """:class:`~kinbox.testing.FakeTransport`: its logs are the topics."""

    name = "fake"

    def __init__(self) -> None:
        self.fake = FakeTransport()

    def topic(self, partitions: int) -> str:
        name = f"t-{uuid.uuid4().hex[:12]}"
        for partition in range(partitions):
            self.fake.logs[(name, partition)] = []
        return name

    def produce(self, topic: str, partition: int, values: Sequence[bytes]) -> None:
        log = self.fake.logs[(topic, partition)]
        for value in values:
            headers = [("event-id", value)]
            self.fake.append(Record(topic, partition, len(log), b"k-" + value, value, headers, 1))

    def transport(self) -> Transport:
        return self.fake

    def committed(self, topic: str, partitions: int) -> dict[int, int]:
        return {p: o for (t, p), o in self.fake.committed.items() if t == topic}


class KafkaTransportSide:
    """:class:`KafkaTransport` as a member of a group of its own, on the test broker."""

    name = "kafka"

    def __init__(self, bootstrap: str) -> None:
        self._bootstrap = bootstrap
        self._group = f"contract-{uuid.uuid4().hex[:12]}"
        self._members: list[KafkaTransport] = []

    @classmethod
    @contextlib.contextmanager
    def running(cls, bootstrap: str) -> Iterator[KafkaTransportSide]:
        """The side, closing what it created after the test."""
        side = cls(bootstrap)
        try:
            yield side
        finally:
            for member in side._members:
                member.close()  # a second close() of a closed consumer is only logged

    def topic(self, partitions: int) -> str:
        return create_topic(self._bootstrap, partitions=partitions)

    def produce(self, topic: str, partition: int, values: Sequence[bytes]) -> None:
        producer = Producer({"bootstrap.servers": self._bootstrap, "enable.idempotence": True})
        for value in values:
            producer.produce(
                topic, value, key=b"k-" + value, partition=partition, headers=[("event-id", value)]
            )
        assert producer.flush(30) == 0, "records not acknowledged"

    def transport(self) -> Transport:
        settings = Settings(
            bootstrap_servers=self._bootstrap,
            database_url="postgresql:///unused",
            group_id=self._group,
            session_timeout=6.0,
        ).validate()
        self._members.append(KafkaTransport(settings))
        return self._members[-1]

    def committed(self, topic: str, partitions: int) -> dict[int, int]:
        return committed(self._bootstrap, self._group, topic, partitions)


class PublisherSide(Protocol):
    """One publisher implementation, driven and inspected by the contract tests."""

    name: str
    publisher: Publisher

    def topic(self) -> str:
        """A topic to publish to (one partition)."""

    def read(self, topic: str) -> list[Sent]:
        """What reached ``topic``, in order."""

    def doomed(self, topic: str) -> OutgoingRecord:
        """A message the broker will not take: the delivery holding it fails."""


class FakePublisherSide:
    """:class:`~kinbox.testing.FakePublisher`: its acknowledged records are the topics."""

    name = "fake"

    def __init__(self) -> None:
        self.fake = FakePublisher()
        self.publisher: Publisher = self.fake

    def topic(self) -> str:
        return f"t-{uuid.uuid4().hex[:12]}"

    def read(self, topic: str) -> list[Sent]:
        return [(r.key, r.value, list(r.headers)) for r in self.fake.acked if r.topic == topic]

    def doomed(self, topic: str) -> OutgoingRecord:
        self.fake.fail_flushes += 1
        return OutgoingRecord(topic, None, b"doomed", [])


class KafkaPublisherSide:
    """:class:`KafkaPublisher` on the test broker; topics take records up to 1,000 bytes.

    ``relay``: configured as the outbox relay's (topics asked about first),
    else as the dead-letter producer.
    """

    LIMIT = 1000

    def __init__(self, bootstrap: str, *, relay: bool = False) -> None:
        self._bootstrap = bootstrap
        self.name = "kafka-relay" if relay else "kafka"
        self.publisher: Publisher = (
            relay_publisher(producer_config(bootstrap, {}))
            if relay
            else dead_letter_publisher(Settings(bootstrap_servers=bootstrap))
        )

    def topic(self) -> str:
        name = create_topic(
            self._bootstrap, partitions=1, config={"max.message.bytes": str(self.LIMIT)}
        )
        # The relay's publisher asks about a topic first and takes "unknown" for
        # an answer: wait until the broker's metadata has the new one.
        admin = AdminClient({"bootstrap.servers": self._bootstrap})

        def known() -> bool:
            found = admin.list_topics(name, timeout=5).topics.get(name)
            return found is not None and found.error is None and bool(found.partitions)

        wait_for(known, timeout=30, what=f"topic {name} in the metadata")
        return name

    def read(self, topic: str) -> list[Sent]:
        return [(r.key, r.value, list(r.headers)) for r in read_topic(self._bootstrap, topic)]

    def doomed(self, topic: str) -> OutgoingRecord:
        # Under the client's own limit (1,000,000 bytes), over the topic's: the
        # client takes it and the broker refuses it (MESSAGE_TOO_LARGE).
        return OutgoingRecord(topic, None, b"doomed" + b"x" * 10 * self.LIMIT, [])
