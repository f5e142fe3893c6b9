"""A window on the real inbox store: what each transaction claimed and committed, and faults.

:class:`RecordingStore` wraps an :class:`~kinbox.core.inbox.InboxStore` (the
PostgreSQL one, for the test client) and changes nothing it does, with two
exceptions a test asks for:

- it notes, per transaction, which records its claim found fresh, which
  it dead-lettered and which reused an id, and hands that to its :class:`Ledger` only once the
  transaction has committed, so the test client can say what became of
  each record without reading ``processed_events`` back;
- it can inject a fault into the transaction that claims a given record
  fresh, at the point where the handlers have run and the dead letters have
  been sent, just before COMMIT (see :data:`FAULTS`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from kinbox.core.errors import StoreError
from kinbox.core.event import Event
from kinbox.core.inbox import InboxStore, Invoke, async_store, session_opener
from kinbox.core.record import Position
from kinbox.core.steps import (
    Call,
    CheckReused,
    Claim,
    DeadLetterRow,
    Park,
    Program,
    Seen,
    Step,
    Steps,
    rewrite,
)

T = TypeVar("T")

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


@dataclass
class Ledger:
    """What committed transactions did to the records of one delivery."""

    ids: dict[Position, str] = field(default_factory=dict)
    """The id each record was claimed under (fresh or not)."""
    applied: set[Position] = field(default_factory=set)
    """Records a committed claim found fresh."""
    dead_lettered: dict[Position, str] = field(default_factory=dict)
    """Records a committed transaction dead-lettered, with the reason it recorded."""
    reused: set[Position] = field(default_factory=set)
    """Duplicates a committed transaction found reusing an id with another payload."""
    parked: dict[Position, str] = field(default_factory=dict)
    """Records a committed transaction parked, with why (the dead letter they wait behind)."""


@dataclass
class _Notes:
    """What one transaction did, kept until it commits."""

    ids: dict[Position, str] = field(default_factory=dict)
    fresh: list[Position] = field(default_factory=list)
    dead_lettered: dict[Position, str] = field(default_factory=dict)
    reused: set[Position] = field(default_factory=set)
    parked: dict[Position, str] = field(default_factory=dict)
    fault: Fault | None = None


class RecordingStore:
    """An :class:`~kinbox.core.inbox.InboxStore` that notes what ``inner`` committed.

    Attributes:
        ledger: what committed since the test client last replaced it.
        faults: faults still to inject, by record: the next transaction
            claiming that record fresh gets the first one (then the next
            such transaction the second...).
        watch: called with the transaction's connection at the fault point
            of every transaction that claimed something fresh (the
            redelivery check reads which tables it wrote there); for an
            ``AsyncConnection``, it returns an awaitable, awaited there.
        injected: the faults injected so far, with the records they hit.
    """

    def __init__(self, inner: InboxStore) -> None:
        self._inner = inner
        self.ledger = Ledger()
        self.faults: dict[Position, list[Fault]] = {}
        self.watch: Callable[[Any], object] | None = None
        self.injected: list[tuple[Fault, Position]] = []

    def for_async(self) -> InboxStore:
        """``inner``'s store for async handlers, recorded into this store's ledger and faults."""
        return _AsyncView(self, async_store(self._inner))

    def sessions(self, session_class: type) -> Callable[[Invoke], Invoke]:
        """``inner``'s ORM sessions: they run on the connection of the recorded transaction."""
        return session_opener(self._inner, session_class)

    def run(self, program: Program[T]) -> T:
        """See :meth:`~kinbox.core.inbox.InboxStore.run`; faults apply."""
        return self.recorded(self._inner, program)

    def recorded(self, inner: InboxStore, program: Program[T], *, awaits: bool = False) -> T:
        """``program`` in a transaction of ``inner`` (this store's, or its async one), recorded.

        ``awaits``: ``inner`` is the async one (:attr:`watch` returns an awaitable there).

        Faults apply, once the program has returned: the handlers ran, the
        dead letters were acknowledged, COMMIT comes next.
        """
        notes = _Notes()

        def noted(step: Step) -> Steps[Any]:
            value = yield step
            if isinstance(step, Claim):
                notes.ids.update((e.position, e.id) for e in step.events)
                notes.fresh += [e.position for e in value]
            elif isinstance(step, DeadLetterRow):
                notes.dead_lettered[step.event.position] = step.reason
            elif isinstance(step, CheckReused):
                notes.reused.update(sighting.event.position for sighting in value)
            elif isinstance(step, Park):
                notes.parked.update(
                    (
                        (step.topic, p.partition, p.offset),
                        f"parked: key waits behind {p.blocked_by}",
                    )
                    for p in step.parked
                )
            return value

        def recording(tx: Seen) -> Steps[T]:
            result = yield from rewrite(program(tx), noted)
            fault = self._take_fault(notes)
            if notes.fresh and self.watch is not None:
                yield Call(self.watch, "unguarded", awaits=awaits)
            if fault == "crash":
                raise InjectedCrash(f"injected: the worker died before COMMIT of {notes.fresh}")
            if fault == "transient":
                raise StoreError(
                    "injected: connection lost after the handlers ran, before COMMIT",
                    transient=True,
                )
            notes.fault = fault
            return result

        result = inner.run(recording)
        self.ledger.ids.update(notes.ids)
        self.ledger.applied.update(notes.fresh)
        self.ledger.dead_lettered.update(notes.dead_lettered)
        self.ledger.reused.update(notes.reused)
        self.ledger.parked.update(notes.parked)
        if notes.fault == "lost-commit":
            raise StoreError(
                "injected: connection lost during COMMIT (the transaction did commit)",
                transient=True,
            )
        return result

    def _take_fault(self, notes: _Notes) -> Fault | None:
        for where in notes.fresh:
            pending = self.faults.get(where)
            if pending:
                fault = pending.pop(0)
                self.injected.append((fault, where))
                return fault
        return None

    def known(self, events: Sequence[Event]) -> set[str]:
        """``inner``'s look-up (:meth:`~kinbox.core.inbox.InboxStore.known`): nothing to record."""
        return self._inner.known(events)

    def close(self) -> None:
        """Close ``inner``."""
        self._inner.close()


class _AsyncView:
    """The async side of a :class:`RecordingStore`: its transactions are recorded there."""

    def __init__(self, recorder: RecordingStore, inner: InboxStore) -> None:
        self._recorder = recorder
        self._inner = inner

    def run(self, program: Program[T]) -> T:
        return self._recorder.recorded(self._inner, program, awaits=True)

    def sessions(self, session_class: type) -> Callable[[Invoke], Invoke]:
        return session_opener(self._inner, session_class)

    def known(self, events: Sequence[Event]) -> set[str]:
        return self._inner.known(events)

    def close(self) -> None:
        """Nothing: the recorder closes its inner store, which closes this one's."""
