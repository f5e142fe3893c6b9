"""Settling one partition batch as the worker does, minus the waiting: :class:`Settler`.

The worker's runner hands a partition batch to the batch processor, and on a
failure pauses the partition, rewinds it to the failed record and tries again
after a backoff (:mod:`kinbox.consume.backoff`). The settler does the same
with the same pieces — the processor, the worker's own
:class:`~kinbox.consume.backoff.Backoff` counting the tries, its
:class:`~kinbox.core.policy.RetryPolicy` saying how long it would wait —
but tries again at once, so a test gets the final verdict of every record:
applied, a duplicate, dead-lettered (a handler failing on its
``max_attempts``-th try, or raising ``DeadLetter``), or failed (an outage the
worker would wait out, given up after ``outage_retries``; ``missing_id=fail``).
Each failed try is kept in :attr:`~kinbox.testing.DeliveryResult.retries`.

What became of each record is read from the
:class:`~kinbox.testing.recorder.RecordingStore`'s ledger (what committed
transactions claimed fresh and dead-lettered) and from the dead letters the
fake broker acknowledged.
"""

from __future__ import annotations

from collections.abc import Mapping

from kinbox.apply.batch import BatchProcessor
from kinbox.consume.backoff import Backoff
from kinbox.consume.pauses import PauseLedger
from kinbox.core.outcome import BatchResult, Failure
from kinbox.core.policy import Decision, RetryPolicy
from kinbox.core.record import Position, Record
from kinbox.core.transport import Partition
from kinbox.testing.publisher import FakePublisher
from kinbox.testing.recorder import InjectedCrash, Ledger, RecordingStore
from kinbox.testing.results import DeliveryResult, FailedTry, Status
from kinbox.testing.transport import FakeTransport


class Settler:
    """Runs partition batches through ``processor`` until their records settle.

    Args:
        processor: the worker's batch code, over ``store``.
        store: the recording store the processor writes through.
        publisher: the fake broker of the dead letters.
        policy: the worker's retry policy (asked only for the delay it would wait).
        outage_retries: outages tolerated per batch before its records are ``failed``.
    """

    def __init__(
        self,
        processor: BatchProcessor,
        store: RecordingStore,
        publisher: FakePublisher,
        policy: RetryPolicy,
        outage_retries: int,
    ) -> None:
        self._processor = processor
        self.store = store
        self.publisher = publisher
        self.outage_retries = outage_retries
        self._policy = _Recorded(policy)
        self._backoff = self._new_backoff()

    def settle(self, tp: Partition, records: list[Record]) -> dict[Position, DeliveryResult]:
        """Process ``records`` (consecutive, of partition ``tp``) until each settles or must wait.

        Returns:
            Each record's result, by its coordinates.
        """
        self.store.ledger = Ledger()
        acked = len(self.publisher.acked)
        retries: dict[Position, list[FailedTry]] = {}
        errors: dict[Position, BaseException] = {}
        pending, outages = list(records), 0
        failure: Failure | None = None
        while pending:
            attempt = self._backoff.attempt(tp, pending[0].offset)
            try:
                result = self._processor.process(pending, attempt)
            except InjectedCrash as crash:
                retries.setdefault(pending[0].position, []).append(
                    FailedTry(attempt, "crash", crash)
                )
                self._backoff = self._new_backoff()  # a restarted worker remembers no tries
                continue
            _note_letters(result, errors)
            if result.next_offset is not None:
                self._backoff.advanced(tp, result.next_offset)
                pending = [r for r in pending if r.offset >= result.next_offset]
            failure = result.failure
            if failure is None:
                break
            where = failure.position
            errors[where] = failure.error
            outages += failure.kind != "handler"
            if failure.kind == "envelope" or outages > self.outage_retries:
                break  # the worker would stop (missing_id=fail) or hold the partition here
            self._backoff.fail(tp, failure)  # an envelope failure would raise: stopped above
            retries.setdefault(where, []).append(
                FailedTry(failure.attempt, failure.kind, failure.error, self._policy.last.delay)
            )
            pending = [r for r in pending if r.offset >= failure.offset]
        unsettled = {r.position for r in pending} if failure is not None else set()
        letters = {_letter_of(r): r for r in self.publisher.acked[acked:]}
        return {
            r.position: self._verdict(r, r.position in unsettled, retries, errors, letters)
            for r in records
        }

    def _verdict(
        self,
        record: Record,
        unsettled: bool,
        retries: Mapping[Position, list[FailedTry]],
        errors: Mapping[Position, BaseException],
        letters: Mapping[Position, Record],
    ) -> DeliveryResult:
        where = record.position
        ledger = self.store.ledger
        status: Status
        reason = error = None
        letter = None
        if where in ledger.dead_lettered:
            status, letter = "dead_lettered", letters.get(where)
            reason = _reason(letter) or ledger.dead_lettered[where]
            error = errors.get(where)
        elif where in ledger.parked:
            status, reason = "parked", ledger.parked[where]
        elif where in ledger.applied:
            status = "applied"
        elif unsettled:
            status, error = "failed", errors.get(where)
        else:
            status = "duplicate"
        return DeliveryResult(
            record,
            ledger.ids.get(where),
            status,
            reason,
            error,
            tuple(retries.get(where, ())),
            letter,
            where in ledger.reused,
        )

    def _new_backoff(self) -> Backoff:
        # The transport only gets rewound; nothing ever waits on it.
        transport = FakeTransport()
        return Backoff(transport, PauseLedger(transport), self._policy, clock=lambda: 0.0)


class _Recorded:
    """The worker's retry policy, remembering its last decision (the delay it would wait)."""

    def __init__(self, policy: RetryPolicy) -> None:
        self._policy = policy
        self.last = Decision("retry", 0.0)

    def decide(self, failure: Failure) -> Decision:
        self.last = self._policy.decide(failure)
        return self.last


def _note_letters(result: BatchResult, errors: dict[Position, BaseException]) -> None:
    for letter in result.letters:
        errors[letter.record.position] = letter.error


def _letter_of(letter: Record) -> Position:
    """The original record's coordinates, from a dead letter's ``kinbox.dlq.*`` headers."""
    headers = {
        name: (value or b"").decode("utf-8", "replace")
        for name, value in letter.headers
        if name.startswith("kinbox.dlq.")  # the original's own headers may be any bytes
    }
    return (
        headers.get("kinbox.dlq.topic", ""),
        int(headers.get("kinbox.dlq.partition", "-1")),
        int(headers.get("kinbox.dlq.offset", "-1")),
    )


def _reason(letter: Record | None) -> str | None:
    if letter is None:
        return None
    for name, value in letter.headers:
        if name == "kinbox.dlq.reason" and value is not None:
            return value.decode("utf-8", "replace")
    return None
