"""In-memory stand-ins for the two seams: InboxStore and Transport."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from kinbox.envelope import Record
from kinbox.errors import StoreError, TransportError
from kinbox.event import Event
from kinbox.store import first_occurrences
from kinbox.transport import Partition, RebalanceListener


class FakeConn:
    """What handlers get as ``tx``: a list of effects, rolled back with the transaction."""

    def __init__(self, effects: list[Any]) -> None:
        self.effects = effects


class _FakeTx:
    def __init__(self, store: FakeStore) -> None:
        self._store = store
        self.connection = FakeConn(store.effects)

    def claim(self, events: Sequence[Event]) -> list[Event]:
        if self._store.fail_claims:
            self._store.fail_claims -= 1
            raise StoreError("OperationalError: server closed the connection", transient=True)
        fresh = []
        for event in first_occurrences(events):
            if event.id not in self._store.claimed:
                self._store.claimed[event.id] = event
                fresh.append(event)
        return fresh

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        mark = len(self._store.effects)
        try:
            yield
        except BaseException:
            del self._store.effects[mark:]
            raise


class FakeStore:
    """Transactions snapshot the claimed ids and effects and restore them on error."""

    def __init__(self) -> None:
        self.claimed: dict[str, Event] = {}
        self.effects: list[Any] = []
        self.commits = 0
        self.fail_claims = 0
        self.closed = False

    @contextmanager
    def transaction(self) -> Iterator[_FakeTx]:
        claimed, mark = dict(self.claimed), len(self.effects)
        try:
            yield _FakeTx(self)
        except BaseException:
            self.claimed = claimed
            del self.effects[mark:]
            raise
        self.commits += 1

    def close(self) -> None:
        self.closed = True


class FakeTransport:
    """A broker with one consumer: logs per partition, positions, commits, pause/seek."""

    def __init__(self, logs: Mapping[Partition, list[Record]] | None = None) -> None:
        self.logs: dict[Partition, list[Record]] = {tp: list(r) for tp, r in (logs or {}).items()}
        self.committed: dict[Partition, int] = {}
        self.position: dict[Partition, int] = {}
        self.paused: set[Partition] = set()
        self.assigned: set[Partition] = set()
        self.commit_calls: list[dict[Partition, int]] = []
        self.commit_errors: list[TransportError] = []
        self.listener: RebalanceListener | None = None
        self.closed = False

    def append(self, record: Record) -> None:
        self.logs.setdefault((record.topic, record.partition), []).append(record)

    # rebalance driving, as the group coordinator would
    def assign(self, partitions: Sequence[Partition]) -> None:
        assert self.listener is not None
        self.listener.on_assigned(list(partitions))
        for tp in partitions:
            self.assigned.add(tp)
            self.position[tp] = self.committed.get(tp, 0)

    def revoke(self, partitions: Sequence[Partition], *, lost: bool = False) -> None:
        assert self.listener is not None
        if lost:
            self.listener.on_lost(list(partitions))
        else:
            self.listener.on_revoked(list(partitions))
        for tp in partitions:
            self.assigned.discard(tp)
            self.paused.discard(tp)

    # Transport protocol
    def subscribe(self, topics: Sequence[str], listener: RebalanceListener) -> None:
        self.listener = listener
        self.assign(sorted(tp for tp in self.logs if tp[0] in topics))

    def poll(self, max_messages: int, timeout: float) -> list[Record]:
        out: list[Record] = []
        for tp in sorted(self.assigned - self.paused):
            log = self.logs.get(tp, [])
            while self.position[tp] < len(log) and len(out) < max_messages:
                out.append(log[self.position[tp]])
                self.position[tp] += 1
        return out

    def commit(self, offsets: Mapping[Partition, int]) -> None:
        self.commit_calls.append(dict(offsets))
        if self.commit_errors:
            raise self.commit_errors.pop(0)
        self.committed.update(offsets)

    def pause(self, partitions: Sequence[Partition]) -> None:
        self.paused.update(partitions)

    def resume(self, partitions: Sequence[Partition]) -> None:
        self.paused.difference_update(partitions)

    def seek(self, partition: Partition, offset: int) -> None:
        self.position[partition] = offset

    def close(self) -> None:
        if self.listener is not None and self.assigned:
            self.revoke(sorted(self.assigned))
        self.closed = True


def record(
    topic: str, partition: int, offset: int, event_id: str | None, value: bytes = b"{}"
) -> Record:
    headers = [] if event_id is None else [("event-id", event_id.encode())]
    return Record(topic, partition, offset, None, value, headers, 1_700_000_000_000)
