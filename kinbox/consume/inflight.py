"""The batches in flight: at most one per partition, several partitions at once.

Each partition batch is applied on a worker thread, in its own database
transaction on its own connection, while the polling thread keeps polling:
so one partition's COMMIT (its fsync) and the offset commit never hold up
another partition's records, and PostgreSQL flushes concurrent commits
together. Order stays per partition: a partition's next batch starts only
once its batch in flight has ended and its result was collected.

A batch that takes long — a slow handler, a database that went away — never
turns the member into a zombie: the polling thread never waits for a batch
(only a revoke does, bounded), so ``max.poll.interval.ms`` is never exceeded
and rebalance callbacks are served. A revoke of a partition with a batch in
flight waits for it (bounded by the runner) so its offsets can be committed
before the partition goes; a batch that outlives that wait, or whose
partition is lost, is *orphaned*: it runs to its end, its result is dropped,
and no new batch of its partition starts before it ended — its database work
is safe either way, the next owner's claim blocks on its rows and then finds
them recorded.

Nothing here waits without a bound: a worker that stops waits for its
batches at most until its shutdown deadline (:meth:`InFlight.drain`), and
leaves those still running to the process's exit. That is safe at any point
of theirs: a batch's offsets are never committed then, and its transaction
either commits whole before the process ends or is rolled back by
PostgreSQL when the process's connections close. A batch that runs long is
never silent either: :meth:`InFlight.report_stuck` names it, with its thread's
stack, every :data:`STUCK_AFTER` seconds.

A batch thread ends a batch that raised ``SystemExit`` or
``KeyboardInterrupt`` (a middleware hook's: a handler's own is caught at its
call) with :class:`~kinbox.core.errors.ExitRequested` instead, so it reaches
the polling thread as a request to stop the worker, not as the process's
exit status.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable, Collection
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from dataclasses import dataclass, field

from kinbox.core.describe import describe
from kinbox.core.errors import ExitRequested
from kinbox.core.outcome import BatchResult
from kinbox.core.transport import Partition

log = logging.getLogger(__name__)

HOLD_AFTER = 1.0
"""Seconds a batch may run before the polling thread says it is still running."""

STUCK_AFTER = 30.0
"""Seconds a batch may run before it is reported at WARNING, with what it waits on, and again
after as many more each time."""

Finished = list[tuple[Partition, "Future[BatchResult]"]]


Label = str | Callable[[], str]
"""What a batch is, for the reports of one that runs long: text, or what makes it when asked."""


@dataclass
class _Batch:
    started: float
    named: Label
    future: Future[BatchResult] = field(init=False)
    orphan: bool = False
    told: bool = False  # "still running" said already
    reported: float = 0.0  # when it was last reported stuck (monotonic)
    thread: int | None = None  # the batch thread's ident, once it runs

    @property
    def label(self) -> str:
        """What the batch is (made only when a report needs it: most batches never do)."""
        return self.named if isinstance(self.named, str) else self.named()


class InFlight:
    """Partition batches running on worker threads, one per partition at most.

    Args:
        workers: most batches running at once.
        executor: runs the batches; a thread pool of ``workers`` by default
            (an executor that runs each job at once makes :meth:`submit`
            synchronous: see :class:`kinbox.testing.InlineExecutor`).
    """

    def __init__(self, workers: int, executor: Executor | None = None) -> None:
        self.workers = workers
        self._own = executor is None
        self._executor = executor or ThreadPoolExecutor(workers, thread_name_prefix="kinbox-batch")
        self._batches: dict[Partition, _Batch] = {}
        self._ended = threading.Event()

    def __contains__(self, tp: object) -> bool:
        """Whether ``tp`` has a batch in flight (an orphaned one included)."""
        return tp in self._batches

    def __len__(self) -> int:
        return len(self._batches)

    @property
    def full(self) -> bool:
        """Whether every worker has a batch."""
        return len(self._batches) >= self.workers

    def submit(self, tp: Partition, work: Callable[[], BatchResult], label: Label = "") -> None:
        """Start ``work``, the next batch of ``tp`` (which has none in flight).

        ``label`` says what the batch is (its handler, its records) in the
        reports of a batch that runs long; a callable is called only then.
        """
        assert tp not in self._batches, f"{tp} already has a batch in flight"
        batch = _Batch(time.monotonic(), label or str(tp))
        self._batches[tp] = batch

        def run() -> BatchResult:
            batch.thread = threading.get_ident()
            try:
                return work()
            except (SystemExit, KeyboardInterrupt) as exc:
                raise ExitRequested(
                    f"the batch of {batch.label} raised {describe(exc)} on its thread: "
                    "stopping the worker"
                ) from exc

        batch.future = self._executor.submit(run)
        batch.future.add_done_callback(lambda _: self._ended.set())

    def wait(self, timeout: float) -> None:
        """Sleep until a batch ends, at most ``timeout`` seconds."""
        if self._batches:
            self._ended.wait(timeout)

    def finished(self) -> Finished:
        """The batches that ended since the last call, in start order.

        An orphan's result is left out; an orphan that raised is not, so the
        loop raises its exception as it would any batch's.
        """
        self._ended.clear()  # before looking: a batch ending now sets it again
        out: Finished = []
        for tp in [tp for tp, batch in self._batches.items() if batch.future.done()]:
            batch = self._batches.pop(tp)
            if not batch.orphan or batch.future.exception() is not None:
                out.append((tp, batch.future))
        return out

    def wait_for(self, partitions: Collection[Partition], timeout: float) -> Finished:
        """Wait (at most ``timeout``) for the batches of ``partitions``; return those that ended.

        A batch that ended with an exception is left for :meth:`finished`,
        so the polling loop raises it. One still running afterwards is
        orphaned (its result will be dropped), with a warning.
        """
        mine = {tp: b for tp, b in self._batches.items() if tp in partitions and not b.orphan}
        if not mine:
            return []
        wait_all([b.future for b in mine.values()], timeout=timeout)
        out: Finished = []
        for tp, batch in mine.items():
            if not batch.future.done():
                batch.orphan = True
                log.warning(
                    "revoke of %s: its batch in flight is still running after %.1fs; its "
                    "offsets will not be committed (its database work is safe: the next "
                    "owner's claim waits for it and then suppresses it)",
                    tp,
                    timeout,
                )
            elif batch.future.exception() is None:
                del self._batches[tp]
                out.append((tp, batch.future))
        return out

    def orphan(self, partitions: Collection[Partition]) -> None:
        """Drop the results of the batches of ``partitions`` (lost): they run to their end."""
        for tp in partitions:
            if tp in self._batches:
                self._batches[tp].orphan = True

    def slow(self) -> list[tuple[Partition, float]]:
        """Batches running longer than :data:`HOLD_AFTER` not reported yet, and for how long."""
        now = time.monotonic()
        out = []
        for tp, batch in self._batches.items():
            if not batch.told and now - batch.started >= HOLD_AFTER:
                batch.told = True
                out.append((tp, now - batch.started))
        return out

    def report_stuck(self) -> None:
        """Say at WARNING, with where it waits, each batch running long.

        Long: for :data:`STUCK_AFTER` since it started, or since it was last reported.
        """
        now = time.monotonic()
        for batch in self._batches.values():
            if not batch.future.done() and now - max(batch.started, batch.reported) >= STUCK_AFTER:
                batch.reported = now
                log.warning(
                    "the batch of %s has been running for %.0fs: its partition waits (the "
                    "others go on; nothing is committed past it); reported again every %.0fs "
                    "while it runs. It waits in:\n%s",
                    batch.label, now - batch.started, STUCK_AFTER, _stack(batch),
                )  # fmt: skip

    def drain(self, timeout: float) -> Finished:
        """Wait at most ``timeout`` for every batch; return those that ended.

        Those still running are orphaned (their results will be dropped) and
        stay in :meth:`unfinished`; each is reported at ERROR, with where it waits.
        """
        wait_all([b.future for b in self._batches.values()], timeout=max(0.0, timeout))
        now = time.monotonic()
        for batch in self._batches.values():
            if not batch.future.done():
                batch.orphan = True
                log.error(
                    "stopping: the batch of %s is still running after %.1fs, beyond the "
                    "shutdown timeout; not waiting for it: its offsets are not committed, and "
                    "its transaction rolls back when the process's connections close (unless "
                    "it commits whole first); the next owner applies its events once. It "
                    "waits in:\n%s",
                    batch.label, now - batch.started, _stack(batch),
                )  # fmt: skip
        return self.finished()

    def unfinished(self) -> int:
        """How many batches still run (orphans included)."""
        return sum(1 for batch in self._batches.values() if not batch.future.done())

    def shutdown(self) -> None:
        """Stop the worker threads: at once if a batch still runs, else once they are idle.

        A batch still running is not waited for (see :meth:`drain`): its
        thread is left to the process's exit.
        """
        if self._own:
            self._executor.shutdown(wait=not self.unfinished(), cancel_futures=True)


def _stack(batch: _Batch) -> str:
    """Where ``batch``'s thread is now: the innermost call last, as in a traceback."""
    frame = None if batch.thread is None else sys._current_frames().get(batch.thread)
    return "".join(traceback.format_stack(frame)).rstrip() if frame is not None else "(not started)"
