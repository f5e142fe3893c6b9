"""Records fetched but not yet in a batch: one lane per partition, in offset order.

A partition has at most one batch in flight (:mod:`kinbox.consume.inflight`),
so what it delivers meanwhile waits here, and becomes its next batch the
moment the one in flight is settled — already fetched, so the database never
waits for Kafka. A lane holds at most ``cap`` records: a fuller one is
*held* (paused), so a partition whose batch is slow neither grows without
bound nor keeps the other partitions' records from being fetched. Pausing
drops nothing: the consumer resumes a paused partition after the last record
it handed over, and those records are all here.

The polling thread owns the lanes; nothing here is touched by batch threads.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterator, Sequence

from kinbox.consume.envelope import Record
from kinbox.kafka.base import Partition, Transport

log = logging.getLogger(__name__)


class Lanes:
    """The waiting records of each partition, and the partitions held for a full lane.

    Args:
        transport: the consumer, to pause and resume held partitions.
        cap: most records waiting per partition before it is held.
    """

    def __init__(self, transport: Transport, cap: int) -> None:
        self._transport = transport
        self._cap = cap
        # Insertion order is the order lanes are served in (see take()).
        self._waiting: dict[Partition, list[Record]] = {}
        self.held: set[Partition] = set()
        """Partitions paused only because their lane is full."""

    def add(self, tp: Partition, records: Sequence[Record]) -> None:
        """Queue ``records`` (consecutive, of ``tp``) behind what waits; hold a full lane."""
        lane = self._waiting.setdefault(tp, [])
        lane.extend(records)
        if len(lane) >= self._cap and tp not in self.held:
            self._transport.pause([tp])
            self.held.add(tp)

    def ready(self) -> Iterator[Partition]:
        """The partitions with records waiting, the longest-waiting first."""
        return iter(list(self._waiting))

    def take(self, tp: Partition, most: int) -> list[Record]:
        """Take the first ``most`` waiting records of ``tp``; its lane goes to the back."""
        lane = self._waiting.pop(tp)
        batch, rest = lane[:most], lane[most:]
        if rest:
            self._waiting[tp] = rest
        return batch

    def waiting(self, tp: Partition) -> int:
        """How many records of ``tp`` wait."""
        return len(self._waiting.get(tp, ()))

    def drop(self, tp: Partition) -> None:
        """Forget ``tp``'s waiting records (rewound, revoked or lost: they come again)."""
        self._waiting.pop(tp, None)

    def unhold(self, keep_paused: Collection[Partition] = ()) -> None:
        """Resume held partitions whose lane has room again, except those in ``keep_paused``."""
        due = sorted(tp for tp in self.held if self.waiting(tp) < self._cap)
        if not due:
            return
        self.held.difference_update(due)
        due = [tp for tp in due if tp not in keep_paused]
        if due:
            self._transport.resume(due)
