"""The relay: publish committed outbox rows to Kafka, at least once, in per-key order.

One loop, one thread::

    wake (NOTIFY from a committing writer, or the poll interval as fallback)
    ──► balance lanes (advisory locks, :mod:`.lanes`)
    ──► per owned lane, one transaction per batch:
          claim rows FOR UPDATE SKIP LOCKED (:mod:`.claim`) ──► publish all, await
          every delivery report (:mod:`.publisher`) ──► mark acked rows sent, failed
          rows retried/parked ──► COMMIT
    ──► cleanup of old sent rows when due (:mod:`.cleanup`)

Guarantees and choices:

- **At least once.** A row is marked sent only after Kafka acknowledged it, in
  the transaction that locked it. A crash between ack and COMMIT re-publishes
  that batch (duplicates ≤ one batch per lane); the inbox drops them by event id.
- **Per-key order** holds with any number of relays: one lane per key, one
  relay per lane (:mod:`.lanes`), seq order within a lane, and the
  sequence-gap filter in :mod:`.claim`.
- **Failure.** A row whose publish fails gets ``attempts + 1``, ``last_error``
  and an exponential backoff; later rows *of the same key* wait for it (order),
  rows of other keys do not. A row is parked (``status = 'dead'``, shown by
  ``kinbox outbox status``) after ``max_attempts`` failures that are not an
  outage; outage errors (broker unreachable, timeouts) never park a row, so a
  long broker outage only delays publishing. A parked row no longer holds back
  its key: the key's later rows go on (a visible gap, like a dead-letter queue).
  Within a batch, a record refused at once by the client (e.g. "message too
  large") holds back the later records of its key in that batch. Limitation:
  a record that fails only in its delivery report while a *later* record of
  its key was acknowledged cannot be taken back; the later one stays in Kafka
  and the failed one goes out after it (the idempotent producer makes this
  rare: it fails a partition's queue together on an outage).
- **Latency.** Writers ``NOTIFY`` in their transaction; the relay ``LISTEN``s
  and wakes within milliseconds of the commit. ``poll_interval`` is the
  fallback (lost notification, backoff expiry, rows held by the xmin filter).
- **Shutdown.** :meth:`Relay.stop` (SIGTERM/SIGINT in the CLI) lets the
  current batch finish and commit, releases the lanes, closes connections.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg

from kinbox.errors import ConfigurationError
from kinbox.names import sql_identifier
from producer_outbox import claim as store
from producer_outbox.cleanup import delete_sent
from producer_outbox.failpoints import Failpoints
from producer_outbox.lanes import LaneOwner
from producer_outbox.publisher import Outcome, Publisher
from producer_outbox.records import OutboxRow, describe, to_record
from producer_outbox.schema import notify_channel

log = logging.getLogger(__name__)

Connection = psycopg.Connection[tuple[Any, ...]]


@dataclass(frozen=True)
class RelayConfig:
    """Relay settings; build from flags > env > defaults, then :meth:`validate`."""

    database_url: str
    schema: str = "kinbox"
    lanes: int = 16
    batch_size: int = 100
    poll_interval: float = 1.0
    max_attempts: int = 10
    backoff_base: float = 0.5
    backoff_max: float = 60.0
    retention: timedelta = field(default=timedelta(days=7))
    cleanup_interval: float = 3600.0
    cleanup_batch: int = 1000
    source: str | None = None

    def validate(self) -> RelayConfig:
        """Return self, or raise :class:`ConfigurationError` naming the bad setting."""
        sql_identifier(self.schema, setting="schema")
        checks: list[tuple[str, object, bool, str]] = [
            ("lanes", self.lanes, 1 <= self.lanes <= 4096, "1..4096"),
            ("batch_size", self.batch_size, 1 <= self.batch_size <= 10_000, "1..10000"),
            ("poll_interval", self.poll_interval, 0 < self.poll_interval <= 3600, "(0, 3600]"),
            ("max_attempts", self.max_attempts, self.max_attempts >= 1, ">= 1"),
            ("backoff_base", self.backoff_base, self.backoff_base >= 0, ">= 0"),
            ("backoff_max", self.backoff_max, self.backoff_max >= self.backoff_base, ">= base"),
            ("retention", self.retention, self.retention >= timedelta(0), ">= 0"),
            ("cleanup_interval", self.cleanup_interval, self.cleanup_interval > 0, "> 0"),
            ("cleanup_batch", self.cleanup_batch, self.cleanup_batch >= 1, ">= 1"),
        ]
        for name, value, ok, allowed in checks:
            if not ok:
                raise ConfigurationError(f"{name}={value!r} is not allowed: use {allowed}")
        if not self.database_url:
            raise ConfigurationError("database_url is required (--database-url)")
        return self

    def backoff(self, attempts: int) -> float:
        """Seconds to wait before try ``attempts + 1`` (exponential, capped)."""
        return float(min(self.backoff_max, self.backoff_base * 2 ** min(attempts, 30)))


def settle(
    rows: Sequence[OutboxRow], outcomes: Sequence[Outcome], config: RelayConfig
) -> tuple[list[Any], list[store.Failure]]:
    """Split a published batch into acknowledged ids and failures (retry or park)."""
    sent: list[Any] = []
    failed: list[store.Failure] = []
    for row, outcome in zip(rows, outcomes, strict=True):
        if outcome.error is None:
            sent.append(row.id)
            continue
        attempts = row.attempts + 1
        park = not outcome.outage and attempts >= config.max_attempts
        failed.append(store.Failure(row.id, outcome.error, config.backoff(row.attempts), park))
        log.log(
            logging.ERROR if park else logging.WARNING,
            "outbox row %s: publish failed (attempt %d%s): %s",
            describe(row),
            attempts,
            ", parked as dead" if park else "",
            outcome.error,
        )
    return sent, failed


class Relay:
    """Publishes one schema's outbox; :meth:`run` until :meth:`stop`."""

    def __init__(
        self,
        config: RelayConfig,
        publisher: Publisher,
        *,
        connect: Callable[[], Connection] | None = None,
        failpoints: Failpoints | None = None,
    ) -> None:
        self.config = config.validate()
        self._publisher = publisher
        self._connect = connect or (lambda: psycopg.connect(config.database_url, autocommit=True))
        self._failpoints = failpoints or Failpoints()
        self._stopping = False
        self._next_cleanup = time.monotonic()  # first cleanup right after start

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
            next_balance = 0.0
            try:
                while not self._stopping:
                    if time.monotonic() >= next_balance:
                        lanes.balance()
                        next_balance = time.monotonic() + min(1.0, self.config.poll_interval)
                    busy = self.run_lanes(work, sorted(lanes.owned))
                    self._maybe_cleanup(work)
                    if not busy:
                        self._wait(listen)
            finally:
                # Closing the connection would release the locks too; releasing
                # first lets another relay take the lanes without waiting.
                with contextlib.suppress(psycopg.Error):
                    lanes.release_all()
        log.info("outbox relay stopped")

    def run_lanes(self, conn: Connection, lanes: Sequence[int]) -> bool:
        """One batch per lane; True if any batch was full (more may be waiting)."""
        busy = False
        for lane in lanes:
            if self._stopping:
                break
            busy |= self.run_batch(conn, lane) >= self.config.batch_size
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
            outcomes = self._publisher.publish(records)
            # Crash test: acked by Kafka, not yet marked: a restart must re-publish.
            self._failpoints.hit("relay_after_publish")
            sent, failed = settle(rows, outcomes, self.config)
            store.mark(conn, self.config.schema, sent, failed)
        log.debug("outbox lane %d: %d sent, %d failed", lane, len(sent), len(failed))
        return len(rows)

    def _maybe_cleanup(self, conn: Connection) -> None:
        if time.monotonic() < self._next_cleanup:
            return
        self._next_cleanup = time.monotonic() + self.config.cleanup_interval
        try:
            deleted = delete_sent(
                conn,
                self.config.schema,
                retention=self.config.retention,
                batch=self.config.cleanup_batch,
                should_stop=lambda: self._stopping,
            )
        except psycopg.OperationalError:
            raise
        except psycopg.Error as exc:  # a failing background task is logged, never fatal
            log.error("outbox cleanup failed: %s", exc)
            return
        if deleted:
            log.info("outbox cleanup: deleted %d sent rows", deleted)

    def _wait(self, listen: Connection) -> None:
        """Sleep until a NOTIFY, the poll interval, or stop — in short slices for signals."""
        deadline = time.monotonic() + self.config.poll_interval
        while not self._stopping:
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
            time.sleep(min(0.2, deadline - time.monotonic()))
