"""In-memory stand-ins for the seams: InboxStore, Transport and Publisher."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg

from kinbox.consume.envelope import Record
from kinbox.errors import StoreError, TransportError
from kinbox.event import Event
from kinbox.kafka.base import Partition, RebalanceListener
from kinbox.store.base import first_occurrences
from kinbox.store.errors import transient_cause, translate


class FakeConn:
    """What handlers get as ``tx``: a list of effects, rolled back with the transaction."""

    def __init__(self, effects: list[Any]) -> None:
        self.effects = effects


class _FakeTx:
    def __init__(self, store: FakeStore, mark: int) -> None:
        self._store = store
        self._mark = mark  # the effects before it are earlier transactions'
        self.connection = FakeConn(store.effects)

    def claim(self, events: Sequence[Event], reclaim: Collection[str] = ()) -> list[Event]:
        self._store.claims.append([e.id for e in events])
        if self._store.fail_claims:
            self._store.fail_claims -= 1
            raise StoreError("OperationalError: server closed the connection", transient=True)
        refused = [e.id for e in events if self._store.refuse_id(e.id)]
        if refused:
            raise StoreError(f"DataError: cannot store event id {refused[0]!r}", transient=False)
        fresh = []
        for event in first_occurrences(events):
            taken_over = event.id in reclaim and self._store.status.get(event.id) == "dead_lettered"
            if event.id not in self._store.claimed or taken_over:
                self._store.claimed[event.id] = event
                self._store.status[event.id] = "applied"
                fresh.append(event)
        return fresh

    def dead_letter(self, event: Event, reason: str) -> None:
        assert event.id in self._store.claimed
        if not storable(reason) or self._store.refuse_reason(reason):
            raise StoreError(f"DataError: cannot store reason {reason[:40]!r}", transient=False)
        self._store.status[event.id] = "dead_lettered"
        self._store.reasons[event.id] = reason

    def check_deferred(self) -> None:
        self._store.check_deferred(self._mark)

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        self._store.savepoints += 1
        mark = len(self._store.effects)
        try:
            yield
        except psycopg.Error as exc:
            del self._store.effects[mark:]
            raise translate(exc, own=False) from exc
        except BaseException:
            del self._store.effects[mark:]
            raise

    @contextmanager
    def unguarded(self) -> Iterator[None]:
        # Nothing to undo here: a failure rolls the whole transaction back.
        try:
            yield
        except psycopg.Error as exc:
            raise translate(exc, own=False) from exc

    def outage(self, exc: BaseException) -> StoreError | None:
        return transient_cause(exc)


def storable(text: str) -> bool:
    """What a UTF8 PostgreSQL through psycopg accepts in a text column: no NUL, no surrogate."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


class FakeStore:
    """Transactions snapshot the claimed ids and effects and restore them on error.

    Like PostgreSQL, it can refuse content, non-transiently: an id in the
    claim (``refuse_id``), a dead letter's reason (NUL or a lone surrogate,
    always; ``refuse_reason``), or COMMIT and the deferred checks, given the
    effects the transaction wrote (``refuse_commit``: a deferred constraint).
    """

    def __init__(self) -> None:
        self.claimed: dict[str, Event] = {}
        self.status: dict[str, str] = {}
        self.reasons: dict[str, str] = {}
        self.effects: list[Any] = []
        self.commits = 0
        self.savepoints = 0
        self.fail_claims = 0
        # Ambiguous commits: the transaction commits, then the "connection" is lost.
        self.lose_after_commit = 0
        self.closed = False
        self.refuse_id: Callable[[str], bool] = lambda _id: False
        self.refuse_reason: Callable[[str], bool] = lambda _reason: False
        self.refuse_commit: Callable[[list[Any]], bool] = lambda _effects: False
        self.claims: list[list[str]] = []
        """The ids of every claim, in order (refused ones included)."""
        self.refused_commits = 0
        self.transactions = 0

    def check_deferred(self, mark: int) -> None:
        if self.refuse_commit(self.effects[mark:]):
            self.refused_commits += 1
            raise StoreError("UniqueViolation: duplicate key (deferred)", transient=False)

    @contextmanager
    def transaction(self) -> Iterator[_FakeTx]:
        self.transactions += 1
        saved = dict(self.claimed), dict(self.status), dict(self.reasons), len(self.effects)
        try:
            yield _FakeTx(self, saved[3])
            self.check_deferred(saved[3])
        except BaseException:
            self.claimed, self.status, self.reasons = saved[0], saved[1], saved[2]
            del self.effects[saved[3] :]
            raise
        self.commits += 1
        if self.lose_after_commit:
            self.lose_after_commit -= 1
            raise StoreError("OperationalError: connection lost during COMMIT", transient=True)

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


class FakePublisher:
    """Records sent and acknowledged at :meth:`flush`; ``fail_flushes`` makes flushes fail."""

    def __init__(self) -> None:
        self.queued: list[Record] = []
        self.acked: list[Record] = []
        self.fail_flushes = 0
        self.closed = False

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes | None]],
    ) -> None:
        self.queued.append(Record(topic, 0, len(self.queued), key, value, list(headers)))

    def flush(self) -> None:
        queued, self.queued = self.queued, []
        if self.fail_flushes:
            self.fail_flushes -= 1
            raise TransportError("broker unreachable", retriable=True)
        self.acked.extend(queued)

    def close(self) -> None:
        self.closed = True

    def headers(self, index: int) -> dict[str, str]:
        """The ``kinbox.dlq.*`` headers of the ``index``-th acknowledged record, as text."""
        return {
            k: (v or b"").decode()
            for k, v in self.acked[index].headers
            if k.startswith("kinbox.dlq.")
        }


def record(
    topic: str,
    partition: int,
    offset: int,
    event_id: str | None,
    value: bytes = b"{}",
    headers: Sequence[tuple[str, bytes | None]] | None = None,
) -> Record:
    if headers is None:
        headers = [] if event_id is None else [("event-id", event_id.encode())]
    return Record(topic, partition, offset, None, value, list(headers), 1_700_000_000_000)
