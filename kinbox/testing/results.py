"""What became of a delivered record: :class:`DeliveryResult`, with its :class:`FailedTry` s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kinbox.core.record import Record

Status = Literal["applied", "duplicate", "dead_lettered", "parked", "failed"]
"""A delivery's verdict; see :attr:`DeliveryResult.status`."""


@dataclass(frozen=True)
class FailedTry:
    """One try of a record that did not settle it; the worker would try again.

    Attributes:
        attempt: the try, as ``event.attempt`` said (a handler failure counts
            a try; an outage or a crash does not).
        kind: ``handler`` (the handler raised, or PostgreSQL refused its
            COMMIT), ``store`` (a database outage: the batch rolled back
            without counting a try), ``dead-letter`` (the dead letter was not
            acknowledged), ``envelope`` (``missing_id=fail``) or ``crash``
            (injected by :func:`~kinbox.testing.assert_redelivery_safe`: the
            worker died before COMMIT and started again).
        error: what was raised.
        delay: how long the real worker would back off before the next try,
            in seconds (the test client does not wait).
    """

    attempt: int
    kind: str
    error: BaseException
    delay: float = 0.0


@dataclass(frozen=True)
class DeliveryResult:
    """What the real claim-and-transaction code made of one delivered record.

    Attributes:
        record: the record as the worker consumed it (its partition and offset).
        event_id: the id kinbox keyed it on (``topic/partition/offset`` for a
            record without a valid id), or ``None`` if it never got that far.
        status: ``applied`` (its handler's transaction committed),
            ``duplicate`` (the inbox had it already: no handler ran),
            ``dead_lettered`` (given up, see :attr:`reason`), ``parked``
            (a handler with ``park_keys=True``: it waits behind an earlier
            dead letter of its key, named in :attr:`reason`), or ``failed``
            (not settled when the client stopped trying: a database outage
            longer than ``outage_retries``, or ``missing_id=fail``; the real
            worker would hold the partition there).
        reason: the dead letter's ``kinbox.dlq.reason`` (``handler-error``,
            ``retries-exhausted``, ``invalid-id``,
            ``dead-letter-requested: <why>``...), else ``None``.
        error: what the last failing try raised (for ``dead_lettered`` and
            ``failed``), else ``None``.
        retries: every try that failed and was tried again, in order; the
            try that settled the record is not among them.
        dead_letter: the record published to the dead-letter topic, with its
            ``kinbox.dlq.*`` headers.
        reused: for a ``duplicate``, whether its payload differed from the
            one its id was first processed with (the worker logs and counts
            it, and records it for ``kinbox explain``).
    """

    record: Record
    event_id: str | None
    status: Status
    reason: str | None = None
    error: BaseException | None = None
    retries: tuple[FailedTry, ...] = ()
    dead_letter: Record | None = None
    reused: bool = False

    @property
    def applied(self) -> bool:
        """Whether the handler's transaction committed."""
        return self.status == "applied"

    @property
    def duplicate(self) -> bool:
        """Whether the inbox suppressed it: already processed, no handler ran."""
        return self.status == "duplicate"

    @property
    def dead_lettered(self) -> bool:
        """Whether it went to the dead-letter topic."""
        return self.status == "dead_lettered"

    @property
    def parked(self) -> bool:
        """Whether it waits behind an earlier dead letter of its key (``park_keys=True``)."""
        return self.status == "parked"

    @property
    def failed(self) -> bool:
        """Whether it was left unsettled (see :attr:`status`)."""
        return self.status == "failed"

    @property
    def retried(self) -> bool:
        """Whether any try failed before the last."""
        return bool(self.retries)

    @property
    def dead_letter_headers(self) -> dict[str, str]:
        """The dead letter's ``kinbox.dlq.*`` headers as text (empty if there is none)."""
        if self.dead_letter is None:
            return {}
        return {
            name: (value or b"").decode("utf-8", "replace")
            for name, value in self.dead_letter.headers
            if name.startswith("kinbox.dlq.")
        }

    def __str__(self) -> str:
        where = f"{self.record.topic}[{self.record.partition}]@{self.record.offset}"
        extra = f" ({self.reason})" if self.reason else ""
        tries = f" after {len(self.retries)} failed tr{'y' if len(self.retries) == 1 else 'ies'}"
        return f"{where} event {self.event_id!r}: {self.status}{extra}" + (
            tries if self.retries else ""
        )
