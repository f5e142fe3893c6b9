"""Failure policy: what to do when a partition batch cannot be applied.

The runner never decides this itself; it describes the :class:`Failure` and
asks a :class:`FailurePolicy`. :class:`RetryPolicy` (the only policy so far)
always retries with exponential backoff and jitter, so the offset never moves
past a failed event. The dead-letter / derive / fail policies for bad input
and permanent handler failures slot in here as further policies returning
other actions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import tenacity

from kinbox.envelope import Record
from kinbox.errors import EnvelopeError, Retry, StoreError
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
        record: the record that could not become an event, for envelope errors.
    """

    topic: str
    partition: int
    offset: int
    attempt: int
    error: BaseException
    event: Event | None = None
    record: Record | None = None

    @property
    def kind(self) -> str:
        """``envelope``, ``store`` or ``handler``: for logs and metrics."""
        if isinstance(self.error, EnvelopeError):
            return "envelope"
        if isinstance(self.error, StoreError) and self.event is None:
            return "store"
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
        state.attempt_number = failure.attempt
        return Decision("retry", self._wait(state))
