"""The consume loop of one group member: poll, wait, commit, follow the rebalances, stop.

Each turn polls and hands the records to the :class:`~kinbox.consume.flow.BatchFlow`,
which queues them per partition, starts a batch for every partition that has
records and none in flight (each on a worker thread, in its own database
transaction, :mod:`kinbox.apply.batch`) and collects the results of those
that ended; then the turn sends to Kafka the offsets their transactions
covered — never more (:mod:`kinbox.consume.offsets`, docs/design.md
invariant 2).

So partitions are applied side by side, each in offset order, and the
polling thread never waits for a batch: while one partition's transaction
commits, the next partition's runs and the next records are fetched. Offsets
are committed asynchronously as batches end (synchronously on revoke and at
shutdown), each only after its own transaction, contiguous per partition
(a partition's batches end in order), and never for a partition revoked or
lost meanwhile.

Stopping is bounded, whatever stops the loop — :meth:`Runner.stop` (a
signal), a fatally failed consumer, ``missing_id=fail``, a batch that raised
(a middleware's hook, a handler's ``sys.exit()``), a thread that died: the
batches in flight get until ``shutdown_timeout`` after the stop began, less
a share kept for committing and closing (:data:`CLOSING_SHARE`); their
offsets are committed, and those still running then are left to the
process's exit (:meth:`Runner.unfinished`), their offsets not committed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor

from kinbox.app import App
from kinbox.apply.batch import BatchProcessor
from kinbox.consume.flow import BatchFlow
from kinbox.consume.inflight import HOLD_AFTER, InFlight
from kinbox.consume.offsets import Offsets
from kinbox.core.config import Settings
from kinbox.core.describe import describe
from kinbox.core.errors import ConfigurationError, FatalTransportError, KinboxError, TransportError
from kinbox.core.inbox import InboxStore
from kinbox.core.lag import LagBoard
from kinbox.core.policy import FailurePolicy, RetryPolicy
from kinbox.core.publisher import Publisher
from kinbox.core.transport import Partition, Transport, ValueReader, ValueReading
from kinbox.middleware.base import Chain, WorkerInfo

log = logging.getLogger(__name__)

BUSY_WAIT = 0.002
"""Seconds the loop sleeps, with batches in flight and nothing fetched, before polling again.

It wakes at once when a batch ends; the bound only says how soon a record
that arrives meanwhile is fetched.
"""

ANSWER_WAIT_SLICE = 0.005
"""Seconds an idle poll waits at most while settled offsets queue behind a commit in flight.

An idle poll otherwise waits ``batch_max_wait``, and the broker's answer,
which only a poll serves, would hold the next commit that long; a
coordinator answers in a few milliseconds.
"""

CLOSING_SHARE = 0.25
"""The part of ``shutdown_timeout`` kept, after the wait for the batches in flight, for
committing offsets and closing the clients (:data:`CLOSING_MOST` at most)."""

CLOSING_MOST = 5.0
"""Seconds of ``shutdown_timeout`` kept for committing and closing, at most."""

SATURATED_WAIT = 0.05
"""The same sleep when every assigned partition already has records waiting.

A record fetched then could only queue behind them: nothing can start
before a batch ends, and that wakes the loop at once. Polling anyway costs
CPU and takes the GIL from the batch threads, so while every partition has
a whole next batch waiting the loop does not poll at all, for up to this
long after its last poll (``Runner._stocked``).
"""


class Runner:
    """Runs ``app``'s handlers over ``transport`` with ``store`` until :meth:`stop`.

    Args:
        app: the handlers (and middleware).
        settings: validated settings; ``pool_size`` partition batches run at once.
        transport: Kafka (or a fake).
        store: the inbox (or a fake).
        policy: what to do about failures; default :class:`RetryPolicy`.
        clock: monotonic seconds, replaceable in tests.
        publisher: where dead letters go (closed by :meth:`run`).
        dead_letter_limits: record size limit per dead-letter topic (see
            :func:`kinbox.kafka.admin.check_dead_letter_topics`).
        executor: runs the batches; by default a thread pool of
            ``settings.pool_size``. :class:`kinbox.testing.InlineExecutor`
            applies each batch inside :meth:`turn`, for deterministic tests.
        lag: the consumer's lag per partition, filled by ``transport``;
            handed to the middleware (:class:`~kinbox.middleware.base.WorkerInfo`).
        on_stopping: called once as the loop ends, on the polling thread and
            before anything is closed, with the error that ends it (``None``
            after :meth:`stop` without one): ``kinbox worker`` starts the
            clock of its shutdown bound there.
        value_reader: the Kafka driver's reader of confluent-kafka
            deserializers' values, for handlers registered with one; by
            default ``transport``'s, when it reads values
            (:class:`~kinbox.core.transport.ValueReading`).
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
        executor: Executor | None = None,
        lag: LagBoard | None = None,
        on_stopping: Callable[[BaseException | None], None] | None = None,
        value_reader: ValueReader | None = None,
    ) -> None:
        if not app.routes:
            raise ConfigurationError(f"{app!r} has no handlers: decorate one with @handler")
        self._app = app
        self._settings = settings
        self._transport = transport
        self._store = store
        self._publisher = publisher
        self._lag = lag
        if value_reader is None and isinstance(transport, ValueReading):
            value_reader = transport.value_reader
        processor = self._processor = BatchProcessor(
            app.routes,
            store,
            settings.id_headers,
            publisher=publisher,
            consumer=settings.group_id,
            max_attempts=settings.max_attempts,
            missing_id=settings.missing_id,
            middleware=app.middleware,
            dead_letter_limits=dead_letter_limits,
            batch_size=settings.batch_max_messages,
            value_reader=value_reader,
        )
        self._stopping = False
        self._stop_at: float | None = None  # when the stop began (time.monotonic)
        self._failure: BaseException | None = None  # what stop() was given to raise
        self._on_stopping = on_stopping
        self._broken = False
        self._offsets = Offsets(transport)
        self._inflight = InFlight(settings.pool_size, executor)
        policy = policy or RetryPolicy(settings.retry_initial, settings.retry_max)
        self._flow = BatchFlow(
            app, settings, transport, processor, self._inflight, self._offsets, policy, clock
        )
        self._clock = clock
        self._polled = -SATURATED_WAIT
        # The consumer's own value: -X max.poll.interval.ms wins over the setting.
        self._revoke_wait = min(settings.shutdown_timeout, settings.effective_max_poll_interval / 2)

    def stop(self, error: BaseException | None = None) -> None:
        """Ask the loop to finish the batches in hand and return (safe from a signal handler).

        With ``error`` (any thread may give one: a thread that died), :meth:`run`
        raises it once the worker is closed; the first one given is kept.
        """
        if self._stop_at is None:
            self._stop_at = time.monotonic()
        if error is not None and self._failure is None:
            self._failure = error
        self._stopping = True

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stopping

    def unfinished(self) -> int:
        """Batches still running after :meth:`run` returned: those its bounded wait left.

        Their offsets were not committed; their threads (and the store and
        dead-letter publisher they use, left open for them) end with the
        process, which closes their connections, so PostgreSQL rolls back
        whatever transaction is still open.
        """
        return self._inflight.unfinished()

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
            EnvelopeError: a record without a valid id, under ``missing_id=fail``.
            ExitRequested: a handler or middleware hook raised ``SystemExit``
                or ``KeyboardInterrupt``.
            BaseException: what a batch raised (a middleware's ``before_batch``,
                a bug), or what :meth:`stop` was given.
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
        failed: BaseException | None = None
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
            self._stopped(error)
            if error is exc:
                raise
            raise error from exc
        except BaseException as exc:
            self._stopped(exc)
            raise
        else:
            self._stopped(self._failure, told=True)  # who gave it has said why
        finally:
            failed = self._close()
        if failed is None:
            failed = self._failure
        if failed is not None:
            raise failed  # a batch raised (a middleware's before_batch) as the loop stopped

    def _stopped(self, error: BaseException | None, *, told: bool = False) -> None:
        """The loop ended (on ``error``, if any): the shutdown's clock starts, if it has not.

        ``error`` is logged unless ``told``: at ERROR, with its traceback
        when it is not one of kinbox's own, whose messages say it all.
        """
        if self._stop_at is None:
            self._stop_at = time.monotonic()
        if error is not None and not told and not isinstance(error, FatalTransportError):
            own = isinstance(error, KinboxError)
            log.error("stopping this worker: %s", describe(error), exc_info=None if own else error)
        if self._on_stopping is not None:
            self._on_stopping(error)

    def _close(self) -> BaseException | None:
        """Wait for the batches in flight, commit, close everything; return a batch's exception.

        The batches still running get until the shutdown deadline (see
        :data:`CLOSING_SHARE`): their offsets can still be committed. Those
        running longer are left to the process's exit, and so are the store
        and the publisher they use: closing the pool would not end their
        transactions anyway (a connection in use is closed only when given
        back), and the process's exit does, rolling back what is still open.
        """
        failed: BaseException | None = None
        for tp, future in self._inflight.drain(self._time_left()):
            exc = future.exception()
            if exc is not None:
                failed = failed or exc
            elif not self._broken and tp in self._flow.assigned:
                self._flow.advance(tp, future.result())
        left = self._inflight.unfinished()
        self._inflight.shutdown()
        self._processor.close()
        if not self._broken:  # a fatally broken consumer refuses every commit
            try:
                self._offsets.commit_now()
            except FatalTransportError as exc:
                log.error("final offset commit: the consumer failed fatally: %s", exc)
        # close() revokes the assignment: on_revoked commits anything left.
        self._transport.close()
        if not left:
            self._store.close()
            if self._publisher is not None:
                self._publisher.close()
        log.info("kinbox worker stopped")
        return failed

    def _time_left(self) -> float:
        """Seconds the batches in flight may still take.

        Until the shutdown deadline, less what committing and closing keep.
        """
        timeout = self._settings.shutdown_timeout
        started = time.monotonic() if self._stop_at is None else self._stop_at
        closing = min(CLOSING_MOST, timeout * CLOSING_SHARE)
        return started + timeout - closing - time.monotonic()

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
        """One round: poll, start batches, collect those that ended, send offsets.

        Public so tests can step the loop (with an inline executor, every
        batch started in a turn is also collected in it).
        """
        self._flow.gate()
        busy = len(self._inflight) > 0
        if busy and self._stocked():
            # Every partition's next batch is fetched already: whatever a poll
            # brought could only queue, and its consume() gives the GIL away
            # and waits to take it back from the batch threads.
            self._inflight.wait(SATURATED_WAIT)
        else:
            # With batches in flight, a poll must not wait: a batch ending is
            # what there is to do next, and wait() wakes for it at once.
            wait = 0.0 if busy else self._settings.batch_max_wait
            if wait > ANSWER_WAIT_SLICE and self._offsets.queued():
                wait = ANSWER_WAIT_SLICE
            records = self._transport.poll(self._settings.batch_max_messages, wait)
            self._polled = self._clock()
            if records:
                self._flow.take(records)
            elif busy:
                saturated = self._flow.every_lane_holds(1)
                self._inflight.wait(SATURATED_WAIT if saturated else BUSY_WAIT)
        self._flow.progress()
        for tp, seconds in self._inflight.slow():
            log.info(
                "batch on %s still running after %.1fs: pausing its partition once %d more "
                "records of it are fetched; the other partitions go on, and polling goes on "
                "to stay in the group",
                tp,
                max(seconds, HOLD_AFTER),
                self._flow.lanes.cap,
            )
        self._inflight.report_stuck()
        self._offsets.commit()

    # -- rebalance listener (called from inside Transport.poll / close) --

    def on_assigned(self, partitions: list[Partition]) -> None:
        """Start assigned partitions with a clean slate."""
        log.info("assigned %s", partitions)
        self._flow.assign(partitions)

    def on_revoked(self, partitions: list[Partition]) -> None:
        """Commit what the database has committed for ``partitions`` before they go.

        A batch in flight on any of them is waited for (bounded), so its
        offsets are committed by this member rather than its events redelivered.
        """
        log.info("revoked %s", partitions)
        if self._broken:
            self._inflight.orphan(partitions)
            self._flow.unassign(partitions)  # nothing can be committed any more
            return
        for tp, future in self._inflight.wait_for(partitions, self._revoke_wait):
            if tp in self._flow.assigned:
                self._flow.advance(tp, future.result())
        self._offsets.commit_leaving(partitions)
        self._flow.unassign(partitions)

    def on_lost(self, partitions: list[Partition]) -> None:
        """Forget ``partitions``: another member owns them now, so commit nothing."""
        log.warning(
            "lost %s (expelled from the group); their offsets are not committed", partitions
        )
        self._inflight.orphan(partitions)
        self._flow.unassign(partitions)

    def on_committed(self, offsets: Mapping[Partition, int], error: TransportError | None) -> None:
        """The broker's answer to an asynchronous offset commit."""
        self._offsets.answered(offsets, error)

    # -- internals --

    def _stocked(self) -> bool:
        """Whether every assigned partition has a whole next batch waiting, and a poll was recent.

        Recent: within :data:`SATURATED_WAIT`, so rebalances, errors and
        commit answers, which only a poll serves, still wait no longer than
        they would otherwise.
        """
        if self._clock() - self._polled >= SATURATED_WAIT:
            return False
        return self._flow.every_lane_holds(self._settings.batch_max_messages)
