"""The consume loop of one group member.

Each turn: poll, queue the records per partition (:mod:`kinbox.consume.lanes`),
start a batch for every partition that has records and no batch in flight
(:mod:`kinbox.consume.inflight`: each batch on a worker thread, in its own
database transaction, :mod:`kinbox.apply.batch`), collect the results of
the batches that ended, and send to Kafka the offsets their transactions
covered — never more (:mod:`kinbox.consume.offsets`, docs/design.md
invariant 2).

So partitions are applied side by side, each in offset order, and the
polling thread never waits for a batch: while one partition's transaction
commits, the next partition's runs and the next records are fetched. Offsets
are committed asynchronously as batches end (synchronously on revoke and at
shutdown), each only after its own transaction, contiguous per partition
(a partition's batches end in order), and never for a partition revoked or
lost meanwhile.

A partition that failed backs off (:mod:`kinbox.consume.backoff`): paused, rewound
to the failed offset and resumed after the policy's delay, while the loop
keeps polling. When the handler fails for event after event, the circuit
breaker (:mod:`kinbox.consume.breaker`) pauses every partition for a while
and then lets one event through. This module owns the loop, the assignment
and the rebalance callbacks, and wires those pieces together.

Three of them hold partitions paused: the lanes (a full lane), the backoff
and the breaker. Each says so to one :class:`~kinbox.consume.pauses.PauseLedger`,
which alone pauses and resumes the consumer: a partition is paused while any
of them holds it.

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
from concurrent.futures import Executor, Future
from functools import partial
from itertools import groupby
from operator import itemgetter

from kinbox.app import App
from kinbox.apply.batch import BatchProcessor
from kinbox.apply.skim import RUN_BATCHES, worth_skimming
from kinbox.consume.backoff import Backoff
from kinbox.consume.breaker import Breaker, State
from kinbox.consume.inflight import HOLD_AFTER, InFlight
from kinbox.consume.lanes import Lanes
from kinbox.consume.offsets import Offsets
from kinbox.consume.pauses import PauseLedger
from kinbox.core.config import Settings
from kinbox.core.describe import describe
from kinbox.core.errors import ConfigurationError, FatalTransportError, KinboxError, TransportError
from kinbox.core.inbox import InboxStore
from kinbox.core.lag import LagBoard
from kinbox.core.outcome import BatchResult
from kinbox.core.policy import FailurePolicy, RetryPolicy
from kinbox.core.publisher import Publisher
from kinbox.core.record import Record
from kinbox.core.transport import Partition, Transport, ValueReader, ValueReading
from kinbox.middleware.base import Chain, WorkerInfo

log = logging.getLogger(__name__)

LANES_BUDGET = 64
"""Batches waiting in all lanes together: sixteen each for up to four partitions."""

_PARTITION = itemgetter(0, 1)
"""A :class:`~kinbox.core.record.Record`'s ``(topic, partition)``."""

BUSY_WAIT = 0.002
"""Seconds the loop sleeps, with batches in flight and nothing fetched, before polling again.

It wakes at once when a batch ends; the bound only says how soon a record
that arrives meanwhile is fetched.
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
            batch_size=settings.batch_max_messages,
            value_reader=value_reader,
        )
        self._stopping = False
        self._stop_at: float | None = None  # when the stop began (time.monotonic)
        self._failure: BaseException | None = None  # what stop() was given to raise
        self._on_stopping = on_stopping
        self._broken = False
        self._pauses = PauseLedger(transport)
        self._assigned = self._pauses.assigned
        # Partitions whose last batch was a whole batch of duplicates: their
        # next batch is a run of RUN_BATCHES, skimmed (kinbox.apply.skim).
        self._skimming: set[Partition] = set()
        self._offsets = Offsets(transport)
        self._backoff = Backoff(
            transport,
            self._pauses,
            policy or RetryPolicy(settings.retry_initial, settings.retry_max),
            clock,
        )
        self._breaker = Breaker(
            transport, self._pauses, settings.breaker_failures, settings.breaker_pause, clock
        )
        self._clock = clock
        self._polled = -SATURATED_WAIT
        # Up to PER_LANE batches wait per partition, LANES_BUDGET in all: the
        # next batch of every partition is fetched already when its batch ends.
        most = settings.batch_max_messages
        self._lanes = Lanes(self._pauses, most, LANES_BUDGET * most)
        self._inflight = InFlight(settings.pool_size, executor)
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
        """Wait for the batches in flight, commit, release everything; return a batch's exception.

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
            elif not self._broken and tp in self._assigned:
                self._advance(tp, future.result())
        left = self._inflight.unfinished()
        self._inflight.shutdown()
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
        self._pauses.sync()
        self._breaker.gate()
        self._backoff.release_due()
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
            records = self._transport.poll(self._settings.batch_max_messages, wait)
            self._polled = self._clock()
            if records:
                self._take(records)
            elif busy:
                self._inflight.wait(SATURATED_WAIT if self._saturated() else BUSY_WAIT)
        self._progress()
        for tp, seconds in self._inflight.slow():
            log.info(
                "batch on %s still running after %.1fs: pausing its partition once %d more "
                "records of it are fetched; the other partitions go on, and polling goes on "
                "to stay in the group",
                tp,
                max(seconds, HOLD_AFTER),
                self._lanes.cap,
            )
        self._inflight.report_stuck()
        self._offsets.commit()

    # -- rebalance listener (called from inside Transport.poll / close) --

    def on_assigned(self, partitions: list[Partition]) -> None:
        """Start assigned partitions with a clean slate."""
        log.info("assigned %s", partitions)
        for tp in partitions:
            self._forget(tp)
        self._pauses.assign(partitions)
        self._lanes.share(len(self._assigned))

    def on_revoked(self, partitions: list[Partition]) -> None:
        """Commit what the database has committed for ``partitions`` before they go.

        A batch in flight on any of them is waited for (bounded), so its
        offsets are committed by this member rather than its events redelivered.
        """
        log.info("revoked %s", partitions)
        if self._broken:
            self._inflight.orphan(partitions)
            self._release(partitions)  # nothing can be committed any more
            return
        for tp, future in self._inflight.wait_for(partitions, self._revoke_wait):
            if tp in self._assigned:
                self._advance(tp, future.result())
        self._offsets.commit_leaving(partitions)
        self._release(partitions)

    def on_lost(self, partitions: list[Partition]) -> None:
        """Forget ``partitions``: another member owns them now, so commit nothing."""
        log.warning(
            "lost %s (expelled from the group); their offsets are not committed", partitions
        )
        self._inflight.orphan(partitions)
        self._release(partitions)

    def on_committed(self, offsets: Mapping[Partition, int], error: TransportError | None) -> None:
        """The broker's answer to an asynchronous offset commit."""
        self._offsets.answered(offsets, error)

    # -- internals --

    def _release(self, partitions: list[Partition]) -> None:
        self._pauses.revoke(partitions)
        for tp in partitions:
            self._forget(tp)
        self._lanes.share(len(self._assigned))

    def _forget(self, tp: Partition) -> None:
        self._skimming.discard(tp)
        self._lanes.drop(tp)
        self._offsets.forget(tp)
        self._backoff.forget(tp)
        self._breaker.forget(tp)

    def _stocked(self) -> bool:
        """Whether every assigned partition has a whole next batch waiting, and a poll was recent.

        Recent: within :data:`SATURATED_WAIT`, so rebalances, errors and
        commit answers, which only a poll serves, still wait no longer than
        they would otherwise.
        """
        if self._clock() - self._polled >= SATURATED_WAIT:
            return False
        return self._every_lane_holds(self._settings.batch_max_messages)

    def _saturated(self) -> bool:
        """Whether every assigned partition has records waiting for its next batch."""
        return self._every_lane_holds(1)

    def _every_lane_holds(self, records: int) -> bool:
        """Whether every assigned partition (there is one at least) has ``records`` waiting."""
        return bool(self._assigned) and all(
            self._lanes.waiting(tp) >= records for tp in self._assigned
        )

    def _take(self, records: list[Record]) -> None:
        # A poll returns each partition's records as runs, in offset order:
        # one step per run, not per record (this is the polling thread's
        # busiest loop in a replay).
        for tp, run in groupby(records, _PARTITION):
            batch = list(run)
            if tp not in self._assigned or tp in self._backoff:
                # Revoked meanwhile (its next owner reads it), or fetched
                # before a pause took effect (the partition was rewound and
                # will deliver these again after the resume).
                continue
            self._lanes.add(tp, batch)

    def _progress(self) -> None:
        """Collect the batches that ended and start the next ones, while that changes anything."""
        self._collect_ended()
        # An inline executor ends each batch as it starts: go on until every lane is empty.
        while self._start() and self._collect_ended():
            pass

    def _start(self) -> bool:
        """Start a batch for each partition with records waiting and none in flight."""
        started = False
        for tp in self._lanes.ready():
            if self._inflight.full:
                break
            if tp in self._inflight or tp in self._backoff:
                continue
            skim = tp in self._skimming and self._breaker.state is State.CLOSED
            batch = self._admitted(tp, RUN_BATCHES if skim else 1)
            if not batch:
                continue
            attempt = self._backoff.attempt(tp, batch[0].offset)
            work = partial(self._processor.process, batch, attempt, skim=skim)
            self._inflight.submit(tp, work, self._label(tp, batch))
            started = True
        self._lanes.unhold()
        return started

    def _label(self, tp: Partition, batch: list[Record]) -> str:
        """``topic[p]@first..last`` and the handler, for the reports of a batch that runs long."""
        route = self._app.routes.get(tp[0])
        handler = f" (handler {route.name})" if route is not None else ""
        return f"{tp[0]}[{tp[1]}]@{batch[0].offset}..{batch[-1].offset}{handler}"

    def _admitted(self, tp: Partition, batches: int = 1) -> list[Record]:
        """Up to ``batches`` batches of ``tp``'s lane, as far as the circuit breaker lets them run.

        A breaker open or half-open takes the whole lane: what it does not
        let through (all, or all but its probe) it rewinds and pauses, so
        those records come again when it closes.
        """
        if self._breaker.state is State.CLOSED:
            return self._lanes.take(tp, batches * self._settings.batch_max_messages)
        lane = self._lanes.take(tp, self._lanes.waiting(tp))
        return self._breaker.admit({tp: lane}).get(tp, [])

    def _collect_ended(self) -> bool:
        ended = self._inflight.finished()
        for tp, future in ended:
            self._collect(tp, future)
        return bool(ended)

    def _collect(self, tp: Partition, future: Future[BatchResult]) -> None:
        result = future.result()  # a batch's exception ends the loop, as it did the batch
        if tp not in self._assigned:
            return  # revoked or lost meanwhile: not ours to commit or rewind
        self._advance(tp, result)
        if worth_skimming(result, self._settings.batch_max_messages):
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
            self._backoff.fail(tp, result.failure)
            # The records fetched behind the failure come again after the rewind.
            self._lanes.drop(tp)

    def _advance(self, tp: Partition, result: BatchResult) -> None:
        self._breaker.observe(result)
        if result.next_offset is not None:
            self._offsets.advance(tp, result.next_offset)
            self._backoff.advanced(tp, result.next_offset)
