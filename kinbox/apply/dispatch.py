"""Running a route's handler over the fresh events of one inbox transaction.

Per-event handlers run *optimistically* first: one after another with no
savepoint, so a fresh event costs only its handler's own statements — and
those go out pipelined, without a round trip each. Under the pipeline a
failed statement may surface in a later handler or only at the end, so any
failure there rolls the transaction back and the batch is redone without the
pipeline (:class:`~kinbox.apply.control.Unpipelined`), where each statement's
error is raised in its own handler. If a handler raises on that pass, the
pass stops and the caller rolls the whole transaction back; what happens
next is decided from that exception exactly as it was when every event had
a savepoint:

- a database outage (:meth:`~kinbox.core.inbox.InboxTransaction.outage`): the batch fails
  as a whole and the try is not counted;
- a conflict (:meth:`~kinbox.core.inbox.InboxTransaction.conflict`: the server
  aborted the transaction to let another through) while the batch may still
  retry conflicts: it is redone at once, the try not counted
  (:class:`~kinbox.apply.control.Conflicted`); past that bound, the conflict
  is a failure of the event like any other;
- a failure to retry (not the event's last try): the partition stops at the
  event (:class:`HandlerFailed`) and the events before it are applied again;
- a permanent failure (:class:`~kinbox.core.errors.DeadLetter`, a payload that
  does not decode into the handler's type (:class:`~kinbox.core.errors.InvalidPayload`),
  or the last try):
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
index row over the btree limit, a statement in a transaction an error it
caught earlier left aborted) is a failure of the event like any other
exception, unless it is an outage or a conflict (the store's driver has the
one classification: :mod:`kinbox.store.errors` for PostgreSQL). A :class:`Verdict`
may also come from outside the handler:
an event whose COMMIT PostgreSQL refused on its last try (see
:mod:`kinbox.apply.narrow`) is dead-lettered here without its handler running.

How the function is called — per event, or once per batch (``batch=True``)
— is the route's :class:`~kinbox.apply.route.HandlerKind`, chosen when it was
registered (:mod:`kinbox.apply.kinds`); the dispatcher gives the kind what it
may do in the transaction (:class:`_Calls`): judge an exception, dead-letter
an event, wrap a call in the middleware's ``around_event``.

Dead letters are returned, not recorded: the caller writes them into
``processed_events`` (:mod:`kinbox.apply.batch`). Exceptions are turned into text
only through :mod:`kinbox.core.describe`, so a broken ``__str__`` cannot escape.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence

from kinbox.apply.control import Conflicted
from kinbox.apply.parking import Blocks
from kinbox.apply.route import Route
from kinbox.core import cause
from kinbox.core.describe import text
from kinbox.core.errors import DeadLetter, InvalidPayload, Retry
from kinbox.core.event import Event
from kinbox.core.letter import (
    HANDLER_ERROR,
    INVALID_ID,
    PAYLOAD,
    REQUESTED,
    RETRIES_EXHAUSTED,
    Letter,
)
from kinbox.core.outcome import Verdict
from kinbox.core.record import Record
from kinbox.core.steps import Seen, Steps
from kinbox.middleware.base import Chain


class Dispatcher:
    """Calls handlers, through their kind, and decides what their exceptions mean.

    Args:
        consumer: the consumer group, written into dead letters.
        max_attempts: tries before dead-lettering, unless the route sets its own.
        chain: the middleware whose ``around_event`` / ``around_events`` wrap each call.
    """

    def __init__(self, consumer: str, max_attempts: int, chain: Chain | None = None) -> None:
        self.consumer = consumer
        """The consumer group: written into dead letters, and the cause of enqueued rows."""
        self._max_attempts = max_attempts
        self.chain = chain or Chain(())
        """The middleware around each call."""

    def run(
        self,
        tx: Seen,
        route: Route,
        records: Mapping[int, Record],
        events: list[Event],
        verdicts: Mapping[int, Verdict],
        *,
        pipelined: bool = False,
        retry_conflict: Callable[[Event], bool] = lambda _event: True,
        blocks: Blocks | None = None,
    ) -> Steps[list[Letter]]:
        """The steps that run ``route``'s handler over ``events``; they return the dead letters.

        Args:
            tx: what the program sees of the open inbox transaction.
            route: the topic's handler.
            records: the batch's records by offset, for dead letters.
            events: the fresh events to run, in offset order.
            verdicts: permanent failures by offset, from earlier passes: those
                events are dead-lettered without their handler running. None
                means an optimistic pass, any means a careful one.
            pipelined: the optimistic pass may run pipelined (see
                :class:`~kinbox.apply.route.HandlerKind`).
            retry_conflict: whether a conflict an event's handler meets
                redoes the batch (:class:`Conflicted`); false once the batch
                has redone as many of the event's as it may in a row: then it
                is the event's failure.
            blocks: for a route that parks keys, where a dead letter blocks its
                key: the key's later events are then held, not run.

        Raises:
            HandlerFailed: a handler failed and the event will be tried again.
            Abandoned: an optimistic pass met a permanent failure.
            Unpipelined: a pipelined pass failed; redo the batch without it.
            Conflicted: a handler met a conflict, to be retried at once.
            StoreError: the database went away (also when seen by a handler).
        """
        calls = _Calls(self, tx, route, records, retry_conflict, blocks)
        runnable: list[Event] = []
        for event in events:
            verdict = verdicts.get(event.offset)
            if verdict is None:
                runnable.append(event)
            else:
                calls.dead_letter(event, verdict.reason, verdict.error)
        if blocks is not None and blocks.blockers:
            runnable = [e for e in runnable if not blocks.holds(e)]
        yield from route.kind.run(calls, runnable, careful=bool(verdicts), pipelined=pipelined)
        return calls.letters

    def letter(
        self,
        route: Route,
        records: Mapping[int, Record],
        event: Event,
        reason: str,
        error: BaseException,
    ) -> Letter:
        """The dead letter of ``event``, given up for ``reason``."""
        attempts = 0 if reason == INVALID_ID else event.attempt
        return Letter(
            records[event.offset], route.dlq_topic, self.consumer, reason, error, attempts
        )

    def limit(self, route: Route) -> int:
        """Tries before an event of ``route`` is dead-lettered."""
        return route.max_attempts or self._max_attempts

    def permanent(
        self,
        tx: Seen,
        route: Route,
        exc: Exception,
        event: Event,
        attempt: int,
        retry_conflict: bool = False,
    ) -> str | None:
        """The dead-letter reason if ``exc`` gives ``event`` up on try ``attempt``, else ``None``.

        Raises:
            StoreError: ``exc`` comes from a database outage (re-raised as such).
            Conflicted: ``exc`` comes from a conflict, and ``retry_conflict``.
        """
        if isinstance(exc, InvalidPayload):
            # The bytes will not change: never worth another try.
            return PAYLOAD
        if isinstance(exc, DeadLetter):
            return f"{REQUESTED}: {text(exc.reason, 500)}"
        outage = tx.outage(exc)
        if outage is not None:
            raise outage from exc
        if retry_conflict:
            conflict = tx.conflict(exc)
            if conflict is not None:
                raise Conflicted(conflict, event) from exc
        if attempt < self.limit(route):
            return None
        return RETRIES_EXHAUSTED if isinstance(exc, Retry) else HANDLER_ERROR


class _Calls:
    """:class:`~kinbox.apply.route.Calls` for one route in one transaction.

    Collects the dead letters the kind gives up.
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        tx: Seen,
        route: Route,
        records: Mapping[int, Record],
        retry_conflict: Callable[[Event], bool],
        blocks: Blocks | None = None,
    ) -> None:
        self._dispatcher = dispatcher
        self._tx = tx
        self._route = route
        self._records = records
        self._retry_conflict = retry_conflict
        self._blocks = blocks
        self.letters: list[Letter] = []

    @property
    def tx(self) -> Seen:
        return self._tx

    @property
    def limit(self) -> int:
        return self._dispatcher.limit(self._route)

    def permanent(self, exc: Exception, event: Event, attempt: int | None = None) -> str | None:
        return self._dispatcher.permanent(
            self._tx, self._route, exc, event,
            event.attempt if attempt is None else attempt, self._retry_conflict(event),
        )  # fmt: skip

    def dead_letter(self, event: Event, reason: str, error: BaseException) -> None:
        self.letters.append(
            self._dispatcher.letter(self._route, self._records, event, reason, error)
        )
        if self._blocks is not None:
            self._blocks.dead_lettered(event)

    def held(self, event: Event) -> bool:
        return self._blocks is not None and self._blocks.holds(event)

    # The cause is set here, around the middleware too, so whatever a layer
    # or the handler enqueues is linked to the event (a ContextVar: no I/O).
    def around_event(self, event: Event, call: Callable[[Event], object]) -> object:
        # cause.handling without its generator: this runs once per event.
        token = cause.enter(self._dispatcher.consumer, event.id)
        try:
            return self._dispatcher.chain.around_event(event, call)
        finally:
            cause.leave(token)

    def around_events(
        self, events: Sequence[Event], call: Callable[[Sequence[Event]], object]
    ) -> object:
        # Which event of several a row belongs to only the handler knows
        # (kinbox.core.cause.caused_by); one event is unambiguous.
        single = events[0].id if len(events) == 1 else None
        with cause.handling(self._dispatcher.consumer, single):
            return self._dispatcher.chain.around_events(events, call)

    # The same, awaited on the loop: the cause is set in the task that runs the call.
    async def around_event_async(
        self, event: Event, call: Callable[[Event], Awaitable[object]]
    ) -> object:
        token = cause.enter(self._dispatcher.consumer, event.id)
        try:
            return await self._dispatcher.chain.around_event_async(event, call)
        finally:
            cause.leave(token)

    async def around_events_async(
        self, events: Sequence[Event], call: Callable[[Sequence[Event]], Awaitable[object]]
    ) -> object:
        single = events[0].id if len(events) == 1 else None
        with cause.handling(self._dispatcher.consumer, single):
            return await self._dispatcher.chain.around_events_async(events, call)
