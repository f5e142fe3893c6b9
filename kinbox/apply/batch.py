"""Apply one partition batch in one database transaction.

::

    records ─► before_batch hooks
            ─► events   (a record without a valid id: dead-letter placeholder,
                         derived id, or stop — the ``missing_id`` setting)
            ─► BEGIN
               claim ids: one INSERT … ON CONFLICT DO NOTHING RETURNING  (duplicates drop out)
               only if some dropped out: record those whose payload differs
                   from their id's row's (reused ids, :mod:`kinbox.core.reuse`)
               run the handler over the fresh events, in offset order
                   (optimistically, without savepoints, a per-event handler's
                   statements pipelined: see :mod:`kinbox.apply.dispatch`);
                   if anything fails under the pipeline, the batch is redone
                   without it, which blames the right event;
                   on a permanent failure the batch is redone with a
                   savepoint per event, the failed one dead-lettered
               record the dead letters in processed_events (status, reason)
               if the broker has not acknowledged them all yet: run the
                   deferred checks now (SET CONSTRAINTS ALL IMMEDIATE), then
                   ROLLBACK ─► deliver them, no transaction open: every one
                   acknowledged by the broker ─► failpoint after_dead_letter_ack
                   ─► BEGIN again: the same batch, their verdicts fixed
               failpoint before_db_commit
            ─► COMMIT ─► failpoint after_db_commit
            ─► a WARNING per reused id recorded (counted in the batch result)
            ─► after_dead_letter, after_batch hooks
            ─► the caller may now commit offset last + 1 to Kafka

No transaction is open while kinbox waits for the broker (docs/design.md, invariant
5). A transaction holds an id from the claim's INSERT on, and an id held
anywhere on the server holds back ``pg_snapshot_xmin``, the gate of every
outbox relay's claim; a dead-letter topic whose leader is away would keep a
delivery waiting for the producer's whole message timeout, try after try. So
dead letters never go out inside the transaction that finds them: it is
rolled back, they are delivered, and the batch is applied again in a new
transaction in which the dead-lettered events' handlers do not run (their
verdicts are fixed) and whose COMMIT records them (:mod:`kinbox.apply.narrow`).
That is the price of a dead letter: its batch is applied once more, the
other events' handlers called again (their work in the rolled-back
transaction went with it). A batch without one is untouched: one
transaction, and not a round trip more. The redo meets a failure of its
own (a handler that fails only now) as any pass does; dead letters beyond
the event it stops at went out but are not recorded, and go out again when
the partition gets there. So does a crash between the delivery and the second
COMMIT: the dead letters stay on their topic, the database has nothing of
the batch, the redelivered batch sends them again (dead letters are
at-least-once), and nothing is applied twice. What runs inside a
transaction and may wait on Kafka is the user's alone: a handler or an
``around_event`` hook that produces and flushes.

A *permanent* failure is a :class:`~kinbox.core.errors.DeadLetter` from the
handler, or any exception (``Retry`` included) on the event's
``max_attempts``-th try. Any other handler failure rolls the transaction
back; the events before the failed one are then applied again in a new
transaction and committed, and the partition stops at the failed event, so
its next try is the first record of a batch and ``attempt`` counts exactly its
tries. A database error in a handler's statement is such a failure too,
caught by the handler or not, unless it is an outage (:mod:`kinbox.store.errors`).

Content the database refuses where no event is named — kinbox's claim of the
batch's ids, COMMIT (a deferred constraint), the dead-letter bookkeeping — is
pinned on its event by splitting the batch (:mod:`kinbox.apply.narrow`): an id that
cannot be stored goes to the ``missing_id`` policy, a refused COMMIT counts
as a try of its event, and so does a COMMIT of a transaction that an error a
handler caught left aborted. So no record stalls its partition. Only an
outage (the server or the connection gone: also when seen inside a handler)
rolls the whole batch back without counting a try, and waits; a conflict (a
serialization failure, a deadlock) is redone at once, a bounded number of
times before it counts (:mod:`kinbox.apply.narrow`). A dead letter the broker
did not acknowledge counts no try either: the events before it commit, and
the partition holds at it until the broker takes it (see
:mod:`kinbox.apply.narrow`).

Ambiguous commit: when the connection is lost during COMMIT, kinbox cannot
know whether the transaction committed, and does not guess. The batch is
reported as a transient failure and tried again from its first record; that
try's claim re-reads ``processed_events`` under the primary key: if COMMIT
did happen, every id is already recorded and the events drop out as
duplicates (no handler runs, the offset moves past them); if it did not, they
are fresh and applied now. Either way each effect commits once.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial

from kinbox.apply import deadletter
from kinbox.apply.control import Conflicted
from kinbox.apply.dispatch import Dispatcher
from kinbox.apply.envelope import derived_event, to_event
from kinbox.apply.keyed import KeyOrder
from kinbox.apply.narrow import Plan, Refused, Settlement, Tally, Undeliverable, Unsent
from kinbox.apply.parking import Blocks, keys_of, park_step, sort_out
from kinbox.apply.route import Route
from kinbox.apply.skim import NOTHING, Skim, look_up
from kinbox.core.errors import ConflictError, EnvelopeError, StoreError, TransportError
from kinbox.core.event import Event
from kinbox.core.failpoints import failpoint
from kinbox.core.inbox import InboxStore
from kinbox.core.letter import INVALID_ID, Letter, is_replay
from kinbox.core.outcome import BatchResult, Failure, Step
from kinbox.core.parking import KeyState
from kinbox.core.publisher import OutgoingRecord, Publisher, Sending, deliver
from kinbox.core.record import Record
from kinbox.core.reuse import Sighting
from kinbox.core.steps import (
    CheckDeferred,
    CheckReused,
    Claim,
    DeadLetterRow,
    Park,
    ParkingState,
    Seen,
    Steps,
)
from kinbox.core.transport import ValueReader
from kinbox.middleware.base import Chain, Middleware

log = logging.getLogger(__name__)


class _NoPublisher:
    """Stands in when no dead-letter publisher is wired: a dead letter fails the batch."""

    def send(self, messages: Sequence[OutgoingRecord]) -> Sending:
        raise TransportError("no dead-letter publisher configured", retriable=False)

    def serve(self, timeout: float) -> None:
        """Nothing is ever in flight."""

    def close(self) -> None:
        """Nothing to release."""


class BatchProcessor:
    """Applies partition batches through ``store`` with the handlers in ``routes``.

    Args:
        routes: handlers by topic.
        store: the inbox (each route's kind may pick its variant:
            :meth:`~kinbox.apply.route.HandlerKind.pick_store`).
        id_headers: event id headers, in order of preference.
        publisher: where dead letters go.
        consumer: the consumer group, written into dead letters.
        max_attempts: tries before dead-lettering, unless the route sets its own.
        missing_id: ``dead-letter``, ``derive`` or ``fail``.
        middleware: hooked around every batch (see :mod:`kinbox.middleware.base`).
        dead_letter_limits: the record size limit of each dead-letter topic,
            which its ``kinbox.dlq.*`` headers must not push a record over.
        batch_size: records one transaction takes at most (``None``: all
            those given); a longer run of records (a skim's) is applied as
            several batches.
        value_reader: the Kafka driver's reader, for handlers whose values a
            confluent-kafka deserializer reads (:mod:`kinbox.kafka.serde`).

    Raises:
        ConfigurationError: a handler needs what ``store`` or
            ``value_reader`` cannot give (an ORM session, a reader).
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
        batch_size: int | None = None,
        value_reader: ValueReader | None = None,
    ) -> None:
        self._store = store
        self._batch_size = batch_size
        # Each route's transactions run in the store its kind picks (an
        # async handler's: the same inbox on an AsyncConnection), and its
        # handler gets what the drivers add (an ORM session from that store,
        # the reader of a deserializer), chosen now, so no batch asks which
        # kind it holds.
        self._stores = {topic: route.kind.pick_store(store) for topic, route in routes.items()}
        self._routes = {t: r.bound(self._stores[t], value_reader) for t, r in routes.items()}
        self._id_headers = tuple(id_headers)
        self._publisher: Publisher = publisher or _NoPublisher()
        self._chain = Chain(middleware)
        self._consumer = consumer
        self._dispatcher = Dispatcher(consumer, max_attempts, self._chain)
        self._missing_id = missing_id
        self._limits = dict(dead_letter_limits or {})
        # Batches of different partitions run on different threads; their
        # dead letters share one publisher, which is not thread-safe: one
        # batch at a time sends and waits for the acknowledgements.
        self._sending = threading.Lock()
        # Key-ordered routes apply each batch as units, one per key, side by side.
        self._keyed = {
            topic: KeyOrder(topic, route.concurrency, self._in_order)
            for topic, route in self._routes.items()
            if route.ordering == "key"
        }

    def process(
        self, records: Sequence[Record], attempt: int = 1, *, skim: bool = False
    ) -> BatchResult:
        """Apply ``records`` (one partition, offset order); never raises for bad input.

        Safe to call from several threads at once for different partitions
        (each transaction takes its own connection from the store). Records
        beyond ``batch_size`` are applied as further batches, one after the
        other, each in its own transaction and between its own middleware
        hooks, until one stops; the result covers them all. A key-ordered
        route's records are applied a unit per key, side by side
        (:mod:`kinbox.apply.keyed`).

        Args:
            records: consecutive records of one partition.
            attempt: the try of the first record (1 = first); the others are on
                their first try, because a failure always stops the partition
                at the failed record.
            skim: look up every id first and drop the known duplicates before
                any transaction (:mod:`kinbox.apply.skim`).

        Raises:
            Exception: what a middleware's ``before_batch`` raised (or a bug);
                every ``after_batch`` whose ``before_batch`` ran has been told.
        """
        keyed = self._keyed.get(records[0].topic) if records else None
        if keyed is not None:
            return keyed.process(records, attempt, skim)
        return self._in_order(records, attempt, skim)

    def close(self) -> None:
        """Let go of the threads of key-ordered routes (idle ones end at once)."""
        for keyed in self._keyed.values():
            keyed.close()

    def _in_order(self, records: Sequence[Record], attempt: int, skim: bool) -> BatchResult:
        """:meth:`process` in partition order: batch after batch, until one stops."""
        events, invalid, stop = self._events(records, attempt)
        looked = look_up(self._store, events) if skim and events else NOTHING
        result = BatchResult(None)
        size = self._batch_size or max(1, len(records))
        for start in range(0, len(records), size):
            if start > len(events):
                break  # past the record the partition stops at
            end = start + size
            batch = records[start:end]
            part = self._hooked(batch, partial(
                self._settle, batch, events[start:end], Plan(invalid),
                stop if len(events) < end else None, looked,
            ))  # fmt: skip
            result = result.then(part)
            if part.failure is not None:
                break
        return result

    def _events(
        self, records: Sequence[Record], attempt: int
    ) -> tuple[list[Event], dict[int, EnvelopeError], Failure | None]:
        """An event per record, up to a record that stops the partition (``missing_id=fail``).

        Returns the events, the records without a valid id by offset (their
        events carry the derived id), and the failure to stop at, if any.
        """
        events: list[Event] = []
        invalid: dict[int, EnvelopeError] = {}
        for index, record in enumerate(records):
            tries = attempt if index == 0 else 1
            try:
                events.append(to_event(record, self._id_headers, tries))
            except EnvelopeError as exc:
                if self._missing_id == "fail":
                    stop = Failure(
                        record.topic, record.partition, record.offset, tries, exc, record=record
                    )
                    return events, invalid, stop
                # Both other policies key the record on its position; under
                # dead-letter that row records it as dead-lettered, so a
                # redelivery finds it and does not send a second dead letter.
                events.append(derived_event(record, tries))
                if self._missing_id == "dead-letter":
                    invalid[record.offset] = exc
        return events, invalid, None

    def _hooked(self, records: Sequence[Record], work: Callable[[], BatchResult]) -> BatchResult:
        """``work``, the batch of ``records``, between the middleware's batch hooks."""
        topic, partition = records[0].topic, records[0].partition
        self._chain.before_batch(topic, partition, records)
        try:
            result = work()
        except BaseException as exc:
            self._chain.after_batch(topic, partition, records, BatchResult(None), exc)
            raise
        for letter in result.letters:
            self._chain.after_dead_letter(letter)
        self._chain.after_batch(topic, partition, records, result)
        return result

    def _settle(
        self,
        records: Sequence[Record],
        events: list[Event],
        plan: Plan,
        stop: Failure | None,
        looked: Skim,
    ) -> BatchResult:
        """Settle ``events`` (a batch's), then stop at ``stop`` if they all are."""
        if not events:
            return BatchResult(None, stop)
        known = looked.known
        if known and self._chain.observes_steps:
            # The look-up decided first which of these events are duplicates.
            left = [e for e in events if e.id not in known]
            if len(left) < len(events):
                step = Step(
                    "claim", topic=events[0].topic, partition=events[0].partition,
                    started=looked.started, ended=looked.ended, events=events, fresh=left,
                )  # fmt: skip
                self._chain.after_step(step)
        by_offset = {r.offset: r for r in records}
        settlement = Settlement(
            by_offset, events, plan, self._missing_id, self._limit, self._deliver
        )
        result = settlement.run(lambda part, plan: self._apply(by_offset, part, plan, known))
        if stop is not None and result.failure is None:
            result = dataclasses.replace(result, failure=stop)
        return result

    def _limit(self, event: Event) -> int:
        return self._dispatcher.limit(self._routes[event.topic])

    def _apply(
        self,
        records: Mapping[int, Record],
        events: list[Event],
        plan: Plan,
        known: frozenset[str] = frozenset(),
    ) -> Tally:
        """One transaction over ``events``: claim, handlers, dead letters, COMMIT.

        The events whose ids are ``known`` (skimmed) are duplicates already:
        left out of the transaction, which is not even begun when none is left.
        It commits only once the broker has acknowledged every dead letter it
        records (``plan.delivered``); one that finds others rolls back.

        Raises:
            Refused: PostgreSQL refused the claim, COMMIT or a dead letter's
                bookkeeping, not transiently (or COMMIT met one conflict too
                many).
            Conflicted: a conflict, while ``plan`` retries them.
            HandlerFailed, Abandoned: see :meth:`Dispatcher.run`.
            Unsent: dead letters not yet acknowledged; rolled back for them.
            StoreError: the database failed; the batch must wait.
        """
        skimmed = 0
        if known:
            left = [e for e in events if e.id not in known]
            skimmed = len(events) - len(left)
            if not left:
                return Tally(0, skimmed, [])
            events = left
        route = self._routes[events[0].topic]
        done = _Done()
        try:
            self._stores[route.topic].run(
                partial(self._transaction, done, route, records, events, plan)
            )
        except ConflictError as exc:
            # Kinbox's own statement or COMMIT: the handlers' conflicts come
            # as Conflicted, or, past the bound, as their events' failures.
            if done.ready:
                self._step("commit", events[0], events, done.committing, error=exc)
            if plan.retries_conflict(None):
                raise Conflicted(exc) from exc
            if done.claimed:
                # COMMIT, or the deferred checks it runs: pinned on an event.
                raise Refused("commit", exc) from exc
            raise  # the claim's: it waits for the other claim of its ids
        except StoreError as exc:
            if done.ready:
                self._step("commit", events[0], events, done.committing, error=exc)
                if not exc.transient:
                    raise Refused("commit", exc) from exc
            raise
        fresh, letters = done.fresh, done.letters
        self._step("commit", events[0], fresh, done.committing)
        failpoint("after_db_commit")
        for sighting in done.reused:  # told once committed: a rolled-back pass recorded nothing
            self._report(sighting)
        return Tally(
            len(fresh) - len(letters), len(events) - len(fresh) + skimmed, letters,
            len(done.reused),
        )  # fmt: skip

    def _transaction(
        self,
        done: _Done,
        route: Route,
        records: Mapping[int, Record],
        events: list[Event],
        plan: Plan,
        tx: Seen,
    ) -> Steps[None]:
        """The body of :meth:`_apply`'s transaction: claim, handlers, dead letters.

        ``done`` says how far it got, for what the store raises.
        """
        fresh = done.fresh = yield from self._claim(events)
        done.claimed = True
        if len(fresh) < len(events):  # only duplicates can reuse an id: a clean batch pays nothing
            done.reused = yield from self._reused(events, fresh)
        letters = done.letters
        candidates, sorted_, states, blocks = fresh, None, {}, None
        if route.park_keys:
            states = yield from self._parking_state(route, fresh)
            sorted_ = sort_out(fresh, states)
            candidates, blocks = sorted_.runnable, Blocks()
        runnable = []
        for event in candidates:
            error = plan.invalid.get(event.offset)
            if error is None:
                runnable.append(event)
            else:
                letters.append(self._dispatcher.letter(route, records, event, INVALID_ID, error))
                if blocks is not None:
                    blocks.dead_lettered(event)
        letters += yield from self._dispatcher.run(
            tx, route, records, runnable, plan.verdicts,
            pipelined=plan.pipelined, retry_conflict=plan.retries_conflict, blocks=blocks,
        )  # fmt: skip
        if sorted_ is not None and blocks is not None:
            yield from self._park(park_step(route.topic, sorted_, blocks, states))
        if letters:
            letters.sort(key=lambda item: item.record.offset)
            yield from self._record(fresh, letters, plan)
            unsent = [x for x in letters if x.record.offset not in plan.delivered]
            if unsent:
                # The dead letters must be acknowledged before COMMIT
                # records them (and so before the offset can move),
                # and no transaction may wait on the broker: roll back,
                # and let the settlement send them and redo this. The
                # checks COMMIT would run are run first, so a refused
                # COMMIT is found before the broker has them.
                yield from self._check_deferred()
                raise Unsent(unsent)
        failpoint("before_db_commit")
        done.ready = True
        done.committing = self._now()

    def _now(self) -> int:
        # Only timed when a middleware listens: the claim and COMMIT are per
        # transaction, but a clock read on no one's behalf is still waste.
        return time.time_ns() if self._chain.observes_steps else 0

    def _step(
        self,
        name: str,
        where: Event,
        events: Sequence[Event],
        started: int,
        fresh: Sequence[Event] | None = None,
        error: BaseException | None = None,
    ) -> None:
        """Tell the middleware a claim or COMMIT of ``where``'s partition is done."""
        if self._chain.observes_steps:
            step = Step(
                name, where.topic, where.partition, started, self._now(), events, fresh, error
            )
            self._chain.after_step(step)

    def _deliver(self, letters: list[Letter]) -> None:
        """Send ``letters`` and wait for the broker to acknowledge them all.

        Called with no transaction open (see the module docstring).

        Raises:
            Undeliverable: one was not acknowledged; blamed on the first, the
                earliest of them not known to be delivered.
        """
        try:
            with self._sending:
                deliver(
                    self._publisher,
                    (deadletter.message(x, self._limits.get(x.target)) for x in letters),
                )
        except TransportError as exc:
            raise Undeliverable(letters[0], exc) from exc
        failpoint("after_dead_letter_ack")

    def _claim(self, events: list[Event]) -> Steps[list[Event]]:
        reclaim = {e.id for e in events if is_replay(e.headers)}
        started = self._now()
        try:
            fresh: list[Event] = yield Claim(events, reclaim)
        except StoreError as exc:
            self._step("claim", events[0], events, started, error=exc)
            if exc.transient:
                raise
            raise Refused("claim", exc) from exc
        self._step("claim", events[0], events, started, fresh)
        return fresh

    def _reused(self, events: list[Event], fresh: list[Event]) -> Steps[list[Sighting]]:
        """Record the duplicates among ``events`` whose payload differs from their id's row's."""
        taken = {e.offset for e in fresh}
        try:
            sightings: list[Sighting] = yield CheckReused(
                [e for e in events if e.offset not in taken]
            )
        except StoreError as exc:
            if exc.transient:
                raise
            raise Refused("claim", exc) from exc  # the claim's bookkeeping: narrowed down alike
        return sightings

    def _parking_state(self, route: Route, fresh: list[Event]) -> Steps[dict[bytes, KeyState]]:
        """Which keys of ``fresh`` are blocked (:mod:`kinbox.apply.parking`)."""
        keys = keys_of(fresh)
        if not keys:
            return {}
        try:
            states: dict[bytes, KeyState] = yield ParkingState(route.topic, keys)
        except StoreError as exc:
            if exc.transient:
                raise
            raise Refused("claim", exc) from exc  # the claim's bookkeeping: narrowed down alike
        return states

    def _park(self, step: Park | None) -> Steps[None]:
        """Record the transaction's parking, if there is any."""
        if step is None:
            return
        try:
            yield step
        except StoreError as exc:
            if exc.transient:
                raise
            raise Refused("commit", exc) from exc  # pinned on an event like a refused COMMIT

    def _report(self, sighting: Sighting) -> None:
        """Say that ``sighting``'s event reused an id with another payload, and was not applied."""
        event = sighting.event
        log.warning(
            "event id %r reused with a different payload in group %r: first processed from %s, "
            "now at %s; not applied",
            event.id, self._consumer, sighting.first, sighting.again,
            extra={
                "topic": event.topic, "partition": event.partition, "offset": event.offset,
                "event_id": event.id, "group": self._consumer,
                "first_topic": sighting.first_topic, "first_partition": sighting.first_partition,
                "first_offset": sighting.first_offset,
            },
        )  # fmt: skip

    def _record(self, fresh: list[Event], letters: list[Letter], plan: Plan) -> Steps[None]:
        """Mark the dead letters' rows ``dead_lettered``, with the reason (or its bare code)."""
        by_offset = {e.offset: e for e in fresh}
        for letter in letters:
            event = by_offset[letter.record.offset]
            bare = event.offset in plan.bare
            reason = letter.reason.partition(":")[0] if bare else letter.summary
            try:
                yield DeadLetterRow(event, reason)
            except StoreError as exc:
                if exc.transient:
                    raise
                raise Refused("record", exc, event) from exc

    def _check_deferred(self) -> Steps[None]:
        try:
            yield CheckDeferred()
        except StoreError as exc:
            if exc.transient:
                raise
            raise Refused("commit", exc) from exc


@dataclasses.dataclass
class _Done:
    """How far one transaction's body got, for what its store then raises."""

    claimed: bool = False
    """The claim is done: a conflict now is the handlers' or COMMIT's."""
    ready: bool = False
    """The body ran to its end: a StoreError now is COMMIT's."""
    committing: int = 0
    """When COMMIT began (time.time_ns), for after_step."""
    fresh: list[Event] = dataclasses.field(default_factory=list)
    letters: list[Letter] = dataclasses.field(default_factory=list)
    reused: list[Sighting] = dataclasses.field(default_factory=list)
    """Duplicates that reused an id with another payload, recorded in this transaction."""
