"""One partition batch in key order: a unit per key, applied side by side, one watermark.

A route registered with ``ordering="key"`` splits each partition batch by
record key. A *unit* holds one key's records, in offset order, and is applied
as a batch of its own: its own transaction, its own claim, its own dead
letters. Up to the route's ``concurrency`` units (of all its partitions
together) run at once, each on a connection of its own. Records without a
key form one unit of their own: among themselves they keep partition order.

::

    batch of p ─► units by key ─► unit A: BEGIN claim handler… COMMIT ─┐
                               ─► unit B: BEGIN claim handler… COMMIT ─┼─► watermark ─► offset
                               ─► unit C: …                            ─┘

A key-ordered batch takes more of what waits than a batch in partition
order (:func:`batch_length`). The batch ends when its last unit ends, so a
partition still has one batch in flight: a revoke waits for all of it, and a
key's next records start only after its earlier ones settled. What the batch
lets the runner commit is the *watermark*: the first record that did not
settle in any unit, or the batch's end (docs/design.md, invariant 2). A unit
that stopped at a failure stops the partition there; the partition is
rewound to that record, and the records of other keys past it, settled
already, come again as duplicates, which the claim drops. So a crash, a
rebalance or a failure with units in flight applies nothing twice and loses
nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_all

from kinbox.core.outcome import BatchResult
from kinbox.core.record import Record

Apply = Callable[[Sequence[Record], int, bool], BatchResult]
"""Apply one unit: ``(records, attempt of the first, skim)``."""


def batch_length(waiting: Sequence[Record], batch: int, concurrency: int) -> int:
    """How many of a partition's ``waiting`` records its next key-ordered batch takes.

    Up to ``concurrency`` batches (of ``batch`` records) of them, but no key
    more than ``batch``: under a backlog each key's unit then holds its
    events of several batches, sharing one claim and one COMMIT where a batch
    of distinct keys would pay a transaction per event, and the batch still
    lasts about as long as one in partition order (``batch`` events one
    after the other, or ``concurrency`` units side by side that long).
    """
    most = min(len(waiting), batch * concurrency)
    if most <= batch:
        return most
    counts: dict[bytes | None, int] = {}
    for index in range(most):
        key = waiting[index].key
        count = counts.get(key, 0) + 1
        if count > batch:
            return index
        counts[key] = count
    return most


def units(records: Sequence[Record]) -> list[list[Record]]:
    """``records`` grouped by key, each group in offset order, groups by their first offset."""
    by_key: dict[bytes | None, list[Record]] = {}
    for record in records:
        by_key.setdefault(record.key, []).append(record)
    return list(by_key.values())


def watermark(records: Sequence[Record], results: Sequence[BatchResult]) -> BatchResult:
    """One result for the batch of ``records`` whose units ended with ``results``.

    Every record below the earliest unit failure is settled: the units that
    did not fail settled all theirs, a failed one all before its failure.
    So the offset to commit is that failure's (``None`` if it is the batch's
    first record), or past the batch's end when no unit failed; the failure
    the partition stops at is the earliest.
    """
    stops = [r.failure for r in results if r.failure is not None]
    failure = min(stops, key=lambda f: f.offset, default=None)
    if failure is None:
        next_offset: int | None = records[-1].offset + 1
    else:
        next_offset = failure.offset if failure.offset > records[0].offset else None
    letters = tuple(sorted((x for r in results for x in r.letters), key=lambda x: x.record.offset))
    return BatchResult(
        next_offset,
        failure,
        sum(r.applied for r in results),
        sum(r.duplicates for r in results),
        sum(r.dead_lettered for r in results),
        letters,
        sum(r.reused for r in results),
    )


class KeyOrder:
    """Applies the batches of one key-ordered route, up to ``concurrency`` units at once.

    Args:
        topic: the route's topic (names the unit threads).
        concurrency: units running at once, over all the route's partitions.
        apply: applies one unit, as a partition-ordered batch.
    """

    def __init__(self, topic: str, concurrency: int, apply: Apply) -> None:
        self.concurrency = concurrency
        self._apply = apply
        self._units = ThreadPoolExecutor(concurrency, thread_name_prefix=f"kinbox-key-{topic}")

    def process(self, records: Sequence[Record], attempt: int, skim: bool) -> BatchResult:
        """Apply ``records`` (one partition, offset order) unit by unit, side by side.

        ``attempt`` is the try of the first record, so of the first unit's
        first record; every other unit starts on a record's first try.

        Raises:
            Exception: what a unit raised (a middleware's ``before_batch``, a
                bug), once every unit has ended.
        """
        split = units(records)
        if len(split) == 1:
            return self._apply(records, attempt, skim)
        # Longest units first: the batch ends with its slowest worker, and
        # short units fill in behind the long ones (the order of different
        # keys' units is free).
        split.sort(key=len, reverse=True)
        futures = [
            self._units.submit(self._apply, unit, attempt if unit[0] is records[0] else 1, skim)
            for unit in split
        ]
        # Every unit ends before the batch does, even when one raised: no
        # transaction of this batch outlives it.
        wait_all(futures)
        return watermark(records, [f.result() for f in futures])

    def close(self) -> None:
        """Let the unit threads go once they are idle."""
        self._units.shutdown(wait=False)
