"""Apply one partition batch in one database transaction.

::

    records ─► before_batch hooks
            ─► events   (a record without a valid id: dead-letter placeholder,
                         derived id, or stop — the ``missing_id`` setting)
            ─► BEGIN
               claim ids: one INSERT … ON CONFLICT DO NOTHING RETURNING  (duplicates drop out)
               run the handler over the fresh events, in offset order
                   (optimistically, without savepoints: see :mod:`kinbox.dispatch`);
                   on a permanent failure the batch is redone with a
                   savepoint per event, the failed one marked dead_lettered
                   and queued for the dead-letter topic
               flush the dead letters: every one acknowledged by the broker
               failpoint before_db_commit
            ─► COMMIT ─► failpoint after_db_commit
            ─► after_dead_letter, after_batch hooks
            ─► the caller may now commit offset last + 1 to Kafka

A *permanent* failure is a :class:`~kinbox.errors.DeadLetter` from the
handler, or any exception (``Retry`` included) on the event's
``max_attempts``-th try. Any other handler failure rolls the transaction
back; the events before the failed one are then applied again in a new
transaction and committed, and the partition stops at the failed event, so
its next try is the first record of a batch and ``attempt`` counts exactly its
tries. A database outage (also when seen inside a handler: see
:func:`~kinbox.pgerrors.transient_cause`) or a dead letter the broker did not
acknowledge rolls the whole batch back and never counts as a try.

Ambiguous commit: when the connection is lost during COMMIT, kinbox cannot
know whether the transaction committed, and does not guess. The batch is
reported as a transient failure and tried again from its first record; that
try's claim re-reads ``processed_events`` under the primary key: if COMMIT
did happen, every id is already recorded and the events drop out as
duplicates (no handler runs, the offset moves past them); if it did not, they
are fresh and applied now. Either way each effect commits once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kinbox import deadletter
from kinbox.app import Route
from kinbox.deadletter import Letter
from kinbox.dispatch import Abandoned, Dispatcher, HandlerFailed, Verdict
from kinbox.envelope import Record, derived_event, to_event
from kinbox.errors import EnvelopeError, StoreError, TransportError
from kinbox.event import Event
from kinbox.failpoints import failpoint
from kinbox.kafka import Publisher
from kinbox.middleware import Chain, Middleware
from kinbox.policy import Failure
from kinbox.store import InboxStore

log = logging.getLogger(__name__)


class _NoPublisher:
    """Stands in when no dead-letter publisher is wired: a dead letter fails the batch."""

    def send(self, topic: str, key: object, value: object, headers: object) -> None:
        raise TransportError("no dead-letter publisher configured", retriable=False)

    def flush(self) -> None:
        """Nothing is ever queued."""

    def close(self) -> None:
        """Nothing to release."""


@dataclass(frozen=True)
class BatchResult:
    """Outcome of one partition batch.

    Attributes:
        next_offset: the offset to commit to Kafka now (last settled + 1), or
            ``None`` when no transaction committed.
        failure: why the partition stopped before its end, if it did.
        applied: events whose handler committed.
        duplicates: deliveries the inbox suppressed.
        dead_lettered: records sent to a dead-letter topic and recorded so.
        letters: those dead letters.
    """

    next_offset: int | None
    failure: Failure | None = None
    applied: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    letters: tuple[Letter, ...] = ()


class BatchProcessor:
    """Applies partition batches through ``store`` with the handlers in ``routes``.

    Args:
        routes: handlers by topic.
        store: the inbox.
        id_headers: event id headers, in order of preference.
        publisher: where dead letters go.
        consumer: the consumer group, written into dead letters.
        max_attempts: tries before dead-lettering, unless the route sets its own.
        missing_id: ``dead-letter``, ``derive`` or ``fail``.
        middleware: hooked around every batch (see :mod:`kinbox.middleware`).
        dead_letter_limits: the record size limit of each dead-letter topic,
            which its ``kinbox.dlq.*`` headers must not push a record over.
    """

    def __init__(
        self,
        routes: Mapping[str, Route],
        store: InboxStore,
        id_headers: Sequence[str],
        *,
        publisher: Publisher | None = None,
        consumer: str = "",
        max_attempts: int = 5,
        missing_id: str = "dead-letter",
        middleware: Sequence[Middleware] = (),
        dead_letter_limits: Mapping[str, int] | None = None,
    ) -> None:
        self._routes = routes
        self._store = store
        self._id_headers = tuple(id_headers)
        self._publisher: Publisher = publisher or _NoPublisher()
        self._dispatcher = Dispatcher(consumer, max_attempts)
        self._missing_id = missing_id
        self._chain = Chain(middleware)
        self._limits = dict(dead_letter_limits or {})

    def process(self, records: Sequence[Record], attempt: int = 1) -> BatchResult:
        """Apply ``records`` (one partition, offset order); never raises for bad input.

        Args:
            records: consecutive records of one partition.
            attempt: the try of the first record (1 = first); the others are on
                their first try, because a failure always stops the partition
                at the failed record.

        Raises:
            Exception: what a middleware's ``before_batch`` raised.
        """
        topic, partition = records[0].topic, records[0].partition
        self._chain.before_batch(topic, partition, records)
        result = self._process(records, attempt)
        for letter in result.letters:
            self._chain.after_dead_letter(letter)
        self._chain.after_batch(topic, partition, records, result)
        return result

    def _process(self, records: Sequence[Record], attempt: int) -> BatchResult:
        events: list[Event] = []
        invalid: dict[int, EnvelopeError] = {}
        stop: Failure | None = None
        for index, record in enumerate(records):
            tries = attempt if index == 0 else 1
            try:
                events.append(to_event(record, self._id_headers, tries))
            except EnvelopeError as exc:
                if self._missing_id == "fail":
                    stop = Failure(
                        record.topic, record.partition, record.offset, tries, exc, record=record
                    )
                    break
                # Both other policies key the record on its position; under
                # dead-letter that row records it as dead-lettered, so a
                # redelivery finds it and does not send a second dead letter.
                events.append(derived_event(record, tries))
                if self._missing_id == "dead-letter":
                    invalid[record.offset] = exc
        if not events:
            return BatchResult(None, stop)
        result = self._settle({r.offset: r for r in records}, events, invalid, attempt)
        if stop is not None and result.failure is None:
            result = BatchResult(
                result.next_offset, stop, result.applied, result.duplicates,
                result.dead_lettered, result.letters,
            )  # fmt: skip
        return result

    def _settle(
        self,
        records: Mapping[int, Record],
        events: list[Event],
        invalid: Mapping[int, EnvelopeError],
        attempt: int,
    ) -> BatchResult:
        """Commit as long a prefix of ``events`` as can be; say where it stopped."""
        todo = events
        stopped: Failure | None = None
        # Permanent failures met so far: once there is one, every pass is careful.
        verdicts: dict[int, Verdict] = {}
        while True:
            try:
                applied, duplicates, letters = self._apply(
                    records, todo, invalid, attempt, verdicts
                )
            except Abandoned as exc:
                verdicts[exc.event.offset] = exc.verdict
                continue
            except HandlerFailed as exc:
                event = exc.event
                stopped = Failure(
                    event.topic, event.partition, event.offset, event.attempt, exc.cause,
                    event=event,
                )  # fmt: skip
                index = next(i for i, e in enumerate(todo) if e.offset == event.offset)
                if index == 0:
                    return BatchResult(None, stopped)
                # The rolled-back try of the events before it is not a failure
                # of theirs: apply them again so the partition moves up to it.
                todo = todo[:index]
                continue
            except (StoreError, TransportError) as exc:
                first = todo[0]
                failure = Failure(first.topic, first.partition, first.offset, attempt, exc)
                return BatchResult(None, failure)
            return BatchResult(
                todo[-1].offset + 1, stopped, applied, duplicates, len(letters), tuple(letters)
            )

    def _apply(
        self,
        records: Mapping[int, Record],
        events: list[Event],
        invalid: Mapping[int, EnvelopeError],
        attempt: int,
        verdicts: Mapping[int, Verdict],
    ) -> tuple[int, int, list[Letter]]:
        """One transaction: claim, handlers, dead letters, COMMIT; returns the counts."""
        route = self._routes[events[0].topic]
        letters: list[Letter] = []
        with self._store.transaction() as tx:
            reclaim = {e.id for e in events if deadletter.is_replay(e.headers)}
            fresh = tx.claim(events, reclaim)
            runnable = []
            for event in fresh:
                if event.offset in invalid:
                    error = invalid[event.offset]
                    letters.append(
                        self._dispatcher.letter(route, records, event, deadletter.INVALID_ID, error)
                    )
                    tx.dead_letter(event, letters[-1].summary)
                else:
                    runnable.append(event)
            letters += self._dispatcher.run(tx, route, records, runnable, attempt, verdicts)
            if letters:
                # The dead letters must be acknowledged before COMMIT records
                # them as dead-lettered (and so before the offset can move):
                # if the broker never gets them, the batch rolls back instead.
                letters.sort(key=lambda item: item.record.offset)
                for letter in letters:
                    deadletter.send(self._publisher, letter, self._limits.get(letter.target))
                self._publisher.flush()
            failpoint("before_db_commit")
        failpoint("after_db_commit")
        return len(fresh) - len(letters), len(events) - len(fresh), letters
