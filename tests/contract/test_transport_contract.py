"""The transport contract, run over the fake transport and KafkaTransport on the real broker.

What the runner relies on (:mod:`kinbox.core.transport`): subscribing brings the
topic's partitions through the listener, a poll hands each partition's
records over in offset order, a commit is what the group reads back, pause
holds one partition while the others flow, seek rewinds, the position
follows both, what the client returned is counted per assignment, and close
revokes.
An asynchronous commit returns at once and its answer comes through a later poll.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from kinbox.core.errors import TransportError
from kinbox.core.record import Record
from kinbox.core.transport import Partition, Transport
from tests.contract.kafka_sides import TransportSide


class Heard:
    """A rebalance listener that remembers what it was told."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[Partition]]] = []
        self.answers: list[tuple[dict[Partition, int], TransportError | None]] = []

    def on_assigned(self, partitions: list[Partition]) -> None:
        self.calls.append(("assigned", sorted(partitions)))

    def on_revoked(self, partitions: list[Partition]) -> None:
        self.calls.append(("revoked", sorted(partitions)))

    def on_lost(self, partitions: list[Partition]) -> None:
        self.calls.append(("lost", sorted(partitions)))

    def on_committed(self, offsets: Mapping[Partition, int], error: TransportError | None) -> None:
        self.answers.append((dict(offsets), error))

    def owned(self) -> set[Partition]:
        """What the member owns now, by the callbacks so far."""
        owned: set[Partition] = set()
        for kind, partitions in self.calls:
            if kind == "assigned":
                owned.update(partitions)
            else:
                owned.difference_update(partitions)
        return owned


def poll_until(
    transport: Transport, done: Callable[[list[Record]], bool], what: str, timeout: float = 30.0
) -> list[Record]:
    """Poll until ``done(records so far)``; fail after ``timeout`` seconds."""
    records: list[Record] = []
    deadline = time.monotonic() + timeout
    while not done(records):
        assert time.monotonic() < deadline, (
            f"{what}: got {[(r.partition, r.offset) for r in records]}"
        )
        records += transport.poll(100, 0.2)
    return records


def joined(consumer: TransportSide, topic: str, partitions: int) -> tuple[Transport, Heard]:
    """A member subscribed to ``topic`` that owns all its ``partitions`` (nothing produced yet)."""
    transport, heard = consumer.transport(), Heard()
    transport.subscribe([topic], heard)
    everything = {(topic, p) for p in range(partitions)}
    assert poll_until(transport, lambda _: heard.owned() == everything, "assignment") == []
    return transport, heard


def by_partition(records: list[Record]) -> dict[int, list[tuple[int, bytes | None]]]:
    out: dict[int, list[tuple[int, bytes | None]]] = {}
    for r in records:
        out.setdefault(r.partition, []).append((r.offset, r.value))
    return out


def test_subscribing_assigns_every_partition_through_the_listener(consumer: TransportSide) -> None:
    topic = consumer.topic(3)
    transport, heard = consumer.transport(), Heard()
    transport.subscribe([topic], heard)
    assert heard.calls == []  # the listener is told from inside poll(), never before
    everything = {(topic, 0), (topic, 1), (topic, 2)}
    assert poll_until(transport, lambda _: heard.owned() == everything, "assignment") == []
    assert heard.calls == [("assigned", sorted(everything))]


def test_a_poll_hands_over_each_partitions_records_in_offset_order(
    consumer: TransportSide,
) -> None:
    topic = consumer.topic(2)
    consumer.produce(topic, 0, [b"a0", b"a1", b"a2", b"a3", b"a4"])
    consumer.produce(topic, 1, [b"b0", b"b1", b"b2"])
    transport = consumer.transport()
    transport.subscribe([topic], Heard())
    records = poll_until(transport, lambda got: len(got) >= 8, "eight records")
    assert by_partition(records) == {
        0: [(o, f"a{o}".encode()) for o in range(5)],
        1: [(o, f"b{o}".encode()) for o in range(3)],
    }
    first = next(r for r in records if r.value == b"a0")
    assert (first.topic, first.key, list(first.headers)) == (topic, b"k-a0", [("event-id", b"a0")])
    assert first.timestamp is not None and first.headers_error is None


def test_a_commit_is_what_the_group_reads_back(consumer: TransportSide) -> None:
    topic = consumer.topic(2)
    consumer.produce(topic, 0, [b"a0", b"a1", b"a2", b"a3"])
    consumer.produce(topic, 1, [b"b0", b"b1"])
    transport = consumer.transport()
    transport.subscribe([topic], Heard())
    poll_until(transport, lambda got: len(got) >= 6, "six records")
    transport.commit({(topic, 0): 4, (topic, 1): 1})
    assert consumer.committed(topic, 2) == {0: 4, 1: 1}
    transport.commit({(topic, 1): 2})
    assert consumer.committed(topic, 2) == {0: 4, 1: 2}


def test_an_asynchronous_commit_is_answered_by_a_later_poll_and_read_back(
    consumer: TransportSide,
) -> None:
    topic = consumer.topic(2)
    consumer.produce(topic, 0, [b"a0", b"a1", b"a2"])
    consumer.produce(topic, 1, [b"b0"])
    transport, heard = consumer.transport(), Heard()
    transport.subscribe([topic], heard)
    poll_until(transport, lambda got: len(got) >= 4, "four records")
    # When offsets are committed asynchronously, twice, the later one higher
    transport.commit({(topic, 0): 2, (topic, 1): 1}, asynchronous=True)
    transport.commit({(topic, 0): 3}, asynchronous=True)
    # Then polls bring the answers, in order, and the group reads the later one back
    deadline = time.monotonic() + 30
    while len(heard.answers) < 2:
        assert time.monotonic() < deadline, f"answers: {heard.answers}"
        assert transport.poll(100, 0.2) == []
    assert heard.answers == [({(topic, 0): 2, (topic, 1): 1}, None), ({(topic, 0): 3}, None)]
    assert consumer.committed(topic, 2) == {0: 3, 1: 1}


def test_pause_holds_a_partition_while_the_others_flow_and_resume_releases_it(
    consumer: TransportSide,
) -> None:
    topic = consumer.topic(2)
    transport, _ = joined(consumer, topic, 2)
    transport.pause([(topic, 0)])
    consumer.produce(topic, 0, [b"a0", b"a1", b"a2"])
    consumer.produce(topic, 1, [b"b0", b"b1", b"b2"])
    records = poll_until(
        transport, lambda got: sum(r.partition == 1 for r in got) >= 3, "partition 1 flowing"
    )
    # A few more polls (two seconds for the real broker): still nothing of partition 0
    for _ in range(10):
        records += transport.poll(100, 0.2)
    assert by_partition(records) == {1: [(0, b"b0"), (1, b"b1"), (2, b"b2")]}
    transport.resume([(topic, 0)])
    released = poll_until(transport, lambda got: len(got) >= 3, "partition 0 resumed")
    assert by_partition(released) == {0: [(0, b"a0"), (1, b"a1"), (2, b"a2")]}


def test_seek_rewinds_a_partition(consumer: TransportSide) -> None:
    topic = consumer.topic(1)
    consumer.produce(topic, 0, [b"a0", b"a1", b"a2", b"a3", b"a4"])
    transport = consumer.transport()
    transport.subscribe([topic], Heard())
    poll_until(transport, lambda got: len(got) >= 5, "five records")
    transport.seek((topic, 0), 2)
    again = poll_until(transport, lambda got: len(got) >= 3, "records after the seek")
    assert by_partition(again) == {0: [(2, b"a2"), (3, b"a3"), (4, b"a4")]}


def test_the_position_follows_what_a_poll_handed_over_and_a_seek(
    consumer: TransportSide,
) -> None:
    topic = consumer.topic(1)
    consumer.produce(topic, 0, [b"a0", b"a1", b"a2"])
    transport = consumer.transport()
    transport.subscribe([topic], Heard())
    poll_until(transport, lambda got: len(got) >= 3, "three records")
    assert transport.positions([(topic, 0)]) == {(topic, 0): 3}
    # A seek leaves no position until a record from there is handed over
    transport.seek((topic, 0), 1)
    assert transport.positions([(topic, 0)]) == {}
    poll_until(transport, lambda got: len(got) >= 2, "the records after the seek")
    assert transport.positions([(topic, 0)]) == {(topic, 0): 3}
    assert transport.positions([(topic, 7)]) == {}  # not assigned: no position


def test_handed_counts_what_the_client_returned_for_the_assignment_a_seek_never_lowers_it(
    consumer: TransportSide,
) -> None:
    topic = consumer.topic(2)
    both = [(topic, 0), (topic, 1)]
    consumer.produce(topic, 0, [b"a0", b"a1", b"a2"])
    consumer.produce(topic, 1, [b"b0"])
    transport = consumer.transport()
    transport.subscribe([topic], Heard())
    assert transport.handed(both) == {}
    poll_until(transport, lambda got: len(got) >= 4, "four records")
    assert transport.handed(both) == {(topic, 0): 3, (topic, 1): 1}
    # A seek back and the records again: still past the last one returned
    transport.seek((topic, 0), 1)
    poll_until(transport, lambda got: len(got) >= 2, "the records after the seek")
    assert transport.handed(both) == {(topic, 0): 3, (topic, 1): 1}
    # Once the assignment ends, nothing is counted for it
    transport.close()
    assert transport.handed(both) == {}


def test_close_revokes_what_the_member_owns(consumer: TransportSide) -> None:
    topic = consumer.topic(2)
    transport, heard = joined(consumer, topic, 2)
    transport.close()
    assert heard.calls[-1] == ("revoked", [(topic, 0), (topic, 1)])
    assert heard.owned() == set() and all(kind != "lost" for kind, _ in heard.calls)
