"""Pinning a refusal on the event that caused it, so no record stalls its partition.

A partition batch is applied in one transaction (:mod:`kinbox.apply.batch`). A
handler's failure names its event (:mod:`kinbox.apply.dispatch`); three refusals
name none, because one statement or one COMMIT covers many events:

``claim``
    kinbox's one INSERT of every id of the batch, refused non-transiently:
    an id the database cannot store, one that :mod:`kinbox.apply.envelope` let
    through (say, a character the server encoding has no code for);
``commit``
    COMMIT refused non-transiently: a deferred constraint or a constraint
    trigger failed on some handler's effect. (When a transaction has dead
    letters to send, the deferred checks run just before they are sent, so a
    refusal is found before the broker has them.)
``record``
    the dead-letter bookkeeping of a known event, refused.

Such a refusal is *narrowed down*: the failed part is split and its first
half applied alone; what commits stays committed and the rest is tried next,
until the refusal is pinned on one event — the first whose inclusion makes
the transaction fail. That event then fails as it would in a handler, the
events before it are committed, and those after it carry on:

- its **claim** refused: its id cannot be stored. It is a malformed id, for
  the ``missing_id`` policy: dead-lettered under ``topic/partition/offset``
  (the default), applied under that id (``derive``), or the worker stops
  (``fail``).
- its **COMMIT** refused: a try of the event, counted like a handler
  failure; the partition stops there and tries it again after a backoff. On
  its last try it is dead-lettered with the reason, without its handler
  running again.
- its **bookkeeping** refused: recorded again with the bare reason code.

Dead letters are sent between transactions, never inside one: no
transaction may wait on Kafka (docs/design.md, invariant 5), yet the broker must
acknowledge a dead letter before a COMMIT records it. A transaction that
finds dead letters the broker has not acknowledged yet rolls back instead of
committing (:class:`Unsent`); they are sent and flushed with no transaction
open, and the part is redone with their verdicts fixed (:meth:`Plan.fix`):
their handlers do not run again, and the redo records them and commits. A
redo that finds a dead letter of its own (an event that fails this time) goes
round once more, so each round delivers at least one more dead letter and
the rounds end. A dead letter the broker does not take (its topic refuses
the record, the producer went fatal, the broker is away) is no refusal of
the database and no try of its event: the events before the first such dead
letter commit, and the partition waits at that record, as for an outage,
until the broker takes it (:class:`Undeliverable`).

If even that is refused — the derived id, the bare code, or the COMMIT of
an event whose handler did not run — nothing of the event is left to blame:
the database is at fault, and the partition waits as for an outage. A
transient error anywhere also rolls back and waits, as before; narrowing
only ever acts on refusals. Every step either commits events or halves the
part being tried, so finding one culprit costs about 2·log2(batch size)
extra transactions, and only when something was refused.

A *conflict* — the server aborted the transaction to let another through: a
serialization failure or a deadlock — is nobody's failure, and the same
transaction usually succeeds when tried again. So the part is redone at
once, after a short random pause (so two partitions that deadlocked do not
meet again in step), without counting a try: up to :data:`CONFLICT_RETRIES`
times for the same event's handler (or for COMMIT and kinbox's own
statements) before the part commits. One more, and it counts: a handler's conflict as a try of
its event (dead-lettered on its last try, like any failure), a conflict at
COMMIT as a refused COMMIT, narrowed down as above. So a conflict that comes
back every time holds its partition for a bounded number of tries, never
forever. (A conflict of kinbox's own claim is with another transaction
claiming the same ids, which decides whether they are fresh: the partition
waits for it, as for a lock.)
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from kinbox.apply.control import Abandoned, Conflicted, HandlerFailed, Unpipelined
from kinbox.apply.envelope import derived_event, derived_id, unstorable_id
from kinbox.core.errors import EnvelopeError, StoreError, TransportError
from kinbox.core.event import Event
from kinbox.core.letter import HANDLER_ERROR, Letter
from kinbox.core.outcome import BatchResult, Failure, Verdict
from kinbox.core.record import Record

log = logging.getLogger(__name__)

Where = Literal["claim", "commit", "record"]

CONFLICT_RETRIES = 3
"""Conflicts of one event's handler a batch redoes at once, counting no try; the next counts."""

CONFLICT_PAUSE = 0.05
"""Seconds: the n-th redo after a conflict waits a random time up to this * 2**(n-1)."""


class Unsent(Exception):
    """A transaction found dead letters the broker has not acknowledged: it was rolled back.

    ``letters`` (in offset order) are to be sent with no transaction open,
    then the part redone with their verdicts fixed.
    """

    def __init__(self, letters: list[Letter]) -> None:
        super().__init__(f"{len(letters)} dead letter(s) to send first")
        self.letters = letters


class Undeliverable(Exception):
    """The broker did not acknowledge a dead letter (no transaction was open).

    ``letter`` is the first of those being sent (lowest offset): the
    partition holds at its record, the events before it still commit.
    """

    def __init__(self, letter: Letter, error: TransportError) -> None:
        super().__init__(f"dead letter to {letter.target!r} not delivered: {error}")
        self.letter = letter
        self.error = error


class Refused(Exception):
    """PostgreSQL refused, non-transiently, something no single event is named for."""

    def __init__(self, where: Where, error: StoreError, event: Event | None = None) -> None:
        super().__init__(f"{where} refused: {error}")
        self.where: Where = where
        self.error = error
        self.event = event
        """The event, when the refusal names one (``record``)."""


@dataclass
class Plan:
    """What the passes over one batch have learned so far; every pass follows it."""

    invalid: dict[int, EnvelopeError] = field(default_factory=dict)
    """Records without a usable id, by offset: dead-lettered under their derived id."""
    verdicts: dict[int, Verdict] = field(default_factory=dict)
    """Events given up, by offset: dead-lettered without their handler running."""
    bare: set[int] = field(default_factory=set)
    """Offsets whose dead-letter reason is recorded as the bare reason code."""
    pipelined: bool = True
    """Whether the optimistic pass may run pipelined: until a pipelined pass failed."""
    conflicts: dict[int | None, int] = field(default_factory=dict)
    """Conflicts redone since the last commit, by the offset of the event whose
    handler met them (``None``: kinbox's own statements, COMMIT)."""
    delivered: set[int] = field(default_factory=set)
    """Offsets whose dead letters the broker acknowledged: a pass records them, sends nothing."""

    def fix(self, letters: list[Letter]) -> None:
        """``letters`` were acknowledged: every later pass dead-letters them, handlers unrun."""
        for letter in letters:
            offset = letter.record.offset
            self.delivered.add(offset)
            if offset not in self.invalid:
                self.verdicts.setdefault(offset, Verdict(letter.reason, letter.error))

    def retries_conflict(self, event: Event | None) -> bool:
        """Whether ``event``'s next conflict is redone at once (else it counts as a failure)."""
        return self.conflicts.get(None if event is None else event.offset, 0) < CONFLICT_RETRIES


@dataclass(frozen=True)
class Tally:
    """What one committed transaction did."""

    applied: int
    duplicates: int
    letters: list[Letter]
    reused: int = 0
    """Of the duplicates, those that reused an id with another payload (recorded)."""


Apply = Callable[[list[Event], Plan], Tally]
"""Applies some consecutive events of the batch in one transaction, following the plan.

Raises :class:`Refused`, :class:`Unsent`,
:class:`~kinbox.apply.control.HandlerFailed`, :class:`~kinbox.apply.control.Abandoned`,
:class:`~kinbox.apply.control.Unpipelined`, :class:`~kinbox.apply.control.Conflicted`
(only while the plan says to retry conflicts), or :class:`~kinbox.core.errors.StoreError`
for what must wait.
"""


class Settlement:
    """Applies one batch's events through ``apply`` until each is settled or one must wait.

    Args:
        records: the batch's records by offset.
        events: its events, in offset order (one per record up to where it stops).
        plan: what is known before the first pass (records without a valid id).
        missing_id: ``dead-letter``, ``derive`` or ``fail``.
        limit: the tries an event gets before it is dead-lettered.
        deliver: sends dead letters and waits for the broker to acknowledge
            them all, called with no transaction open; raises
            :class:`Undeliverable` if it does not.
    """

    def __init__(
        self,
        records: Mapping[int, Record],
        events: list[Event],
        plan: Plan,
        missing_id: str,
        limit: Callable[[Event], int],
        deliver: Callable[[list[Letter]], None],
    ) -> None:
        self._records = records
        self._events = list(events)
        self._plan = plan
        self._missing_id = missing_id
        self._limit = limit
        self._deliver = deliver
        self._start = 0  # events before it are committed
        self._bound = len(events)  # the batch stops here (a failure to retry)
        self._stopped: Failure | None = None
        self._applied = self._duplicates = self._reused = 0
        self._letters: list[Letter] = []

    def run(self, apply: Apply) -> BatchResult:
        """Settle the events; never raises for what an event contains.

        Raises:
            Exception: what ``apply`` raised that is none of the above
                (a bug, or a middleware's exception).
        """
        end = self._bound
        suspect = 0  # while narrowing: the end of the smallest part known to be refused
        while self._start < self._bound:
            part = self._events[self._start : end]
            try:
                tally = apply(part, self._plan)
            except Unpipelined:
                self._plan.pipelined = False  # the same part again, one statement at a time
                continue
            except Conflicted as exc:
                self._conflicted(part, exc)
                continue
            except Abandoned as exc:
                self._plan.verdicts[exc.event.offset] = exc.verdict
                continue
            except HandlerFailed as exc:
                failed = exc.event
                self._stopped = Failure(
                    failed.topic, failed.partition, failed.offset, failed.attempt, exc.cause,
                    event=failed,
                )  # fmt: skip
                # The rolled-back try of the events before it is not a failure
                # of theirs: apply them again so the partition moves up to it.
                end = self._bound = self._index(failed.offset)
                suspect = 0
                continue
            except Refused as exc:
                if exc.event is None and len(part) > 1:
                    log.warning(
                        "%s of %s[%d]@%d..%d refused (%s): narrowing it down",
                        exc.where, part[0].topic, part[0].partition, part[0].offset,
                        part[-1].offset, exc.error,
                        extra={"topic": part[0].topic, "partition": part[0].partition,
                               "offset": part[0].offset},
                    )  # fmt: skip
                    suspect, end = self._start + len(part), self._start + len(part) // 2
                    continue
                outcome = self._pinned(exc, exc.event or part[0])
                if outcome is None:
                    continue
                self._stopped = self._wait(part, exc.error) if outcome == "wait" else outcome
                break
            except Unsent as exc:
                # Rolled back: the broker acknowledges the dead letters while
                # no transaction waits for it, then the part is redone.
                try:
                    self._deliver(exc.letters)
                except Undeliverable as undelivered:
                    # An outage of the dead-letter topic, not a try of the event:
                    # the events before it commit, the partition holds at it.
                    self._stopped = self._undelivered(undelivered)
                    end = self._bound = self._index(undelivered.letter.record.offset)
                    suspect = 0
                    continue
                self._plan.fix(exc.letters)
                continue
            except (StoreError, TransportError) as exc:
                self._stopped = self._wait(part, exc)
                break
            self._applied += tally.applied
            self._duplicates += tally.duplicates
            self._reused += tally.reused
            self._letters += tally.letters
            self._plan.conflicts.clear()
            # Committed: next, the rest of the refused part (the refusal is
            # there), or, once it is settled, everything left.
            self._start = end
            if self._start >= suspect:
                suspect = 0
            end = suspect or self._bound
        return self._result()

    def _pinned(self, exc: Refused, event: Event) -> Failure | Literal["wait"] | None:
        """Deal with the one event ``exc`` is pinned on.

        Returns:
            ``None`` to try again (the plan now says what to do with the
            event), a failure to stop at, or ``"wait"`` when it is not the
            event's fault.
        """
        plan, record = self._plan, self._records[event.offset]
        if exc.where == "record":
            if event.offset not in plan.bare:
                plan.bare.add(event.offset)
                return None
        elif exc.where == "claim":
            if event.offset not in plan.invalid and event.id != derived_id(record):
                return self._unstorable(event, record, exc.error)
        elif event.offset not in plan.verdicts and event.offset not in plan.invalid:
            if event.attempt < self._limit(event):
                return Failure(
                    event.topic, event.partition, event.offset, event.attempt, exc.error,
                    event=event,
                )  # fmt: skip
            log.error(
                "COMMIT of %s[%d]@%d (event %r) refused on its last try (%d): dead-lettering it",
                event.topic, event.partition, event.offset, event.id, event.attempt,
                extra=_position(event),
            )  # fmt: skip
            plan.verdicts[event.offset] = Verdict(HANDLER_ERROR, exc.error)
            return None
        # The derived id, the bare reason code, or an event whose handler did
        # not run: nothing of the event is left to blame. Wait, as for an outage.
        log.error(
            "%s of %s[%d]@%d refused with nothing of the event left to blame: "
            "the database is at fault, the partition waits",
            exc.where, event.topic, event.partition, event.offset,
            extra=_position(event),
        )  # fmt: skip
        return "wait"

    def _conflicted(self, part: list[Event], exc: Conflicted) -> None:
        """Say so, and pause a moment before ``part`` is redone after a conflict."""
        key = None if exc.event is None else exc.event.offset
        seen = self._plan.conflicts[key] = self._plan.conflicts.get(key, 0) + 1
        first = part[0]
        whose = (
            "COMMIT or kinbox's own statement"
            if exc.event is None
            else f"the handler of offset {exc.event.offset}"
        )
        log.warning(
            "%s[%d]@%d..%d: the server aborted the transaction over a conflict with another, "
            "met by %s (%s); redoing it (%d of %d in a row; no try counted)",
            first.topic, first.partition, first.offset, part[-1].offset, whose, exc,
            seen, CONFLICT_RETRIES,
            extra={"topic": first.topic, "partition": first.partition, "offset": first.offset},
        )  # fmt: skip
        time.sleep(random.uniform(0, CONFLICT_PAUSE * 2 ** (seen - 1)))

    def _wait(self, part: list[Event], error: BaseException) -> Failure:
        """The partition waits at ``part``'s first event (an outage: no try counted)."""
        first = part[0]
        return Failure(first.topic, first.partition, first.offset, first.attempt, error)

    def _unstorable(self, event: Event, record: Record, error: StoreError) -> Failure | None:
        """``event``'s id cannot be stored: a malformed id, for the ``missing_id`` policy."""
        envelope = unstorable_id(record, event.id, error)
        if self._missing_id == "fail":
            return Failure(
                record.topic, record.partition, record.offset, event.attempt, envelope,
                record=record,
            )  # fmt: skip
        log.warning(
            "%s; keyed on its position instead (missing_id=%s)",
            envelope,
            self._missing_id,
            extra={"topic": record.topic, "partition": record.partition, "offset": record.offset},
        )
        self._events[self._start] = derived_event(record, event.attempt)
        if self._missing_id == "dead-letter":
            self._plan.invalid[event.offset] = envelope
        return None

    def _undelivered(self, exc: Undeliverable) -> Failure:
        """The partition waits at the dead letter's record (no try counted)."""
        r = exc.letter.record
        event = self._events[self._index(r.offset)]
        return Failure(
            r.topic, r.partition, r.offset, event.attempt, exc.error, record=r,
            dead_letter_topic=exc.letter.target,
        )  # fmt: skip

    def _index(self, offset: int) -> int:
        return next(i for i, e in enumerate(self._events) if e.offset == offset)

    def _result(self) -> BatchResult:
        done = self._events[self._start - 1].offset + 1 if self._start else None
        return BatchResult(
            done, self._stopped, self._applied, self._duplicates, len(self._letters),
            tuple(self._letters), self._reused,
        )  # fmt: skip


def _position(event: Event) -> dict[str, object]:
    """The ``extra=`` of a log line about ``event`` (``--log-format json`` fields)."""
    return {
        "topic": event.topic,
        "partition": event.partition,
        "offset": event.offset,
        "event_id": event.id,
    }
