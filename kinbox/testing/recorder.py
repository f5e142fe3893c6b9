"""A window on the real inbox store: what each transaction claimed and committed, and faults.

:class:`RecordingStore` wraps an :class:`~kinbox.core.inbox.InboxStore` (the
PostgreSQL one, for the test client) and changes nothing it does, with two
exceptions a test asks for:

- it notes, per transaction, which records its claim found fresh and which
  it dead-lettered, and hands that to its :class:`Ledger` only once the
  transaction has committed, so the test client can say what became of
  each record without reading ``processed_events`` back;
- it can inject a fault into the transaction that claims a given record
  fresh, at the point where the handlers have run and the dead letters have
  been sent, just before COMMIT (see :data:`FAULTS`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from kinbox.core.errors import StoreError
from kinbox.core.event import Event
from kinbox.core.inbox import (
    InboxStore,
    InboxTransaction,
    Invoke,
    async_store,
    session_opener,
)

Coordinates = tuple[str, int, int]
"""A record's ``(topic, partition, offset)``."""

Fault = Literal["crash", "transient", "lost-commit"]
FAULTS: tuple[Fault, ...] = ("crash", "transient", "lost-commit")
"""The faults a transaction can be given, each at the moment the handlers have run:

``crash``
    the worker dies before COMMIT: the transaction rolls back and
    :class:`InjectedCrash` is raised, which nothing in kinbox catches; the
    test client then starts over from the last committed offset, as a
    restarted worker would.
``transient``
    a transient :class:`~kinbox.core.errors.StoreError` (the connection lost
    before COMMIT): rolled back, and the worker retries the batch.
``lost-commit``
    COMMIT succeeds but its answer is lost: a transient
    :class:`~kinbox.core.errors.StoreError` after the commit, so the worker
    retries a batch that is in fact committed (the ambiguous commit).
"""


class InjectedCrash(BaseException):
    """The worker "died" between its handlers and COMMIT (a ``crash`` fault).

    A ``BaseException``, like the ``SystemExit`` of a killed process, so no
    ``except Exception`` on the way out can mistake it for a handler failure.
    """


def coordinates(event: Event) -> Coordinates:
    """``event``'s ``(topic, partition, offset)``."""
    return (event.topic, event.partition, event.offset)


@dataclass
class Ledger:
    """What committed transactions did to the records of one delivery."""

    ids: dict[Coordinates, str] = field(default_factory=dict)
    """The id each record was claimed under (fresh or not)."""
    applied: set[Coordinates] = field(default_factory=set)
    """Records a committed claim found fresh."""
    dead_lettered: dict[Coordinates, str] = field(default_factory=dict)
    """Records a committed transaction dead-lettered, with the reason it recorded."""


@dataclass
class _Notes:
    """What one transaction did, kept until it commits."""

    ids: dict[Coordinates, str] = field(default_factory=dict)
    fresh: list[Coordinates] = field(default_factory=list)
    dead_lettered: dict[Coordinates, str] = field(default_factory=dict)


class RecordingStore:
    """An :class:`~kinbox.core.inbox.InboxStore` that notes what ``inner`` committed.

    Attributes:
        ledger: what committed since the test client last replaced it.
        faults: faults still to inject, by record: the next transaction
            claiming that record fresh gets the first one (then the next
            such transaction the second...).
        watch: called with the transaction's connection at the fault point
            of every transaction that claimed something fresh (the
            redelivery check reads which tables it wrote there).
        injected: the faults injected so far, with the records they hit.
    """

    def __init__(self, inner: InboxStore) -> None:
        self._inner = inner
        self.ledger = Ledger()
        self.faults: dict[Coordinates, list[Fault]] = {}
        self.watch: Callable[[Any], None] | None = None
        self.injected: list[tuple[Fault, Coordinates]] = []

    def for_async(self) -> InboxStore:
        """``inner``'s store for async handlers, recorded into this store's ledger and faults."""
        return _AsyncView(self, async_store(self._inner))

    def sessions(self, session_class: type) -> Callable[[Invoke], Invoke]:
        """``inner``'s ORM sessions: they run on the connection of the recorded transaction."""
        return session_opener(self._inner, session_class)

    @contextmanager
    def transaction(self) -> Iterator[InboxTransaction]:
        """See :meth:`~kinbox.core.inbox.InboxStore.transaction`; faults apply."""
        with self.recorded(self._inner) as tx:
            yield tx

    @contextmanager
    def recorded(self, inner: InboxStore) -> Iterator[InboxTransaction]:
        """A transaction of ``inner`` (this store's, or its async one), recorded; faults apply."""
        notes = _Notes()
        with inner.transaction() as tx:
            yield _RecordingTransaction(tx, notes)
            # Reached only when the body ended normally: the handlers ran, the
            # dead letters were acknowledged, COMMIT comes next.
            fault = self._take_fault(notes)
            if notes.fresh and self.watch is not None:
                # An async transaction's connection has a blocking face too.
                self.watch(getattr(tx, "bridged", tx.connection))
            if fault == "crash":
                raise InjectedCrash(f"injected: the worker died before COMMIT of {notes.fresh}")
            if fault == "transient":
                raise StoreError(
                    "injected: connection lost after the handlers ran, before COMMIT",
                    transient=True,
                )
        self.ledger.ids.update(notes.ids)
        self.ledger.applied.update(notes.fresh)
        self.ledger.dead_lettered.update(notes.dead_lettered)
        if fault == "lost-commit":
            raise StoreError(
                "injected: connection lost during COMMIT (the transaction did commit)",
                transient=True,
            )

    def _take_fault(self, notes: _Notes) -> Fault | None:
        for where in notes.fresh:
            pending = self.faults.get(where)
            if pending:
                fault = pending.pop(0)
                self.injected.append((fault, where))
                return fault
        return None

    def known(self, ids: Collection[str]) -> set[str]:
        """``inner``'s look-up (:meth:`~kinbox.core.inbox.InboxStore.known`): nothing to record."""
        return self._inner.known(ids)

    def close(self) -> None:
        """Close ``inner``."""
        self._inner.close()


class _AsyncView:
    """The async side of a :class:`RecordingStore`: its transactions are recorded there."""

    def __init__(self, recorder: RecordingStore, inner: InboxStore) -> None:
        self._recorder = recorder
        self._inner = inner

    def transaction(self) -> AbstractContextManager[InboxTransaction]:
        return self._recorder.recorded(self._inner)

    def sessions(self, session_class: type) -> Callable[[Invoke], Invoke]:
        return session_opener(self._inner, session_class)

    def known(self, ids: Collection[str]) -> set[str]:
        return self._inner.known(ids)

    def close(self) -> None:
        """Nothing: the recorder closes its inner store, which closes this one's."""


class _RecordingTransaction:
    """``tx``, noting its claims and dead letters into ``notes``."""

    def __init__(self, tx: InboxTransaction, notes: _Notes) -> None:
        self._tx = tx
        self._notes = notes

    @property
    def connection(self) -> Any:
        return self._tx.connection

    def claim(self, events: Sequence[Event], reclaim: Collection[str] = ()) -> list[Event]:
        fresh = self._tx.claim(events, reclaim)
        self._notes.ids.update((coordinates(e), e.id) for e in events)
        self._notes.fresh += [coordinates(e) for e in fresh]
        return fresh

    def dead_letter(self, event: Event, reason: str) -> None:
        self._tx.dead_letter(event, reason)
        self._notes.dead_lettered[coordinates(event)] = reason

    def check_deferred(self) -> None:
        self._tx.check_deferred()

    def savepoint(self) -> AbstractContextManager[None]:
        return self._tx.savepoint()

    def unguarded(self) -> AbstractContextManager[None]:
        return self._tx.unguarded()

    def outage(self, exc: BaseException) -> StoreError | None:
        return self._tx.outage(exc)

    def __getattr__(self, name: str) -> Any:
        # Whatever the seam gains later reaches the real transaction unchanged.
        return getattr(self._tx, name)
