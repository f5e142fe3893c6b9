"""The consume loop of one group member.

Each turn: poll a batch, split it by partition, apply each partition batch in
its own database transaction (:mod:`kinbox.apply.batch`, on the worker thread of
:mod:`kinbox.consume.inflight`), then commit to Kafka the offsets those transactions
covered — never more (:mod:`kinbox.consume.offsets`, DESIGN invariant 2).

A partition that failed backs off (:mod:`kinbox.consume.backoff`): paused, rewound
to the failed offset and resumed after the policy's delay, while the loop
keeps polling. When the handler fails for event after event, the circuit
breaker (:mod:`kinbox.consume.breaker`) pauses every partition for a while
and then lets one event through. This module owns the loop, the assignment
and the rebalance callbacks, and wires those pieces together.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from kinbox.app import App
from kinbox.apply.batch import BatchProcessor
from kinbox.apply.outcome import BatchResult
from kinbox.apply.policy import FailurePolicy, RetryPolicy
from kinbox.config import Settings
from kinbox.consume.backoff import Backoff
from kinbox.consume.breaker import Breaker
from kinbox.consume.envelope import Record
from kinbox.consume.inflight import InFlight, Results
from kinbox.consume.lag import LagBoard
from kinbox.consume.offsets import Offsets
from kinbox.errors import ConfigurationError, FatalTransportError, TransportError
from kinbox.kafka.base import Partition, Publisher, Transport
from kinbox.middleware.base import Chain, WorkerInfo
from kinbox.store.base import InboxStore

log = logging.getLogger(__name__)

Job = tuple[Partition, list[Record], int]
"""One partition batch to apply: its partition, records and the first record's try."""


class Runner:
    """Runs ``app``'s handlers over ``transport`` with ``store`` until :meth:`stop`.

    Args:
        app: the handlers (and middleware).
        settings: validated settings.
        transport: Kafka (or a fake).
        store: the inbox (or a fake).
        policy: what to do about failures; default :class:`RetryPolicy`.
        clock: monotonic seconds, replaceable in tests.
        publisher: where dead letters go (closed by :meth:`run`).
        dead_letter_limits: record size limit per dead-letter topic (see
            :func:`kinbox.kafka.admin.check_dead_letter_topics`).
        lag: the consumer's lag per partition, filled by ``transport``;
            handed to the middleware (:class:`~kinbox.middleware.base.WorkerInfo`).
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
        dead_letter_limits: Mapping[str, int] | None = None,
        lag: LagBoard | None = None,
    ) -> None:
        if not app.routes:
            raise ConfigurationError(f"{app!r} has no handlers: decorate one with @handler")
        self._app = app
        self._settings = settings
        self._transport = transport
        self._store = store
        self._publisher = publisher
        self._lag = lag
        self._processor = BatchProcessor(
            app.routes,
            store,
            settings.id_headers,
            publisher=publisher,
            consumer=settings.group_id,
            max_attempts=settings.max_attempts,
            missing_id=settings.missing_id,
            middleware=app.middleware,
            dead_letter_limits=dead_letter_limits,
        )
        self._stopping = False
        self._broken = False
        self._assigned: set[Partition] = set()
        self._offsets = Offsets(transport)
        self._backoff = Backoff(
            transport, policy or RetryPolicy(settings.retry_initial, settings.retry_max), clock
        )
        self._breaker = Breaker(transport, settings.breaker_failures, settings.breaker_pause, clock)
        self._inflight = InFlight(
            transport,
            settings.batch_max_messages,
            # The consumer's own value: -X max.poll.interval.ms wins over the setting.
            revoke_wait=min(settings.shutdown_timeout, settings.effective_max_poll_interval / 2),
            keep_alive=self._offsets.commit,
        )

    def stop(self) -> None:
        """Ask the loop to finish the batch in hand and return (safe from a signal handler)."""
        self._stopping = True

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stopping

    def run(self) -> None:
        """Consume until :meth:`stop`; then commit what is committed in the DB and close.

        The middleware's ``before_worker_start`` runs first and its
        ``after_worker_stop`` last, on every path.

        Raises:
            FatalTransportError: the consumer is fatally broken (fenced by a
                member with its ``group.instance.id``, say). The worker must
                end: the client can never poll or commit again. The offsets
                already committed stay valid; a restart resumes from them.
            TransportError: Kafka refused the subscription.
        """
        worker = WorkerInfo(
            self._settings.group_id, tuple(self._app.topics), self._settings, self._lag
        )
        chain = Chain(self._app.middleware)
        try:
            chain.before_worker_start(worker)
        except BaseException:
            self._close()
            raise
        error: BaseException | None = None
        try:
            self._consume()
        except BaseException as exc:
            error = exc
            raise
        finally:
            chain.after_worker_stop(worker, error)

    def _consume(self) -> None:
        self._transport.subscribe(self._app.topics, self)
        log.info(
            "kinbox worker consuming %s as group %r", self._app.topics, self._settings.group_id
        )
        try:
            while not self._stopping:
                self.turn()
        except FatalTransportError as exc:
            self._broken = True  # from here on, a rebalance callback commits nothing
            error = self._explained(exc)
            log.error(
                "the Kafka consumer failed fatally and cannot be used again: %s. Stopping this "
                "worker; the offsets committed so far stay valid and a restart resumes from them",
                error,
            )
            if error is exc:
                raise
            raise error from exc
        finally:
            self._close()

    def _close(self) -> None:
        # A batch still running (an exception interrupted the wait) ends
        # first: its transaction must not race the pool's close.
        self._inflight.shutdown()
        if not self._broken:  # a fatally broken consumer refuses every commit
            self._offsets.commit()
        # close() revokes the assignment: on_revoked commits anything left.
        self._transport.close()
        self._store.close()
        if self._publisher is not None:
            self._publisher.close()
        log.info("kinbox worker stopped")

    def _explained(self, exc: FatalTransportError) -> FatalTransportError:
        """``exc``, or the consumer's own account of the fatal error if ``exc`` lacks it.

        A call the broken consumer refused (a commit, say) carries only the
        code ``_FATAL``; the reason (fenced, ...) is in the error event the
        consumer queued for its next poll, so one more poll reads it.
        """
        try:
            self._transport.poll(self._settings.batch_max_messages, 0.5)
        except FatalTransportError as reason:
            return reason
        except TransportError:
            pass
        return exc

    def turn(self) -> None:
        """One poll-apply-commit round (public so tests can step the loop)."""
        if self._breaker.gate(self._assigned, self._backoff.paused):
            self._backoff.resume_due()
        records = self._transport.poll(
            self._settings.batch_max_messages, self._settings.batch_max_wait
        )
        if records:
            self._handle(records)
        self._offsets.commit()

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
        if self._broken:
            self._release(partitions)  # nothing can be committed any more
            return
        for tp, result in self._inflight.results_for_revoke(partitions):
            if tp in partitions and result.next_offset is not None:
                self._offsets.advance(tp, result.next_offset)
        self._offsets.commit_leaving(partitions)
        self._release(partitions)

    def on_lost(self, partitions: list[Partition]) -> None:
        """Forget ``partitions``: another member owns them now, so commit nothing."""
        log.warning(
            "lost %s (expelled from the group); their offsets are not committed", partitions
        )
        self._release(partitions)

    # -- internals --

    def _release(self, partitions: list[Partition]) -> None:
        held = self._inflight.held
        paused = [
            tp
            for tp in partitions
            if tp in self._backoff.paused or tp in held or tp in self._breaker.held
        ]
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
        self._inflight.held.discard(tp)
        self._offsets.forget(tp)
        self._backoff.forget(tp)
        self._breaker.forget(tp)

    def _handle(self, records: list[Record]) -> None:
        self._offsets.handed(records)
        by_partition: dict[Partition, list[Record]] = {}
        for record in records:
            by_partition.setdefault((record.topic, record.partition), []).append(record)
        # A partition backing off was fetched before its pause took effect; it
        # was rewound and will deliver these again after the resume.
        runnable = {tp: b for tp, b in by_partition.items() if tp not in self._backoff.paused}
        jobs: list[Job] = [
            (tp, batch, self._backoff.attempt(tp, batch[0].offset))
            for tp, batch in self._breaker.admit(runnable).items()
        ]
        if not jobs:
            return
        holdable = sorted(
            tp
            for tp in self._assigned
            if tp not in self._backoff.paused and tp not in self._breaker.held
        )
        results = self._inflight.run(
            lambda: self._process(jobs), {tp for tp, _, _ in jobs}, holdable
        )
        for tp, result in results:
            # A partition revoked or lost meanwhile is not ours to commit or rewind.
            if tp in self._assigned:
                self._settle(tp, result)
        self._inflight.unhold(keep_paused=self._backoff.paused)

    def _process(self, jobs: list[Job]) -> Results:
        """Runs on the batch thread: database and handlers only, no runner state."""
        return [(tp, self._processor.process(batch, attempt)) for tp, batch, attempt in jobs]

    def _settle(self, tp: Partition, result: BatchResult) -> None:
        self._breaker.observe(result)
        if result.next_offset is not None:
            self._offsets.advance(tp, result.next_offset)
            self._backoff.advanced(tp, result.next_offset)
        if result.failure is not None:
            self._backoff.fail(tp, result.failure)
            self._inflight.held.discard(tp)  # paused for its backoff now, not for the batch
