"""Records from a poll to their batch's result: queued, admitted, started, collected.

The runner hands each poll's records over (:meth:`BatchFlow.take`); they wait
in their partition's lane (:mod:`kinbox.consume.lanes`). :meth:`BatchFlow.progress`
then starts a batch for every partition with records waiting and none in
flight (:mod:`kinbox.consume.inflight`), as far as the circuit breaker admits
them (:mod:`kinbox.consume.breaker`), and collects the results of the batches
that ended: offsets advance (:mod:`kinbox.consume.offsets`), a failure backs
off (:mod:`kinbox.consume.backoff`), the breaker counts. Lanes, backoff and
breaker hold partitions paused through one
:class:`~kinbox.consume.pauses.PauseLedger`, which also knows which partitions
are assigned; the runner tells the flow about rebalances.

The polling thread owns all of it; the batches run on the in-flight threads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Set
from concurrent.futures import Future
from functools import partial
from itertools import groupby
from operator import itemgetter

from kinbox.app import App
from kinbox.apply.batch import BatchProcessor
from kinbox.apply.keyed import batch_length
from kinbox.apply.skim import RUN_BATCHES, worth_skimming
from kinbox.consume.backoff import Backoff
from kinbox.consume.breaker import Breaker, State
from kinbox.consume.inflight import InFlight
from kinbox.consume.lanes import Lanes
from kinbox.consume.offsets import Offsets
from kinbox.consume.pauses import PauseLedger
from kinbox.core.config import Settings
from kinbox.core.outcome import BatchResult
from kinbox.core.policy import FailurePolicy
from kinbox.core.record import Record
from kinbox.core.transport import Partition, Transport

log = logging.getLogger(__name__)

LANES_BUDGET = 64
"""Batches waiting in all lanes together: sixteen each for up to four partitions."""

_PARTITION = itemgetter(0, 1)
"""A :class:`~kinbox.core.record.Record`'s ``(topic, partition)``."""


class BatchFlow:
    """The partitions' records on their way from a poll to a committed offset.

    Args:
        app: the handlers, to name them in the reports of a batch that runs long.
        settings: batch size and the breaker's settings.
        transport: the consumer, paused and rewound (through the ledger and the backoff).
        processor: applies one partition batch (on an in-flight thread).
        inflight: the batches running.
        offsets: where collected results advance the offsets.
        policy: how long a failed partition waits.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        app: App,
        settings: Settings,
        transport: Transport,
        processor: BatchProcessor,
        inflight: InFlight,
        offsets: Offsets,
        policy: FailurePolicy,
        clock: Callable[[], float],
    ) -> None:
        self._app = app
        self._batch = settings.batch_max_messages
        self._processor = processor
        self._inflight = inflight
        self._offsets = offsets
        self.pauses = PauseLedger(transport)
        self.backoff = Backoff(transport, self.pauses, policy, clock)
        self.breaker = Breaker(
            transport, self.pauses, settings.breaker_failures, settings.breaker_pause, clock
        )
        # Up to PER_LANE batches wait per partition, LANES_BUDGET in all: the
        # next batch of every partition is fetched already when its batch ends.
        self.lanes = Lanes(self.pauses, self._batch, LANES_BUDGET * self._batch)
        # Partitions whose last batch was a whole batch of duplicates: their
        # next batch is a run of RUN_BATCHES, skimmed (kinbox.apply.skim).
        self._skimming: set[Partition] = set()
        # Key-ordered topics' concurrency: their batches are longer (batch_length).
        self._keyed = {t: r.concurrency for t, r in app.routes.items() if r.ordering == "key"}

    @property
    def assigned(self) -> Set[Partition]:
        """The partitions this member holds now."""
        return self.pauses.assigned

    def gate(self) -> None:
        """Before a poll: hold or let go of partitions as the breaker and the backoff say."""
        self.pauses.sync()
        self.breaker.gate()
        self.backoff.release_due()

    def take(self, records: list[Record]) -> None:
        """Queue one poll's records in their lanes."""
        # A poll returns each partition's records as runs, in offset order:
        # one step per run, not per record (this is the polling thread's
        # busiest loop in a replay).
        assigned, backoff = self.pauses.assigned, self.backoff
        for tp, run in groupby(records, _PARTITION):
            if tp not in assigned or tp in backoff:
                # Revoked meanwhile (its next owner reads it), or fetched
                # before a pause took effect (the partition was rewound and
                # will deliver these again after the resume).
                continue
            self.lanes.add(tp, list(run))

    def every_lane_holds(self, records: int) -> bool:
        """Whether every assigned partition (there is one at least) has ``records`` waiting."""
        assigned = self.pauses.assigned
        return bool(assigned) and all(self.lanes.waiting(tp) >= records for tp in assigned)

    def progress(self) -> None:
        """Collect the batches that ended and start the next ones, while that changes anything."""
        self._collect_ended()
        # An inline executor ends each batch as it starts: go on until every lane is empty.
        while self._start() and self._collect_ended():
            pass

    def advance(self, tp: Partition, result: BatchResult) -> None:
        """Count what ``result`` (of a batch of ``tp``) did, and move ``tp``'s offset past it."""
        self.breaker.observe(result)
        if result.next_offset is not None:
            self._offsets.advance(tp, result.next_offset)
            self.backoff.advanced(tp, result.next_offset)

    def assign(self, partitions: list[Partition]) -> None:
        """Start ``partitions`` with a clean slate."""
        for tp in partitions:
            self._forget(tp)
        self.pauses.assign(partitions)
        self.lanes.share(len(self.pauses.assigned))

    def unassign(self, partitions: list[Partition]) -> None:
        """``partitions`` went (revoked or lost): resume them and forget them."""
        self.pauses.unassign(partitions)
        for tp in partitions:
            self._forget(tp)
        self.lanes.share(len(self.pauses.assigned))

    def _forget(self, tp: Partition) -> None:
        self._skimming.discard(tp)
        self.lanes.drop(tp)
        self._offsets.forget(tp)
        self.backoff.forget(tp)
        self.breaker.forget(tp)

    def _start(self) -> bool:
        """Start a batch for each partition with records waiting and none in flight."""
        started = False
        for tp in self.lanes.ready():
            if self._inflight.full:
                break
            if tp in self._inflight or tp in self.backoff:
                continue
            skim = tp in self._skimming and self.breaker.state is State.CLOSED
            batch = self._admitted(tp, RUN_BATCHES * self._batch if skim else self._length(tp))
            if not batch:
                continue
            attempt = self.backoff.attempt(tp, batch[0].offset)
            work = partial(self._processor.process, batch, attempt, skim=skim)
            self._inflight.submit(tp, work, partial(self._label, tp, batch))
            started = True
        self.lanes.unhold()
        return started

    def _label(self, tp: Partition, batch: list[Record]) -> str:
        """``topic[p]@first..last`` and the handler, for the reports of a batch that runs long."""
        route = self._app.routes.get(tp[0])
        handler = f" (handler {route.name})" if route is not None else ""
        return f"{tp[0]}[{tp[1]}]@{batch[0].offset}..{batch[-1].offset}{handler}"

    def _length(self, tp: Partition) -> int:
        """Records of ``tp``'s lane its next batch takes at most."""
        concurrency = self._keyed.get(tp[0])
        if concurrency is None:
            return self._batch
        return batch_length(self.lanes.records(tp), self._batch, concurrency)

    def _admitted(self, tp: Partition, most: int) -> list[Record]:
        """Up to ``most`` of ``tp``'s lane, as far as the circuit breaker lets them run.

        A breaker open or half-open takes the whole lane: what it does not
        let through (all, or all but its probe) it rewinds and holds, so
        those records come again when it closes.
        """
        if self.breaker.state is State.CLOSED:
            return self.lanes.take(tp, most)
        lane = self.lanes.take(tp, self.lanes.waiting(tp))
        return self.breaker.admit({tp: lane}).get(tp, [])

    def _collect_ended(self) -> bool:
        ended = self._inflight.finished()
        for tp, future in ended:
            self._collect(tp, future)
        return bool(ended)

    def _collect(self, tp: Partition, future: Future[BatchResult]) -> None:
        result = future.result()  # a batch's exception ends the loop, as it did the batch
        if tp not in self.pauses.assigned:
            return  # revoked or lost meanwhile: not ours to commit or rewind
        self.advance(tp, result)
        if worth_skimming(result, self._batch):
            if tp not in self._skimming:
                log.info(
                    "%s: a whole batch of duplicates (a replay?): skimming its next records, "
                    "%d batches at a time, until a batch holds something fresh",
                    tp,
                    RUN_BATCHES,
                )
                self._skimming.add(tp)
        elif tp in self._skimming:
            log.debug("%s: fresh events again: batch by batch", tp)
            self._skimming.discard(tp)
        if result.failure is not None:
            self.backoff.fail(tp, result.failure)
            # The records fetched behind the failure come again after the rewind.
            self.lanes.drop(tp)
