"""Records fetched but not yet in a batch: one lane per partition, in offset order.

A partition has at most one batch in flight (:mod:`kinbox.consume.inflight`),
so what it delivers meanwhile waits here, and becomes its next batch the
moment the one in flight ends — already fetched, so the database never
waits for Kafka.

A lane holds at most :attr:`Lanes.cap` records: a fuller one is *held*
(paused), so a partition whose batch is slow, or which alone has a backlog,
neither grows without bound nor keeps the other partitions' records from
being fetched (the consumer hands records over in the order it fetched
them, all partitions in one queue: only pausing one lets the others' come
first). The cap is :data:`PER_LANE` batches, less when many partitions are
assigned — all lanes together stay within a budget — but never less than
one batch.
Pausing drops nothing held here: the consumer resumes a paused partition
after the last record it handed over, and those records are all here. What
it had fetched beyond them it fetches again, which is why a lane is resumed
only half empty.

The invariant that bounds a lane: a partition in :attr:`Lanes.held` is
paused, whoever else would resume it. The lanes hold a partition through the
:class:`~kinbox.consume.pauses.PauseLedger`, which resumes it only once no
reason at all wants it paused, so the circuit breaker or a backoff letting
it go leaves it paused while its lane is full.

The polling thread owns the lanes; nothing here is touched by batch threads.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence, Set

from kinbox.consume.pauses import PauseLedger, Reason
from kinbox.core.record import Record
from kinbox.core.transport import Partition

log = logging.getLogger(__name__)

PER_LANE = 16
"""Batches one lane holds at most (when the budget allows).

A held partition is resumed half empty, and the consumer then fetches it
afresh: its first records come a fetch round trip later, up to
``fetch.wait.max.ms`` behind a fetch already waiting on the broker. The half
left must outlast that. At four batches (two left, ~80 ms of a fast batch
handler's work) the lanes ran dry at every resume and the loop sat in
``poll`` with nothing in flight for half the run.
"""


class Lanes:
    """The waiting records of each partition, and the partitions held for a full lane.

    Args:
        pauses: where held partitions are wanted paused.
        batch: records per batch.
        budget: records waiting in all lanes together, at most (roughly:
            each lane may take a poll's worth beyond its cap).
        per_lane: batches one lane holds at most.
    """

    def __init__(
        self, pauses: PauseLedger, batch: int, budget: int, per_lane: int = PER_LANE
    ) -> None:
        self._pauses = pauses
        self._batch = batch
        self._budget = budget
        self._per_lane = per_lane
        self.cap = per_lane * batch
        """Most records waiting in one lane before its partition is held."""
        # Insertion order is the order lanes are served in (see take()).
        self._waiting: dict[Partition, list[Record]] = {}

    @property
    def held(self) -> Set[Partition]:
        """Partitions held paused because their lane is full."""
        return self._pauses.holding(Reason.LANE)

    def add(self, tp: Partition, records: Sequence[Record]) -> None:
        """Queue ``records`` (consecutive, of ``tp``) behind what waits; hold a full lane."""
        lane = self._waiting.setdefault(tp, [])
        lane.extend(records)
        if len(lane) >= self.cap and tp not in self.held:
            self._pauses.want(Reason.LANE, [tp])

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

    def share(self, partitions: int) -> None:
        """Size the lanes for ``partitions`` assigned: the budget shared, at least a batch each."""
        most = self._per_lane * self._batch
        self.cap = max(self._batch, min(most, self._budget // max(1, partitions)))

    def records(self, tp: Partition) -> Sequence[Record]:
        """The records of ``tp`` waiting, in offset order (not to be changed)."""
        return self._waiting.get(tp, ())

    def waiting(self, tp: Partition) -> int:
        """How many records of ``tp`` wait."""
        return len(self._waiting.get(tp, ()))

    def drop(self, tp: Partition) -> None:
        """Forget ``tp``'s waiting records (rewound, revoked or lost: they come again)."""
        self._waiting.pop(tp, None)
        self._pauses.release(Reason.LANE, [tp])

    def unhold(self) -> None:
        """Let go of held partitions whose lane is half empty.

        Not sooner: a paused partition drops what the consumer had fetched
        of it, and resuming costs a fetch, so a lane that holds and resumes
        at every batch would fetch most records twice.
        """
        held = self.held
        if held:
            self._pauses.release(
                Reason.LANE, [tp for tp in held if self.waiting(tp) <= self.cap // 2]
            )
