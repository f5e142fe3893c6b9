"""Apply one partition batch in one database transaction.

::

    records ─► events   (a record without a valid id: dead-letter placeholder,
                         derived id, or stop — the ``missing_id`` setting)
            ─► BEGIN
               claim ids: one INSERT … ON CONFLICT DO NOTHING RETURNING  (duplicates drop out)
               for each fresh event, in offset order:
                   SAVEPOINT → handler(event, tx) → RELEASE
                   on a permanent failure: ROLLBACK TO SAVEPOINT, mark the row
                   dead_lettered, queue the record for the dead-letter topic
               flush the dead letters: every one acknowledged by the broker
               failpoint before_db_commit
            ─► COMMIT ─► failpoint after_db_commit
            ─► the caller may now commit offset last + 1 to Kafka

A *permanent* failure is a :class:`~kinbox.errors.DeadLetter` from the
handler, or any exception (``Retry`` included) on the event's
``max_attempts``-th try. Any other handler failure rolls the transaction
back; the events before the failed one are then applied again in a new
transaction and committed, and the partition stops at the failed event, so
its next try is the first record of a batch and ``attempt`` counts exactly its
tries. A database outage (also when seen inside a handler: see
:func:`~kinbox.store.transient_cause`) or a dead letter the broker did not
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

from kinbox import deadletter, telemetry
from kinbox.app import Route
from kinbox.deadletter import Letter
from kinbox.envelope import Record, derived_event, to_event
from kinbox.errors import DeadLetter, EnvelopeError, Retry, StoreError, TransportError
from kinbox.event import Event
from kinbox.failpoints import failpoint
from kinbox.policy import Failure
from kinbox.store import InboxStore, InboxTransaction, transient_cause
from kinbox.transport import Publisher

log = logging.getLogger(__name__)


class _HandlerFailed(Exception):
    """A handler failed, not for the last time: carries it out of the transaction."""

    def __init__(self, event: Event, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.event = event
        self.cause = cause


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
    """

    next_offset: int | None
    failure: Failure | None = None
    applied: int = 0
    duplicates: int = 0
    dead_lettered: int = 0


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
    ) -> None:
        self._routes = routes
        self._store = store
        self._id_headers = tuple(id_headers)
        self._publisher: Publisher = publisher or _NoPublisher()
        self._consumer = consumer
        self._max_attempts = max_attempts
        self._missing_id = missing_id

    def process(self, records: Sequence[Record], attempt: int = 1) -> BatchResult:
        """Apply ``records`` (one partition, offset order); never raises for bad input.

        Args:
            records: consecutive records of one partition.
            attempt: the try of the first record (1 = first); the others are on
                their first try, because a failure always stops the partition
                at the failed record.
        """
        first = records[0]
        telemetry.received.add(len(records), {"topic": first.topic})
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
                result.next_offset, stop, result.applied, result.duplicates, result.dead_lettered
            )
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
        while True:
            try:
                applied, duplicates, dead = self._apply(records, todo, invalid, attempt)
            except _HandlerFailed as exc:
                event = exc.event
                telemetry.failures.add(1, {"topic": event.topic})
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
                telemetry.failures.add(1, {"topic": first.topic})
                failure = Failure(first.topic, first.partition, first.offset, attempt, exc)
                return BatchResult(None, failure)
            return BatchResult(todo[-1].offset + 1, stopped, applied, duplicates, dead)

    def _apply(
        self,
        records: Mapping[int, Record],
        events: list[Event],
        invalid: Mapping[int, EnvelopeError],
        attempt: int,
    ) -> tuple[int, int, int]:
        first = events[0]
        route = self._routes[first.topic]
        letters: list[Letter] = []
        with (
            telemetry.batch_span(first.topic, first.partition, first.offset, len(events)),
            self._store.transaction() as tx,
        ):
            reclaim = {e.id for e in events if deadletter.is_replay(e.headers)}
            fresh = tx.claim(events, reclaim)
            runnable = []
            for event in fresh:
                if event.offset in invalid:
                    error = invalid[event.offset]
                    letters.append(
                        self._letter(route, records, event, deadletter.INVALID_ID, error)
                    )
                    tx.dead_letter(event, letters[-1].summary)
                else:
                    runnable.append(event)
            if route.batch:
                self._run_batch(tx, route, records, runnable, attempt, letters)
            else:
                for event in runnable:
                    self._run_one(tx, route, records, event, letters)
            if letters:
                # The dead letters must be acknowledged before COMMIT records
                # them as dead-lettered (and so before the offset can move):
                # if the broker never gets them, the batch rolls back instead.
                for letter in sorted(letters, key=lambda item: item.record.offset):
                    deadletter.send(self._publisher, letter)
                self._publisher.flush()
            failpoint("before_db_commit")
        failpoint("after_db_commit")
        dead = len(letters)
        applied = len(fresh) - dead
        topic = {"topic": first.topic}
        telemetry.applied.add(applied, topic)
        telemetry.duplicates.add(len(events) - len(fresh), topic)
        telemetry.dead_lettered.add(dead, topic)
        return applied, len(events) - len(fresh), dead

    def _run_one(
        self,
        tx: InboxTransaction,
        route: Route,
        records: Mapping[int, Record],
        event: Event,
        letters: list[Letter],
    ) -> None:
        try:
            with tx.savepoint():
                route.fn(event, tx.connection)
        except Exception as exc:
            reason = self._permanent(route, exc, event.attempt)
            if reason is None:
                raise _HandlerFailed(event, exc) from exc
            letters.append(self._letter(route, records, event, reason, exc))
            tx.dead_letter(event, letters[-1].summary)

    def _run_batch(
        self,
        tx: InboxTransaction,
        route: Route,
        records: Mapping[int, Record],
        events: list[Event],
        attempt: int,
        letters: list[Letter],
    ) -> None:
        if not events:
            return
        try:
            with tx.savepoint():
                route.fn(events, tx.connection)
            return
        except Exception as exc:
            if self._permanent(route, exc, attempt) is None:
                raise _HandlerFailed(events[0], exc) from exc
        # Last try: the handler cannot say which event is the poison, so hand
        # it the events one at a time and dead-letter those that still fail.
        for event in events:
            try:
                with tx.savepoint():
                    route.fn([event], tx.connection)
            except Exception as exc:
                reason = self._permanent(route, exc, max(attempt, self._limit(route)))
                assert reason is not None
                letters.append(self._letter(route, records, event, reason, exc))
                tx.dead_letter(event, letters[-1].summary)

    def _limit(self, route: Route) -> int:
        return route.max_attempts or self._max_attempts

    def _permanent(self, route: Route, exc: Exception, attempt: int) -> str | None:
        """The dead-letter reason if ``exc`` gives the event up, else ``None``.

        Raises:
            StoreError: ``exc`` comes from a database outage (re-raised as such).
        """
        if isinstance(exc, DeadLetter):
            return f"{deadletter.REQUESTED}: {exc.reason}"
        outage = transient_cause(exc)
        if outage is not None:
            raise outage from exc
        if attempt < self._limit(route):
            return None
        return deadletter.RETRIES_EXHAUSTED if isinstance(exc, Retry) else deadletter.HANDLER_ERROR

    def _letter(
        self,
        route: Route,
        records: Mapping[int, Record],
        event: Event,
        reason: str,
        error: BaseException,
    ) -> Letter:
        attempts = 0 if reason == deadletter.INVALID_ID else event.attempt
        return Letter(
            records[event.offset], route.dlq_topic, self._consumer, reason, error, attempts
        )
