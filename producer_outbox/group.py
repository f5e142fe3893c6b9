"""A lane group: one connection, its own producer, a share of the relay's lanes.

A relay runs its lanes in ``parallel`` lane groups side by side (one thread
each, :mod:`.relay`). Each group is the relay's loop on its own::

    wake (NOTIFY from a committing writer, or the poll interval as fallback)
    ──► a step, over every lane of the group at once:
          mark the rows whose keys settled since the last step (below)
          claim the next rows, leaving out keys in flight (:mod:`.claim`: a
              read-only transaction, no row lock, no transaction id)
          send them (:mod:`.batch`, :mod:`.producer`), and wait a moment for
              their delivery reports (at most ``SETTLE_WAIT``)
          mark every row whose key settled: acked rows sent, failed rows
              retried/parked — one short write transaction — and free its key
    ──► upkeep tasks that are due (:mod:`.schedule`), between steps:
          balance lanes, every min(1 s, poll interval) (advisory locks, :mod:`.lanes`)
          delete old sent rows, every ``cleanup_interval`` (group 0 only, :mod:`.cleanup`),
          never while their topic still keeps their records (:mod:`.retention`)
          read the outbox's gauges, every ``metrics_interval`` (group 0, with an SDK)
    ──► wait again (serving delivery reports meanwhile), unless the claim was
        full, a lane was just taken or a key was freed

No transaction stays open while Kafka works, so nothing a relay does holds
back the ``pg_snapshot_xmin`` every claim filters on. A record that waits on a
broker that does not answer (up to ``message.timeout.ms``) stays *in flight*
(:mod:`.flight`): its key, and only its key, is left out of the next claims
until it settles, and the step goes on without it; the other rows of its
claim are marked as their reports come. A topic whose rows are still waiting
after ``SETTLE_WAIT`` is *slow*: the next steps do not wait for its rows at
all. A group has at most a batch of rows in flight (so a crash publishes at
most that again), not counting the rows of topics that kept a row waiting
``STUCK_AFTER``, and at most ``IN_FLIGHT_BATCHES`` batches' worth in all.

Why groups, and why they keep every guarantee. A step spends its time in
three places that can overlap: PostgreSQL (the claim, the marks), Python
(turning rows into records and producing them) and Kafka (the delivery
reports). One group does them one after another; two groups overlap one's
PostgreSQL work with the other's Python and Kafka work. Nothing is shared
between groups that order depends on: a key lives in one lane, a lane in one
group at a time (its advisory lock is held by the group's connection, which
also runs the lane's claims and marks), and a group's claims leave out the
keys it has in flight. So, while their connections live, two groups never
have rows of the same key in flight (after a lost connection, see
:mod:`.flight`), and a failure holds back its key's later rows exactly as in
a relay with one group. A lane moves between groups, as between relays, only
when none of its rows is in flight. Each group has its own producer (and a
second one, made when first needed, for the rows that go alone:
:mod:`.batch`), so one group's records never wait in another's queue, and a
fatal producer error ends only its own group's sendings.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Collection
from typing import Any

import psycopg

from kinbox.core.failpoints import failpoint
from kinbox.core.publisher import Publisher, Siblings
from kinbox.store.errors import Blame, blame
from producer_outbox import claim as store
from producer_outbox import topics
from producer_outbox.batch import Marks, judge, plan
from producer_outbox.cleanup import delete_sent
from producer_outbox.config import RelayConfig
from producer_outbox.flight import Flight, RowsInFlight, Settled
from producer_outbox.lane_locks import LaneOwner
from producer_outbox.records import OutboxRow, to_record
from producer_outbox.schedule import Scheduler
from producer_outbox.schema import notify_channel
from producer_outbox.sent_retention import TopicRetention, floor
from producer_outbox.shared import Shared
from producer_outbox.telemetry import RelayTelemetry

log = logging.getLogger("producer_outbox.relay")

_BALANCE = "balance lanes"

SETTLE_WAIT = 0.5
"""Seconds a step waits for its rows' delivery reports before it goes on without them.

A healthy broker answers in milliseconds; a topic whose row waited this long
is slow, and later steps do not wait for its rows at all.
"""

STUCK_AFTER = 5.0
"""Seconds after which a topic's rows in flight no longer count against the group's batch.

Far above a busy broker's answer, so only a topic that really stopped
answering lets the group take more than a batch in flight.
"""

IN_FLIGHT_BATCHES = 10
"""A group claims nothing more while this many batches' worth of rows are in flight."""

Connection = psycopg.Connection[tuple[Any, ...]]


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
        shared: what the relay's groups share (registration, rows in flight).
        telemetry: spans and counts around each send; group 0 also reads
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
        self._alone: Publisher | None = None  # the second producer, made when first needed
        self._connect = connect
        self._stopping = should_stop
        self._shared = shared or Shared(groups)
        self._telemetry = telemetry or RelayTelemetry(config.schema)
        self._topic_retention = topic_retention
        # Upkeep between batches; PostgreSQL gone passes through to run(),
        # which reconnects (a task's other failures are logged and it is
        # tried again later). Made once, so the cleanup's schedule outlives a
        # reconnect: its first run is right after the start.
        self._upkeep: Scheduler[Connection] = Scheduler(passes=_gone)
        if index == 0:
            self._upkeep.add("cleanup", config.cleanup_interval, self._cleanup)
            if self._telemetry.metering:
                # The outbox's gauges (backlog, parked, oldest): only read for an SDK.
                self._upkeep.add("metrics", config.metrics_interval, self._telemetry.refresh)
        # Rounds in a row that met an outage and reached Kafka with nothing:
        # the outage's backoff grows with it.
        self._outages = 0
        # Rows sent and not yet marked; kept across reconnects (their reports
        # still come), each row with the epoch (connection) it was claimed on.
        self._flights = RowsInFlight()
        self._epoch = 0

    def run(self) -> None:
        """Publish until stopped; reconnect with backoff when PostgreSQL fails."""
        try:
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
        finally:
            if self._alone is not None:
                self._alone.close()

    def _run(self) -> None:
        delay = self.config.backoff_base or 0.5
        while not self._stopping():
            try:
                self._run_connected()
                return
            except psycopg.Error as exc:
                # Judged as kinbox judges its own statements: an outage, a
                # conflict (a deadlock) or a timeout passes, so the group
                # starts again on a new connection; anything else is a fault
                # of the relay's statements or schema, and stops the relay.
                verdict = blame(exc, own=True)
                if verdict == "event":
                    raise
                self._shared.holding(self.index, 0)  # the lane locks went with the connection
                log.warning(
                    "outbox relay: %s (%s); reconnecting in %.1fs", _MET[verdict], exc, delay
                )
                self._sleep(delay)
                delay = min(self.config.backoff_max, delay * 2)

    def _run_connected(self) -> None:
        with self._connect() as work, self._connect() as listen:
            self._epoch += 1  # rows claimed from now on hold their lanes through `work`
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
            # every second (or poll interval, if shorter) while it lives,
            # never giving up a lane with rows in flight.
            interval = min(1.0, self.config.poll_interval)
            self._upkeep.add(
                _BALANCE, interval, lambda _work: lanes.balance(busy=self._flights.lanes())
            )
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
                        self._wait(listen, work)  # (a lane just taken may have rows: no wait)
                # Stopping: the rows in flight get their reports and marks
                # before their lanes go.
                self._drain(work)
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
        """One step over ``lanes`` (see the module doc); True if more may be waiting."""
        self.settle_flights(conn)  # first: the claim then sees their marks, and their keys
        if not lanes or self._stopping():
            return False
        # At most a batch in flight, not counting rows of stuck topics, which
        # may add up to IN_FLIGHT_BATCHES batches' worth in all.
        batch = self.config.batch_size
        stuck = self._flights.slow_topics(time.monotonic() - STUCK_AFTER)
        limit = min(
            batch - self._flights.count(but=stuck), IN_FLIGHT_BATCHES * batch - self._flights.rows
        )
        if limit <= 0:
            return False
        rows = store.claim(
            conn,
            self.config.schema,
            owned=lanes,
            lanes=self.config.lanes,
            limit=limit,
            busy_keys=self._flights.busy_keys(),
            busy_ids=self._flights.busy_ids(),
        )
        if not rows:
            return False
        self._await(self._send(rows))
        self.settle_flights(conn)
        return len(rows) >= limit

    def _send(self, rows: list[OutboxRow]) -> list[Flight]:
        """Send a claim's rows as :func:`~producer_outbox.batch.plan` cuts them."""
        cut = plan(rows, self._flights.alone_topics())
        flights = []
        if cut.together:
            flights.append(self._launch([rows[i] for i in cut.together], self._publisher))
        for index in cut.alone:
            flights.append(self._launch([rows[index]], self._alone_publisher(), alone=True))
        for index in cut.waiting:
            self._flights.wait(rows[index])
        self._shared.flying(self.index, self._flights.rows)
        return flights

    def _launch(
        self, rows: list[OutboxRow], publisher: Publisher, *, alone: bool = False
    ) -> Flight:
        made = [to_record(row, source=self.config.source) for row in rows]
        # Spans for rows enqueued in a trace; their records carry the spans' context.
        records, spans = self._telemetry.start(rows, made)
        started = time.monotonic()
        sending = publisher.send(records)
        return self._flights.add(
            rows, sending, epoch=self._epoch, started=started, spans=spans, alone=alone
        )

    def _alone_publisher(self) -> Publisher:
        """The second producer, for rows that go alone (the group's own, without siblings)."""
        if self._alone is None:
            if not isinstance(self._publisher, Siblings):
                return self._publisher
            self._alone = self._publisher.sibling()
        return self._alone

    def _serve(self, timeout: float) -> None:
        """Hand over the delivery reports that come within ``timeout`` seconds."""
        if self._alone is None:
            self._publisher.serve(timeout)
            return
        # Each returns at once when it has nothing in flight.
        self._publisher.serve(timeout / 2)
        self._alone.serve(timeout / 2)

    def _await(self, flights: list[Flight]) -> None:
        """Wait until ``flights`` have their reports, but those of slow topics; at most a moment."""
        deadline = time.monotonic() + SETTLE_WAIT
        while True:
            now = time.monotonic()
            slow = self._flights.slow_topics(now - SETTLE_WAIT)
            if all(flight.reported(slow) for flight in flights) or now >= deadline:
                return
            self._serve(min(0.05, deadline - now))

    def settle_flights(self, conn: Connection) -> bool:
        """Mark the rows whose keys settled, then free their keys; True if any were.

        One pipeline: the marks' transaction and the clearing of topics that
        work again. A failure of a row claimed on an earlier connection is not
        marked (see :mod:`.flight`): the lane's owner now decides about it.
        """
        self._serve(0)
        settled = self._flights.take_settled()
        if not settled:
            return False
        try:
            self._mark(conn, settled)
        finally:
            self._flights.release(settled)
            self._shared.flying(self.index, self._flights.rows)
        return True

    def _mark(self, conn: Connection, settled: list[Settled]) -> None:
        rows: list[OutboxRow] = []
        outcomes = []
        stale: set[str] = set()
        now = time.monotonic()
        for part in settled:
            part_rows, part_outcomes = part.rows, part.outcomes
            self._telemetry.finish(part_rows, part_outcomes, part.spans, now - part.flight.started)
            rows += part_rows
            outcomes += part_outcomes
            if part.flight.epoch != self._epoch:
                stale.update(row.id for row in part_rows)
        result = judge(rows, outcomes, self.config, outage_delay=self.config.backoff(self._outages))
        failed = [f for f in result.failed if f.id not in stale]
        # Crash tests: acked by Kafka, not yet marked: a restart must re-publish;
        # the second one only while another group has rows in flight too.
        failpoint("relay_after_publish")
        if self._shared.others_flying(self.index):
            failpoint("relay_after_publish_overlapped")
        with conn.pipeline():
            store.mark(conn, self.config.schema, result.sent, failed)
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
            "outbox lanes %s: %d sent, %d failed, %d held, %d still in flight",
            _lane_list({row.lane for row in rows}),
            len(result.sent),
            len(result.failed) + len(result.topics),
            result.held,
            self._flights.rows - len(rows),
        )

    def _drain(self, conn: Connection) -> None:
        """Wait for the reports of every row in flight (each comes in bounded time); mark them."""
        while self._flights.rows:
            self._turned()
            self._serve(0.2)
            self.settle_flights(conn)

    def _track_topics(self, conn: Connection, result: Marks) -> None:
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

    def _wait(self, listen: Connection, work: Connection) -> None:
        """Sleep until a NOTIFY, the poll interval, or stop — in short slices for signals.

        Rows in flight are served meanwhile: the wait ends early once one of
        their keys is freed, as later rows of it may now be claimed.
        """
        deadline = time.monotonic() + self.config.poll_interval
        while not self._stopping():
            self._turned()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            slice_ = min(0.05 if self._flights.rows else 0.2, remaining)
            woke = False
            for _ in listen.notifies(timeout=slice_, stop_after=1):
                woke = True
            if woke:
                # Drain the rest: one wake-up serves every pending notification.
                for _ in listen.notifies(timeout=0):
                    pass
                return
            if self._flights.rows and self.settle_flights(work):
                return

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self._stopping() and time.monotonic() < deadline:
            self._turned()
            time.sleep(min(0.2, deadline - time.monotonic()))


def _gone(exc: Exception) -> bool:
    """Whether ``exc`` (an upkeep task's) says PostgreSQL is gone: the group reconnects."""
    return isinstance(exc, psycopg.Error) and blame(exc, own=True) == "outage"


_MET: dict[Blame, str] = {
    "outage": "PostgreSQL is unavailable",
    "conflict": "PostgreSQL aborted a statement to resolve a conflict",
    "wait": "a statement waited too long (lock_timeout or statement_timeout)",
}
"""What a group met, by :func:`~kinbox.store.errors.blame`'s verdict, for its warning."""


def _lane_list(lanes: Collection[int]) -> str:
    """The lanes for a log line, briefly."""
    ordered = sorted(lanes)
    return ",".join(map(str, ordered)) if len(ordered) <= 8 else f"{len(ordered)} lanes"
