"""Failure policy: how long a partition waits after a failure it must retry.

Permanent failures never get here: the batch processor dead-letters them
inside the batch's transaction (see :mod:`kinbox.batch`). What reaches the
runner is a failure to retry — a handler's non-final failure (or a COMMIT
refused because of its event, see :mod:`kinbox.narrow`), a database outage, a
dead letter the broker did not acknowledge — or, under ``missing_id=fail``, a
bad record that stops the worker. The runner describes
the :class:`Failure` and asks a :class:`FailurePolicy` for the delay;
:class:`RetryPolicy` backs off exponentially with jitter (tenacity's wait).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import tenacity

from kinbox.envelope import Record
from kinbox.errors import EnvelopeError, Retry, StoreError, TransportError
from kinbox.event import Event


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
    def kind(self) -> str:
        """``envelope``, ``store``, ``dead-letter`` or ``handler``: for logs and metrics."""
        if isinstance(self.error, EnvelopeError):
            return "envelope"
        if isinstance(self.error, StoreError) and self.event is None:
            return "store"
        if isinstance(self.error, TransportError) and self.event is None:
            return "dead-letter"
        return "handler"


@dataclass(frozen=True)
class Decision:
    """What the runner does about a failure: ``retry`` the partition after ``delay`` seconds."""

    action: Literal["retry"]
    delay: float


class FailurePolicy(Protocol):
    """Decides what happens to a failed partition batch."""

    def decide(self, failure: Failure) -> Decision:
        """Return the decision for ``failure``."""


class RetryPolicy:
    """Retry every failure, backing off exponentially (tenacity's wait with jitter).

    A handler raising :class:`~kinbox.errors.Retry` chooses its own delay.
    """

    def __init__(self, initial: float = 0.5, maximum: float = 30.0) -> None:
        self._wait = tenacity.wait_exponential_jitter(
            multiplier=initial, max=maximum, jitter=initial / 2
        )

    def decide(self, failure: Failure) -> Decision:
        """See :meth:`FailurePolicy.decide`."""
        if isinstance(failure.error, Retry):
            return Decision("retry", max(0.0, failure.error.delay))
        state = tenacity.RetryCallState(None, None, (), {})  # type: ignore[arg-type]
        state.attempt_number = max(1, failure.streak)
        return Decision("retry", self._wait(state))
