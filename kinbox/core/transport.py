"""The consuming side of the Kafka seam, free of any driver: what the runner needs from Kafka.

:class:`Transport` (the group member's consumer, with a
:class:`RebalanceListener`) is what the runner depends on. This module imports
no Kafka client, so the engine loads no librdkafka:
:class:`~kinbox.kafka.consumer.KafkaTransport` is the real implementation, on
confluent-kafka, and :mod:`kinbox.testing` has a fake. The producing side is
:mod:`kinbox.core.publisher`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from kinbox.core.event import Event

if TYPE_CHECKING:
    from kinbox.core.errors import TransportError
    from kinbox.core.record import Record

Partition = tuple[str, int]
"""A (topic, partition) pair."""

ValueReader = Callable[[object], Callable[[Event], object]]
"""Makes a Kafka client library's deserializer into a reader of an event's value.

A handler registered with a confluent-kafka ``Deserializer`` (Schema
Registry's Avro, Protobuf, JSON Schema) reads its payload through one: the
Kafka driver's (:meth:`ValueReading.value_reader`), which the runner hands
to its batch code when it starts.
"""


class RebalanceListener(Protocol):
    """Told about assignment changes and commit outcomes, from inside :meth:`Transport.poll`."""

    def on_assigned(self, partitions: list[Partition]) -> None:
        """Partitions were added to this member."""

    def on_revoked(self, partitions: list[Partition]) -> None:
        """Partitions are about to go: the last chance to commit their offsets."""

    def on_lost(self, partitions: list[Partition]) -> None:
        """Partitions were taken away already: commit nothing for them."""

    def on_committed(self, offsets: Mapping[Partition, int], error: TransportError | None) -> None:
        """The broker answered an asynchronous commit of ``offsets``; ``error`` if it failed."""


class Transport(Protocol):
    """What the runner needs from Kafka."""

    def subscribe(self, topics: Sequence[str], listener: RebalanceListener) -> None:
        """Join the group for ``topics``; ``listener`` hears about rebalances."""

    def poll(self, max_messages: int, timeout: float) -> list[Record]:
        """Return up to ``max_messages`` records, waiting at most ``timeout`` seconds.

        The listener may be told about a rebalance from inside, between the
        client calls a poll makes. A record the client returned for a
        partition whose assignment then ended within the same poll is not
        returned: it belongs to the assignment that ended, and the
        partition's next owner (this member too, if it got the partition
        back) reads it again from the committed offset.
        """

    def commit(self, offsets: Mapping[Partition, int], *, asynchronous: bool = False) -> None:
        """Commit ``offsets`` (next offset to read); synchronously unless ``asynchronous``.

        An asynchronous commit returns once it is sent; a later :meth:`poll`
        tells the listener its outcome (:meth:`RebalanceListener.on_committed`).
        Commits are sent in order, so a later one lands after an earlier one.

        Raises:
            TransportError: ``retriable`` is false when the broker rejected the
                commit because the group moved on (a synchronous commit), or the
                client refused to send it.
        """

    def pause(self, partitions: Sequence[Partition]) -> None:
        """Stop fetching ``partitions`` (the member stays in the group)."""

    def resume(self, partitions: Sequence[Partition]) -> None:
        """Fetch ``partitions`` again."""

    def seek(self, partition: Partition, offset: int) -> None:
        """Read ``partition`` from ``offset`` next."""

    def positions(self, partitions: Sequence[Partition]) -> dict[Partition, int]:
        """The next offset the consumer reads, per partition (those without one left out).

        It is past every record the consumer handed over and every offset it
        stepped over without one: a transaction's commit or abort marker, an
        aborted record, a record compaction removed. After a seek it is
        unknown until a record from there has been handed over.
        """

    def handed(self, partitions: Sequence[Partition]) -> dict[Partition, int]:
        """The offset after the last record the client returned, per partition (none: left out).

        Counted for the partition's current assignment (it starts with none),
        as each call into the client that returned records ends — before any
        other call into it can serve a rebalance callback. So a callback
        served later in the same :meth:`poll` already counts the records an
        earlier call of that poll returned, which the poll has not handed
        over yet. A seek never lowers it. Until every record below it is
        settled, the partition's :meth:`positions` may lie past a record not
        settled, and must not be committed.
        """

    def close(self) -> None:
        """Leave the group (revoke callbacks run) and release the client."""


class ForwardingTransport:
    """A :class:`Transport` handing every call to ``inner``: the base of a wrapper.

    A wrapper that watches some calls (health, the stage stamps) overrides
    those and inherits the rest.
    """

    def __init__(self, inner: Transport) -> None:
        self._inner = inner

    def subscribe(self, topics: Sequence[str], listener: RebalanceListener) -> None:
        """See :meth:`Transport.subscribe`."""
        self._inner.subscribe(topics, listener)

    def poll(self, max_messages: int, timeout: float) -> list[Record]:
        """See :meth:`Transport.poll`."""
        return self._inner.poll(max_messages, timeout)

    def commit(self, offsets: Mapping[Partition, int], *, asynchronous: bool = False) -> None:
        """See :meth:`Transport.commit`."""
        self._inner.commit(offsets, asynchronous=asynchronous)

    def pause(self, partitions: Sequence[Partition]) -> None:
        """See :meth:`Transport.pause`."""
        self._inner.pause(partitions)

    def resume(self, partitions: Sequence[Partition]) -> None:
        """See :meth:`Transport.resume`."""
        self._inner.resume(partitions)

    def seek(self, partition: Partition, offset: int) -> None:
        """See :meth:`Transport.seek`."""
        self._inner.seek(partition, offset)

    def positions(self, partitions: Sequence[Partition]) -> dict[Partition, int]:
        """See :meth:`Transport.positions`."""
        return self._inner.positions(partitions)

    def handed(self, partitions: Sequence[Partition]) -> dict[Partition, int]:
        """See :meth:`Transport.handed`."""
        return self._inner.handed(partitions)

    def close(self) -> None:
        """See :meth:`Transport.close`."""
        self._inner.close()


@runtime_checkable
class ValueReading(Protocol):
    """A transport whose client library has deserializers of its own, and reads values with them."""

    def value_reader(self, deserializer: object) -> Callable[[Event], object]:
        """Event -> what ``deserializer`` (a confluent-kafka ``Deserializer``) makes of its value.

        A :data:`ValueReader`; asked once per handler registered with such a
        deserializer, when the runner starts.
        """
