"""The overview at one moment: ``kinbox status``'s report and the dead-letter topics.

One :class:`Overview` is taken every few seconds by the sampler
(:mod:`kinbox.console.sampler`); the overview page shows the newest, and the
charts are drawn from the figures each one adds. A part that cannot be read
(the broker away, the database down) leaves its error in the snapshot, and
the rest is still shown.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from kinbox.console.letters import Scan, TopicCount
from kinbox.core.config import Settings
from kinbox.core.errors import KinboxError
from kinbox.ops.status_report import StatusReport, gather

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Overview:
    """What the overview shows.

    Attributes:
        at: when it was taken.
        window: the seconds its activity counts cover (the sampling interval).
        status: groups, lag, ``processed_events``, the outbox and the slots.
        letters: each dead-letter topic's counts.
        open_letters: open dead letters among those read.
        errors: what could not be read, and why.
    """

    at: dt.datetime
    window: float
    status: StatusReport | None = None
    letters: list[TopicCount] = field(default_factory=list)
    open_letters: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def lag(self) -> int:
        """Records not processed yet, over every group."""
        return sum(g.lag.lag for g in self.status.groups) if self.status else 0

    @property
    def oldest(self) -> float | None:
        """Seconds the oldest unprocessed record of any group waits."""
        ages = [a for g in (self.status.groups if self.status else []) if (a := g.lag.oldest_age())]
        return max(ages, default=None)

    def rate(self, status: str) -> float:
        """Rows per second that reached ``status`` in the window, over every group."""
        if self.status is None:
            return 0.0
        rows = sum(g.window[status].rows for g in self.status.groups if status in g.window)
        return rows / self.window


def take(settings: Settings, window: float, letters: Callable[[], Scan]) -> Overview:
    """Read the status and the dead-letter topics now; an unreadable part leaves an error."""
    errors: list[str] = []
    status = None
    try:
        status = gather(settings, None, window=dt.timedelta(seconds=window))
    except KinboxError as exc:
        log.warning("the console could not read the status: %s", exc)
        errors.append(f"status: {exc}")
    scan = None
    try:
        scan = letters()
    except KinboxError as exc:
        log.warning("the console could not read the dead letters: %s", exc)
        errors.append(f"dead letters: {exc}")
    return Overview(
        dt.datetime.now(dt.UTC),
        window,
        status,
        scan.topics if scan else [],
        scan.open if scan else 0,
        errors,
    )
