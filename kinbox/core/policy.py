"""Failure policy: how long a partition waits after a failure it must retry.

Permanent failures never get here: the batch processor dead-letters them
inside the batch's transaction (see :mod:`kinbox.apply.batch`). What reaches the
runner is a failure to retry — a handler's non-final failure (or a COMMIT
refused because of its event, see :mod:`kinbox.apply.narrow`), a database outage, a
dead letter the broker did not acknowledge — or, under ``missing_id=fail``, a
bad record that stops the worker. The runner describes
the :class:`Failure` and asks a :class:`FailurePolicy` for the delay;
:class:`RetryPolicy` backs off exponentially with jitter (tenacity's wait).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import tenacity

from kinbox.core.errors import Retry
from kinbox.core.outcome import Failure


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

    A handler raising :class:`~kinbox.core.errors.Retry` chooses its own delay.
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
