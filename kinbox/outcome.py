"""What became of one partition batch: :class:`BatchResult`, shared by batch, runner, middleware."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kinbox.deadletter import Letter
    from kinbox.policy import Failure


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
    """

    next_offset: int | None
    failure: Failure | None = None
    applied: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    letters: tuple[Letter, ...] = ()
