"""A lane group: one connection, one producer, a share of the relay's lanes, a batch at a time.

A relay runs its lanes in ``parallel`` lane groups side by side (one thread
each, :mod:`.relay`). Each group is the relay's loop on its own::

    wake (NOTIFY from a committing writer, or the poll interval as fallback)
    ──► one transaction per batch, over every lane of the group at once:
          claim rows FOR UPDATE SKIP LOCKED (:mod:`.claim`) ──► publish all, await
          every delivery report (:mod:`.publisher`) ──► mark acked rows sent, failed
          rows retried/parked ──► COMMIT
    ──► upkeep tasks that are due (:mod:`.schedule`), between batches:
          balance lanes, every min(1 s, poll interval) (advisory locks, :mod:`.lanes`)
          delete old sent rows, every ``cleanup_interval`` (group 0 only, :mod:`.cleanup`),
          never while their topic still keeps their records (:mod:`.retention`)
          read the outbox's gauges, every ``metrics_interval`` (group 0, with an SDK)
    ──► wait again, unless the batch was full or a lane was just taken

Why groups, and why they keep every guarantee. A batch spends its time in
three places that can overlap: PostgreSQL (the claim, the marks, the COMMIT),
Python (turning rows into records and producing them) and Kafka (the delivery
reports). One group does them one after another; two groups overlap one's
PostgreSQL work with the other's Python and Kafka work. Nothing is shared
between groups that order depends on: a key lives in one lane, a lane in one
group at a time (its advisory lock is held by the group's connection, which
also runs the lane's batches), and a group runs its batches strictly one
after another, each committed before the next is claimed. So two batches in
flight at once never hold rows of the same key, and a failure in one group's
batch holds back its key's later rows exactly as in a relay with one group. A
lane moves between groups, as between relays, only between batches, when
every record of it has its delivery report. Each group has its own producer,
so one group's flush never waits for the other's records, and a fatal
producer error ends only its own group's batch.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator
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

log = logging.getLogger("producer_outbox.relay")

_BALANCE = "balance lanes"

Connection = psycopg.Connection[tuple[Any, ...]]


class RelayObserver(Protocol):
    """Told how the loop is doing (:class:`kinbox.ops.health.Health` is one)."""

    def turned(self) -> None:
        """The loop made progress: a round, a batch, a slice of a wait, a cleanup batch."""

    def holding(self, count: int) -> None:
        """The relay owns ``count`` lanes now."""


class Shared:
    """What a relay's lane groups share: registration, open batches, the observer.

    Args:
        groups: how many lane groups the relay runs.
        observer: told of the relay as a whole: the lanes of every group, and
            a turn once every group turned since the last one.
    """

    def __init__(self, groups: int = 1, observer: RelayObserver | None = None) -> None:
        self._lock = threading.Lock()
        self._open = 0
        self._observer = observer
        self._groups = groups
        self._turned: set[int] = set()
        self._held = [0] * groups
        self.registered = threading.Event()
        """Set once group 0 registered the relay (or ended): the others start then."""

    def turned(self, group: int) -> None:
        """``group`` made progress; the relay did once every group has."""
        if self._observer is None:
            return
        with self._lock:
            self._turned.add(group)
            if len(self._turned) < self._groups:
                return
            self._turned.clear()
        self._observer.turned()

    def holding(self, group: int, count: int) -> None:
        """``group`` owns ``count`` lanes now."""
        if self._observer is None:
            return
        with self._lock:
            self._held[group] = count
            total = sum(self._held)
        self._observer.holding(total)

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Count one open batch for the duration of the block."""
        with self._lock:
            self._open += 1
        try:
            yield
        finally:
            with self._lock:
                self._open -= 1

    @property
    def open(self) -> int:
        """Batches open now, in every group of the relay."""
        return self._open


class LaneGroup:
    """Publishes the lanes it owns until ``should_stop`` says so (see the module doc).

    Args:
        config: the relay's settings.
        publisher: this group's own publisher.
        connect: opens a connection (autocommit).
        index: this group's number, 0 .. ``groups - 1``; group 0 registers the
            relay and runs the cleanup.
        groups: how many groups the relay runs.
        should_stop: asked before every batch and while waiting.
        shared: what the relay's groups share (registration, open batches).
        telemetry: spans and counts around each publish; group 0 also reads
            the gauges (only with an SDK).
        topic_retention: with it, group 0's cleanup keeps sent rows while their
            topic keeps their records (:mod:`.retention`).
    """

    def __init__(
        self,
        config: RelayConfig,
        publisher: Publisher,
        connect: Callable[[], Connection],
        *,
        index: int = 0,
        groups: int = 1,
        should_stop: Callable[[], bool] = lambda: False,
        shared: Shared | None = None,
        telemetry: RelayTelemetry | None = None,
        topic_retention: TopicRetention | None = None,
    ) -> None:
        self.config = config
        self.index, self.groups = index, groups
        self._publisher = publisher
        self._connect = connect
        self._stopping = should_stop
        self._shared = shared or Shared(groups)
        self._telemetry = telemetry or RelayTelemetry(config.schema)
        self._topic_retention = topic_retention
        # Upkeep between batches; a lost connection passes through to run(),
        # which reconnects. Made once, so the cleanup's schedule outlives a
        # reconnect: its first run is right after the start.
        self._upkeep: Scheduler[Connection] = Scheduler(propagate=(psycopg.OperationalError,))
        if index == 0:
            self._upkeep.add("cleanup", config.cleanup_interval, self._cleanup)
            if self._telemetry.metering:
                # The outbox's gauges (backlog, parked, oldest): only read for an SDK.
                self._upkeep.add("metrics", config.metrics_interval, self._telemetry.refresh)
        # Rounds in a row that met an outage and reached Kafka with nothing:
        # the outage's backoff grows with it.
        self._outages = 0

    def run(self) -> None:
        """Publish until stopped; reconnect with backoff when PostgreSQL fails."""
        if self.index == 0:
            try:
                self._run()
            finally:
                self._shared.registered.set()  # never leave the others waiting
            return
        # Only once the relay is registered (group 0 checked the lane count
        # against the other relays') may another group take lanes.
        while not self._stopping() and not self._shared.registered.wait(0.2):
            self._turned()
        self._run()

    def _run(self) -> None:
        delay = self.config.backoff_base or 0.5
        while not self._stopping():
            try:
                self._run_connected()
                return
            except psycopg.OperationalError as exc:
                self._shared.holding(self.index, 0)  # the lane locks went with the connection
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
            lanes = LaneOwner(
                work, self.config.schema, self.config.lanes, group=self.index, groups=self.groups
            )
            if self.index == 0:
                lanes.register()
                self._shared.registered.set()
                log.info(
                    "outbox relay started: schema=%s lanes=%d parallel=%d",
                    self.config.schema,
                    lanes.lanes,
                    self.groups,
                )
            # The lanes belong to this connection: balance them at once, then
            # every second (or poll interval, if shorter) while it lives.
            interval = min(1.0, self.config.poll_interval)
            self._upkeep.add(_BALANCE, interval, lambda _work: lanes.balance())
            try:
                self._upkeep.run_due(work, should_stop=self._stopping)
                while not self._stopping():
                    self._turned()
                    self._shared.holding(self.index, len(lanes.owned))
                    # The claim first, upkeep after: a wake-up goes straight to
                    # the rows that woke it, never behind a lane balancing.
                    busy = self.run_lanes(work, lanes.owned)
                    before = set(lanes.owned)
                    self._upkeep.run_due(work, should_stop=self._stopping)
                    if not busy and lanes.owned <= before:
                        self._wait(listen)  # (a lane just taken may have rows: no wait)
            finally:
                self._shared.holding(self.index, 0)
                self._upkeep.remove(_BALANCE)
                # Closing the connection would release the locks too; releasing
                # first lets another relay take the lanes without waiting.
                with contextlib.suppress(psycopg.Error):
                    lanes.release_all()
        if self.index == 0:
            log.info("outbox relay stopped")

    def run_lanes(self, conn: Connection, lanes: Collection[int]) -> bool:
        """One batch of ``lanes``; True if it was full (more may be waiting)."""
        if not lanes or self._stopping():
            return False
        return self.run_batch(conn, lanes) >= self.config.batch_size

    def run_batch(self, conn: Connection, lanes: Collection[int]) -> int:
        """Claim, publish, mark and commit one batch of ``lanes``; return its size.

        One pipeline: BEGIN, the claim and its planner settings go in one round
        trip; the marks, COMMIT and the clearing of topics that work again in
        another.
        """
        with self._shared.batch(), conn.pipeline():
            with conn.transaction():
                rows = store.claim(
                    conn,
                    self.config.schema,
                    owned=lanes,
                    lanes=self.config.lanes,
                    limit=self.config.batch_size,
                )
                if not rows:
                    return 0
                records = [to_record(row, source=self.config.source) for row in rows]
                # Spans (for rows enqueued in a trace) and counts around the publish.
                outcomes = self._telemetry.publish(self._publisher, rows, records)
                # Crash tests: acked by Kafka, not yet marked: a restart must re-publish;
                # the second one only while another group's batch is in flight too.
                failpoint("relay_after_publish")
                if self._shared.open > 1:
                    failpoint("relay_after_publish_overlapped")
                result = settle(
                    rows, outcomes, self.config, outage_delay=self.config.backoff(self._outages)
                )
                store.mark(conn, self.config.schema, result.sent, result.failed)
            # After the COMMIT, on its own: a topic that took a record works again.
            cleared = topics.clear_many(
                conn, self.config.schema, result.acked_topics - result.topics.keys()
            )
        for topic in cleared():
            log.info("outbox topic %r accepts records again", topic, extra={"topic": topic})
        if result.sent:
            self._outages = 0
        elif result.outages:
            self._outages += 1
        self._track_topics(conn, result)
        log.debug(
            "outbox lanes %s: %d sent, %d failed, %d held",
            _lane_list(lanes),
            len(result.sent),
            len(result.failed) + len(result.topics),
            result.held,
        )
        return len(rows)

    def _track_topics(self, conn: Connection, result: Settlement) -> None:
        """Pause the topics Kafka refused as a whole."""
        for topic, error in sorted(result.topics.items()):
            failures, retry_in = topics.record_failure(
                conn,
                self.config.schema,
                topic,
                error,
                base=self.config.backoff_base,
                cap=self.config.backoff_max,
            )
            log.error(
                "outbox topic %r refused by Kafka (%s): its rows wait, never parked "
                "(round %d, next try in %.1fs)",
                topic,
                error,
                failures,
                retry_in,
                extra={"topic": topic},
            )

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
        self._turned()  # asked between cleanup batches: the loop is busy, not stuck
        return self._stopping()

    def _turned(self) -> None:
        self._shared.turned(self.index)

    def _wait(self, listen: Connection) -> None:
        """Sleep until a NOTIFY, the poll interval, or stop — in short slices for signals."""
        deadline = time.monotonic() + self.config.poll_interval
        while not self._stopping():
            self._turned()
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
        while not self._stopping() and time.monotonic() < deadline:
            self._turned()
            time.sleep(min(0.2, deadline - time.monotonic()))


def _lane_list(lanes: Collection[int]) -> str:
    """The lanes for a log line, briefly."""
    ordered = sorted(lanes)
    return ",".join(map(str, ordered)) if len(ordered) <= 8 else f"{len(ordered)} lanes"
