"""The consume loop of one group member.

Each turn: poll a batch, split it by partition, apply each partition batch in
its own database transaction (:mod:`kinbox.batch`), then commit to Kafka the
offsets those transactions covered — never more (DESIGN invariant 2).

Everything runs on the polling thread, rebalance callbacks included (they fire
inside :meth:`Transport.poll`), so a callback never sees a batch half done.

A failed partition is paused and rewound to the failed offset, and resumed
after the policy's delay; meanwhile the loop keeps polling, so the member
stays in the group and the other partitions keep flowing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from kinbox.app import App
from kinbox.batch import BatchProcessor
from kinbox.config import Settings
from kinbox.envelope import Record
from kinbox.errors import ConfigurationError, TransportError
from kinbox.policy import Failure, FailurePolicy, RetryPolicy
from kinbox.store import InboxStore
from kinbox.transport import Partition, Transport

log = logging.getLogger(__name__)


class Runner:
    """Runs ``app``'s handlers over ``transport`` with ``store`` until :meth:`stop`.

    Args:
        app: the handlers.
        settings: validated settings.
        transport: Kafka (or a fake).
        store: the inbox (or a fake).
        policy: what to do about failures; default :class:`RetryPolicy`.
        clock: monotonic seconds, replaceable in tests.
    """

    def __init__(
        self,
        app: App,
        settings: Settings,
        transport: Transport,
        store: InboxStore,
        policy: FailurePolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not app.routes:
            raise ConfigurationError(f"{app!r} has no handlers: decorate one with @handler")
        self._app = app
        self._settings = settings
        self._transport = transport
        self._store = store
        self._policy = policy or RetryPolicy(settings.retry_initial, settings.retry_max)
        self._clock = clock
        self._processor = BatchProcessor(app.routes, store, settings.id_headers)
        self._stopping = False
        # Offsets whose events are committed in the database but not yet in Kafka.
        self._pending: dict[Partition, int] = {}
        # Paused partitions and when to resume them.
        self._paused_until: dict[Partition, float] = {}
        # Consecutive failures at an offset: (offset, count).
        self._failures: dict[Partition, tuple[int, int]] = {}

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
            self._commit()
            # close() revokes the assignment: on_revoked commits anything left.
            self._transport.close()
            self._store.close()
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

    def on_revoked(self, partitions: list[Partition]) -> None:
        """Commit what the database has committed for ``partitions`` before they go."""
        log.info("revoked %s", partitions)
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

    def _release(self, partitions: list[Partition]) -> None:
        paused = [tp for tp in partitions if tp in self._paused_until]
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
        self._pending.pop(tp, None)
        self._paused_until.pop(tp, None)
        self._failures.pop(tp, None)

    def _handle(self, records: list[Record]) -> None:
        by_partition: dict[Partition, list[Record]] = {}
        for record in records:
            by_partition.setdefault((record.topic, record.partition), []).append(record)
        for tp, batch in by_partition.items():
            if tp in self._paused_until:
                # Fetched before the pause took effect; the partition was
                # rewound and will deliver these again after the resume.
                continue
            failed_at, count = self._failures.get(tp, (-1, 0))
            attempt = count + 1 if batch[0].offset == failed_at else 1
            result = self._processor.process(batch, attempt)
            if result.next_offset is not None:
                self._pending[tp] = max(self._pending.get(tp, 0), result.next_offset)
                if result.next_offset > failed_at:
                    self._failures.pop(tp, None)
            if result.failure is not None:
                self._fail(tp, result.failure)

    def _fail(self, tp: Partition, failure: Failure) -> None:
        decision = self._policy.decide(failure)
        self._failures[tp] = (failure.offset, failure.attempt)
        where = f"{failure.topic}[{failure.partition}]@{failure.offset}"
        if failure.event is not None:
            where += f" (event {failure.event.id!r} at offset {failure.event.offset})"
        log.error(
            "%s failure at %s, attempt %d: %s: %s; rolled back, retrying in %.2fs; "
            "the offset is not committed past it",
            failure.kind,
            where,
            failure.attempt,
            type(failure.error).__name__,
            failure.error,
            decision.delay,
            exc_info=failure.kind == "handler" and failure.attempt == 1,
        )
        self._transport.pause([tp])
        self._transport.seek(tp, failure.offset)
        self._paused_until[tp] = self._clock() + decision.delay

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
