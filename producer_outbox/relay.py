"""The relay: publish committed outbox rows to Kafka, at least once, in per-key order.

One loop, one thread::

    wake (NOTIFY from a committing writer, or the poll interval as fallback)
    ──► upkeep tasks that are due (:mod:`.schedule`):
          balance lanes, every min(1 s, poll interval) (advisory locks, :mod:`.lanes`)
          delete old sent rows, every ``cleanup_interval`` (:mod:`.cleanup`),
          never while their topic still keeps their records (:mod:`.retention`)
    ──► per owned lane, one transaction per batch:
          claim rows FOR UPDATE SKIP LOCKED (:mod:`.claim`) ──► publish all, await
          every delivery report (:mod:`.publisher`) ──► mark acked rows sent, failed
          rows retried/parked ──► COMMIT

Guarantees and choices:

- **At least once.** A row is marked sent only after Kafka acknowledged it, in
  the transaction that locked it. A crash between ack and COMMIT re-publishes
  that batch (duplicates ≤ one batch per lane); the inbox drops them by event id.
- **Per-key order.** A key is the ``key`` given to ``enqueue``
  (``aggregateid``), across topics. A key's rows are published in
  ``(txid, seq)`` order, the order :mod:`.claim` defines: the rows of one
  transaction in the order it enqueued them, never interleaved with another
  transaction's; the rows of different transactions in the order PostgreSQL
  gave those transactions their ids — at their first write (INSERT, UPDATE,
  DELETE, SELECT … FOR UPDATE/SHARE) or ``pg_current_xact_id()`` call, not at
  BEGIN and not at COMMIT. A row goes out only once every transaction with a
  lower id has ended, so the order is final when the row is published, every
  relay agrees on it, and writers need not lock anything. It holds with any
  number of relays: one lane per key, one relay per lane (:mod:`.lanes`).
  It is *commit* order when the writers of a key serialise on a lock taken
  before their first write: ``SELECT … FOR UPDATE`` of the aggregate's row (a
  transaction waiting for a row lock gets its id only once it holds it) or
  ``pg_advisory_xact_lock`` (which assigns no id) as the first statement. An
  ``UPDATE`` as the first statement is not enough: PostgreSQL gives the
  updating transaction its id *before* it waits for the row lock, so two such
  writers starting at the same moment can be published in the opposite order
  of their commits.
- **Failure** (verdicts in :mod:`.batch`). A row whose publish fails by its
  own fault gets ``attempts + 1``, ``last_error`` and an exponential backoff,
  and is parked (``status = 'dead'``) on its ``max_attempts``-th such failure.
  Later rows of its key wait for it, also while it is parked: a parked row
  blocks its key until ``kinbox outbox requeue`` puts it back, and it then
  goes out first (:mod:`.parked`). Rows of other keys never wait. Outages
  (broker unreachable, timeouts) and a topic Kafka refuses as a whole
  (missing, not authorized: :mod:`.topics`) never count as attempts and never
  park; a row that only waited behind another is left untouched.
  Limitation: when Kafka refuses a record only in its delivery report while a
  later record of its key, sent in another produce request, is acknowledged,
  the later one cannot be taken back; the relay logs the order break at
  ERROR. The client refuses a record over its own ``message.max.bytes`` at
  once, before sending it, and then the later rows of its key are held: with
  ``-X message.max.bytes`` no higher than the topics' ``max.message.bytes``,
  an oversized row cannot break order.
- **Latency.** Writers ``NOTIFY`` in their transaction; the relay ``LISTEN``s
  and wakes within milliseconds of the commit. ``poll_interval`` is the
  fallback (lost notification, backoff expiry, rows held by the xmin filter).
- **Upkeep** runs between batches on the work connection, never during one
  (a lane is released only when none of its rows is in flight). A failing
  task is logged and tried again one interval later; only a lost connection
  ends the connected loop, which reconnects. Lane balancing starts anew with
  each connection (the locks were the old connection's); the cleanup keeps
  its schedule across reconnects, its first run right after the start.
- **Health.** An optional observer (:class:`RelayObserver`; ``--health-port``
  serves it as ``/livez`` and ``/readyz``) hears each turn of the loop and
  how many lanes the relay owns.
- **Shutdown.** :meth:`Relay.stop` (SIGTERM/SIGINT in the CLI) lets the
  current batch finish and commit, releases the lanes, closes connections.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import psycopg

from kinbox.failpoints import failpoint
from producer_outbox import claim as store
from producer_outbox import topics
from producer_outbox.batch import Settlement, settle
from producer_outbox.cleanup import delete_sent
from producer_outbox.config import RelayConfig
from producer_outbox.lanes import LaneOwner
from producer_outbox.publisher import Publisher
from producer_outbox.records import to_record
from producer_outbox.retention import TopicRetention, floor
from producer_outbox.schedule import Scheduler
from producer_outbox.schema import notify_channel
from producer_outbox.telemetry import RelayTelemetry

__all__ = ["Relay", "RelayConfig"]

log = logging.getLogger(__name__)

_BALANCE = "balance lanes"

Connection = psycopg.Connection[tuple[Any, ...]]


class RelayObserver(Protocol):
    """Told how the loop is doing (:class:`kinbox.ops.health.Health` is one)."""

    def turned(self) -> None:
        """The loop made progress: a round, a batch, a slice of a wait, a cleanup batch."""

    def holding(self, count: int) -> None:
        """The relay owns ``count`` lanes now."""


class _Unobserved:
    def turned(self) -> None:
        pass

    def holding(self, count: int) -> None:
        pass


class Relay:
    """Publishes one schema's outbox; :meth:`run` until :meth:`stop`."""

    def __init__(
        self,
        config: RelayConfig,
        publisher: Publisher,
        *,
        connect: Callable[[], Connection] | None = None,
        observer: RelayObserver | None = None,
        topic_retention: TopicRetention | None = None,
        telemetry: RelayTelemetry | None = None,
    ) -> None:
        self.config = config.validate()
        # With it, sent rows outlive their records on the broker (:mod:`.retention`).
        self._topic_retention = topic_retention
        self._observer: RelayObserver = observer or _Unobserved()
        self._publisher = publisher
        self._telemetry = telemetry or RelayTelemetry(self.config.schema)
        self._connect = connect or (lambda: psycopg.connect(config.database_url, autocommit=True))
        self._stopping = False
        # Upkeep between batches; a lost connection passes through to run(),
        # which reconnects. Made once, so the cleanup's schedule outlives a
        # reconnect: its first run is right after the start.
        self._upkeep: Scheduler[Connection] = Scheduler(propagate=(psycopg.OperationalError,))
        self._upkeep.add("cleanup", self.config.cleanup_interval, self._cleanup)
        if self._telemetry.metering:
            # The outbox's gauges (backlog, parked, oldest): only read for an SDK.
            self._upkeep.add("metrics", self.config.metrics_interval, self._telemetry.refresh)
        # Rounds of the lanes in a row that met an outage and reached Kafka with
        # nothing: the outage's backoff grows with it.
        self._outages = 0
        self._round_sent = self._round_outage = False
        self._failing: set[str] = set()  # topics recorded as failing (.topics)

    def stop(self) -> None:
        """Ask :meth:`run` to return after the current batch (signal-handler safe)."""
        self._stopping = True

    def run(self) -> None:
        """Publish until :meth:`stop`; reconnect with backoff when PostgreSQL fails."""
        delay = self.config.backoff_base or 0.5
        while not self._stopping:
            try:
                self._run_connected()
                return
            except psycopg.OperationalError as exc:
                self._observer.holding(0)  # the lane locks went with the connection
                log.warning("outbox relay lost PostgreSQL (%s); reconnecting in %.1fs", exc, delay)
                self._sleep(delay)
                delay = min(self.config.backoff_max, delay * 2)

    def _run_connected(self) -> None:
        with self._connect() as work, self._connect() as listen:
            listen.execute(
                psycopg.sql.SQL("LISTEN {}").format(
                    psycopg.sql.Identifier(notify_channel(self.config.schema))
                )
            )
            lanes = LaneOwner(work, self.config.schema, self.config.lanes)
            lanes.register()
            log.info("outbox relay started: schema=%s lanes=%d", self.config.schema, lanes.lanes)
            # The lanes belong to this connection: balance them at once, then
            # every second (or poll interval, if shorter) while it lives.
            interval = min(1.0, self.config.poll_interval)
            self._upkeep.add(_BALANCE, interval, lambda _work: lanes.balance())
            try:
                while not self._stopping:
                    self._observer.turned()
                    self._upkeep.run_due(work, should_stop=lambda: self._stopping)
                    self._observer.holding(len(lanes.owned))
                    busy = self.run_lanes(work, sorted(lanes.owned))
                    if not busy:
                        self._wait(listen)
            finally:
                self._observer.holding(0)
                self._upkeep.remove(_BALANCE)
                # Closing the connection would release the locks too; releasing
                # first lets another relay take the lanes without waiting.
                with contextlib.suppress(psycopg.Error):
                    lanes.release_all()
        log.info("outbox relay stopped")

    def run_lanes(self, conn: Connection, lanes: Sequence[int]) -> bool:
        """One batch per lane; True if any batch was full (more may be waiting)."""
        self._failing = topics.failing(conn, self.config.schema)
        self._round_sent = self._round_outage = False
        busy = False
        for lane in lanes:
            if self._stopping:
                break
            self._observer.turned()  # a round may take long: each batch is progress
            busy |= self.run_batch(conn, lane) >= self.config.batch_size
        if self._round_sent:
            self._outages = 0
        elif self._round_outage:
            self._outages += 1
        return busy

    def run_batch(self, conn: Connection, lane: int) -> int:
        """Claim, publish, mark and commit one batch of ``lane``; return its size."""
        with conn.transaction():
            rows = store.claim(
                conn,
                self.config.schema,
                lane=lane,
                lanes=self.config.lanes,
                limit=self.config.batch_size,
            )
            if not rows:
                return 0
            records = [to_record(row, source=self.config.source) for row in rows]
            # Spans (for rows enqueued in a trace) and counts around the publish.
            outcomes = self._telemetry.publish(self._publisher, rows, records)
            # Crash test: acked by Kafka, not yet marked: a restart must re-publish.
            failpoint("relay_after_publish")
            result = settle(
                rows, outcomes, self.config, outage_delay=self.config.backoff(self._outages)
            )
            store.mark(conn, self.config.schema, result.sent, result.failed)
        self._round_sent |= bool(result.sent)
        self._round_outage |= result.outages > 0
        self._track_topics(conn, result)
        log.debug(
            "outbox lane %d: %d sent, %d failed, %d held",
            lane,
            len(result.sent),
            len(result.failed) + len(result.topics),
            result.held,
        )
        return len(rows)

    def _track_topics(self, conn: Connection, result: Settlement) -> None:
        """Pause the topics Kafka refused as a whole; forget those that work again."""
        for topic, error in sorted(result.topics.items()):
            failures, retry_in = topics.record_failure(
                conn,
                self.config.schema,
                topic,
                error,
                base=self.config.backoff_base,
                cap=self.config.backoff_max,
            )
            self._failing.add(topic)
            log.error(
                "outbox topic %r refused by Kafka (%s): its rows wait, never parked "
                "(round %d, next try in %.1fs)",
                topic,
                error,
                failures,
                retry_in,
                extra={"topic": topic},
            )
        for topic in sorted((result.acked_topics & self._failing) - result.topics.keys()):
            self._failing.discard(topic)
            if topics.clear(conn, self.config.schema, topic):
                log.info("outbox topic %r accepts records again", topic, extra={"topic": topic})

    def _cleanup(self, conn: Connection) -> None:
        """Upkeep: delete sent rows older than the retention, in bounded batches.

        With the broker's topic retention at hand, never rows whose records
        the topic still keeps (:mod:`.retention`); a broker that does not
        answer fails the task, which deletes nothing and runs again later.
        """
        retention = self.config.retention
        if self._topic_retention is not None:
            kept = floor(conn, self.config.schema, retention, self._topic_retention)
            if kept.keep > retention or kept.forever:
                level = logging.WARNING if kept.keep > retention else logging.INFO
                log.log(level, "outbox cleanup: %s", kept.explain(retention),
                        extra={"topic": kept.topic})  # fmt: skip
            retention = kept.keep
        deleted = delete_sent(
            conn,
            self.config.schema,
            retention=retention,
            batch=self.config.cleanup_batch,
            should_stop=self._cleanup_should_stop,
        )
        if deleted:
            log.info("outbox cleanup: deleted %d sent rows", deleted)

    def _cleanup_should_stop(self) -> bool:
        self._observer.turned()  # asked between cleanup batches: the loop is busy, not stuck
        return self._stopping

    def _wait(self, listen: Connection) -> None:
        """Sleep until a NOTIFY, the poll interval, or stop — in short slices for signals."""
        deadline = time.monotonic() + self.config.poll_interval
        while not self._stopping:
            self._observer.turned()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            woke = False
            for _ in listen.notifies(timeout=min(0.2, remaining), stop_after=1):
                woke = True
            if woke:
                # Drain the rest: one wake-up serves every pending notification.
                for _ in listen.notifies(timeout=0):
                    pass
                return

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self._stopping and time.monotonic() < deadline:
            self._observer.turned()
            time.sleep(min(0.2, deadline - time.monotonic()))
