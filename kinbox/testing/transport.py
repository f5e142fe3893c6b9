"""An in-memory :class:`~kinbox.core.transport.Transport`: :class:`FakeTransport`; :func:`record`.

:class:`FakeTransport` is a broker with one group member: a log per
partition, the member's positions and committed offsets, pause and seek.
Tests drive the group coordinator's side by hand (:meth:`FakeTransport.assign`,
:meth:`FakeTransport.revoke`), so a rebalance happens exactly where the test
wants it. The contract suite (``tests/contract``) runs the same tests over
it and :class:`~kinbox.kafka.consumer.KafkaTransport` on a real broker.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from kinbox.core.errors import TransportError
from kinbox.core.record import Record
from kinbox.core.transport import Partition, RebalanceListener


class FakeTransport:
    """A broker with one consumer: logs per partition, positions, commits, pause/seek.

    Args:
        logs: the records already in each partition (a partition given with
            no records exists, empty). :meth:`append` adds more.

    State, readable by tests: :attr:`logs`, :attr:`committed`,
    :attr:`position`, :attr:`assigned`, :attr:`paused`, :attr:`commit_calls`,
    :attr:`closed`.

    A poll is two client calls, as :class:`~kinbox.kafka.consumer.KafkaTransport`'s
    is: the first takes one record, the second the rest. Knob:
    :attr:`inside_poll`, callables run between them, as the rebalance
    callbacks a real consumer serves inside its second call (e.g.
    ``fake.inside_poll.append(lambda: fake.revoke([tp]))``).

    Knob: ``commit_errors``, a list of :class:`~kinbox.core.errors.TransportError`;
    each commit pops the first one and raises it instead of committing (a
    ``retriable=False`` one is the broker refusing a commit after the group
    moved on). An asynchronous commit lands at once (or fails with the popped
    error) and the listener hears its outcome in the next :meth:`poll`, as
    from a real broker.

    As a real consumer does, the first :meth:`poll` after :meth:`subscribe`
    assigns (``on_assigned``, from inside the poll) every partition the
    topics have then. Unlike a real one, :meth:`poll` never waits: it returns
    what there is, partition by partition, and a partition created after that
    first poll is never assigned unless a test calls :meth:`assign`.
    """

    def __init__(self, logs: Mapping[Partition, list[Record]] | None = None) -> None:
        self.logs: dict[Partition, list[Record]] = {tp: list(r) for tp, r in (logs or {}).items()}
        """The records of each partition; a record's index is its offset."""
        self.committed: dict[Partition, int] = {}
        """The last committed offset (the next one to read) by partition."""
        self.position: dict[Partition, int] = {}
        """The next offset :meth:`poll` reads, by assigned partition."""
        self.paused: set[Partition] = set()
        self.assigned: set[Partition] = set()
        self.commit_calls: list[dict[Partition, int]] = []
        """The offsets of every :meth:`commit` call, failed ones included."""
        self.commit_errors: list[TransportError] = []
        self.listener: RebalanceListener | None = None
        """The listener given to :meth:`subscribe`."""
        self._joining: list[Partition] = []  # assigned by the next poll
        self._answers: list[tuple[dict[Partition, int], TransportError | None]] = []
        self._sought: set[Partition] = set()  # no position until a poll hands a record over
        self.inside_poll: list[Callable[[], None]] = []
        """Run and removed by the next poll whose first call returns a record, between its calls."""
        self._handed: dict[Partition, int] = {}  # see handed()
        self._ended: set[Partition] = set()  # assignments ended since a poll's first call
        self.closed = False

    def append(self, record: Record) -> None:
        """Add ``record`` to the end of its partition (its ``offset`` is taken as given)."""
        self.logs.setdefault((record.topic, record.partition), []).append(record)

    # rebalance driving, as the group coordinator would
    def assign(self, partitions: Sequence[Partition]) -> None:
        """Give ``partitions`` to the member (``on_assigned``), at their committed offsets."""
        assert self.listener is not None, "subscribe first"
        for tp in partitions:
            self._handed.pop(tp, None)
        self.listener.on_assigned(list(partitions))
        for tp in partitions:
            self.assigned.add(tp)
            self.position[tp] = self.committed.get(tp, 0)

    def revoke(self, partitions: Sequence[Partition], *, lost: bool = False) -> None:
        """Take ``partitions`` away: ``on_revoked``, or ``on_lost`` when ``lost``."""
        assert self.listener is not None, "subscribe first"
        if lost:
            self.listener.on_lost(list(partitions))
        else:
            self.listener.on_revoked(list(partitions))
        for tp in partitions:
            self.assigned.discard(tp)
            self.paused.discard(tp)
            self._handed.pop(tp, None)
        self._ended.update(partitions)

    # Transport protocol
    def subscribe(self, topics: Sequence[str], listener: RebalanceListener) -> None:
        """See :meth:`~kinbox.core.transport.Transport.subscribe`; the next poll assigns."""
        self.listener = listener
        self._joining = sorted(tp for tp in self.logs if tp[0] in topics)

    def poll(self, max_messages: int, timeout: float) -> list[Record]:
        """See :meth:`~kinbox.core.transport.Transport.poll`; never waits.

        Runs :attr:`inside_poll` between its two calls; a record the first
        call returned for a partition revoked there is dropped.
        """
        if self._joining:
            # Like the group's first rebalance: the callback runs inside poll().
            joining, self._joining = self._joining, []
            # A test may have assigned some by hand in between: not twice.
            joining = [tp for tp in joining if tp not in self.assigned]
            if joining:
                self.assign(joining)
        answers, self._answers = self._answers, []
        for offsets, error in answers:
            if self.listener is not None:
                self.listener.on_committed(offsets, error)
        out = self._read(1)
        if not out or max_messages <= 1:
            return out
        self._ended.clear()
        actions, self.inside_poll = self.inside_poll, []
        for action in actions:
            action()
        more = self._read(max_messages - 1)
        return [r for r in out if (r.topic, r.partition) not in self._ended] + more

    def _read(self, most: int) -> list[Record]:
        """One client call: up to ``most`` records, partition by partition, counted as handed."""
        out: list[Record] = []
        for tp in sorted(self.assigned - self.paused):
            log = self.logs.get(tp, [])
            while self.position[tp] < len(log) and len(out) < most:
                taken = log[self.position[tp]]
                out.append(taken)
                self.position[tp] += 1
                self._sought.discard(tp)
                self._handed[tp] = max(self._handed.get(tp, 0), taken.offset + 1)
        return out

    def commit(self, offsets: Mapping[Partition, int], *, asynchronous: bool = False) -> None:
        """See :meth:`~kinbox.core.transport.Transport.commit`; ``commit_errors`` apply."""
        self.commit_calls.append(dict(offsets))
        error = self.commit_errors.pop(0) if self.commit_errors else None
        if error is None:
            self.committed.update(offsets)
        if asynchronous:
            self._answers.append((dict(offsets), error))
        elif error is not None:
            raise error

    def pause(self, partitions: Sequence[Partition]) -> None:
        """See :meth:`~kinbox.core.transport.Transport.pause`."""
        self.paused.update(partitions)

    def resume(self, partitions: Sequence[Partition]) -> None:
        """See :meth:`~kinbox.core.transport.Transport.resume`."""
        self.paused.difference_update(partitions)

    def seek(self, partition: Partition, offset: int) -> None:
        """See :meth:`~kinbox.core.transport.Transport.seek`."""
        self.position[partition] = offset
        self._sought.add(partition)

    def positions(self, partitions: Sequence[Partition]) -> dict[Partition, int]:
        """See :meth:`~kinbox.core.transport.Transport.positions`: :attr:`position`, assigned only.

        The fake's logs have no transaction markers: the position is past the
        last record handed over. As librdkafka's, it is unknown after a seek
        until a poll hands a record over from there.
        """
        return {
            tp: self.position[tp]
            for tp in partitions
            if tp in self.assigned and tp not in self._sought
        }

    def handed(self, partitions: Sequence[Partition]) -> dict[Partition, int]:
        """See :meth:`~kinbox.core.transport.Transport.handed`."""
        return {tp: self._handed[tp] for tp in partitions if tp in self._handed}

    def close(self) -> None:
        """See :meth:`~kinbox.core.transport.Transport.close`: revokes what is assigned."""
        if self.listener is not None and self.assigned:
            self.revoke(sorted(self.assigned))
        self.closed = True


def record(
    topic: str,
    partition: int,
    offset: int,
    event_id: str | None,
    value: bytes = b"{}",
    headers: Sequence[tuple[str, bytes | None]] | None = None,
) -> Record:
    """A :class:`~kinbox.core.record.Record` carrying ``event_id`` in its ``event-id`` header.

    Args:
        topic: the record's topic.
        partition: its partition.
        offset: its offset.
        event_id: ``None`` for a record without an id header.
        value: its value.
        headers: all the headers instead (then ``event_id`` is not added).
    """
    if headers is None:
        headers = [] if event_id is None else [("event-id", event_id.encode())]
    return Record(topic, partition, offset, None, value, list(headers), 1_700_000_000_000)
