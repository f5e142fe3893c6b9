"""The batch in flight: applied on a worker thread while the polling thread keeps polling.

The polling thread owns the consumer and all of the runner's state; batches
run on one worker thread. A batch that takes longer than a moment — a slow
handler, a database that went away — must not turn this member into a
zombie: if the group expelled it (``max.poll.interval.ms``), its partitions
would go to another member while it still works on them, and the commit at
the end would be for a generation that is gone. So after :data:`HOLD_AFTER`
the polling thread *holds* the assigned partitions (pauses them) and keeps
calling ``poll()``: the member stays in the group however long the handler
takes, and rebalance callbacks are served.

A revoke that touches the batch's partitions waits for it (bounded by the
runner) so its offsets can be committed before the partitions go; a batch
that outlives that wait has its offsets dropped — its database work is safe
either way, the next owner's claim blocks on its rows and then finds them
recorded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from kinbox.apply.outcome import BatchResult
from kinbox.consume.envelope import Record
from kinbox.kafka.base import Partition, Transport

log = logging.getLogger(__name__)

Results = list[tuple[Partition, BatchResult]]

HOLD_AFTER = 1.0
"""Seconds a batch may run before the polling thread pauses the partitions and polls."""


class InFlight:
    """Runs one batch at a time on a worker thread; keeps the member polling meanwhile.

    Args:
        transport: the consumer, used only from the polling thread.
        poll_size: most records per keep-alive poll.
        revoke_wait: longest wait for the batch when its partitions are revoked.
        keep_alive: called after each keep-alive poll (the runner commits offsets).
    """

    def __init__(
        self,
        transport: Transport,
        poll_size: int,
        revoke_wait: float,
        keep_alive: Callable[[], None],
    ) -> None:
        self._transport = transport
        self._poll_size = poll_size
        self._revoke_wait = revoke_wait
        self._keep_alive = keep_alive
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="kinbox-batch")
        self._future: Future[Results] | None = None
        self._partitions: set[Partition] = set()
        self.held: set[Partition] = set()
        """Partitions paused only because a batch is in flight."""

    def run(
        self, work: Callable[[], Results], partitions: set[Partition], holdable: Sequence[Partition]
    ) -> Results:
        """Run ``work`` (a batch over ``partitions``) on the worker thread; return its results.

        After :data:`HOLD_AFTER` seconds, ``holdable`` is paused and polled
        until the batch ends. The caller resumes them with :meth:`unhold`.

        Raises:
            Exception: whatever ``work`` raised.
        """
        future = self._executor.submit(work)
        try:
            return future.result(timeout=HOLD_AFTER)
        except FutureTimeout:
            pass
        log.info(
            "batch on %s still running after %.1fs: pausing %d partition(s), polling meanwhile "
            "to stay in the group",
            sorted(partitions),
            HOLD_AFTER,
            len(holdable),
        )
        self._transport.pause(holdable)
        self.held.update(holdable)
        self._future, self._partitions = future, partitions
        try:
            while not future.done():
                stray = self._transport.poll(self._poll_size, 0.2)
                if stray:
                    self._put_back(stray)
                self._keep_alive()
        finally:
            self._future, self._partitions = None, set()
        return future.result()

    def results_for_revoke(self, partitions: Collection[Partition]) -> Results:
        """Wait (bounded) for a batch in flight on any of ``partitions``; return its results.

        Returns no results when nothing of theirs is in flight, when the batch
        failed (the polling loop re-raises that from the same future) or when
        it outlives the wait.
        """
        future = self._future
        if future is None or not self._partitions.intersection(partitions):
            return []
        try:
            return future.result(timeout=self._revoke_wait)
        except FutureTimeout:
            log.warning(
                "revoke of %s: the batch in flight is still running after %.1fs; its offsets "
                "will not be committed (its database work is safe: the next owner's claim "
                "waits for it and then suppresses it)",
                sorted(partitions),
                self._revoke_wait,
            )
            return []
        except Exception:
            return []

    def unhold(self, keep_paused: Collection[Partition]) -> None:
        """Resume the held partitions, except those in ``keep_paused`` (backing off)."""
        due = sorted(tp for tp in self.held if tp not in keep_paused)
        self.held.clear()
        if due:
            self._transport.resume(due)

    def shutdown(self) -> None:
        """Wait for a batch still running: its transaction must not race the pool's close."""
        self._executor.shutdown(wait=True)

    def _put_back(self, records: list[Record]) -> None:
        """Rewind and pause partitions that delivered while a batch is in flight.

        Held partitions deliver nothing, but one assigned during the wait was
        not held: its records are handed back, never dropped.
        """
        first: dict[Partition, int] = {}
        for record in records:
            tp = (record.topic, record.partition)
            first[tp] = min(first.get(tp, record.offset), record.offset)
        for tp, offset in first.items():
            self._transport.pause([tp])
            self._transport.seek(tp, offset)
            self.held.add(tp)
