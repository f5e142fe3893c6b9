"""The consume loop of one group member.

Each turn: poll a batch, split it by partition, apply each partition batch in
its own database transaction (:mod:`kinbox.batch`), then commit to Kafka the
offsets those transactions covered — never more (DESIGN invariant 2).

Batches run on one worker thread; the polling thread owns the consumer and
all of the runner's state. A batch that takes longer than a moment — a slow
handler, a database that went away — must not turn this member into a
zombie: if the group expelled it (``max.poll.interval.ms``), its partitions
would go to another member while it still works on them, and the commit at
the end would be for a generation that is gone. So while a batch is in
flight the polling thread pauses every assigned partition and keeps calling
``poll()``: the member stays in the group however long the handler takes,
and rebalance callbacks are served. A revoke that touches the batch's
partitions waits for it (at most ``min(shutdown_timeout, max_poll_interval / 2)``)
and commits what it committed before letting the partitions go; a batch that
outlives that wait has its offsets dropped — its database work is safe either
way, the next owner's claim blocks on its rows and then finds them recorded.

A failed partition is paused and rewound to the failed offset, and resumed
after the policy's delay; meanwhile the loop keeps polling, so the member
stays in the group and the other partitions keep flowing.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from kinbox.app import App
from kinbox.batch import BatchProcessor, BatchResult
from kinbox.config import Settings
from kinbox.envelope import Record
from kinbox.errors import ConfigurationError, EnvelopeError, TransportError
from kinbox.policy import Failure, FailurePolicy, RetryPolicy
from kinbox.store import InboxStore
from kinbox.transport import Partition, Publisher, Transport

log = logging.getLogger(__name__)

Results = list[tuple[Partition, BatchResult]]

HOLD_AFTER = 1.0
"""Seconds a batch may run before the polling thread pauses the partitions and polls."""


class Runner:
    """Runs ``app``'s handlers over ``transport`` with ``store`` until :meth:`stop`.

    Args:
        app: the handlers.
        settings: validated settings.
        transport: Kafka (or a fake).
        store: the inbox (or a fake).
        policy: what to do about failures; default :class:`RetryPolicy`.
        clock: monotonic seconds, replaceable in tests.
        publisher: where dead letters go (closed by :meth:`run`).
    """

    def __init__(
        self,
        app: App,
        settings: Settings,
        transport: Transport,
        store: InboxStore,
        policy: FailurePolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
        publisher: Publisher | None = None,
    ) -> None:
        if not app.routes:
            raise ConfigurationError(f"{app!r} has no handlers: decorate one with @handler")
        self._app = app
        self._settings = settings
        self._transport = transport
        self._store = store
        self._policy = policy or RetryPolicy(settings.retry_initial, settings.retry_max)
        self._clock = clock
        self._publisher = publisher
        self._processor = BatchProcessor(
            app.routes,
            store,
            settings.id_headers,
            publisher=publisher,
            consumer=settings.group_id,
            max_attempts=settings.max_attempts,
            missing_id=settings.missing_id,
        )
        self._stopping = False
        self._assigned: set[Partition] = set()
        # Offsets whose events are committed in the database but not yet in Kafka.
        self._pending: dict[Partition, int] = {}
        # Paused after a failure, and when to resume them.
        self._paused_until: dict[Partition, float] = {}
        # Failures at an offset: (offset, handler tries so far, failures of any kind).
        self._failures: dict[Partition, tuple[int, int, int]] = {}
        # Paused only because a batch is in flight.
        self._held: set[Partition] = set()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="kinbox-batch")
        self._inflight: Future[Results] | None = None
        self._inflight_tps: set[Partition] = set()
        self._revoke_wait = min(settings.shutdown_timeout, settings.max_poll_interval / 2)

    def stop(self) -> None:
        """Ask the loop to finish the batch in hand and return (safe from a signal handler)."""
        self._stopping = True

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stopping

    def run(self) -> None:
        """Consume until :meth:`stop`; then commit what is committed in the DB and close.

        Raises:
            TransportError: Kafka failed fatally (the offsets already committed
                stay valid; a restart resumes from them).
        """
        self._transport.subscribe(self._app.topics, self)
        log.info(
            "kinbox worker consuming %s as group %r", self._app.topics, self._settings.group_id
        )
        try:
            while not self._stopping:
                self.turn()
        finally:
            # A batch still running (an exception interrupted the wait) ends
            # first: its transaction must not race the pool's close.
            self._executor.shutdown(wait=True)
            self._commit()
            # close() revokes the assignment: on_revoked commits anything left.
            self._transport.close()
            self._store.close()
            if self._publisher is not None:
                self._publisher.close()
            log.info("kinbox worker stopped")

    def turn(self) -> None:
        """One poll-apply-commit round (public so tests can step the loop)."""
        self._resume_due()
        records = self._transport.poll(
            self._settings.batch_max_messages, self._settings.batch_max_wait
        )
        if records:
            self._handle(records)
        self._commit()

    # -- rebalance listener (called from inside Transport.poll / close) --

    def on_assigned(self, partitions: list[Partition]) -> None:
        """Start assigned partitions with a clean slate."""
        log.info("assigned %s", partitions)
        for tp in partitions:
            self._forget(tp)
            self._assigned.add(tp)

    def on_revoked(self, partitions: list[Partition]) -> None:
        """Commit what the database has committed for ``partitions`` before they go.

        A batch in flight on any of them is waited for (bounded), so its
        offsets are committed by this member rather than its events redelivered.
        """
        log.info("revoked %s", partitions)
        if self._inflight is not None and self._inflight_tps.intersection(partitions):
            self._await_for_revoke(self._inflight, partitions)
        offsets = {tp: self._pending[tp] for tp in partitions if tp in self._pending}
        if offsets:
            try:
                self._transport.commit(offsets)
            except TransportError as exc:
                # Whatever the reason, the partition is leaving: never retry
                # this commit onto the next owner. It re-reads from the last
                # committed offset and the inbox suppresses the repeats.
                log.warning("offset commit on revoke dropped: %s", exc)
        self._release(partitions)

    def on_lost(self, partitions: list[Partition]) -> None:
        """Forget ``partitions``: another member owns them now, so commit nothing."""
        log.warning(
            "lost %s (expelled from the group); their offsets are not committed", partitions
        )
        self._release(partitions)

    # -- internals --

    def _await_for_revoke(self, future: Future[Results], partitions: list[Partition]) -> None:
        try:
            results = future.result(timeout=self._revoke_wait)
        except FutureTimeout:
            log.warning(
                "revoke of %s: the batch in flight is still running after %.1fs; its offsets "
                "will not be committed (its database work is safe: the next owner's claim "
                "waits for it and then suppresses it)",
                partitions,
                self._revoke_wait,
            )
            return
        except Exception:
            return  # the polling loop re-raises it from the same future
        for tp, result in results:
            if tp in partitions and result.next_offset is not None:
                self._pending[tp] = max(self._pending.get(tp, 0), result.next_offset)

    def _release(self, partitions: list[Partition]) -> None:
        paused = [tp for tp in partitions if tp in self._paused_until or tp in self._held]
        if paused:
            try:
                # Pausing is the member's own state; don't let it outlive the
                # assignment and stall a later re-assignment of the partition.
                self._transport.resume(paused)
            except TransportError as exc:
                log.debug("resume on release failed: %s", exc)
        for tp in partitions:
            self._forget(tp)

    def _forget(self, tp: Partition) -> None:
        self._assigned.discard(tp)
        self._held.discard(tp)
        self._pending.pop(tp, None)
        self._paused_until.pop(tp, None)
        self._failures.pop(tp, None)

    def _handle(self, records: list[Record]) -> None:
        by_partition: dict[Partition, list[Record]] = {}
        for record in records:
            by_partition.setdefault((record.topic, record.partition), []).append(record)
        jobs = []
        for tp, batch in by_partition.items():
            if tp in self._paused_until:
                # Fetched before the pause took effect; the partition was
                # rewound and will deliver these again after the resume.
                continue
            failed_at, tries, _ = self._failures.get(tp, (-1, 0, 0))
            attempt = tries + 1 if batch[0].offset == failed_at else 1
            jobs.append((tp, batch, attempt))
        if not jobs:
            return
        future = self._executor.submit(self._process, jobs)
        for tp, result in self._wait(future, {tp for tp, _, _ in jobs}):
            # A partition revoked or lost meanwhile is not ours to commit or rewind.
            if tp in self._assigned:
                self._settle(tp, result)
        self._unhold()

    def _process(self, jobs: list[tuple[Partition, list[Record], int]]) -> Results:
        """Runs on the batch thread: database and handlers only, no runner state."""
        return [(tp, self._processor.process(batch, attempt)) for tp, batch, attempt in jobs]

    def _wait(self, future: Future[Results], partitions: set[Partition]) -> Results:
        try:
            return future.result(timeout=HOLD_AFTER)
        except FutureTimeout:
            pass
        held = sorted(tp for tp in self._assigned if tp not in self._paused_until)
        log.info(
            "batch on %s still running after %.1fs: pausing %d partition(s), polling meanwhile "
            "to stay in the group",
            sorted(partitions),
            HOLD_AFTER,
            len(held),
        )
        self._transport.pause(held)
        self._held.update(held)
        self._inflight, self._inflight_tps = future, partitions
        try:
            while not future.done():
                stray = self._transport.poll(self._settings.batch_max_messages, 0.2)
                if stray:
                    self._put_back(stray)
                self._commit()
        finally:
            self._inflight, self._inflight_tps = None, set()
        return future.result()

    def _put_back(self, records: list[Record]) -> None:
        """Rewind and pause partitions that delivered while a batch is in flight.

        Paused partitions deliver nothing, but one assigned during the wait
        was not paused: its records are handed back, never dropped.
        """
        first: dict[Partition, int] = {}
        for record in records:
            tp = (record.topic, record.partition)
            first[tp] = min(first.get(tp, record.offset), record.offset)
        for tp, offset in first.items():
            self._transport.pause([tp])
            self._transport.seek(tp, offset)
            self._held.add(tp)

    def _unhold(self) -> None:
        due = sorted(tp for tp in self._held if tp not in self._paused_until)
        self._held.clear()
        if due:
            self._transport.resume(due)

    def _settle(self, tp: Partition, result: BatchResult) -> None:
        if result.next_offset is not None:
            self._pending[tp] = max(self._pending.get(tp, 0), result.next_offset)
            failed_at = self._failures.get(tp, (-1, 0, 0))[0]
            if result.next_offset > failed_at:
                self._failures.pop(tp, None)
        if result.failure is not None:
            self._fail(tp, result.failure)

    def _fail(self, tp: Partition, failure: Failure) -> None:
        where = f"{failure.topic}[{failure.partition}]@{failure.offset}"
        if failure.kind == "envelope":
            # missing_id=fail: stop here; run() commits what is before it.
            raise EnvelopeError(
                f"missing_id=fail: {failure.error}; stopping the worker. Offsets are "
                f"committed up to {where}, so a restart meets this record again: fix it, or "
                "run with missing_id=dead-letter",
                topic=failure.topic,
                partition=failure.partition,
                offset=failure.offset,
            ) from failure.error
        offset, tries, streak = self._failures.get(tp, (-1, 0, 0))
        if offset != failure.offset:
            tries, streak = 0, 0
        if failure.kind == "handler":
            tries = failure.attempt
        streak += 1
        self._failures[tp] = (failure.offset, tries, streak)
        decision = self._policy.decide(dataclasses.replace(failure, streak=streak))
        if failure.event is not None:
            where += f" (event {failure.event.id!r})"
        log.error(
            "%s failure at %s, attempt %d: %s: %s; rolled back, retrying in %.2fs; "
            "the offset is not committed past it",
            failure.kind,
            where,
            failure.attempt,
            type(failure.error).__name__,
            failure.error,
            decision.delay,
            exc_info=failure.error if failure.kind == "handler" and failure.attempt == 1 else None,
        )
        self._transport.pause([tp])
        self._transport.seek(tp, failure.offset)
        self._paused_until[tp] = self._clock() + decision.delay
        self._held.discard(tp)

    def _resume_due(self) -> None:
        now = self._clock()
        due = [tp for tp, until in self._paused_until.items() if until <= now]
        if due:
            for tp in due:
                del self._paused_until[tp]
            self._transport.resume(due)

    def _commit(self) -> None:
        if not self._pending:
            return
        offsets = dict(self._pending)
        try:
            self._transport.commit(offsets)
        except TransportError as exc:
            if exc.retriable:
                log.warning("offset commit failed, will retry: %s", exc)
                return
            log.warning("offset commit rejected by the broker, dropped: %s", exc)
        for tp, offset in offsets.items():
            if self._pending.get(tp) == offset:
                del self._pending[tp]
