"""What became of one partition batch: :class:`BatchResult`, :class:`Failure`, each :class:`Step`.

Also the :class:`Verdict` on an event a pass gave up for good. The control
flow that carries a handler's failure out of a transaction is the engine's
own (:mod:`kinbox.apply.control`).

Shared by the batch processor, the runner, the failure policy and the
middleware; it imports nothing of them, so no circle forms between them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kinbox.core.errors import EnvelopeError, StoreError, TransportError

if TYPE_CHECKING:
    from kinbox.core.event import Event
    from kinbox.core.letter import Letter
    from kinbox.core.record import Position, Record


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
        reused: of the duplicates, those whose payload differed from the one
            their id was first processed with (:mod:`kinbox.core.reuse`).
    """

    next_offset: int | None
    failure: Failure | None = None
    applied: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    letters: tuple[Letter, ...] = ()
    reused: int = 0

    def then(self, later: BatchResult) -> BatchResult:
        """One result for this batch followed by ``later``, the next one of its partition."""
        return BatchResult(
            self.next_offset if later.next_offset is None else later.next_offset,
            later.failure,
            self.applied + later.applied,
            self.duplicates + later.duplicates,
            self.dead_lettered + later.dead_lettered,
            self.letters + later.letters,
            self.reused + later.reused,
        )


@dataclass(frozen=True)
class Failure:
    """Why a partition stopped at ``offset``.

    Attributes:
        topic: the partition's topic.
        partition: the partition.
        offset: the first offset not applied; reading resumes here.
        attempt: consecutive failures at this offset, this one included.
        error: the cause (:class:`EnvelopeError`, :class:`StoreError`, or what
            the handler raised).
        event: the event whose handler failed, when one did.
        record: the record that could not become an event, for envelope errors,
            or whose dead letter the broker did not take.
        dead_letter_topic: where that dead letter was going, when one was
            not delivered (the partition holds at its record).
        streak: consecutive failures of the partition at this offset, of any
            kind (set by the runner; the backoff grows with it, while only
            handler failures count towards ``max_attempts``).
    """

    topic: str
    partition: int
    offset: int
    attempt: int
    error: BaseException
    event: Event | None = None
    record: Record | None = None
    dead_letter_topic: str | None = None
    streak: int = 1

    @property
    def position(self) -> Position:
        """``(topic, partition, offset)`` of the record it stopped at."""
        return (self.topic, self.partition, self.offset)

    @property
    def kind(self) -> str:
        """``envelope``, ``store``, ``dead-letter`` or ``handler``: for logs and metrics."""
        if isinstance(self.error, EnvelopeError):
            return "envelope"
        if isinstance(self.error, StoreError) and self.event is None:
            return "store"
        if isinstance(self.error, TransportError) and self.event is None:
            return "dead-letter"
        return "handler"


@dataclass(frozen=True, slots=True)
class Step:
    """One claim or one COMMIT of a partition batch's transaction, as it happened.

    A batch takes one transaction, or several when it is redone or narrowed
    down (:mod:`kinbox.apply.narrow`), so a batch may report several steps
    of each kind.

    Attributes:
        name: ``claim`` or ``commit``. A batch that was skimmed
            (:mod:`kinbox.apply.skim`) reports the look-up as a ``claim`` of
            its events first: ``fresh`` are those it left to the claim.
        topic: the batch's topic.
        partition: its partition.
        started: when the step began, in nanoseconds since the epoch (``time.time_ns``).
        ended: when it ended, likewise.
        events: the events of the transaction: those the claim was given, or
            those the COMMIT settled (applied or dead-lettered).
        fresh: for a claim that succeeded, the events it found new; the
            others of ``events`` are duplicates. ``None`` for a COMMIT or a
            failed claim.
        error: what the step raised, if it failed.
    """

    name: str
    topic: str
    partition: int
    started: int
    ended: int
    events: Sequence[Event]
    fresh: Sequence[Event] | None = None
    error: BaseException | None = None


@dataclass(frozen=True)
class Verdict:
    """A permanent failure seen in an earlier pass: why, and what was raised."""

    reason: str
    error: BaseException
