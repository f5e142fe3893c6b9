"""Partitions that failed: their tries at the failed offset, and how long each waits.

A failure the batch processor hands back is one to retry (permanent failures
were dead-lettered inside the transaction). The partition is held paused
(:class:`~kinbox.consume.pauses.PauseLedger`), rewound to the failed offset
and let go after the :class:`FailurePolicy`'s delay; the loop keeps polling
meanwhile, so the member stays in the group and the other partitions keep
flowing. Only handler failures count towards ``max_attempts``; every
failure, an outage included, lengthens the backoff.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from kinbox.consume.pauses import PauseLedger, Reason
from kinbox.core.describe import describe, text
from kinbox.core.errors import EnvelopeError
from kinbox.core.outcome import Failure
from kinbox.core.policy import FailurePolicy
from kinbox.core.transport import Partition, Transport

log = logging.getLogger(__name__)


class Backoff:
    """Failure state per partition.

    Args:
        transport: the consumer, to rewind partitions.
        pauses: where a failed partition is wanted paused until its delay is over.
        policy: decides how long a failed partition waits.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        transport: Transport,
        pauses: PauseLedger,
        policy: FailurePolicy,
        clock: Callable[[], float],
    ) -> None:
        self._transport = transport
        self._pauses = pauses
        self._policy = policy
        self._clock = clock
        self.until: dict[Partition, float] = {}
        """Partitions backing off, and when to let them go."""
        # Failures at an offset: (offset, handler tries so far, failures of any kind).
        self._failures: dict[Partition, tuple[int, int, int]] = {}

    def __contains__(self, tp: object) -> bool:
        """Whether ``tp`` is backing off."""
        return tp in self.until

    def attempt(self, tp: Partition, first_offset: int) -> int:
        """The try of a batch of ``tp`` starting at ``first_offset`` (1 unless it failed there)."""
        failed_at, tries, _ = self._failures.get(tp, (-1, 0, 0))
        return tries + 1 if first_offset == failed_at else 1

    def advanced(self, tp: Partition, next_offset: int) -> None:
        """``tp`` committed up to ``next_offset``: a failure below it is over."""
        if next_offset > self._failures.get(tp, (-1, 0, 0))[0]:
            self._failures.pop(tp, None)

    def forget(self, tp: Partition) -> None:
        """Drop ``tp``'s state (assigned afresh, revoked or lost)."""
        self.until.pop(tp, None)
        self._failures.pop(tp, None)

    def fail(self, tp: Partition, failure: Failure) -> None:
        """Hold ``tp`` paused, rewind it to the failed offset and schedule its release.

        Raises:
            EnvelopeError: a record without a valid id under ``missing_id=fail``:
                the worker stops; offsets are committed up to that record.
        """
        where = f"{failure.topic}[{failure.partition}]@{failure.offset}"
        if failure.kind == "envelope":
            raise EnvelopeError(
                f"missing_id=fail: {text(failure.error)}; stopping the worker. Offsets are "
                f"committed up to {where}, so a restart meets this record again: fix it, or "
                "run with missing_id=dead-letter",
                topic=failure.topic,
                partition=failure.partition,
                offset=failure.offset,
            ) from failure.error
        offset, tries, streak = self._failures.get(tp, (-1, 0, 0))
        if offset != failure.offset:
            tries, streak = 0, 0
        if failure.kind == "handler":
            tries = failure.attempt
        streak += 1
        self._failures[tp] = (failure.offset, tries, streak)
        failure = dataclasses.replace(failure, streak=streak)
        decision = self._policy.decide(failure)
        self._say(failure, where, decision.delay)
        self._pauses.want(Reason.BACKOFF, [tp])
        self._transport.seek(tp, failure.offset)
        self.until[tp] = self._clock() + decision.delay

    def _say(self, failure: Failure, where: str, delay: float) -> None:
        """Log the failure at ERROR: every try of it, so a waiting partition is never silent."""
        if failure.event is not None:
            where += f" (event {failure.event.id!r})"
        if failure.dead_letter_topic is not None:
            log.error(
                "dead letter of %s to %r not delivered (%d time(s) in a row): %s. Only this "
                "partition waits: it stays paused at offset %d (not committed past it) and "
                "tries again in %.2fs; other partitions carry on. Fix the dead-letter topic "
                "(it must exist, take a record of this size and be writable) and the "
                "partition drains by itself",
                where, failure.dead_letter_topic, failure.streak, describe(failure.error),
                failure.offset, delay,
            )  # fmt: skip
            return
        log.error(
            "%s failure at %s, attempt %d: %s; rolled back, retrying in %.2fs; "
            "the offset is not committed past it",
            failure.kind,
            where,
            failure.attempt,
            describe(failure.error),
            delay,
            exc_info=failure.error if failure.kind == "handler" and failure.attempt == 1 else None,
            extra={
                "topic": failure.topic,
                "partition": failure.partition,
                "offset": failure.offset,
                "event_id": None if failure.event is None else failure.event.id,
            },
        )

    def release_due(self) -> None:
        """Let go of the partitions whose delay is over."""
        now = self._clock()
        due = [tp for tp, until in self.until.items() if until <= now]
        if due:
            for tp in due:
                del self.until[tp]
            self._pauses.release(Reason.BACKOFF, due)
