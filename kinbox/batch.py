"""Apply one partition batch in one database transaction.

::

    records ─► events (stop at the first bad record)
            ─► BEGIN
               claim ids: one INSERT … ON CONFLICT DO NOTHING RETURNING  (duplicates drop out)
               for each fresh event, in offset order: SAVEPOINT → handler(event, tx) → RELEASE
               failpoint before_db_commit
            ─► COMMIT ─► failpoint after_db_commit
            ─► the caller may now commit offset last + 1 to Kafka

Any failure rolls the whole transaction back and is returned as a
:class:`~kinbox.policy.Failure`; nothing here talks to Kafka, so the offset
cannot move past it. The per-event savepoint is where a dead-letter policy
will roll back just the failed event and carry on.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kinbox import telemetry
from kinbox.app import Route
from kinbox.envelope import Record, to_event
from kinbox.errors import EnvelopeError, StoreError
from kinbox.event import Event
from kinbox.failpoints import failpoint
from kinbox.policy import Failure
from kinbox.store import InboxStore

log = logging.getLogger(__name__)


class _HandlerFailed(Exception):
    """Carries a handler's exception out of the transaction, with its event."""

    def __init__(self, event: Event, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.event = event
        self.cause = cause


@dataclass(frozen=True)
class BatchResult:
    """Outcome of one partition batch.

    Attributes:
        next_offset: the offset to commit to Kafka now (last applied + 1), or
            ``None`` when no transaction committed.
        failure: why the partition stopped before its end, if it did.
        applied: events whose handler committed.
        duplicates: deliveries the inbox suppressed.
    """

    next_offset: int | None
    failure: Failure | None = None
    applied: int = 0
    duplicates: int = 0


class BatchProcessor:
    """Applies partition batches through ``store`` with the handlers in ``routes``."""

    def __init__(
        self, routes: Mapping[str, Route], store: InboxStore, id_headers: Sequence[str]
    ) -> None:
        self._routes = routes
        self._store = store
        self._id_headers = tuple(id_headers)

    def process(self, records: Sequence[Record], attempt: int = 1) -> BatchResult:
        """Apply ``records`` (one partition, offset order); never raises for bad input.

        Args:
            records: consecutive records of one partition.
            attempt: the delivery attempt of the first record (1 = first try).
        """
        first = records[0]
        events: list[Event] = []
        bad: tuple[Record, EnvelopeError] | None = None
        for record in records:
            try:
                events.append(to_event(record, self._id_headers, attempt))
            except EnvelopeError as exc:
                bad = (record, exc)
                break
        telemetry.received.add(len(records), {"topic": first.topic})
        next_offset = None
        applied = duplicates = 0
        if events:
            try:
                applied = self._apply(events)
            except _HandlerFailed as exc:
                return self._failed(events, attempt, exc.cause, exc.event)
            except StoreError as exc:
                return self._failed(events, attempt, exc, None)
            duplicates = len(events) - applied
            next_offset = events[-1].offset + 1
        failure = None
        if bad is not None:
            record, error = bad
            # The good events before it are committed; this record holds the
            # partition (the later dead-letter policy moves it on).
            failure = Failure(
                record.topic,
                record.partition,
                record.offset,
                attempt if record.offset == first.offset else 1,
                error,
                record=record,
            )
        return BatchResult(next_offset, failure, applied, duplicates)

    def _apply(self, events: list[Event]) -> int:
        first = events[0]
        route = self._routes[first.topic]
        with (
            telemetry.batch_span(first.topic, first.partition, first.offset, len(events)),
            self._store.transaction() as tx,
        ):
            fresh = tx.claim(events)
            if route.batch:
                if fresh:
                    try:
                        with tx.savepoint():
                            route.fn(fresh, tx.connection)
                    except Exception as exc:
                        raise _HandlerFailed(fresh[0], exc) from exc
            else:
                for event in fresh:
                    try:
                        with tx.savepoint():
                            route.fn(event, tx.connection)
                    except Exception as exc:
                        raise _HandlerFailed(event, exc) from exc
            failpoint("before_db_commit")
        failpoint("after_db_commit")
        telemetry.applied.add(len(fresh), {"topic": first.topic})
        telemetry.duplicates.add(len(events) - len(fresh), {"topic": first.topic})
        return len(fresh)

    def _failed(
        self, events: list[Event], attempt: int, error: BaseException, event: Event | None
    ) -> BatchResult:
        first = events[0]
        telemetry.failures.add(1, {"topic": first.topic})
        failure = Failure(first.topic, first.partition, first.offset, attempt, error, event=event)
        return BatchResult(None, failure)
