"""Running a route's handler over the fresh events of one inbox transaction.

Per-event handlers run *optimistically* first: one after another with no
savepoint, so a fresh event costs only its handler's own statements. If a
handler raises, the pass stops and the caller rolls the whole transaction
back; what happens next is decided from that exception exactly as it was
when every event had a savepoint:

- a database outage (:meth:`~kinbox.store.base.InboxTransaction.outage`): the batch fails
  as a whole and the try is not counted;
- a failure to retry (not the event's last try): the partition stops at the
  event (:class:`HandlerFailed`) and the events before it are applied again;
- a permanent failure (:class:`~kinbox.errors.DeadLetter`, or the last try):
  the :class:`Verdict` is kept and the transaction redone *carefully*, with a
  savepoint per event, so the event is dead-lettered without its handler
  running again and a later poison event is isolated on its own.

So a handler may run again for an event whose earlier run was rolled back
(as it already did for the events before a retried one). Its database work
went with the rollback, so the effect still commits once; work outside the
database (an HTTP call) is not rolled back and must be idempotent, as for
any retry.

A handler's failure is judged by what it raised, wherever it came from: a
database error in its own statements (a value too long for its column, an
index row over the btree limit) is a failure of the event like any other
exception, unless it is an outage (the store's driver has the one
classification: :mod:`kinbox.store.errors` for PostgreSQL). A :class:`Verdict`
may also come from outside the handler:
an event whose COMMIT PostgreSQL refused on its last try (see
:mod:`kinbox.apply.narrow`) is dead-lettered here without its handler running.

Batch handlers (``batch=True``) run under one savepoint per batch; on the
last try the handler cannot say which event is the poison, so it is handed
the events one at a time and those that still fail are dead-lettered.

Dead letters are returned, not recorded: the caller writes them into
``processed_events`` (:mod:`kinbox.apply.batch`). Exceptions are turned into text
only through :mod:`kinbox.describe`, so a broken ``__str__`` cannot escape.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kinbox.apply import deadletter
from kinbox.apply.deadletter import Letter
from kinbox.apply.route import Route
from kinbox.consume.envelope import Record
from kinbox.describe import describe, text
from kinbox.errors import DeadLetter, Retry
from kinbox.event import Event
from kinbox.store.base import InboxTransaction


class HandlerFailed(Exception):
    """A handler failed, not for the last time: carries it out of the transaction."""

    def __init__(self, event: Event, cause: BaseException) -> None:
        super().__init__(describe(cause))
        self.event = event
        self.cause = cause


@dataclass(frozen=True)
class Verdict:
    """A permanent failure seen in an earlier pass: why, and what was raised."""

    reason: str
    error: BaseException


class Abandoned(Exception):
    """An optimistic pass met a permanent failure: roll back, redo carefully."""

    def __init__(self, event: Event, verdict: Verdict) -> None:
        super().__init__(verdict.reason)
        self.event = event
        self.verdict = verdict


class Dispatcher:
    """Calls handlers and decides what their exceptions mean.

    Args:
        consumer: the consumer group, written into dead letters.
        max_attempts: tries before dead-lettering, unless the route sets its own.
    """

    def __init__(self, consumer: str, max_attempts: int) -> None:
        self._consumer = consumer
        self._max_attempts = max_attempts

    def run(
        self,
        tx: InboxTransaction,
        route: Route,
        records: Mapping[int, Record],
        events: list[Event],
        verdicts: Mapping[int, Verdict],
    ) -> list[Letter]:
        """Run ``route``'s handler over ``events`` in ``tx``; return the dead letters to record.

        Args:
            tx: the open inbox transaction.
            route: the topic's handler.
            records: the batch's records by offset, for dead letters.
            events: the fresh events to run, in offset order.
            verdicts: permanent failures by offset, from earlier passes: those
                events are dead-lettered without their handler running. None
                means an optimistic pass, any means a careful one.

        Raises:
            HandlerFailed: a handler failed and the event will be tried again.
            Abandoned: an optimistic pass met a permanent failure.
            StoreError: the database went away (also when seen by a handler).
        """
        letters: list[Letter] = []
        runnable: list[Event] = []
        for event in events:
            verdict = verdicts.get(event.offset)
            if verdict is None:
                runnable.append(event)
            else:
                letters.append(self.letter(route, records, event, verdict.reason, verdict.error))
        if route.batch:
            self._run_batch(tx, route, records, runnable, letters)
        elif verdicts:
            for event in runnable:
                self._run_careful(tx, route, records, event, letters)
        else:
            for event in runnable:
                self._run_optimistic(tx, route, event)
        return letters

    def letter(
        self,
        route: Route,
        records: Mapping[int, Record],
        event: Event,
        reason: str,
        error: BaseException,
    ) -> Letter:
        """The dead letter of ``event``, given up for ``reason``."""
        attempts = 0 if reason == deadletter.INVALID_ID else event.attempt
        return Letter(
            records[event.offset], route.dlq_topic, self._consumer, reason, error, attempts
        )

    def _run_optimistic(self, tx: InboxTransaction, route: Route, event: Event) -> None:
        try:
            with tx.unguarded():
                route.fn(event, tx.connection)
        except Exception as exc:
            reason = self._permanent(tx, route, exc, event.attempt)
            if reason is None:
                raise HandlerFailed(event, exc) from exc
            raise Abandoned(event, Verdict(reason, exc)) from exc

    def _run_careful(
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
            return
        except Exception as exc:
            reason = self._permanent(tx, route, exc, event.attempt)
            if reason is None:
                raise HandlerFailed(event, exc) from exc
            letters.append(self.letter(route, records, event, reason, exc))

    def _run_batch(
        self,
        tx: InboxTransaction,
        route: Route,
        records: Mapping[int, Record],
        events: list[Event],
        letters: list[Letter],
    ) -> None:
        if not events:
            return
        # Only the first event can be on a later try: a failure stops the
        # partition there, so the next batch starts with it.
        attempt = events[0].attempt
        try:
            with tx.savepoint():
                route.fn(events, tx.connection)
            return
        except Exception as exc:
            if self._permanent(tx, route, exc, attempt) is None:
                raise HandlerFailed(events[0], exc) from exc
        # Last try: the handler cannot say which event is the poison, so hand
        # it the events one at a time and dead-letter those that still fail.
        for event in events:
            try:
                with tx.savepoint():
                    route.fn([event], tx.connection)
            except Exception as exc:
                reason = self._permanent(tx, route, exc, max(attempt, self.limit(route)))
                assert reason is not None
                letters.append(self.letter(route, records, event, reason, exc))

    def limit(self, route: Route) -> int:
        """Tries before an event of ``route`` is dead-lettered."""
        return route.max_attempts or self._max_attempts

    def _permanent(
        self, tx: InboxTransaction, route: Route, exc: Exception, attempt: int
    ) -> str | None:
        """The dead-letter reason if ``exc`` gives the event up, else ``None``.

        Raises:
            StoreError: ``exc`` comes from a database outage (re-raised as such).
        """
        if isinstance(exc, DeadLetter):
            return f"{deadletter.REQUESTED}: {text(exc.reason, 500)}"
        outage = tx.outage(exc)
        if outage is not None:
            raise outage from exc
        if attempt < self.limit(route):
            return None
        return deadletter.RETRIES_EXHAUSTED if isinstance(exc, Retry) else deadletter.HANDLER_ERROR
